"""The unit tests split from tests/e2e/test_gate.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.compile.tolerance import compare, length_tolerance
from aoti_farm.runtime import install
from aoti_farm.runtime.gate import GATE_RATIO, Gate, time_against_eager


# --- the gate's decisions -------------------------------------------------------------------------


def test_gate_decisions_follow_manifest_and_trial():
    heavy, light = torch.randn(1 << 20), torch.randn(16)
    fast = lambda: (light.sum(), heavy.sum(), heavy.sum())  # noqa: E731
    cheap = lambda: light.sum()  # noqa: E731
    g = Gate("faster")
    ran = []

    def never():
        ran.append(1)
        raise AssertionError("trial must not run")

    # compile host says slower, or says nothing: declined without a trial
    assert g.confirm("slow", {"ratio": 1.4}, never) is False
    assert g.confirm("none", None, never) is False
    assert g.confirm("junk", {"ratio": "fast"}, never) is False
    assert not ran and g.stats()["gate_trials"] == 0
    # compile host says faster; the trial here decides (workloads 1000x apart)
    assert g.confirm("wins", {"ratio": 0.3}, lambda: (cheap, fast, "cpu")) is True
    assert g.confirm("loses", {"ratio": 0.3}, lambda: (fast, cheap, "cpu")) is False
    assert g.why["wins"]["host_ratio"] <= GATE_RATIO < g.why["loses"]["host_ratio"], g.why
    # a failing trial declines; every decision is settled and counted
    assert g.confirm("boom", {"ratio": 0.3}, lambda: 1 / 0) is False
    st = g.stats()
    assert st["gated_signatures"] == 5 and st["served_signatures"] == 1 and st["gate_errors"] == 1, st
    assert st["gate_trials"] > 0
    assert [g.decision(k) for k in ("slow", "wins", "loses", "unseen")] == [False, True, False, None]
    assert Gate("always").confirm("x", None, never) is True and not ran
    with pytest.raises(ValueError):
        Gate("sometimes")


def test_a_win_smaller_than_a_routed_call_costs_is_declined():
    """The on-host trial's hot loop does not see what a routed call costs inside a model
    (cold caches): a kernel must also save MIN_SAVING_US a call to be served."""
    from aoti_farm.runtime.gate import MIN_SAVING_US

    g = Gate("faster")
    timed = {}
    g.measure = lambda run_kernel, run_eager, device, **kw: timed[device]
    trial = lambda device: (lambda: (lambda: None, lambda: None, device))  # noqa: E731
    # the same 10% win, once tiny and once large
    timed["tiny"] = {"ratio": 0.9, "kernel_us": 0.9 * MIN_SAVING_US, "eager_us": MIN_SAVING_US, "calls": 4}
    timed["large"] = {"ratio": 0.9, "kernel_us": 90 * MIN_SAVING_US, "eager_us": 100 * MIN_SAVING_US, "calls": 4}
    assert g.confirm("tiny", {"ratio": 0.5}, trial("tiny")) is False
    assert g.why["tiny"]["reason"] == "faster here by less than a routed call costs"
    assert g.confirm("large", {"ratio": 0.5}, trial("large")) is True
    assert g.why["large"]["reason"] == "faster here"


def test_time_against_eager_fields_and_bounds():
    a = torch.randn(64)
    m = time_against_eager(lambda: a + 1, lambda: a * 2, "cpu", budget_s=0.05)
    assert set(m) >= {"kernel_us", "eager_us", "ratio", "rounds", "threads", "device", "calls"}
    assert m["rounds"] >= 3 and m["kernel_us"] > 0 and m["eager_us"] > 0 and m["device"] == "cpu"
    assert m["calls"] == 2 + 2 * m["rounds"] * m["batch"]
    # rounds and batches follow the budget (a fake clock that each call advances)
    now = [0.0]

    def cost(seconds):
        return lambda: now.__setitem__(0, now[0] + seconds)

    clock = lambda: now[0]  # noqa: E731
    slow = time_against_eager(cost(0.03), cost(0.001), "cpu", budget_s=0.01, clock=clock)
    assert (slow["rounds"], slow["batch"], slow["calls"]) == (1, 1, 4) and slow["ratio"] == pytest.approx(30)
    mid = time_against_eager(cost(0.01), cost(0.001), "cpu", budget_s=0.05, clock=clock)
    assert (mid["rounds"], mid["batch"], mid["calls"]) == (2, 1, 6) and mid["ratio"] == pytest.approx(10)
    fast = time_against_eager(cost(1e-6), cost(2e-6), "cpu", budget_s=0.3, clock=clock)
    assert (fast["rounds"], fast["batch"]) == (7, 2000) and fast["ratio"] == pytest.approx(0.5)
    assert fast["kernel_us"] == pytest.approx(1.0) and fast["eager_us"] == pytest.approx(2.0)
    # one preempted batch (a 0.5 s stall in the third round's kernel batch) does not move it
    n = [0]

    def spiky():
        n[0] += 1
        now[0] += 1e-6 + (0.5 if n[0] == 4500 else 0.0)

    noisy = time_against_eager(spiky, cost(2e-6), "cpu", budget_s=0.3, clock=clock)
    assert n[0] > 4500 and noisy["ratio"] == pytest.approx(0.5) and noisy["kernel_us"] == pytest.approx(1.0)


def test_serve_policy_is_validated(tmp_path, monkeypatch):
    from aoti_farm.config import HookConfig, resolve
    from aoti_farm.errors import UserError

    with pytest.raises(UserError, match="serve"):
        install(cache_dir=str(tmp_path), serve="sometimes")
    monkeypatch.setenv("AOTI_FARM_SERVE", "always")
    assert resolve(HookConfig, env={"AOTI_FARM_SERVE": "always"}).serve == "always"
    assert resolve(HookConfig, env={}).serve == "faster"
    with pytest.raises(UserError, match="serve"):
        resolve(HookConfig, cli={"serve": "never"}, env={})


# --- tolerances that scale with the number of summed terms ---------------------------------------


def _tree_scan(x: torch.Tensor) -> torch.Tensor:
    """A correct inclusive scan in another order (Hillis-Steele, as parallel scans do)."""
    y, s = x.clone(), 1
    while s < x.shape[1]:
        z = y.clone()
        z[:, s:] = y[:, s:] + y[:, :-s]
        y, s = z, s * 2
    return y


def test_long_scan_tolerance_accepts_reordered_sum_refuses_wrong_one():
    x = torch.randn(256, 16384, generator=torch.Generator().manual_seed(0))
    sig = S.from_call(torch.ops.aten.cumsum.default, (x, 1), {})
    expected = torch.cumsum(x, 1)
    reordered = _tree_scan(x)
    extra = length_tolerance(sig, (x, 1), {}, expected)
    assert extra[1] > 0
    assert compare(expected, [reordered]) is not None          # the fixed float32 tolerance refuses it
    assert compare(expected, [reordered], extra) is None       # correct: accepted
    shifted = torch.cat([torch.zeros(256, 1), expected[:, :-1]], 1)   # an exclusive scan
    bad = compare(expected, [shifted], extra)
    assert bad is not None and bad["problem"] == "values"
    short = expected - x[:, :1]                                 # drops the first term
    assert compare(expected, [short], extra) is not None
    # elementwise ops keep the fixed tolerance
    a = torch.randn(64, 64)
    assert length_tolerance(S.from_call(torch.ops.aten.add.Tensor, (a, a), {}), (a, a), {}, a + a) == (0.0, 0.0)


def _tol(op, args, kwargs=None):
    kwargs = kwargs or {}
    return length_tolerance(S.from_call(op, args, kwargs), args, kwargs, op(*args, **kwargs))


def test_length_tolerance_only_where_terms_add_up():
    g = torch.Generator().manual_seed(1)
    x, a, b = torch.randn(4, 65536, generator=g), torch.randn(64, 512, generator=g), torch.randn(512, 32, generator=g)
    eps = torch.finfo(torch.float32).eps
    rtol, atol = _tol(torch.ops.aten.sum.dim_IntList, (x, [1]))
    assert rtol == 0 and atol == pytest.approx(eps * 65536 * float(x.abs().mean()), rel=1e-6)
    rtol, atol = _tol(torch.ops.aten.mm.default, (a, b))
    assert atol == pytest.approx(eps * 512 * float(a.abs().mean()) * float(b.abs().mean()), rel=1e-6)
    rtol, atol = _tol(torch.ops.aten.cumprod.default, (x[:, :64] * 0.1 + 1, 1))
    assert rtol == pytest.approx(eps * 64) and atol == 0
    # a mean gets its sum's bound over its count, eps * mean|x|: not length-scaled (a mean
    # missing one of L terms is off by ~mean|x| / L, still far past it for any L < 1 / eps)
    rtol, atol = _tol(torch.ops.aten.mean.dim, (x, [1]))
    assert rtol == 0 and atol == pytest.approx(eps * float(x.abs().mean()), rel=1e-6)
    # softmax and max stay at the dtype's tolerance (their outputs are not in summed units:
    # a length-scaled atol would accept wrong kernels)
    for op, args in ((torch.ops.aten._softmax.default, (x, 1, False)), (torch.ops.aten.amax.default, (x, [1]))):
        assert _tol(op, args) == (0.0, 0.0), op
