"""The native hit path's typed entry (runtime/fastpath.cpp: register_typed), end to end
with real kernels: a served op whose C++ signature the extension has is registered unboxed,
builds the boxed kernel's fast key from its typed arguments, runs a remembered kernel on
them and calls eager's kernel unboxed (through a private member of torch's
SafeKernelFunction: the differential test of that patch is here).

Each case runs twice, typed (the default) and all boxed (``AOTI_FARM_DEV=typed_entry=0``):
the same bits both ways, eager's bits for a remembered miss, the same counts.  The typed key
must equal the boxed one byte for byte: a decision is remembered by the boxed kernel (the
first call of a signature goes to Python there) and replayed by the typed entry, so a
typed key that differed would hand every call to the boxed kernel (``typed_boxed``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aoti_farm import signature as S
from aoti_farm.runtime import Settings, install, native

from _runtime_helpers import same

pytestmark = pytest.mark.skipif(native.disabled(), reason="AOTI_FARM_NATIVE=0")

OPS = ["aten::native_layer_norm", "aten::gelu", "aten::add.Tensor", "aten::sum.dim_IntList"]


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 16, generator=g)
    return x, torch.randn(16, generator=g), torch.randn(16, generator=g), torch.randn(2, 8, 16, generator=g)


def _calls(x, w, b, y):
    """Every argument kind of the typed signatures used: int[] (SymInt[]), optional tensors
    and a double (layer_norm), a str (gelu), a Scalar (add's alpha: non-negative and negative
    int, float), an
    optional int[] with a bool and an optional dtype (sum)."""
    return {
        "layer_norm": lambda: F.layer_norm(x, (16,), w, b, 1e-5),
        "layer_norm, no affine": lambda: F.layer_norm(x, (16,), None, None, 1e-5),
        "gelu tanh": lambda: F.gelu(x, approximate="tanh"),
        "gelu": lambda: F.gelu(x),
        "add alpha=2": lambda: torch.add(x, y, alpha=2),
        "add alpha=0.5": lambda: torch.add(x, y, alpha=0.5),
        "add alpha=-3": lambda: torch.add(x, y, alpha=-3),
        "sum dim": lambda: torch.sum(x, dim=(1,), keepdim=True),
    }


@pytest.fixture(scope="module")
def typed_cache(kernels, tmp_path_factory):
    """Kernels for four of the calls; the other four stay misses (eager through the
    remembered decision)."""
    x, w, b, y = _inputs()
    sigs = [
        S.from_call(torch.ops.aten.native_layer_norm.default, (x, [16], w, b, 1e-5), {}),
        S.from_call(torch.ops.aten.gelu.default, (x,), {"approximate": "tanh"}),
        S.from_call(torch.ops.aten.add.Tensor, (x, y), {"alpha": 2}),
        S.from_call(torch.ops.aten.sum.dim_IntList, (x, [1], True), {}),
    ]
    for sig in sigs:
        out = kernels.ensure(sig)
        assert out.status in ("compiled", "cached"), (sig.op, out)
    return kernels.copy_to(tmp_path_factory.mktemp("typed") / "cache")


def _serve(cache, calls, rounds=20):
    with install(cache_dir=str(cache.root), ops=OPS, on_miss="ignore", route="all", serve="always",
                 settings=Settings(native="require", poll_interval=3600)) as hook:
        with torch.no_grad():
            got = {k: [f() for _ in range(rounds)] for k, f in calls.items()}
        st = hook.stats()
    return got, st


def _flat(o):
    return list(o) if isinstance(o, tuple) else [o]


def _bits(t):
    return (t.dtype, tuple(t.shape), t.stride(), t.contiguous().view(torch.uint8).flatten().tolist()
            if t.numel() else [])


SERVED = ("layer_norm", "gelu tanh", "add alpha=2", "sum dim")


def test_typed_entry_serves_what_the_boxed_kernel_serves(typed_cache, monkeypatch):
    x, w, b, y = _inputs()
    calls = _calls(x, w, b, y)
    with torch.no_grad():
        expected = {k: _flat(f()) for k, f in calls.items()}
    runs = {}
    for typed in (True, False):
        monkeypatch.setenv("AOTI_FARM_DEV", "" if typed else "typed_entry=0")
        runs[typed] = _serve(typed_cache, calls)
    for typed, (got, st) in runs.items():
        for k, outs in got.items():
            for o in outs:
                for a, e in zip(_flat(o), expected[k]):
                    if k in SERVED:     # the kernel: eager's metadata, values within verification's tolerance
                        assert (a.dtype, a.shape, a.stride()) == (e.dtype, e.shape, e.stride()), (typed, k)
                        assert torch.allclose(a, e, rtol=1e-5, atol=1e-5), (typed, k)
                    else:               # a remembered miss: eager's kernel, bit for bit
                        assert same(a, e), (typed, k)
        n = st["native"]
        assert n["active"], n
        want = {"aten::native_layer_norm", "aten::gelu", "aten::add.Tensor", "aten::sum.dim_IntList"} if typed else set()
        assert set(n["typed_ops"]) == want, (typed, n)
        # one trip to Python per distinct call, however registered
        assert n["slow_calls"] == len(calls), (typed, n)
        # the typed entry hands only those to the boxed kernel: every later call found the
        # key the boxed kernel remembered, so the typed key is the boxed key, byte for byte
        assert n["typed_boxed"] == (len(calls) if typed else 0), (typed, n)
        per = st["per_op"]
        for op in ("aten::native_layer_norm", "aten::gelu", "aten::add.Tensor", "aten::sum.dim_IntList"):
            assert per[op]["hits"] == 20, (typed, op, per)
        assert st["hits"] == 80 and st["misses"] == 4 * 20, (typed, st)
    # the same kernel ran both ways: the same bits
    for k in calls:
        for o_t, o_b in zip(runs[True][0][k], runs[False][0][k]):
            assert [_bits(t) for t in _flat(o_t)] == [_bits(t) for t in _flat(o_b)], k


def test_typed_entry_keeps_eager_errors_and_views(typed_cache, monkeypatch):
    """Through the typed entry a remembered miss calls eager's kernel unboxed: its errors
    are eager's, and a call the key cannot hold (a wrapped number, requires_grad) takes the
    boxed kernel as before."""
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    x, w, b, y = _inputs()
    with install(cache_dir=str(typed_cache.root), ops=OPS, on_miss="ignore", route="all", serve="always",
                 settings=Settings(native="require", poll_interval=3600)) as hook:
        errors = []
        for _ in range(3):          # the first decided in Python, then remembered (the typed path)
            try:
                F.layer_norm(x, (15,), None, None, 1e-5)
            except RuntimeError as e:
                errors.append(str(e))
        wrapped = x + 1.5
        g = x.clone().requires_grad_()
        graded = F.gelu(g, approximate="tanh")
        served = F.gelu(x, approximate="tanh")
        st = hook.stats()
    try:
        F.layer_norm(x, (15,), None, None, 1e-5)
        eager_error = None
    except RuntimeError as e:
        eager_error = str(e)
    assert eager_error and errors == [eager_error] * 3
    assert same(wrapped, x + 1.5)
    assert graded.requires_grad and same(graded.detach(), F.gelu(x, approximate="tanh"))
    assert torch.allclose(served, F.gelu(x, approximate="tanh"), rtol=1e-5, atol=1e-5)
    assert "aten::gelu" in st["native"]["typed_ops"] and st["per_op"]["aten::gelu"]["hits"] == 1, st
