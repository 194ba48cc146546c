"""A fresh host's ISA probe in a forked copy of the ``warm`` driver, which has torch
imported already.

``warm`` runs a fresh many-core host's ISA probe outside the driver
(:func:`aoti_farm.hostprep.isa_in_child`).  Doing it in the driver would hold the
driver's interpreter lock while ``import ray`` and ``ray.init`` need it.  An exec'd child
first imports torch again: 3.4 s from source on the 16-core GPU host, whose image ships
torch without bytecode.  In run 11 (2026-11-26) the probe gated the plan, every actor's
fingerprint and the first compile at 18.9 s, while the actors' own imports were done at
16.3-17.2 s.  A fork of the driver starts with torch already imported.

Forking is safe only while the process has no other Python thread, so :func:`start`
forks only then.  ``warm`` calls it before it starts any thread of its own.  The child
closes no shared state: it redirects its standard streams to ``/dev/null``, writes its
bytecode where an exec'd child of ``warm`` would (:mod:`aoti_farm.pycache`), runs
:func:`aoti_farm.hostprep._isa_main` (which writes the host's memo under the probe's
file lock, as the exec'd child does), sends the answer
through a pipe and leaves with ``os._exit``, so no atexit handler of the driver runs.
A child that fails or says nothing within the timeout is killed; the caller then runs
the exec'd child as before.  ``AOTI_FARM_DEV=isa_fork=0`` turns the fork off.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
import warnings

DEV = "isa_fork"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place


def enabled() -> bool:
    return _dev(DEV) != "0"


class Forked:
    """A running forked probe: :meth:`result` waits for its answer."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd, self.t0 = pid, fd, time.time()

    def result(self, timeout: float = 180.0) -> dict:
        """The child's answer (``_isa_main``'s dict plus ``seconds``), or
        ``{"status": "failed", "error"}``; never raises, never leaves the child running."""
        chunks: list = []
        end = time.monotonic() + timeout
        why = None
        try:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    why = f"no answer in {timeout:.0f} s"
                    break
                ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
                if ready:
                    b = os.read(self.fd, 65536)
                    if not b:
                        break
                    chunks.append(b)
        except OSError as e:
            why = f"{type(e).__name__}: {e}"
        finally:
            os.close(self.fd)
        if why is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = None
        try:
            out = json.loads(b"".join(chunks).decode()) if why is None else None
        except ValueError:
            out = None
        if not isinstance(out, dict):
            return {"status": "failed", "seconds": time.time() - self.t0,
                    "error": why or f"the forked probe said nothing (wait status {status})"}
        return {**out, "seconds": time.time() - self.t0}


def start(fn=None, pycache: str | None = None) -> Forked | None:
    """Fork now and run ``fn`` (default :func:`aoti_farm.hostprep._isa_main`) in the
    child; None where this process may not fork (another Python thread runs, no
    ``fork``, turned off, or the fork failed).  ``pycache``: the farm's bytecode cache
    (:func:`aoti_farm.pycache.apply`'s answer), where the child writes bytecode."""
    if (not enabled() or not hasattr(os, "fork") or threading.active_count() != 1
            or threading.current_thread() is not threading.main_thread()):
        return None
    if fn is None:
        from aoti_farm.hostprep import _isa_main as fn
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        with warnings.catch_warnings():   # 3.12 warns of native threads (torch's); the child uses none
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:   # the child: never returns
        code = 1
        try:
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            if pycache:   # what an exec'd child of warm does (aoti_farm/pycache.py)
                sys.pycache_prefix = pycache
                sys.dont_write_bytecode = False
            data = json.dumps(fn(), default=str).encode()
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return Forked(pid, r)
