"""A hook that cannot serve an op costs nothing for it.  With ``on_miss="ignore"``
only ops with a servable entry are registered (``route="servable-at-install"``, the
default there: computed once; ``route="servable"``, opt-in: recomputed after each poll):
an op whose only entry the speed gate declines on the compile host is never routed through
the hook (asserted on the registration and on the counters: nothing reaches it), the same
entry under ``serve="always"`` is, and an op whose first servable entry is published later
is registered then.  Uses the session's real add kernel (tests/e2e/test_gate.py's cache)."""

from __future__ import annotations

import time

import pytest
import torch

from aoti_farm.errors import UserError
from aoti_farm.runtime import Settings, install

from _counters import assert_delta
from _runtime_helpers import wait_until
from e2e.test_gate import _add_call, _gate_cache

ADD = "aten::add.Tensor"
OPS = [ADD, "aten::mul.Tensor"]


def test_an_op_whose_only_entry_is_gated_is_not_routed(kernels, tmp_path):
    cache = _gate_cache(kernels, tmp_path, ratio=1.6)   # slower than eager on the compile host
    a, b = _add_call()
    expected = torch.add(a, b, alpha=2)
    table = {op: torch._C._dispatch_dump(op) for op in OPS}
    with install(cache_dir=str(cache.root), ops=OPS, on_miss="ignore", route="servable", serve="faster") as hook:
        assert hook.ops == [] and hook.stats()["routed_ops"] == 0
        # nothing routed: the dispatcher's tables are untouched, so every call runs eager's own code
        assert {op: torch._C._dispatch_dump(op) for op in OPS} == table
        before = hook.stats()
        got = [torch.add(a, b, alpha=2) for _ in range(3)] + [torch.mul(a, a)]
        assert_delta(before, hook.stats(), {}, ignore=("rescans",))   # nothing reached the hook
    assert all(torch.equal(x, expected) for x in got[:3])
    # the same entry where the gate is off is servable: add (only) is routed, and hits
    with install(cache_dir=str(cache.root), ops=OPS, on_miss="ignore", route="servable", serve="always") as hook:
        assert hook.ops == [ADD]
        before = hook.stats()
        got = torch.add(a, b, alpha=2)
        assert_delta(before, hook.stats(), {"calls": 1, "hits": 1, "kernels_loaded": 1,
                                            "per_op": {ADD: {"hits": 1}}}, ignore=("rescans",))
    assert torch.equal(got, expected)


def test_an_op_is_routed_once_its_first_servable_entry_is_published(kernels, tmp_path):
    root = tmp_path / "gate-0.5"
    a, b = _add_call()
    with install(cache_dir=str(root), ops=OPS, on_miss="ignore", route="servable", serve="always",
                 settings=Settings(poll_interval=0.1)) as hook:
        assert hook.ops == []
        _gate_cache(kernels, tmp_path, ratio=0.5)          # published into the hook's cache now
        assert wait_until(lambda: hook.ops == [ADD], 60), hook.ops
        before = hook.stats()
        got = torch.add(a, b, alpha=2)
        assert_delta(before, hook.stats(), {"calls": 1, "hits": 1, "kernels_loaded": 1,
                                            "per_op": {ADD: {"hits": 1}}}, ignore=("rescans",))
    assert torch.equal(got, torch.add(a, b, alpha=2))


def test_the_default_routes_every_op_only_where_a_miss_must_be_seen(tmp_path):
    with install(cache_dir=str(tmp_path), ops=OPS, on_miss="queue") as hook:
        assert sorted(hook.ops) == sorted(OPS) and hook.stats()["route"] == "paying"
    with install(cache_dir=str(tmp_path), ops=OPS, on_miss="queue", route="all") as hook:
        assert sorted(hook.ops) == sorted(OPS) and hook.stats()["route"] == "all"
    with install(cache_dir=str(tmp_path), ops=OPS, on_miss="ignore", route="all") as hook:
        assert sorted(hook.ops) == sorted(OPS)
    for route in ("servable", "servable-at-install"):
        with pytest.raises(UserError, match="route"):
            install(cache_dir=str(tmp_path), on_miss="queue", route=route)
    with pytest.raises(UserError, match="route"):
        install(cache_dir=str(tmp_path), on_miss="ignore", route="some")


def test_by_default_a_serving_only_hook_routes_what_was_servable_at_install(kernels, tmp_path):
    """on_miss="ignore" routes only ops with a servable entry, computed once: an entry
    published later changes nothing until the next install (no re-registration while
    calls may be in flight)."""
    cache = _gate_cache(kernels, tmp_path / "first", ratio=0.5)
    a, b = _add_call()
    with install(cache_dir=str(cache.root), ops=OPS, on_miss="ignore", serve="always") as hook:
        assert hook.ops == [ADD] and hook.stats()["route"] == "servable-at-install"
        before = hook.stats()
        got = [torch.add(a, b, alpha=2), torch.mul(a, a)]
        assert_delta(before, hook.stats(), {"calls": 1, "hits": 1, "kernels_loaded": 1,
                                            "per_op": {ADD: {"hits": 1}}}, ignore=("rescans",))
    assert torch.equal(got[0], torch.add(a, b, alpha=2))
    root = tmp_path / "gate-0.5"
    with install(cache_dir=str(root), ops=OPS, on_miss="ignore", serve="always",
                 settings=Settings(poll_interval=0.05)) as hook:
        assert hook.ops == []
        rescans = hook.stats()["rescans"]
        _gate_cache(kernels, tmp_path, ratio=0.5)                      # published into it after install
        assert wait_until(lambda: hook.stats()["rescans"] > rescans, 30)   # the poller listed it
        time.sleep(0.2)
        assert hook.ops == []
        before = hook.stats()
        torch.add(a, b, alpha=2)
        assert_delta(before, hook.stats(), {}, ignore=("rescans",))      # still never enters the hook
    with install(cache_dir=str(root), ops=OPS, on_miss="ignore", serve="always") as hook:
        assert hook.ops == [ADD]                                         # the next install routes it
