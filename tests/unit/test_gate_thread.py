"""The gate's trial thread does not outlive its trials (runtime/gate.py, ``Gate._run``).

A thread that ran a parallel torch op owns an OpenMP team for as long as it lives.  While
it does, libgomp counts more threads than cores and switches the program's own team from
spinning to sleeping at every barrier: every eager call of the process changes speed
(on a loaded 2-core host GPT-2 generation ran ten times faster or slower for it), though
the hook served nothing.  So once its queue is empty the gate's thread exits, and the
process's threads are the program's again."""

from __future__ import annotations

import os
import threading
import time

import torch

from aoti_farm.runtime.gate import Gate


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _gate_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "aoti-farm-gate"]


def _settle(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_trial_thread_leaves_no_openmp_team_behind():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1 << 21)
        (x + x).sum()   # the program's own team, started before the baseline
        before = _os_threads()
        ran_in = []

        def trial():
            def run():   # large enough for a parallel region: an OpenMP team in the gate's thread
                ran_in.append(threading.current_thread().name)
                return x + x
            return run, run, "cpu"

        g = Gate("faster")
        g.measure = lambda k, e, device, **kw: (k(), e(), {"ratio": 0.5, "kernel_us": 10.0, "eager_us": 100.0,
                                                            "calls": 2})[-1]
        for i in range(3):
            g.request(f"k{i}", lambda: {"ratio": 0.5}, trial)
        assert g.wait(30)
        assert [g.decision(f"k{i}") for i in range(3)] == [True] * 3
        assert set(ran_in) == {"aoti-farm-gate"}
        assert _settle(lambda: not _gate_threads()), "the gate's thread outlived its trials"
        assert _settle(lambda: _os_threads() <= before), (_os_threads(), before)
        # a later request starts the thread again, and it goes again
        g.request("k9", lambda: {"ratio": 0.5}, trial)
        assert g.wait(30) and g.decision("k9") is True
        assert _settle(lambda: not _gate_threads() and _os_threads() <= before)
        g.close()
    finally:
        torch.set_num_threads(saved)
