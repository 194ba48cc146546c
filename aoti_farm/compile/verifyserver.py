"""One long-lived verification child per process, for hosts with the libstdc++ trap.

Where a compile worker cannot load AOTI libraries itself (:func:`aoti_farm.startup.loadenv.load_safe`
is False: the host needs the libstdc++ preload and this process started without it, as
the Ray actors of a fresh host do), every kernel is verified in a child that has the
preload.  A child per kernel imports torch per kernel: 4.5 s median per signature with
16 actors on a 16-core H100 host,
as long as the compile itself.  So the child lives on: ``python -m aoti_farm.compile.child
--serve`` imports torch once, then verifies one kernel per request line (the same
``AOTICompiler._verify_here`` as before: trials against eager, the speed gate) and answers
one line.

Nothing is weaker than with a child per kernel:

* the kernel is still loaded only in the child, never in the worker;
* a kernel that crashes its loader kills the child: that kernel is refused (``kernel
  crashed its loader``), and the next request starts a fresh child;
* any other error in the child is an infrastructure failure (the farm retries), and the
  child exits, so no state of a failed verification is reused;
* the child dies with its parent (its stdin closes).

:func:`prestart` starts the child without waiting, so that its imports overlap the
compile whose kernel it will verify (``AOTICompiler.compile`` calls it).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time

from aoti_farm.startup import spawn
from aoti_farm.metrics.counters import Counters

#: Marks the answer line (anything else the child writes to stdout is skipped).
REPLY = "aoti-farm-verify: "

#: The child: the compiler's verification entry point (aoti_farm/compile/child.py), serving (no import of it here).
CHILD = spawn.python("-m", "aoti_farm.compile.child", "--serve")

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_err = None
_buf = b""
_counters = Counters("started", "requests", "crashed", "replaced_without_preload")


def stats() -> dict:
    """``started`` children, ``requests`` answered or failed, ``crashed`` (killed by a signal),
    ``replaced_without_preload`` (a running child lacked a preload the host now wants)."""
    return _counters.snapshot()


def _alive() -> bool:
    return _proc is not None and _proc.poll() is None


#: The environment's LD_PRELOAD the running child was started with.
_child_preload: str = ""


def _start_locked(preload: str | None = None) -> None:
    """Start the child if none runs, or replace one started without a preload that this
    host now wants (a child started before the loader memo existed would load kernels
    without the libstdc++ it needs).  ``preload``: a library to preload in a child
    started now even though the host's memo does not (yet) ask for it."""
    global _proc, _err, _buf, _child_preload
    from aoti_farm.startup import loadenv

    env = loadenv.child_env()
    if preload and not _alive():
        parts = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        env["LD_PRELOAD"] = ":".join([preload] + [p for p in parts if p != preload])
    if _alive():
        want = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        have = _child_preload.split(":")
        if all(p in have for p in want):
            return
        _drop_locked()
        _counters.inc("replaced_without_preload")
    _err = tempfile.TemporaryFile()
    _buf = b""
    _proc = subprocess.Popen(CHILD, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=_err, env=env)
    _child_preload = env.get("LD_PRELOAD", "")
    _counters.inc("started")


def prestart(preload: str | None = None) -> None:
    """Start the child now if none runs (returns at once).  ``preload``: start it with
    that library preloaded although the loader memo does not ask for it yet (an actor
    on a fresh host, :meth:`aoti_farm.workers.compile_actor.CompileActor.warmup`): the
    child is used only if the memo then wants that preload; otherwise it is replaced
    (a different preload wanted) or never asked (kernels load in-process) and stopped."""
    with _lock:
        _start_locked(preload)


def child_preload() -> str | None:
    """The LD_PRELOAD the running child was started with ('' for none), None if no child runs."""
    with _lock:
        return _child_preload if _alive() else None


def stop() -> None:
    """End the child if one runs (a child started ahead of need that turned out not to
    be needed: :meth:`aoti_farm.workers.compile_actor.CompileActor.warmup`)."""
    with _lock:
        _drop_locked()


def _stderr_tail() -> str:
    try:
        _err.seek(0)
        return _err.read()[-8000:].decode("utf-8", "replace")   # a C++ abort's what() precedes its stack
    except (OSError, AttributeError):
        return ""


def _drop_locked() -> int | None:
    global _proc
    p, _proc = _proc, None
    if p is None:
        return None
    try:
        p.stdin.close()
    except OSError:
        pass
    try:
        return p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


def request(req: dict, timeout: float = 600.0) -> tuple[dict | None, int | None, str]:
    """Send one request; ``(answer, None, "")``, or ``(None, returncode, stderr tail)``
    when the child died with the request (a negative code: killed by that signal).  Raises
    ``subprocess.TimeoutExpired`` (the child is killed) after ``timeout`` seconds, and
    RuntimeError when the child was gone before the request reached it."""
    global _buf
    with _lock:
        _start_locked()
        _counters.inc("requests")
        p = _proc
        try:
            p.stdin.write((json.dumps(req) + "\n").encode())
            p.stdin.flush()
        except OSError as e:   # it died before this kernel reached it: the host's failure, not the kernel's
            rc = _drop_locked()
            raise RuntimeError(f"verification child gone before the request (exit {rc}): {e}") from None
        deadline = time.monotonic() + timeout
        fd = p.stdout.fileno()
        while True:
            while b"\n" in _buf:
                line, _buf = _buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith(REPLY):
                    ans = json.loads(text[len(REPLY):])
                    if "error" in ans:   # the child exits after an error: nothing of it is reused
                        _drop_locked()
                    return ans, None, ""
            left = deadline - time.monotonic()
            if left <= 0:
                p.kill()
                _drop_locked()
                raise subprocess.TimeoutExpired(CHILD, timeout)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:   # EOF: the child died (a crashing kernel, or worse)
                rc = _drop_locked()
                if rc is not None and rc < 0:
                    _counters.inc("crashed")
                return None, rc, _stderr_tail()
            _buf += chunk


def serve(handle) -> int:
    """The child's loop: one JSON request per stdin line, ``handle(request)`` -> one
    ``REPLY`` line.  After an exception it answers ``{"error"}`` and returns 1 (exits)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # stray prints (torch, Inductor) go to stderr, never into the answers
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            res = handle(json.loads(line))
        except Exception as e:  # noqa: BLE001 -- told to the parent, then this child ends
            out.write(REPLY + json.dumps({"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}) + "\n")
            out.flush()
            return 1
        res["server_pid"] = os.getpid()
        out.write(REPLY + json.dumps(res, default=str) + "\n")
        out.flush()
    return 0

