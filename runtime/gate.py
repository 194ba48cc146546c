"""The speed gate: a cached kernel is served only where it is faster than eager.

A verified kernel is correct, not necessarily fast: a single op that Inductor compiles no
better than ATen pays the runner's call on top (tiny ops), and some kernels lose outright.
So each kernel is timed against eager twice:

1. **On the compiling device**, when it is verified (``aoti_farm/compiler.py`` calls
   :func:`time_against_eager`): same inputs, interleaved rounds, a noise-aware statistic.
   The result is the manifest's ``speed`` field::

       {"kernel_us": float, "eager_us": float, "ratio": kernel/eager (median of the
        per-round ratios), "rounds": int, "threads": intra-op threads, "device": str}

2. **On the serving host**, the first time this process would run the kernel
   (:meth:`Gate.request`): a compile host and a serving host of one fingerprint can still
   differ (core count, clocks, load).  The kernel is timed the same way, in the gate's own
   background thread on fresh inputs of the signature (never on the caller's request
   path), within :data:`TRIAL_BUDGET_S` seconds; calls meanwhile run eager.  Then the
   decision is settled for the life of the process (never re-measured).

Under the policy ``serve="faster"`` (the default) a kernel is served only when the
compile-time ratio is at most :data:`GATE_RATIO` (faster by a 5% margin) *and* the on-host
trial agrees; an entry without a ``speed`` field is not served.  ``serve="always"`` serves
every verified kernel (the behaviour before the gate).  A gated-out signature is a cache
hit that runs eager: counted as ``gated``, never queued as a miss.

The statistic: each round times a batch of kernel calls and a batch of eager calls (in
alternating order), the batch sized so a round takes about ``budget / rounds``; the ratio
is the median of the per-round ratios, which one preempted batch does not move.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import statistics
import threading
import time
from typing import Callable

import torch

#: A kernel is served under ``serve="faster"`` only when kernel/eager is at most this.
GATE_RATIO = 0.95
#: Policies of :class:`Gate`.
POLICIES = ("faster", "always")
#: Seconds the compile-time measurement may take per signature (CPU; about the same on GPU).
COMPILE_BUDGET_S = 0.3
#: Seconds the serving host's confirmation may take per signature (once per process).
TRIAL_BUDGET_S = 0.1
#: Rounds of the measurement (fewer, down to one, for a call so slow that they do not fit).
ROUNDS = 7
MIN_ROUNDS = 3
#: Most calls per batch (tiny ops).
MAX_BATCH = 2000


def policy_from_env(default: str = "faster") -> str:
    """``AOTI_FARM_SERVE`` (faster | always), else ``default``."""
    v = os.environ.get("AOTI_FARM_SERVE", "").strip().lower()
    return v if v in POLICIES else default


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def time_against_eager(run_kernel: Callable[[], object], run_eager: Callable[[], object], device: str,
                       budget_s: float = COMPILE_BUDGET_S, rounds: int = ROUNDS,
                       clock: Callable[[], float] = time.perf_counter) -> dict:
    """Time ``run_kernel()`` against ``run_eager()`` (both on the same inputs): one warm-up
    call each, then ``rounds`` rounds of one batch each, alternating which goes first.
    Returns the manifest's ``speed`` dict plus ``calls`` (executions spent)."""
    sync = _sync(device)
    with torch.no_grad():
        t0 = clock()
        run_kernel()
        sync()
        t1 = clock()
        run_eager()
        sync()
        t2 = clock()
        per_call = max(t1 - t0, t2 - t1, 1e-7)
        fit = int(budget_s / (2 * per_call))
        # as many rounds as fit the budget (up to ``rounds``); a call so slow that fewer
        # than MIN_ROUNDS fit gets fewer, down to one (noise is small against such a call)
        rounds = max(1, min(rounds, fit))
        batch = max(1, min(MAX_BATCH, int(budget_s / (2 * rounds * per_call))))
        ks, es, ratios = [], [], []
        for r in range(rounds):
            times = {}
            for which in (("k", "e") if r % 2 == 0 else ("e", "k")):
                fn = run_kernel if which == "k" else run_eager
                sync()
                a = clock()
                for _ in range(batch):
                    fn()
                sync()
                times[which] = (clock() - a) / batch
            ks.append(times["k"])
            es.append(times["e"])
            ratios.append(times["k"] / times["e"] if times["e"] > 0 else math.inf)
    return {"kernel_us": statistics.median(ks) * 1e6, "eager_us": statistics.median(es) * 1e6,
            "ratio": float(statistics.median(ratios)), "rounds": rounds, "batch": batch,
            "threads": torch.get_num_threads(), "device": device, "calls": 2 + 2 * rounds * batch}


def compile_ratio(speed) -> float | None:
    """The manifest's kernel/eager ratio, or None when absent or malformed."""
    if not isinstance(speed, dict):
        return None
    r = speed.get("ratio")
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
        return None
    return float(r)


def speedup_text(speed) -> str:
    """One short column for humans: kernel time as a multiple of eager's, with both times
    ("0.37x eager (76/208 us)"); "-" for an entry without a measurement."""
    r = compile_ratio(speed)
    if r is None:
        return "-"
    try:
        return f"{r:.2f}x eager ({float(speed['kernel_us']):.0f}/{float(speed['eager_us']):.0f} us)"
    except (KeyError, TypeError, ValueError):
        return f"{r:.2f}x eager"


def speed_summary(ratios: list) -> dict:
    """Counts of a cache's measured kernels: faster than eager by the margin, not, and
    unmeasured, with the median ratio (None where nothing was measured)."""
    got = [r for r in ratios if r is not None]
    return {"faster": sum(1 for r in got if r <= GATE_RATIO), "not_faster": sum(1 for r in got if r > GATE_RATIO),
            "unmeasured": len(ratios) - len(got), "median_ratio": statistics.median(got) if got else None}


class Gate:
    """One hook's decisions: ``decision(key)`` on every call (a dict lookup), ``confirm``
    once per signature.  Thread-safe; never raises from ``confirm``."""

    def __init__(self, policy: str = "faster", ratio: float = GATE_RATIO, budget_s: float = TRIAL_BUDGET_S):
        if policy not in POLICIES:
            raise ValueError(f"serve: {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.ratio = ratio
        self.budget_s = budget_s
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
        self.trials = 0                    # kernel + eager executions spent on confirmations
        self.gated_signatures = 0          # signatures declined (served eager)
        self.served_signatures = 0         # signatures confirmed faster
        self.errors = 0                    # confirmations that failed (declined)

    @property
    def active(self) -> bool:
        return self.policy != "always"

    def decision(self, key: str) -> bool | None:
        """True: serve the kernel; False: run eager; None: not decided yet."""
        if self.policy == "always":
            return True
        return self._decided.get(key)

    def confirm(self, key: str, speed, trial: Callable[[], tuple]) -> bool | None:
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
            else:
                t = trial()
                run_kernel, run_eager, device = t[:3]
                with (t[3] if len(t) > 3 else contextlib.nullcontext()):
                    m = self.measure(run_kernel, run_eager, device, budget_s=self.budget_s)
                calls = m["calls"]
                ok = m["ratio"] <= self.ratio
                why = {"reason": "faster here" if ok else "slower here", "compile_ratio": cr,
                       "host_ratio": m["ratio"], "host_kernel_us": m["kernel_us"], "host_eager_us": m["eager_us"]}
        except Exception as e:  # noqa: BLE001 -- a trial that fails declines the kernel
            ok = False
            why = {"reason": f"confirmation failed: {type(e).__name__}: {str(e)[:200]}"}
            with self._lock:
                self.errors += 1
        with self._lock:
            self._pending.discard(key)
            self._decided[key] = ok
            self.why[key] = why
            self.trials += calls
            if ok:
                self.served_signatures += 1
            else:
                self.gated_signatures += 1
        return ok

    def request(self, key: str, speed: Callable[[], object], trial: Callable[[], tuple]) -> None:
        """Decide ``key`` in the gate's background thread (:meth:`confirm` with ``speed()``),
        unless it is decided or on its way; never blocks, never raises."""
        with self._lock:
            if self._closed or key in self._decided or key in self._pending or key in self._queued:
                return
            self._queued.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="aoti-farm-gate", daemon=True)
                self._thread.start()
        self._jobs.put((key, speed, trial))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            key, speed, trial = job
            try:
                if not self._closed:
                    try:
                        sp = speed()
                    except Exception:  # noqa: BLE001 -- an unreadable entry has no speed: declined
                        sp = None
                    self.confirm(key, sp, trial)
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

    def stats(self) -> dict:
        with self._lock:
            return {"policy": self.policy, "ratio": self.ratio, "gate_trials": self.trials,
                    "gated_signatures": self.gated_signatures, "served_signatures": self.served_signatures,
                    "gate_errors": self.errors, "deciding": len(self._pending) + len(self._queued)}
