"""Kernel speed against eager: the compile-time measurement the manifest's ``speed`` field
records, and what the speed gate, ``cache ls``/``stats``, the warm report and ``explain``
read from it.  The serving side of the gate (the on-host confirmation, the policy per
process) is ``aoti_farm.runtime.gate``; this module is its pure, Ray- and hook-free half.

The statistic: each round times a batch of kernel calls and a batch of eager calls (in
alternating order), the batch sized so a round takes about ``budget / rounds``; the ratio
is the median of the per-round ratios, which one preempted batch does not move.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

#: A kernel is served under ``serve="faster"`` only when kernel/eager is at most this.
GATE_RATIO = 0.95
#: ... and, on the serving host, only when it saves at least this many µs a call.  The
#: on-host trial times calls in a hot loop; inside a model a routed call also pays the
#: native path's key and lookup with cold caches: 1.5-4 µs a call on the 2-core VM
#: (routing only native_layer_norm,
#: 5 calls a tiny BERT forward, cost +20 µs), 1.3-1.8 µs on the GPU hosts (every op of a
#: launch-bound BERT routed: +10-14% of a ~1.3 ms forward over its ~100 routed calls).  The
#: trial cannot tell where in that range a call of the model will land, so it takes the
#: top: a kernel that wins less loses in some model (with 2 µs, tiny BERT's layer_norm
#: was served, its only routed op, and the model ran 1.012x eager).
MIN_SAVING_US = 4.0
#: Policies of :class:`Gate`.
POLICIES = ("faster", "always")
#: Seconds the compile-time measurement may take per signature (CPU; about the same on GPU).
COMPILE_BUDGET_S = 0.3
#: Seconds the serving host's confirmation may take per signature (once per process).
TRIAL_BUDGET_S = 0.1
#: Seconds one serving process may spend on on-host trials in the gate's background thread
#: (after ``install()``'s own, ``runtime/pretrial.py``).  The trials run beside the
#: program's own threads: a model of many small signatures (a decode loop) would otherwise
#: spend seconds of a core on them while it serves.  A signature not decided when the
#: budget is spent is declined (served eager, counted ``gated``, remembered natively), so
#: its calls stop asking.
PROCESS_TRIAL_BUDGET_S = 2.0
#: Rounds of the measurement (fewer, down to one, for a call so slow that they do not fit).
ROUNDS = 7
MIN_ROUNDS = 3
#: Most calls per batch (tiny ops).
MAX_BATCH = 2000


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
