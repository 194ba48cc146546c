"""Unit tests (no compile): an unserved call is eager's own call, and signatures and the
runner's inputs are exact (runtime/dispatch.py, aoti_farm/signature, aoti_farm/compile/runner.py)."""

from __future__ import annotations

import pytest
import torch

import aoti_farm
from aoti_farm import signature as S
from aoti_farm.runtime import dispatch

from _runtime_helpers import same


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())


def _wrapped_calls():
    """Python numbers next to 0-dim tensors: eager keeps wrapped-number semantics."""
    h = torch.tensor(0.0010004, dtype=torch.float16)
    h3 = torch.tensor(3.0, dtype=torch.float16)
    i8 = torch.tensor(109, dtype=torch.int8)
    b = torch.tensor(True)
    return {
        "f16*1e5": lambda: h * 1e5,            # a float16 1e5 would be inf
        "f16*0.1": lambda: h3 * 0.1,           # a float16 0.1 would round first
        "i8+200": lambda: i8 + 200,            # an int8 200 would raise overflow
        "i8*-0.0": lambda: i8 * -0.0,
        "bool+1.5": lambda: b + 1.5,
        "f16*(1+2j)": lambda: h3 * (1 + 2j),
        "f16/3": lambda: h3 / 3,
    }


def _check_untouched(expected, got):
    for k in expected:
        e, g = expected[k], got[k]
        assert (g.dtype, g.shape, g.stride(), _bits(g)) == (e.dtype, e.shape, e.stride(), _bits(e)), (k, g, e)


def test_unserved_numbers_next_to_0dim_tensors_are_eager_bit_for_bit():
    calls = _wrapped_calls()
    expected = {k: f() for k, f in calls.items()}
    assert torch.isfinite(expected["f16*1e5"]) and expected["i8+200"].item() == 109 + 200 - 256
    reg = dispatch.Registration(None, lambda info, device, orig, keyset, args, kwargs:
                                dispatch.call_original(info, orig, keyset, args, kwargs))
    try:
        got = {k: f() for k, f in calls.items()}
    finally:
        reg.uninstall()
    _check_untouched(expected, got)


def test_record_does_not_change_numbers_next_to_0dim_tensors(tmp_path):
    calls = _wrapped_calls()
    expected = {k: f() for k, f in calls.items()}
    with aoti_farm.record(tmp_path / "t.json") as rec:
        got = {k: f() for k, f in calls.items()}
    _check_untouched(expected, got)
    assert rec.skipped   # the wrapped numbers were seen (and never recorded)


def test_flat_tensors_binds_keyword_only_tensors_by_name():
    from aoti_farm.compile.runner import flat_tensors
    from aoti_farm.runtime.calls import gatherer

    seq = torch.tensor([5.0, 1.0, 3.0])
    v = torch.tensor([2.0, 4.0])
    idx = torch.argsort(seq)
    op = torch.ops.aten.searchsorted.Tensor
    for args, kwargs in [((seq, v), {"sorter": idx}), ((seq, v), {"right": True, "sorter": idx}),
                         ((seq,), {"self": v, "sorter": idx})]:
        sig = S.from_call(op, args, kwargs)
        for got in (flat_tensors(sig, args, kwargs), gatherer(sig)(args, kwargs)):
            assert [t is x for t, x in zip(got, (seq, v, idx))] == [True] * 3 and len(got) == 3


def test_signed_zero_scalars_have_their_own_keys():
    """Keys compare bits: ``leaky_relu(x, -0.0)`` is never the ``0.0`` kernel's call."""
    from aoti_farm.runtime.calls import CallMemo

    x = torch.randn(4)
    op = torch.ops.aten.leaky_relu.default
    info = S.op_info(op)
    memo = CallMemo(["cpu"])
    pos, neg = S.from_call(op, (x, 0.0), {}), S.from_call(op, (x, -0.0), {})   # 0.0 first: cached first
    assert pos != neg and pos.key != neg.key and S.signature_key(neg.op, neg.args) == neg.key
    assert memo.get(info, pos.args).key == pos.key and memo.get(info, neg.args).key == neg.key
    back = S.parse_signature(neg.to_obj())            # a trace's signature is the hook's
    assert back == neg and back != pos and back.key == neg.key
    nan1, nan2 = S.from_call(op, (x, float("nan")), {}), S.from_call(op, (x, float("nan")), {})
    assert nan1 == nan2 and hash(nan1.args) == hash(nan2.args)   # memoised once, not per call
    lst = torch.ops.aten.upsample_nearest1d.vec
    a = S.from_call(lst, (torch.randn(1, 1, 4), None, [0.0]), {})
    b = S.from_call(lst, (torch.randn(1, 1, 4), None, [-0.0]), {})
    assert a != b and a.key != b.key


def test_conditions_name_each_global_and_follow_it():
    C = S.conditions
    assert C.mismatch("cpu") is None and C.mismatch("cuda") is None and C.current() == C.DEFAULTS
    assert set(C.NAMES) >= {"default_dtype", "matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision",
                            "cudnn_enabled", "cudnn_deterministic", "cudnn_benchmark", "deterministic_algorithms"}
    changed = {"default_dtype": ("float64", ("cpu", "cuda")), "matmul_allow_tf32": (True, ("cuda",)),
               "cudnn_allow_tf32": (False, ("cuda",)), "float32_matmul_precision": ("medium", ("cpu", "cuda")),
               "cudnn_deterministic": (True, ("cuda",)), "cudnn_benchmark": (True, ("cuda",)),
               "deterministic_algorithms": (True, ("cpu", "cuda"))}
    for name, (value, devices) in changed.items():
        with C.applied({**C.as_dict(C.DEFAULTS), name: value}):
            for d in ("cpu", "cuda"):
                why = C.mismatch(d)
                if d in devices:
                    assert why is not None and why.startswith(f"{name}="), (name, d, why)
                elif name not in ("float32_matmul_precision", "matmul_allow_tf32"):   # one setting in torch
                    assert why is None, (name, d, why)
        assert C.current() == C.DEFAULTS, name                   # restored
    # a manifest's record of them: absent = the defaults, round trip, malformed never matches
    assert C.from_dict(None) == C.DEFAULTS and C.from_dict(C.as_dict()) == C.DEFAULTS
    assert C.mismatch("cpu", C.from_dict("junk")) is not None
    f64 = C.from_dict({"default_dtype": "float64"})
    assert C.mismatch("cpu", f64) == "default_dtype=float32"


def test_kernel_meta_reads_verified_threads_defensively():
    from types import SimpleNamespace

    from aoti_farm.runtime.kernels import KernelTable

    sig = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(4), torch.empty(4)), {})
    call = SimpleNamespace(key=sig.key, sig=sig, device="cpu")
    runner = object()   # a Python runner: checked with itself
    cases = [({}, {1}), ({"verified_threads": [1, 2, 4]}, {1, 2, 4}), ({"verified_threads": "x"}, set()),
             ({"verified_threads": [0, True, 2.0, 3]}, {3})]
    for extra, threads in cases:
        entry = SimpleNamespace(manifest={"signature": sig.to_obj(), **extra})
        conds, got, msig, checker = KernelTable._meta(entry, call, runner, "cpu")
        assert got == frozenset(threads) and conds == S.conditions.DEFAULTS and msig == sig and checker is runner
    cuda = SimpleNamespace(key=sig.key, sig=sig, device="cuda")
    entry = SimpleNamespace(manifest={"signature": sig.to_obj(), "conditions": {"cudnn_allow_tf32": False}})
    conds, threads, _, _ = KernelTable._meta(entry, cuda, runner, "cuda:0")
    assert threads is None and S.conditions.mismatch("cuda", conds) == "cudnn_allow_tf32=True"


def test_key_command_names_the_serving_conditions(tmp_path, capsys):
    import json

    from aoti_farm.cli import main
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    sig = S.from_call(torch.ops.aten.leaky_relu.default, (torch.empty(4), -0.0), {})
    t = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig, 1, 0)]), t)
    assert main(["key", "--trace", str(t), "--index", "0", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["key"] == sig.key and ["arg1", ["f", -0.0]] in d["key_fields"]
    assert d["serving_conditions"]["default_dtype"] == "float32" and "threads" in d
    assert "deterministic_algorithms" in d["serving_conditions"]
    assert main(["key", "--trace", str(t), "--index", "0"]) == 0
    out = capsys.readouterr().out
    for name in ("default_dtype", "float32_matmul_precision", "deterministic_algorithms", "verified_threads",
                 '["f", -0.0]'):
        assert name in out, name
