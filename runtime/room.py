"""The hook's compiles and the serving threads: the program's thread count is the program's.

The hook's background compile (a C++ compiler at idle priority, :func:`aoti_farm.startup.spawn.lowest_priority`)
shares the cores with serving.  An earlier version lowered each serving thread's intra-op
thread count while a compile ran ("yield_core").  That changed the program's own state:
a program that called ``torch.set_num_threads(2)`` was left at 1 when the thread never
called a served op again, it changed both the program's speed and, for reductions and
matmuls, its rounding, and a lowered count cannot be told from one the program chose (a
count equal to torch's default may have been set by the program).  So the hook never
calls ``torch.set_num_threads``: :class:`ThreadRoom` keeps its interface (the supervisor
reports running compiles, the native path is told the limit) but its limit is always 0,
which the native side (``fastpath.cpp``) reads as "leave every thread alone".
The ``yield_core`` setting is retired (refused by name: ``config.RETIRED_SETTINGS``).
The compile's cost to serving is bounded by its priority instead.
"""

from __future__ import annotations

import os
import threading

from aoti_farm.metrics.counters import Counters


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadRoom:
    """Running compiles of one hook, reported for ``stats()``; never changes a thread count.
    ``set_compiles(n)`` from the supervisor; ``follow()`` from each Python kernel call;
    ``attach_native(mod)`` at the switch to the native path (its limit set to 0: off)."""

    def __init__(self):
        self.enabled = False
        self.cores = usable_cores()
        self.limit = 0          # 0: no limit, always
        self.compiles = 0
        self.counters = Counters("lowered", "restored", "errors")   # stay 0: kept for the stats' shape
        self._lock = threading.Lock()
        self._native = None

    def set_compiles(self, n: int) -> None:
        """``n`` compiles of this hook are running now (reported, nothing else)."""
        self.compiles = n

    def attach_native(self, mod) -> None:
        """The native kernels serve from now on: their thread limit is off."""
        with self._lock:
            try:
                mod.set_thread_limit(0)
            except Exception:  # noqa: BLE001 -- an extension without the limit lowers nothing
                pass
            self._native = mod

    def close(self) -> None:
        self.set_compiles(0)

    def stats(self) -> dict:
        return {"enabled": False, "limit": 0, **self.counters.snapshot(), "threads_lowered_now": 0,
                "note": "the hook never changes the program's thread count"}

    def follow(self) -> None:
        """Called on every Python kernel call; nothing to do."""
