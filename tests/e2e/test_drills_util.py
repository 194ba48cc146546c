"""Helpers shared by the drills (tests/test_drills_*.py): mounts, snapshots, processes. No tests here."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
EXE = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its type and content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
            except OSError as e:
                out[os.path.relpath(p, root)] = f"unreadable {e.errno}"
    return out


def _mount(*args) -> tuple[bool, str]:
    p = subprocess.run(["mount", *args], capture_output=True, text=True)
    return p.returncode == 0, (p.stderr or p.stdout).strip()


@contextlib.contextmanager
def ro_bind(src: Path, dst: Path):
    """``dst``: a read-only view of ``src`` (root ignores permission bits, not EROFS).
    Yields None if mounting is not permitted here (the caller skips with the reason)."""
    import pytest

    dst.mkdir(parents=True, exist_ok=True)
    ok, why = _mount("--bind", str(src), str(dst))
    if not ok:
        pytest.skip(f"read-only bind mount not permitted here: {why}")
    try:
        ok, why = _mount("-o", "remount,bind,ro", str(dst))
        if not ok:
            pytest.skip(f"remounting read-only not permitted here: {why}")
        yield dst
    finally:
        subprocess.run(["umount", "-l", str(dst)], capture_output=True)


@contextlib.contextmanager
def small_tmpfs(dst: Path, size: str = "1m"):
    import pytest

    dst.mkdir(parents=True, exist_ok=True)
    ok, why = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(dst))
    if not ok:
        pytest.skip(f"tmpfs mount not permitted here: {why}")
    try:
        yield dst
    finally:
        subprocess.run(["umount", "-l", str(dst)], capture_output=True)


def fill(d: Path) -> int:
    """Fill the filesystem of ``d``; returns bytes written."""
    n = 0
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                n += f.write(b"\0" * 4096)
        except OSError:
            pass
    return n


def env(**kw) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    e.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    e["PYTHONPATH"] = str(REPO / "tests") + os.pathsep + e.get("PYTHONPATH", "")
    e.update({k: str(v) for k, v in kw.items()})
    return e


def wait_for(pred, timeout: float, step: float = 0.1):
    """Poll ``pred`` until it returns truthy or ``timeout`` passes; returns its last value.
    (A liveness bound, not a timed assertion: the callers assert on what happened.)"""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)


def kill_tree(pid: int, sig=signal.SIGKILL) -> None:
    """Kill ``pid`` and every descendant (found through /proc), children first."""
    kids = descendants(pid)
    for p in reversed(kids):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
