"""Drill 8 (P5, P8): resource trouble -- a read-only cache, a full disk, a cache directory
that vanishes while a process serves from it.

The CLI must answer with one line and exit 2 (nothing half-done); a serving process must
keep returning eager results (no exception into the caller), with counters saying why.

Tests run as root in CI, and root ignores permission bits, so "read-only" is a read-only
bind mount (EROFS binds root too) and "full" is a 1 MiB tmpfs; both skip with the reason
if mounting is not permitted.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from aoti_farm.cli import main
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul
from e2e.test_drills_util import EXE, env, fill, ro_bind, small_tmpfs, snapshot


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line_exit_2(rc, err, *words):
    assert rc == 2, f"exit {rc}: {err!r}"
    assert err.count("\n") == 1 and err.startswith("aoti-farm: error: ") and "Traceback" not in err, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


@pytest.fixture()
def damaged_copy(kernels, tmp_path):
    """A copy of the session cache with one good entry and one corrupt one."""
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "src")
    bad = cache.entry_dir(kernels.fp.id, "ab" * 32)
    bad.mkdir(parents=True)
    (bad / "manifest.msgpack").write_bytes(b"\xc1 garbage")
    return cache


def test_read_only_cache_cli(damaged_copy, tmp_path, capsys):
    trace = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig_mul(), 1, 0)]), trace)
    with ro_bind(damaged_copy.root, tmp_path / "ro") as ro:
        before = snapshot(ro)
        # commands that only read still work on a read-only cache
        rc, out, err = _cli(capsys, "cache", "verify", "--cache-dir", ro)
        assert rc == 1 and "1 corrupt" in out and err == "", (rc, out, err)
        rc, out, err = _cli(capsys, "cache", "stats", "--cache-dir", ro)
        assert rc == 0, err
        # commands that write say so in one line, exit 2, before doing anything
        writers = [("cache", "verify", "--repair"), ("cache", "rm", "--all"), ("cache", "gc", "--max-size", "0"),
                   ("compile-one", "--trace", trace, "--index", "0")]
        for argv in writers:
            rc, out, err = _cli(capsys, *argv, "--cache-dir", ro)
            _one_line_exit_2(rc, err, str(ro), "read-only")
        p = subprocess.run([EXE, "warm", "--model", str(trace), "--cache-dir", str(ro), "--cpu-workers", "1"],
                           capture_output=True, text=True, env=env(), timeout=300)
        warm_rc = p.returncode
        _one_line_exit_2(p.returncode, p.stderr, str(ro))
        assert snapshot(ro) == before
    print(f"drill 8 read-only cache: writers_exit2={len(writers)} warm_exit={warm_rc} readers_ok=2 "
          f"cache_changed=0")


def test_full_disk_cli(kernels, tmp_path, capsys):
    """A cache on a full filesystem: the CLI says so in one line; nothing partial is left."""
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    with small_tmpfs(tmp_path / "full", "1m") as mnt:
        root = mnt / "cache"
        filled = fill(mnt)
        trace = tmp_path / "t.json"
        save_trace(Trace([TraceEntry(sig_mul(), 1, 0)]), trace)
        rc, out, err = _cli(capsys, "compile-one", "--trace", trace, "--index", "0", "--cache-dir", root)
        assert rc in (1, 2) and err.count("\n") == 1 and "Traceback" not in err, (rc, err)
        assert "space" in err.lower(), err
        # free a little: layout fits, a kernel does not -> a failed publish leaves nothing
        (mnt / "filler").unlink()
        from aoti_farm.cache.store import Cache

        cache = Cache(root, signing_key=None)
        cache.ensure(kernels.fp)
        fill(mnt)
        src = kernels.cache.entry_dir(kernels.fp.id, sig.key)
        from aoti_farm.errors import FarmError

        with pytest.raises(FarmError) as ei:
            cache.publish(kernels.fp, sig, {"kernel.so": src / "kernel.so"}, {})
        assert "space" in str(ei.value).lower()
        leftovers = os.listdir(cache.tmp_dir())
        assert leftovers == [] and not cache.has_entry(kernels.fp.id, sig.key)
    print(f"drill 8 full disk: compile-one exit={rc} filled_bytes={filled} publish=FarmError "
          f"tmp_leftovers={len(leftovers)} partial_entries=0")
