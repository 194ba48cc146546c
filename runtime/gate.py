"""The speed gate: a cached kernel is served only where it is faster than eager.

A verified kernel is correct, not necessarily fast: a single op that Inductor compiles no
better than ATen pays the runner's call on top (tiny ops), and some kernels lose outright.
So each kernel is timed against eager twice:

1. **On the compiling device**, when it is verified (``aoti_farm/compile/verify.py`` calls
   :func:`time_against_eager`): same inputs, interleaved rounds, a noise-aware statistic.
   The result is the manifest's ``speed`` field::

       {"kernel_us": float, "eager_us": float, "ratio": kernel/eager (median of the
        per-round ratios), "rounds": int, "threads": intra-op threads, "device": str}

2. **On the serving host**, the first time this process would run the kernel
   (:meth:`Gate.request`): a compile host and a serving host of one fingerprint can still
   differ (core count, clocks, load).  The kernel is timed the same way, in the gate's own
   background thread on fresh inputs of the signature (never on the caller's request
   path), within :data:`TRIAL_BUDGET_S` seconds; calls meanwhile run eager.  Then the
   decision is settled for the life of the process (never re-measured).  The background
   trials of one process share :data:`PROCESS_TRIAL_BUDGET_S` seconds; once spent, a
   signature still undecided is declined without a trial (reason "trial budget spent"),
   so a model of many small signatures neither spends a core on trials while it serves
   nor keeps asking the hook about calls that run eager.

   Each measured decision is kept in this host's private memo (``aoti_farm/speedgate/hostgate.py``:
   per fingerprint, cache and key, with the on-host ratio and the thread count): a later
   process at the same thread count takes it at install (:meth:`Gate.preload`), before
   routing, with no trial.  The memo is written from the gate's thread and at install,
   never on a call's path.

Under the policy ``serve="faster"`` (the default) a kernel is served only when the
compile-time ratio is at most :data:`GATE_RATIO` (faster by a 5% margin) *and* the on-host
trial agrees: the same margin, and a saving of at least :data:`MIN_SAVING_US` a call (what
a routed call costs inside a model beyond the trial's hot loop); an entry without a
``speed`` field is not served.  ``serve="always"`` serves
every verified kernel (the behaviour before the gate).  A gated-out signature is a cache
hit that runs eager: counted as ``gated``, never queued as a miss.

The statistic: each round times a batch of kernel calls and a batch of eager calls (in
alternating order), the batch sized so a round takes about ``budget / rounds``; the ratio
is the median of the per-round ratios, which one preempted batch does not move.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Callable

import torch

from aoti_farm.speedgate import hostgate
from aoti_farm.metrics.counters import Counters

from aoti_farm.speedgate.speed import (  # noqa: F401 -- the gate's constants and statistic live in the core
    COMPILE_BUDGET_S, GATE_RATIO, MAX_BATCH, MIN_ROUNDS, MIN_SAVING_US, POLICIES, PROCESS_TRIAL_BUDGET_S, ROUNDS, TRIAL_BUDGET_S, _sync, compile_ratio,
    min_saving_us, speed_summary, speedup_text, time_against_eager, wins_here)


class Gate:
    """One hook's decisions: ``decision(key)`` on every call (a dict lookup), ``confirm``
    once per signature.  Thread-safe; never raises from ``confirm``."""

    def __init__(self, policy: str = "faster", ratio: float = GATE_RATIO, budget_s: float = TRIAL_BUDGET_S,
                 process_budget_s: float = PROCESS_TRIAL_BUDGET_S):
        if policy not in POLICIES:
            raise ValueError(f"serve: {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.ratio = ratio
        self.budget_s = budget_s
        self.process_budget_s = process_budget_s   # the background trials' seconds in this process
        self.spent_s = 0.0
        self.min_saving_us = min_saving_us()   # the least win a call that pays the routing must have
        self.measure = time_against_eager   # (run_kernel, run_eager, device, budget_s=) -> speed dict
        self._lock = threading.Lock()
        self._decided: dict[str, bool] = {}
        self._pending: set[str] = set()
        self._queued: set[str] = set()
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._idle = threading.Condition(self._lock)
        self.why: dict[str, dict] = {}     # key -> how it was decided (ratios, reason)
        self.memo_root = None               # the cache whose decisions are kept (hostgate); None: none kept
        self._fresh: dict[str, dict] = {}   # fp id -> {key: memo record} measured, not yet written
        # gate_trials: kernel + eager executions spent on confirmations; gated_signatures:
        # declined (served eager); served_signatures: confirmed faster; gate_errors:
        # confirmations that failed (declined)
        # remembered: decisions taken from this host's memo (no trial)
        self.counters = Counters("gate_trials", "gated_signatures", "served_signatures", "gate_errors",
                                 "remembered")

    @property
    def active(self) -> bool:
        return self.policy != "always"

    def decision(self, key: str) -> bool | None:
        """True: serve the kernel; False: run eager; None: not decided yet."""
        if self.policy == "always":
            return True
        return self._decided.get(key)

    def preload(self, fp_id: str, root, threads: int) -> int:
        """Take this host's kept decisions for ``fp_id`` and the cache at ``root``, measured
        at ``threads`` intra-op threads (``aoti_farm/speedgate/hostgate.py``); later decisions of
        this gate are kept there too.  Returns how many were taken.  Never raises."""
        if self.policy == "always":
            return 0
        self.memo_root = root
        got = hostgate.load(fp_id, root, threads)
        n = 0
        with self._lock:
            for key, rec in got.items():
                if key in self._decided or key in self._pending:
                    continue
                ok = hostgate.kept_ok(rec, self.ratio, self.min_saving_us)
                self._decided[key] = ok
                self.why[key] = {"reason": self._reason(ok, rec["host_ratio"]) + " (remembered)",
                                 "host_ratio": rec["host_ratio"], "threads": rec["threads"], "decided_at": rec["at"]}
                n += 1
        self.counters.inc("remembered", n=n)
        return n

    def _reason(self, ok: bool, host_ratio: float) -> str:
        """Why an on-host verdict went as it did (a fresh trial's or a kept one's)."""
        return ("faster here" if ok else "slower here" if host_ratio > self.ratio
                else "faster here by less than a routed call costs")

    def persist(self) -> None:
        """Write the decisions measured since the last call to this host's memo (the gate's
        thread, install(), close()).  Never raises."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
        for fp_id, recs in fresh.items():
            hostgate.save(fp_id, self.memo_root, recs)

    def confirm(self, key: str, speed, trial: Callable[[], tuple], background: bool = False,
                fp_id: str | None = None) -> bool | None:
        """Decide ``key`` in this thread: declined at once when the manifest's ratio is
        missing or above :data:`GATE_RATIO`; otherwise ``trial()`` returns ``(run_kernel,
        run_eager, device[, context])`` and the two are timed here (within ``context``, if
        given).  None when another thread is deciding it."""
        if self.policy == "always":
            return True
        with self._lock:
            if key in self._decided:
                return self._decided[key]
            if key in self._pending:
                return None
            self._pending.add(key)
        calls, ok = 0, False
        try:
            cr = compile_ratio(speed)
            if cr is None:
                why = {"reason": "no compile-time speed in the manifest"}
            elif cr > self.ratio:
                why = {"reason": "slower on the compile host", "compile_ratio": cr}
            elif background and self.spent_s >= self.process_budget_s:
                why = {"reason": "trial budget spent", "compile_ratio": cr,
                       "process_budget_s": self.process_budget_s}
            else:
                t = trial()
                run_kernel, run_eager, device = t[:3]
                with (t[3] if len(t) > 3 else contextlib.nullcontext()):
                    m = self.measure(run_kernel, run_eager, device, budget_s=self.budget_s)
                calls = m["calls"]
                ok = wins_here(m["ratio"], m["kernel_us"], m["eager_us"], self.ratio, self.min_saving_us)
                why = {"reason": self._reason(ok, m["ratio"]), "compile_ratio": cr, "host_ratio": m["ratio"],
                       "host_kernel_us": m["kernel_us"], "host_eager_us": m["eager_us"]}
                # kept for later processes, unless measured on an overloaded host (more runnable
                # threads than cores: both sides' times are mostly waiting, and a decision
                # kept for days should not rest on them)
                rec = None if hostgate.overloaded() else hostgate.record(ok, {"threads": torch.get_num_threads(), **m})
                if rec is not None and fp_id is not None and self.memo_root is not None:
                    with self._lock:
                        self._fresh.setdefault(fp_id, {})[key] = rec
        except Exception as e:  # noqa: BLE001 -- a trial that fails declines the kernel
            ok = False
            why = {"reason": f"confirmation failed: {type(e).__name__}: {str(e)[:200]}"}
            self.counters.inc("gate_errors")
        with self._lock:
            self._pending.discard(key)
            self._decided[key] = ok
            self.why[key] = why
        self.counters.inc("gate_trials", n=calls)
        self.counters.inc("served_signatures" if ok else "gated_signatures")
        return ok

    def request(self, key: str, speed: Callable[[], object], trial: Callable[[], tuple],
                fp_id: str | None = None) -> None:
        """Decide ``key`` in the gate's background thread (:meth:`confirm` with ``speed()``),
        unless it is decided or on its way; never blocks, never raises."""
        with self._lock:
            if self._closed or key in self._decided or key in self._pending or key in self._queued:
                return
            self._queued.add(key)
            self._jobs.put((key, speed, trial, fp_id))   # under the lock: _run's exit check sees it
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aoti-farm-gate", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        """The trials' thread.  It exits as soon as its queue is empty (the next request
        starts another): a thread that ran a parallel torch op keeps an OpenMP team of its
        own while it lives, and while it does, libgomp counts more threads than cores and
        makes every barrier of the program's own team sleep instead of spin.  That changes
        the speed of every eager call in the process (on a loaded host, ten times faster or
        slower), which a hook that serves nothing must not do."""
        while True:
            with self._lock:
                if self._jobs.empty():
                    self._thread = None
                    return
                job = self._jobs.get_nowait()
            if job is None:
                with self._lock:
                    self._thread = None
                return
            key, speed, trial, fp_id = job
            try:
                if not self._closed:
                    t0 = time.monotonic()
                    try:
                        sp = speed()
                    except Exception:  # noqa: BLE001 -- an unreadable entry has no speed: declined
                        sp = None
                    self.confirm(key, sp, trial, background=True, fp_id=fp_id)
                    self.spent_s += time.monotonic() - t0
                    if self._jobs.empty():
                        self.persist()
            finally:
                with self._lock:
                    self._queued.discard(key)
                    self._idle.notify_all()

    def wait(self, timeout: float = 60.0) -> bool:
        """Wait until every requested decision is made (tests, benchmarks); True if so."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._queued or self._pending:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            t = self._thread
        if t is not None:
            self._jobs.put(None)
            t.join(timeout=5)
        self.persist()

    def stats(self) -> dict:
        with self._lock:
            deciding = len(self._pending) + len(self._queued)
        return {"policy": self.policy, "ratio": self.ratio, **self.counters.snapshot(), "deciding": deciding,
                "trial_seconds": round(self.spent_s, 3), "trial_budget_s": self.process_budget_s}
