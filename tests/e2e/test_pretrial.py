"""``install()`` times the routed ops' kernels on this host before it returns
(``runtime/pretrial.py``), and unroutes an op none of whose kernels won here, so a hooked
model pays no routing for ops that would only run eager.  Uses the session's real add
kernel (tests/e2e/test_gate.py's cache); the trial is the gate's real measurement, with a
fixed delay added to one side where a test needs a known outcome.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_pretrial.py.
"""

from __future__ import annotations

import pytest
import torch

from aoti_farm.runtime import gate as gate_mod
from aoti_farm.runtime import Settings, install

from _counters import assert_delta
from e2e.test_gate import _add_call, _gate_cache, _penalised

ADD = "aten::add.Tensor"
OPS = [ADD, "aten::mul.Tensor"]


def _install(cache, serve="faster", **settings):
    return install(cache_dir=str(cache.root), ops=OPS, on_miss="ignore", serve=serve,
                   settings=Settings(**settings))


def test_an_op_whose_kernels_lose_here_is_unrouted_at_install(kernels, tmp_path, monkeypatch):
    cache = _gate_cache(kernels, tmp_path, ratio=0.5)   # faster on the compile host
    monkeypatch.setattr(gate_mod, "time_against_eager", _penalised("kernel"))
    a, b = _add_call()
    with _install(cache) as hook:
        st = hook.stats()
        assert hook.ops == [] and st["routed_ops"] == 0, hook.ops
        it = st["install_trial"]
        assert (it["tried"], it["faster_here"], it["undecided"], it["unrouted"]) == (1, 0, 0, [ADD]), it
        assert next(iter(hook.gate.why.values()))["reason"] == "slower here"
        assert st["native"]["trial_calls"] > 0          # timed through the dispatcher
        before = hook.stats()
        got = torch.add(a, b, alpha=2)
        assert_delta(before, hook.stats(), {}, ignore=("rescans",))   # nothing reaches the hook
    assert torch.equal(got, torch.add(a, b, alpha=2))


@pytest.mark.parametrize("on_miss", ["queue", "compile"])
def test_by_default_a_compiling_hook_unroutes_ops_that_lose_here(kernels, tmp_path, monkeypatch, on_miss):
    """The defaults (``on_miss`` "compile" or "queue": ``route="paying"``) decide each op's
    route from this host's trials: add, whose only kernel loses here, is not routed (its
    calls cost exactly eager, and its new signatures are not queued: they would lose the
    same way); mul, with no entry, stays routed so its misses are seen and queued."""
    cache = _gate_cache(kernels, tmp_path, ratio=0.5)   # faster on the compile host
    monkeypatch.setattr(gate_mod, "time_against_eager", _penalised("kernel"))
    a, b = _add_call()
    table = torch._C._dispatch_dump(ADD)
    with install(cache_dir=str(cache.root), ops=OPS, on_miss=on_miss, serve="faster",
                 settings=Settings(worker_idle=1)) as hook:
        st = hook.stats()
        assert st["route"] == "paying" and hook.ops == ["aten::mul.Tensor"], hook.ops
        assert st["install_trial"]["unrouted"] == [ADD], st["install_trial"]
        assert torch._C._dispatch_dump(ADD) == table     # eager's own kernel, untouched
        before = hook.stats()
        got = [torch.add(a, b, alpha=2), torch.add(a[:3], a[:3])]   # a new signature of add: not queued
        assert_delta(before, hook.stats(), {}, ignore=("rescans",))
        torch.mul(a, a)
        assert hook.stats()["misses"] == before["misses"] + 1
    assert torch.equal(got[0], torch.add(a, b, alpha=2))


def test_an_op_whose_kernel_wins_here_stays_routed_and_hits_at_once(kernels, tmp_path, monkeypatch):
    cache = _gate_cache(kernels, tmp_path, ratio=0.5)
    monkeypatch.setattr(gate_mod, "time_against_eager", _penalised("eager"))
    a, b = _add_call()
    with _install(cache) as hook:
        it = hook.stats()["install_trial"]
        assert hook.ops == [ADD] and (it["tried"], it["faster_here"], it["unrouted"]) == (1, 1, []), (it, hook.gate.why)
        before = hook.stats()
        got = torch.add(a, b, alpha=2)
        # decided before the first call: a hit, no gate_pending call that runs eager
        assert_delta(before, hook.stats(), {"calls": 1, "hits": 1, "per_op": {ADD: {"hits": 1}}},
                     ignore=("rescans", "kernels_loaded"))
    assert torch.equal(got, torch.add(a, b, alpha=2))


def test_the_real_trial_routes_exactly_the_ops_that_won_here(kernels, tmp_path):
    """No delay added: whatever this host measures, the op is routed iff its kernel won."""
    cache = _gate_cache(kernels, tmp_path, ratio=0.5)
    with _install(cache) as hook:
        it = hook.stats()["install_trial"]
        (why,) = hook.gate.why.values()
        assert it["tried"] == 1 and why["reason"] in ("faster here", "slower here",
                                                      "faster here by less than a routed call costs"), (it, why)
        won = why["reason"] == "faster here"
        assert hook.ops == ([ADD] if won else []) and it["unrouted"] == ([] if won else [ADD])


def test_install_trial_off_or_out_of_budget_leaves_the_first_call_to_decide(kernels, tmp_path, monkeypatch):
    cache = _gate_cache(kernels, tmp_path, ratio=0.5)
    with _install(cache, install_trial=0) as hook:
        assert hook.ops == [ADD] and hook.stats()["install_trial"] is None and hook.gate.why == {}
    monkeypatch.setenv("AOTI_FARM_INSTALL_TRIAL", "0")
    with _install(cache) as hook:
        assert hook.stats()["install_trial"] is None
    monkeypatch.delenv("AOTI_FARM_INSTALL_TRIAL")
    with _install(cache, install_trial=1e-9) as hook:   # the budget is spent before the first entry
        it = hook.stats()["install_trial"]
        assert hook.ops == [ADD] and (it["tried"], it["undecided"], it["unrouted"]) == (0, 1, []), it
    with _install(cache, serve="always") as hook:        # no gate: nothing to try
        assert hook.ops == [ADD] and hook.stats()["install_trial"] is None
