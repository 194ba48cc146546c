"""``Hook.stats()``'s summary (calls, served, hit rate, why not served) and the stats taken
after ``uninstall()`` (what ``aoti-farm run`` writes at exit), which describe the hook as
it served, not the empty registration left behind."""

from __future__ import annotations

import torch

from aoti_farm.runtime import install
from aoti_farm.runtime.hookstats import summary


def test_summary_adds_up_the_outcomes():
    s = {"calls": 100, "hits": 40, "gated": 25, "gate_pending": 5, "misses": 10, "failed_signatures": 2,
         "fallbacks": {"a view": 15, "requires_grad": 3}}
    got = summary(s)
    assert got["calls"] == 100 and got["served"] == 40 and got["hit_rate"] == 0.4
    assert got["not_served"] == {"gated": 25, "gate_pending": 5, "missed": 10, "failed": 2, "ineligible": 18}
    assert got["served"] + sum(got["not_served"].values()) == got["calls"]
    assert got["top_reason"] == "gated" and got["ineligible_by_reason"]["a view"] == 15
    assert summary({"calls": 0, "hits": 0, "fallbacks": {}}) == {
        "calls": 0, "served": 0, "hit_rate": 0.0, "ineligible_by_reason": {}, "top_reason": None,
        "not_served": {"gated": 0, "gate_pending": 0, "missed": 0, "failed": 0, "ineligible": 0}}


def test_stats_after_uninstall_describe_the_hook_as_it_served(tmp_path):
    a = torch.randn(4, 4)
    hook = install(cache_dir=str(tmp_path), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                   serve="always", native="off")
    torch.add(a, a)
    live = hook.stats()
    hook.uninstall()
    after = hook.stats()
    assert live["routed_ops"] == 1 and after["routed_ops"] == 1 and after["uninstalled"] is True
    assert after["native"]["active"] == live["native"]["active"]
    assert after["summary"]["calls"] == live["summary"]["calls"] == 1
    assert after["summary"]["not_served"]["missed"] == 1 and after["summary"]["hit_rate"] == 0.0


def test_the_miss_explainer_never_enters_the_hook_it_explains(tmp_path, monkeypatch):
    """explain_misses: whatever the explainer runs (torch ops included) bypasses the hook,
    so its calls are neither counted, queued nor explained in turn."""
    from aoti_farm.runtime import metrics as metrics_mod

    seen = []

    class OpsInExplainer:
        def __init__(self, *a, **kw):
            pass

        def __call__(self, call):
            seen.append(call.key)
            torch.add(torch.ones(len(seen) + 7), torch.ones(len(seen) + 7))   # a new signature each time

    monkeypatch.setattr(metrics_mod, "MissExplainer", OpsInExplainer)
    hook = install(cache_dir=str(tmp_path), ops=["aten::add.Tensor"], on_miss="queue", route="all",
                   serve="always", native="off", explain_misses=True)
    try:
        a = torch.randn(3, 3)
        torch.add(a, a)
        hook.flush()
        import time

        time.sleep(0.5)
        hook.flush()
        st = hook.stats()
    finally:
        hook.uninstall()
    assert len(seen) == 1 and st["misses"] == 1 and st["calls"] == 1, (seen, st["summary"])
