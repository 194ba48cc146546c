"""A served call is eager's call, an unserved one is eager's own, end to end:
real compiles into the session cache, the hook on the native and the Python hit path.

Compiled signatures: int64 div, leaky_relu(0.0), int32 floor division, searchsorted with a
sorter, a float32 sum.
"""

from __future__ import annotations

import pytest
import torch

import aoti_farm
from aoti_farm import signature as S
from aoti_farm.runtime import Settings, install

PATHS = ["native", "off"]


def _bits(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), t.stride(), bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()))


def _compiled(kernels, op, args, kwargs=None, hints=None):
    sig = S.from_call(op, args, kwargs or {})
    if hints:
        sig = S.Signature(sig.op, sig.args, hints)
    out = kernels.ensure(sig)
    assert out.status in ("compiled", "cached"), f"{sig.op}: {out.status}: {out.error} {out.evidence}"
    return sig


def _hook(kernels, native):
    settings = Settings() if native == "native" else Settings(native="off")
    return install(cache_dir=str(kernels.cache.root), on_miss="ignore", route="all", settings=settings)


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("native", PATHS)
def test_default_dtype_float64_int_division_is_eager(kernels, native, one_thread):
    a = torch.arange(1, 9, dtype=torch.int64)
    b = torch.full((8,), 3, dtype=torch.int64)
    sig = _compiled(kernels, torch.ops.aten.div.Tensor, (a, b))
    expected32 = a / b
    torch.set_default_dtype(torch.float64)
    try:
        expected64 = a / b
        with _hook(kernels, native) as hook:
            got64 = a / b
            torch.set_default_dtype(torch.float32)
            got32 = a / b             # served again once the default is back
            st = hook.stats()
    finally:
        torch.set_default_dtype(torch.float32)
    assert expected64.dtype is torch.float64 and _bits(got64) == _bits(expected64)
    assert _bits(got32) == _bits(expected32)
    assert st["fallbacks"].get("conditions: default_dtype=float64") == 1, st["fallbacks"]
    assert st["per_op"][sig.op]["hits"] == 1, st["per_op"]


def test_negative_zero_scalar_is_not_the_zero_kernel(kernels, one_thread):
    x = torch.linspace(-2, 2, 16)
    sig = _compiled(kernels, torch.ops.aten.leaky_relu.default, (x, 0.0))
    # (a dict would merge the two: -0.0 == 0.0 in Python)
    expected = [torch.nn.functional.leaky_relu(x, s) for s in (-0.0, 0.0)]
    assert _bits(expected[0]) != _bits(expected[1])      # eager: x * -0.0 is +0.0 for x < 0
    for native in PATHS:
        with _hook(kernels, native) as hook:
            got = [torch.nn.functional.leaky_relu(x, s) for s in (-0.0, 0.0)]   # -0.0 first
            st = hook.stats()
        # -0.0 has no kernel: a miss, eager's own call; 0.0 is served by its kernel
        assert st["per_op"][sig.op] == {"hits": 1, "misses": 1, "fallbacks": 0}, (native, st["per_op"])
        assert [_bits(g) for g in got] == [_bits(e) for e in expected], native


@pytest.mark.parametrize("native", PATHS)
def test_unserved_numbers_next_to_0dim_tensors_under_the_hook(tmp_path, native):
    h = torch.tensor(0.0010004, dtype=torch.float16)
    i8 = torch.tensor(109, dtype=torch.int8)
    calls = {"f16*1e5": lambda: h * 1e5, "f16*0.1": lambda: h * 0.1, "i8+200": lambda: i8 + 200}
    expected = {k: f() for k, f in calls.items()}
    settings = Settings() if native == "native" else Settings(native="off")
    with install(cache_dir=str(tmp_path / "empty"), on_miss="ignore", route="all", settings=settings):
        got = {k: f() for k, f in calls.items()}
    with aoti_farm.record(tmp_path / "t.json"):
        recorded = {k: f() for k, f in calls.items()}
    for k in calls:
        assert _bits(got[k]) == _bits(expected[k]) == _bits(recorded[k]), (k, got[k], expected[k])
    assert expected["i8+200"].item() == 53 and torch.isfinite(expected["f16*1e5"])


@pytest.mark.parametrize("native", PATHS)
def test_user_error_keeps_the_kernel(kernels, native, one_thread):
    a = torch.arange(-8, 8, dtype=torch.int32)
    b = torch.full((16,), 3, dtype=torch.int32)
    sig = _compiled(kernels, torch.ops.aten.div.Tensor_mode, (a, b), {"rounding_mode": "floor"},
                    hints={"other": {"range": [1, 5]}})   # verified on divisors that are not 0
    zero = b.clone()
    zero[5] = 0
    with pytest.raises(RuntimeError) as eager_err:
        torch.div(a, zero, rounding_mode="floor")
    with _hook(kernels, native) as hook:
        with pytest.raises(RuntimeError) as err:
            torch.div(a, zero, rounding_mode="floor")
        got = [torch.div(a, b, rounding_mode="floor") for _ in range(10)]
        st = hook.stats()
    assert str(err.value) == str(eager_err.value)
    expected = torch.div(a, b, rounding_mode="floor")
    assert all(_bits(g) == _bits(expected) for g in got)
    assert st["kernel_errors"] == 0 and st["user_errors"] == 1, st
    assert st["per_op"][sig.op]["hits"] == 10, st["per_op"]


def test_searchsorted_with_sorter_on_the_python_path(kernels, one_thread):
    seq = torch.randn(32, generator=torch.Generator().manual_seed(0))
    sorter = torch.argsort(seq)
    v = torch.randn(8, generator=torch.Generator().manual_seed(1))
    sig = _compiled(kernels, torch.ops.aten.searchsorted.Tensor, (seq, v), {"sorter": sorter})
    expected = torch.searchsorted(seq, v, sorter=sorter)
    with _hook(kernels, "off") as hook:
        got = [torch.searchsorted(seq, v, sorter=sorter) for _ in range(3)]
        st = hook.stats()
    assert all(_bits(g) == _bits(expected) for g in got)
    assert st["per_op"][sig.op]["hits"] == 3 and st["kernel_errors"] == 0, st


@pytest.mark.parametrize("native", PATHS)
def test_unverified_thread_count_is_checked_first(kernels, native, one_thread):
    """The compiler verified the kernel at the thread counts in its manifest's
    ``verified_threads`` (1, 2 and the host's core count); at a count outside them the hook
    checks it against eager once before serving it there.  Where no checking runner is
    loaded (the native path's entry verified at every count from 1 to ``os.cpu_count()``)
    the check cannot run: that count runs eager, counted ``threads_unverified``."""
    import os

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    sig = _compiled(kernels, torch.ops.aten.sum.dim_IntList, (x, [1]))
    entry = kernels.cache.open_entry(kernels.fp, sig.key)
    try:
        verified = entry.verified_threads
    finally:
        entry.close()
    assert 1 in verified
    unverified = max(verified) + 1                      # a count the compiler did not verify at
    checked = native != "native" or set(verified) != set(range(1, (os.cpu_count() or 1) + 1))
    with _hook(kernels, native) as hook:
        at1 = [torch.sum(x, dim=1) for _ in range(2)]
        s1 = hook.stats()
        torch.set_num_threads(unverified)
        at2 = [torch.sum(x, dim=1) for _ in range(3)]
        s2 = hook.stats()
    assert s1["thread_checks"] == {} and s1["per_op"][sig.op]["hits"] == 2, s1
    if checked:
        assert s2["thread_checks"] == {"agree": 1}, s2
        assert s2["per_op"][sig.op]["hits"] == 5, s2["per_op"]
    else:
        assert s2["thread_checks"] == {"threads_unverified": 1}, s2
        assert s2["per_op"][sig.op]["hits"] == 2, s2["per_op"]
    expected = torch.sum(x, dim=1)
    for g in at1 + at2:
        torch.testing.assert_close(g, expected)


@pytest.mark.parametrize("native", PATHS)
def test_precision_torch_cannot_read_declines_instead_of_raising(kernels, native, one_thread):
    """Once a program sets the new per-backend precision API, torch 2.13 raises when the
    legacy precision is read: the hook (and the native key) must neither raise nor serve."""
    from conftest import sig_add_alpha

    sig = sig_add_alpha()
    _compiled(kernels, torch.ops.aten.add.Tensor, (torch.randn(8, 16), torch.randn(16)), {"alpha": 2})
    a, b = torch.randn(8, 16), torch.randn(16)
    expected = torch.add(a, b, alpha=2)
    prev = torch.backends.mkldnn.matmul.fp32_precision
    with _hook(kernels, native) as hook:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        try:
            got = torch.add(a, b, alpha=2)
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = prev
        again = torch.add(a, b, alpha=2)
        st = hook.stats()
    assert _bits(got) == _bits(expected) and _bits(again) == _bits(expected)
    assert st["fallbacks"].get("conditions: float32_matmul_precision=mixed") == 1, st["fallbacks"]
    assert st["per_op"][sig.op]["hits"] == 1, st["per_op"]
