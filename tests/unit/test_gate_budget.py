"""The gate's background trials share one per-process budget (runtime/gate.py): once it is
spent, an undecided signature is declined without a trial, so a model of many small
signatures neither spends a core on trials while it serves nor keeps asking the hook."""

from __future__ import annotations

import time

from aoti_farm.runtime.gate import Gate


def _measure(run_kernel, run_eager, device, **kw):
    time.sleep(0.05)   # a trial that takes 50 ms
    return {"ratio": 0.5, "kernel_us": 10.0, "eager_us": 100.0, "calls": 10}


def test_background_trials_stop_at_the_process_budget():
    g = Gate("faster", process_budget_s=0.12)
    g.measure = _measure
    trial = lambda: (lambda: None, lambda: None, "cpu")  # noqa: E731
    for i in range(8):
        g.request(f"k{i}", lambda: {"ratio": 0.5}, trial)
    assert g.wait(30)
    decided = [g.decision(f"k{i}") for i in range(8)]
    timed = [k for k, w in g.why.items() if w["reason"] == "faster here"]
    spent = [k for k, w in g.why.items() if w["reason"] == "trial budget spent"]
    assert 1 <= len(timed) <= 4 and len(timed) + len(spent) == 8, g.why
    assert decided.count(True) == len(timed) and decided.count(False) == len(spent)
    st = g.stats()
    assert st["trial_budget_s"] == 0.12 and st["trial_seconds"] >= 0.12 and st["gate_trials"] == 10 * len(timed)
    # install()'s own trials (confirm in the caller's thread) are not bounded by it
    assert g.confirm("install", {"ratio": 0.5}, trial) is True
    g.close()
