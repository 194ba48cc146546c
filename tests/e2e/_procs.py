"""Process checks shared by the tests that start processes of their own."""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """Running (an exited process left unreaped by this sandbox's init is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    """True once ``pid`` is not running, False if it still runs after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def wait_all_gone(pids, timeout: float) -> list[int]:
    """The pids of ``pids`` still running after ``timeout`` s (polled; [] as soon as all are gone)."""
    end = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() >= end:
            return left
        time.sleep(0.2)


def workers_of(marker: str) -> list[int]:
    """The running compile workers (``aoti_farm.runtime.compile_worker``) whose command line
    has ``marker`` as one of its arguments (a cache directory, ``--parent-pid``'s value)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if b"aoti_farm.runtime.compile_worker" in cmd and marker.encode() in cmd and alive(int(d)):
                out.append(int(d))
    return out


def group(pgid: int) -> list[int]:
    """The running processes of process group ``pgid`` (a worker and its compiler children)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(d))
    return out


def warm_on_a_bad_trace(tmp_path, monkeypatch, at_load) -> None:
    """Run ``warm`` on a trace that fails to load, ``at_load()`` called as it starts
    reading the traces (what ``warm`` started before them is running then); the command
    must end with its one-line error naming the trace.  Checks on what it stopped are the
    caller's."""
    import pytest

    from aoti_farm.config import FarmConfig
    from aoti_farm.errors import UserError
    from aoti_farm.workers import warm

    real_load = warm.load_signatures

    def load(paths):
        at_load()
        return real_load(paths)

    monkeypatch.setattr(warm, "load_signatures", load)
    bad = tmp_path / "trace.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="trace.json"):
        warm.warm(FarmConfig(cache_dir=str(tmp_path / "cache")), [str(bad)])
