"""Unit tests of issue 32's defences that need no process, compile or Ray: the metrics
span's squatted-port check (its ``/proc/net/tcp`` parsing), the miss queue's caps as
settings, the one owner/mode check of ``aoti_farm/security/private.py``, and each layer of the
escaping and report-tick defences on its own (the e2e drills in
``tests/e2e/test_drills_env_attacks.py`` pass while either layer holds)."""

from __future__ import annotations

import logging
import os

import pytest

from aoti_farm.metrics import exposition

# --- metrics: ports another user holds ------------------------------------------------------------

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:24B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1577 1 0 100 0 0 10 0
   1: 00000000:24B9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1578 1 0 100 0 0 10 0
   2: 0100007F:24BA 0100007F:A000 01 00000000:00000000 00:00000000 00000000  1002        0 1579 1 0 20 4 27 102 -1
   3: garbage
   4: 0100007F:ZZZZ 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1003        0 1 1 0 100 0 0 10 0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:24BB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1004        0 1 1 0 100 0 0 10 0
"""


def test_proc_net_tcp_lists_listening_sockets_with_their_owner():
    assert exposition.parse_proc_net_tcp(TCP) == [("0100007F", 0x24B8, 1001, 1577), ("00000000", 0x24B9, 0, 1578)]
    assert exposition.parse_proc_net_tcp(TCP6) == [("00000000000000000000000001000000", 0x24BB, 1004, 1)]
    assert exposition.parse_proc_net_tcp("") == []


def test_foreign_listeners_are_other_uids_on_ports_of_the_span(tmp_path):
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    span = range(0x24B8, 0x24B8 + 4)   # 9400..9403
    # uid 0 is "us": its port 9401 is not reported; 9402 is a connection, not a listener
    assert exposition.foreign_listeners(span, uid=0, proc=str(tmp_path)) == [(9400, 1001), (9403, 1004)]
    assert exposition.foreign_listeners(span, uid=1001, proc=str(tmp_path)) == [(9401, 0), (9403, 1004)]
    assert exposition.foreign_listeners(range(1, 3), uid=0, proc=str(tmp_path)) == []
    assert exposition.foreign_listeners(span, uid=0, proc=str(tmp_path / "none")) == []   # not Linux: no claim


def test_held_ports_are_one_warning_line_per_owner(caplog):
    with caplog.at_level(logging.WARNING, logger="aoti_farm.metrics"):
        exposition._warn_held([(9400, 1001), (9401, 1001), (9403, 1004)], "this process serves on 9402")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "9400, 9401" in lines[0] and "uid 1001" in lines[0] and "9402" in lines[0]
    assert "9403" in lines[1] and "uid 1004" in lines[1]


# --- the miss queue's caps are settings ----------------------------------------------------------


def test_queue_caps_resolve_argument_over_toml_over_default(tmp_path):
    from aoti_farm.errors import UserError
    from aoti_farm.runtime import misswriter
    from aoti_farm.runtime import settings

    env = {"AOTI_FARM_CACHE_DIR": str(tmp_path / "c")}
    d = settings.resolve(env=env).config
    assert (d.queue_cap, d.queue_cap_per_op) == (misswriter.QUEUE_CAP, misswriter.QUEUE_CAP_PER_OP) == (1024, 128)
    toml = tmp_path / "f.toml"
    toml.write_text("[hook]\nqueue_cap = 40\nqueue_cap_per_op = 7\n")
    env["AOTI_FARM_CONFIG"] = str(toml)
    t = settings.resolve(env=env).config
    assert (t.queue_cap, t.queue_cap_per_op) == (40, 7)
    a = settings.resolve(env=env, queue_cap=9).config
    assert (a.queue_cap, a.queue_cap_per_op) == (9, 7)
    for bad, text in (({"queue_cap": 0}, "queue_cap: 0 must be at least 1"),
                      ({"queue_cap_per_op": -3}, "queue_cap_per_op: -3 is negative"),
                      ({"queue_cap": "many"}, "queue_cap")):
        with pytest.raises(UserError, match=text):
            settings.resolve(env=env, **bad)
    # no variable of its own (the environment's surface stays small): one set is refused, naming the way
    with pytest.raises(UserError,
                       match=r"AOTI_FARM_QUEUE_CAP: no longer read; use install\(settings=Settings\(queue_cap=...\)\)"):
        settings.resolve(env={**env, "AOTI_FARM_QUEUE_CAP": "5"})


def test_the_miss_writer_keeps_to_the_caps_it_is_given(tmp_path):
    import torch

    from aoti_farm import signature as S
    from aoti_farm.cache.store import Cache
    from aoti_farm.runtime.calls import Call
    from aoti_farm.runtime.misswriter import MissWriter

    cache = Cache(tmp_path / "c")
    cache.ensure()

    class Fp:
        id = "f" * 24

    w = MissWriter(cache, {"cpu": Fp()}, True, lambda call: None, cap=5, cap_per_op=2)
    for op in (torch.ops.aten.relu.default, torch.ops.aten.neg.default, torch.ops.aten.abs.default):
        for n in range(1, 4):
            sig = S.from_call(op, (torch.empty(n),), {})
            w._write(Call(sig, sig.key, "cpu"))   # the writer thread's step, here in the test's thread
    st = w.counters.snapshot()
    assert st["queued"] == 5 and len(os.listdir(cache.ns(Fp.id) / "queue")) == 5
    assert st["queue_overflow"] == 9 - 5


# --- private.py: the one owner/mode check --------------------------------------------------------


def test_private_checks_share_one_rule(tmp_path):
    """check_dir, check_file and open_append refuse the same things for the same reasons."""
    from aoti_farm.security import private
    from aoti_farm.security.safeio import UnsafeFile

    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    f = d / "f"
    f.write_text("x")
    os.chmod(f, 0o600)
    private.check_dir(d)
    private.check_file(f)
    os.close(private.open_append(f))
    os.chmod(f, 0o620)
    for call in (private.check_file, private.open_append):
        with pytest.raises(UnsafeFile, match=r"writable by group or others \(mode 620\)") as e:
            call(f)
        assert e.value.kind == "insecure"
    os.chmod(f, 0o600)
    os.chmod(d, 0o770)
    with pytest.raises(UnsafeFile, match=r"mode 770\); chmod 700 it") as e:
        private.check_dir(d)
    os.chmod(d, 0o700)
    os.symlink(f, d / "link")
    with pytest.raises(UnsafeFile, match="is a symbolic link") as e:
        private.check_file(d / "link")
    assert e.value.kind == "insecure"
    os.symlink(d, tmp_path / "dlink")
    with pytest.raises(UnsafeFile, match="a private directory must not be one"):
        private.check_dir(tmp_path / "dlink")
    with pytest.raises(UnsafeFile, match="not a directory") as e:
        private.check_dir(f)
    assert e.value.kind == "not_regular"
    with pytest.raises(UnsafeFile, match="not a regular file"):
        private.check_file(d / ".." / "d")
    if os.getuid() == 0:   # another owner: only root can make one here
        os.chown(f, 1, 1)
        for call in (private.check_file, private.open_append):
            with pytest.raises(UnsafeFile, match=r"owned by uid 1, not this user \(0\)"):
                call(f)
        os.chown(d, 1, 1)
        with pytest.raises(UnsafeFile, match=r"owned by uid 1, not this user \(0\); remove it"):
            private.check_dir(d)


# --- each layer of the report's tick bound on its own ----------------------------------------------


def _ticks(html: str) -> list[float]:
    import re

    return [float(x) for x in re.findall(r'class="tick">([0-9.e+]+)s<', html)]


def _timeline(seconds: float) -> dict:
    return {"format": "aoti-farm-warm-report", "signatures": [],
            "timeline": {"process_start": 0.0, "end": seconds}}


def test_report_ticks_step_spreads_them_over_the_whole_span():
    """Layer 1 (``_tick_step``): 13 ticks reach the end of a 29-day span.  Without it the
    loop's count alone stops after 12 two-hour steps, a day into the span."""
    from aoti_farm.report.report_html import MAX_TICKS, render

    total = 29 * 86400.0
    ticks = _ticks(render(_timeline(total)))
    assert 2 <= len(ticks) <= MAX_TICKS
    assert ticks[-1] >= total * (MAX_TICKS - 2) / (MAX_TICKS - 1), ticks


def test_report_ticks_count_is_capped_whatever_the_step(monkeypatch):
    """Layer 2 (the drawing loop's count): with a step far too small for the span, still
    at most MAX_TICKS ticks are drawn."""
    from aoti_farm.report import report_html

    monkeypatch.setattr(report_html, "_tick_step", lambda total: 1.0)
    ticks = _ticks(report_html.render(_timeline(86400.0)))
    assert len(ticks) == report_html.MAX_TICKS, len(ticks)


# --- each layer of the escaping on its own -----------------------------------------------------------

HOSTILE = "\x1b]0;PWNED\x07\x1b[2J"


def _trace_doc() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[2] / "configs/examples/mlp_trace.json").read_text())


def test_trace_names_are_escaped_where_the_message_is_made():
    """Layer 1 (``short_repr`` on names from the file): the error's own text carries no
    control character and stays short, before any printing."""
    from aoti_farm.errors import UserError
    from aoti_farm.trace import parse_trace

    doc = _trace_doc()
    field = dict(doc["entries"][0])
    field[HOSTILE + "A" * 5000] = 1
    hint = dict(doc["entries"][0])
    hint["hints"] = {HOSTILE + "ok": {"range": [0, 1]}}
    for e in (field, hint):
        with pytest.raises(UserError) as err:
            parse_trace({**doc, "entries": [e]})
        msg = str(err.value)
        assert "\x1b" not in msg and "\x07" not in msg, msg
        assert len(msg) < 400 and "\\x1b" in msg


def test_cli_errors_escape_whatever_the_message_holds(tmp_path, capsys):
    """Layer 2 (the CLI's one-line error): a message quoting input unescaped (here a
    path named by the user) reaches the terminal escaped."""
    from aoti_farm.cli import main

    assert main(["trace", "validate", str(tmp_path / (HOSTILE + ".json"))]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err, err
    assert "\\x1b]0;PWNED\\x07" in err and len(err.strip().splitlines()) == 1
