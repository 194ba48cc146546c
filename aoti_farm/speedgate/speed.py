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
#: on-host trial times calls in a hot loop, where a tiny kernel's win of a few hundred
#: nanoseconds shows; inside a model those calls run with cold caches beside other work and
#: the win is gone or turned into a loss, so a model that calls many tiny ops (a decode
#: loop) runs slower with them served.  The floor keeps those on eager and serves the
#: kernels whose win survives the model.  Its A/B (``AOTI_FARM_DEV=min_saving_us=0``,
#: docs/benchmarks.md "The speed gate's floor"): without it GPT-2 generate serves a
#: hundred times more calls and runs about 3% slower, a tiny BERT about 2%.
MIN_SAVING_US = 4.0


def min_saving_us() -> float:
    """The floor in force: :data:`MIN_SAVING_US`, or the developer switch ``min_saving_us``
    (``AOTI_FARM_DEV``) for an A/B of it."""
    from aoti_farm.config import dev

    raw = dev("min_saving_us")
    try:
        return float(raw) if raw else MIN_SAVING_US
    except ValueError:
        return MIN_SAVING_US


def wins_here(host_ratio: float, kernel_us: float, eager_us: float, ratio: float = GATE_RATIO,
              floor_us: float | None = None) -> bool:
    """The gate's rule for a kernel timed on the serving host: at most ``ratio`` of eager and
    a saving of at least ``floor_us`` (default :func:`min_saving_us`) a call.  The one rule
    for a fresh trial (``runtime/gate.py``) and a kept one (``hostgate.kept_ok``)."""
    floor = min_saving_us() if floor_us is None else floor_us
    return host_ratio <= ratio and eager_us - kernel_us >= floor


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


def through_dispatcher(fp, mod, kid: int, op, args, kwargs) -> tuple:
    """(run_kernel, run_eager): ``op`` called through the dispatcher, with this thread's
    calls forced to kernel ``kid`` of the native registration ``fp`` (boxing, the runner,
    its output tensors: a served call but for its key and lookup), or let through to eager
    (``mod.set_inside``: the same boxed entry, then eager's kernel).  Both sides make the
    same two extension calls around the op.  The hook's on-host trial
    (``runtime/trial.py``) and the compile-time measurement (:func:`time_served_call`) time
    these two, so that ``warm``'s figures, the gate and ``explain`` measure one thing."""

    def run_kernel():
        fp.force(kid)
        try:
            op(*args, **kwargs)
        finally:
            fp.force(-1)

    def run_eager():
        prev = mod.set_inside(True)
        try:
            op(*args, **kwargs)
        finally:
            mod.set_inside(prev)

    return run_kernel, run_eager


#: The dispatch key a native registration of each device's kernels takes.
_DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def time_served_call(sig, kernel_path: str, guards=(), seed: int = 1000, **kw) -> dict | None:
    """The compile-time half of the speed gate, timed as the hook serves: the kernel loaded
    into a native registration of ``sig``'s op (the hit path's extension,
    :mod:`aoti_farm.speedgate.hitpath`), called through the dispatcher from Python against eager
    called the same way (:func:`through_dispatcher`), on ``sig``'s inputs at ``seed``.
    ``kw``: :func:`time_against_eager`'s.  Returns its dict with ``via: "hit path"``, or
    None where the extension cannot be built or loaded here (the caller times the runner
    instead, ``via: "runner"``); one not built yet is built first.  The registration lasts
    only the measurement; a call of the op from another thread meanwhile runs eager."""
    from aoti_farm.speedgate import hitpath
    from aoti_farm import signature as S

    if sig.device not in _DISPATCH_KEYS:
        return None
    mod = hitpath.load()
    if mod is None and not hitpath.disabled() and not hitpath.library_path().exists():
        # built once per host and torch (about 30 s; processes starting together build it
        # once), as the first hooked program there would build it
        try:
            hitpath.build()
        except Exception:  # noqa: BLE001 -- no build here: the runner is timed instead
            return None
        mod = hitpath.load()
    if mod is None:
        return None
    op = S.resolve_op(sig.op)
    args, kwargs = S.materialize(sig, seed=seed)
    fp = mod.FastPath(lambda slot, vals: mod.EAGER_ONCE, lambda kid, message: None)
    try:
        # (the dispatcher's "Overriding a previously registered kernel" is a c10 warning,
        # which no Python filter sees: FastPath.add_op drops it)
        fp.add_op(op._schema.name, op._schema.overload_name, _DISPATCH_KEYS[sig.device], hitpath.typed_entry())
        kid = fp.load(kernel_path, sig.device, [tuple(int(x) for x in g) for g in guards or ()])
        run_kernel, run_eager = through_dispatcher(fp, mod, kid, op, args, kwargs)
        m = time_against_eager(run_kernel, run_eager, "cuda" if sig.device == "cuda" else "cpu", **kw)
    finally:
        fp.destroy()
    m.pop("calls", None)
    m["via"] = "hit path"
    return m


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
