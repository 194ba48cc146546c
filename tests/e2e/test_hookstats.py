"""The hook's stats as it served, and its miss explainer, with a real hook: ``install()``
computes this host's fingerprint, whose ISA probe starts a child process on a host with no
memo yet (so these are not unit tests).  The summary's arithmetic is in
tests/unit/test_hookstats.py."""

from __future__ import annotations

import torch

from aoti_farm.runtime import Settings, install


def test_stats_after_uninstall_describe_the_hook_as_it_served(tmp_path):
    a = torch.randn(4, 4)
    hook = install(cache_dir=str(tmp_path), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                   serve="always", settings=Settings(native="off"))
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
                   serve="always", settings=Settings(native="off", explain_misses=True))
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
