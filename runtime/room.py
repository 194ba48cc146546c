"""Making room for the compiler: fewer intra-op threads in serving while the hook compiles.

torch runs each CPU op on one intra-op thread per core.  When the hook's background
compile (a C++ compiler at idle priority) holds one core, every OpenMP region of a serving
request waits for the thread that shares its core with the compiler: on the 2-core VM of
this project that took eager's p99 from 1.26 ms to 5.9 ms (``scripts/bench/contention.py``),
whatever the compiler's priority.  With one thread fewer, serving never waits on that core.

So while a compile of this hook runs (its worker's warm-up or a compile, or the native
path's build), the hook sets a **thread limit**: usable cores minus running compiles, at
least 1.  Every thread that calls a served op lowers its own intra-op thread count to the
limit on its next call (OpenMP's count is per thread, so only the thread itself can), and
puts back what it had once the limit is lifted, unless the program changed it meanwhile.
Threads that start meanwhile take torch's usual count (only the calling thread is lowered).
A thread already at or below the limit is left alone, so ``torch.set_num_threads(cores - 1)``
in the program makes this a no-op.

Results are eager's at the lowered thread count.  Elementwise ops are bit-identical;
reductions and matmuls may round differently in the last bits, as they do between hosts
with different core counts.  ``install(..., yield_core=False)`` turns it off (``ThreadRoom``
takes the resolved value: ``AOTI_FARM_YIELD_CORE=0`` is read by ``runtime/settings.py``, and
only where the caller left ``yield_core`` unset).

The native hit path keeps its own record of lowered threads (``fastpath.cpp``); the Python
kernels use this module's, and hand it over when the hook switches to native.  A thread
that never calls a served op again after the limit is lifted keeps the lowered count;
:meth:`ThreadRoom.close` restores the thread that uninstalls the hook.
"""

from __future__ import annotations

import os
import threading

import torch

from aoti_farm.counters import Counters


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def lowest_priority() -> None:
    """In a compile's child process, before exec: run only on CPU time that serving leaves
    idle (SCHED_IDLE, inherited by the C++ compiler it starts); nice 19 where that is not
    allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)
    except OSError:
        pass


class ThreadRoom:
    """The thread limit of one hook.  ``set_compiles(n)`` from the hook's watcher thread;
    ``follow()`` from each Python kernel call; ``attach_native(mod)`` at the switch."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.cores = usable_cores()
        self.limit = 0          # 0: no limit
        self.gen = 1
        self.counters = Counters("lowered", "restored", "errors")   # threads lowered/restored by the Python kernels
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._saved: dict[int, tuple[int, int]] = {}   # native thread id -> (its count, the count set)
        self._native = None
        self._native_base: dict = {}   # the native side's (process-wide) counters at attach

    # -- the hook's side ----------------------------------------------------------------------
    def set_compiles(self, n: int) -> None:
        """``n`` compiles of this hook are running now."""
        limit = max(1, self.cores - n) if (n > 0 and self.enabled and self.cores > 1) else 0
        with self._lock:
            if limit == self.limit:
                return
            self.limit = limit
            self.gen += 1
            if self._native is not None:
                self._native.set_thread_limit(limit)

    def attach_native(self, mod) -> None:
        """The native kernels serve from now on: they take over this room's lowered threads."""
        with self._lock:
            saved, self._saved = dict(self._saved), {}
            mod.adopt_lowered(saved)
            mod.set_thread_limit(self.limit)
            st = mod.thread_limit_state()
            self._native_base = {k: st[k] for k in ("lowered", "restored", "errors")}
            self._native = mod

    def close(self) -> None:
        """The hook goes away: lift the limit and restore the calling thread."""
        self.set_compiles(0)
        try:
            if self._native is not None:
                self._native.follow_thread_limit()
            else:
                self.follow()
        except Exception:  # noqa: BLE001 -- never raise from uninstall
            self.counters.inc("errors")

    def stats(self) -> dict:
        d = {"enabled": self.enabled, "limit": self.limit, **self.counters.snapshot(),
             "threads_lowered_now": len(self._saved)}
        if self._native is not None:
            n = self._native.thread_limit_state()
            for k in ("lowered", "restored", "errors"):
                d[k] += n[k] - self._native_base.get(k, 0)
            d["threads_lowered_now"] += len(n["saved"])
        return d

    # -- the Python kernels' side ----------------------------------------------------------------
    def follow(self) -> None:
        if getattr(self._tls, "gen", 0) != self.gen:
            self._adjust()

    def _adjust(self) -> None:
        with self._lock:
            gen, limit = self.gen, self.limit
            tid = threading.get_native_id()
            have = self._saved.get(tid)
            try:
                if limit <= 0:
                    if have is not None:
                        if torch.get_num_threads() == have[1]:
                            torch.set_num_threads(have[0])
                        del self._saved[tid]
                        self.counters.inc("restored")
                elif have is None:
                    cur = torch.get_num_threads()
                    if cur > limit:
                        torch.set_num_threads(limit)
                        # that also set the count threads starting from now take: put it
                        # back from a helper thread, so only this thread is lowered
                        t = threading.Thread(target=torch.set_num_threads, args=(cur,), daemon=True)
                        t.start()
                        t.join()
                        self._saved[tid] = (cur, limit)
                        self.counters.inc("lowered")
            except Exception:  # noqa: BLE001 -- a serving call never fails for this
                self.counters.inc("errors")
            self._tls.gen = gen
