"""The `aoti-farm` command itself: fast help, one-line errors with exit 2, key, wiring.

The tests of this module that compile, start Ray or start processes are in tests/e2e/test_cli.py.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from aoti_farm.cli import main
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_mul


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_help_groups_user_commands_apart_from_developer_tools(capsys):
    """`aoti-farm --help` lists the user's commands, then the developer tools, each
    exactly once, and every command of the parser is in one of the two groups."""
    import re

    from aoti_farm.cli import DEVELOPER_COMMANDS, USER_COMMANDS, build_parser

    assert set(USER_COMMANDS) == {"record", "warm", "run", "serve", "explain", "report", "cache", "trace"}
    assert set(DEVELOPER_COMMANDS) == {"key", "compile-one", "native", "bench"}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(USER_COMMANDS) | set(DEVELOPER_COMMANDS)
    rc, out, _ = _cli(capsys, "--help")
    assert rc == 0
    head, _, rest = out.partition("\ncommands:\n")
    users, _, devs = rest.partition("\ndeveloper tools:\n")
    listed = lambda text: re.findall(r"^  ([a-z-]+)  ", text, re.M)  # noqa: E731
    assert listed(users) == list(USER_COMMANDS), out
    assert listed(devs) == list(DEVELOPER_COMMANDS), out
    assert not set(listed(head)) & set(sub.choices), out   # argparse's own, mixed list is gone


@pytest.mark.parametrize("argv, words", [
    (["bogus"], "invalid choice"),
    (["cache"], "required"),
    (["cache", "gc"], "--max-size"),
    (["cache", "stats", "--bogus-flag"], "unrecognized"),
    (["key", "--trace", "x.json", "--index", "one"], "invalid int"),
    (["trace", "merge", "only-one.json"], "OUT"),
])
def test_bad_usage_is_one_line_exit_2(capsys, argv, words):
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("aoti-farm: error: ") and words in err, err


def test_bad_size_and_bad_index(tmp_path, capsys):
    rc, _, err = _cli(capsys, "cache", "gc", "--max-size", "lots", "--cache-dir", str(tmp_path))
    assert rc == 2 and "500M" in err and err.count("\n") == 1
    t = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig_mul(), 1, 0)]), t)
    rc, _, err = _cli(capsys, "key", "--trace", str(t), "--index", "5")
    assert rc == 2 and "has 1 entries" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, "compile-one", "--trace", str(t), "--index", "-1")
    assert rc == 2 and "--index -1" in err


def _corrupt_caches(tmp_path):
    bad_version = tmp_path / "v"
    bad_version.mkdir()
    (bad_version / "VERSION").write_text("something else 7\n")
    a_file = tmp_path / "f"
    a_file.write_text("not a directory")
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my files")
    return {"bad VERSION": (bad_version, "VERSION"), "a file": (a_file, "not a directory"),
            "not a cache": (foreign, "no VERSION"), "missing": (tmp_path / "nope", "no such directory")}


@pytest.mark.parametrize("cmd", [["stats"], ["ls"], ["verify", "--repair"], ["gc", "--max-size", "1K"],
                                 ["rm", "--all"]])
def test_unusable_cache_dir_exit_2_and_untouched(tmp_path, capsys, cmd):
    for name, (d, words) in _corrupt_caches(tmp_path).items():
        before = sorted(os.listdir(d)) if d.is_dir() else None
        rc, out, err = _cli(capsys, "cache", *cmd, "--cache-dir", str(d))
        assert rc == 2, (name, err)
        assert err.count("\n") == 1 and str(d) in err and words in err and "--cache-dir" in err, (name, err)
        assert (sorted(os.listdir(d)) if d.is_dir() else None) == before


def test_cache_dir_from_environment(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "v"
    bad.mkdir()
    (bad / "VERSION").write_text("other\n")
    monkeypatch.setenv("AOTI_FARM_CACHE_DIR", str(bad))
    rc, _, err = _cli(capsys, "cache", "stats")
    assert rc == 2 and str(bad) in err
    rc, out, err = _cli(capsys, "cache", "stats", "--cache-dir", str(tmp_path / "empty-ok"))
    assert rc == 2 and "empty-ok" in err and str(bad) not in err  # the flag wins over the environment
    (tmp_path / "empty-ok").mkdir()
    rc, out, _ = _cli(capsys, "cache", "stats", "--cache-dir", str(tmp_path / "empty-ok"), "--json")
    assert rc == 0 and json.loads(out)["entries"] == 0


def test_keyboard_interrupt_exits_130(tmp_path, capsys, monkeypatch):
    from aoti_farm.cli import cache_cmds

    def interrupted(ns):
        raise KeyboardInterrupt

    monkeypatch.setitem(cache_cmds.COMMANDS, "stats", interrupted)
    rc, _, err = _cli(capsys, "cache", "stats", "--cache-dir", str(tmp_path))
    assert rc == 130 and err.strip() == "aoti-farm: error: interrupted"


def test_bad_config_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[farm]\nretries = 'many'\n")
    rc, _, err = _cli(capsys, "cache", "stats", "--config", str(cfg), "--cache-dir", str(tmp_path))
    assert rc == 2 and str(cfg) in err and "retries" in err and err.count("\n") == 1
