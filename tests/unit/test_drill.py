"""Unit tests of the differential drill's own parts (runtime/drill.py): no compile, no
hook, no subprocess.  The drill is only as good as its comparison and its corpus: each
difference the drill must report is shown to be reported, and each case's adversarial
inputs are shown to hit the signature that was compiled."""

from __future__ import annotations

import math

import pytest
import torch

import aoti_farm
from aoti_farm.runtime import drill
from aoti_farm.trace import load_trace


def _case():
    return drill.Case("neg", "unary", lambda x: torch.neg(x), lambda dev: [])


@pytest.mark.parametrize("eager, served, needle", [
    (torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), "sign of zero"),
    (torch.tensor([math.nan, 1.0]), torch.tensor([math.inf, 1.0]), "eager has NaN"),
    (torch.tensor([math.inf, 1.0]), torch.tensor([1e30, 1.0]), "values"),
    (torch.tensor([9.0]), torch.tensor([10.0]), "eager 9.0, served 10.0"),
    (torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0]), "dtype"),
    (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 3.0], [2.0, 4.0]]).t(), "strides"),
    (torch.tensor([1, 2]), torch.tensor([1, 3]), "values"),
])
def test_compare_reports_each_difference(eager, served, needle):
    why = drill.compare(_case(), (), [eager], None, [served], None)
    assert why is not None and needle in why, why


def test_compare_accepts_eager_within_tolerance_and_nan_in_place():
    e = torch.tensor([1.0, math.nan, -math.inf, -0.0])
    assert drill.compare(_case(), (), [e], None, [e + torch.tensor([1e-7, 0, 0, -0.0])], None) is None


@pytest.mark.parametrize("eager_err, served_err, needle", [
    (("IndexError", "index out of range"), None, "eager raises IndexError"),
    (None, ("RuntimeError", "boom"), "served raises RuntimeError"),
    (("IndexError", "x"), ("RuntimeError", "y"), "eager raises IndexError, served raises RuntimeError"),
])
def test_compare_reports_error_differences(eager_err, served_err, needle):
    out = None if eager_err else [torch.ones(1)]
    got = None if served_err else [torch.ones(1)]
    why = drill.compare(_case(), (), out, eager_err, got, served_err)
    assert why is not None and needle in why, why
    assert drill.compare(_case(), (), None, ("IndexError", "a"), None, ("IndexError", "b")) is None


def test_decline_reasons_name_the_counter():
    assert drill.decline_reason({"fallbacks": {"requires_grad": 1}}) == "fallback: requires_grad"
    assert "failed signature" in drill.decline_reason({"failed_signatures": 1})
    assert "miss" in drill.decline_reason({"misses": 1})
    assert "not routed" in drill.decline_reason({})
    assert "kernel raised" in drill.decline_reason({"kernel_errors": 1, "misses": 1})


def test_corpus_covers_the_families_and_the_issue():
    names = " ".join(c.name for c in drill.corpus())
    for op in ("sigmoid", "exp f16", "neg int32", "leaky_relu slope -0.0", "leaky_relu slope 0.0", "0-dim",
               "Python", "lt ", "eq int32", "floor_divide f32", "rounding_mode=floor", "rounding_mode=trunc",
               "remainder f32", "floor_divide int32", "div true int32", "sum ", "mean ", "amax", "argmax",
               "var_mean f32 [2,32,64,64] dim (2,3) correction 1 keepdim", "cumsum", "native_layer_norm",
               "native_group_norm", "_logcumsumexp", "_softmax", "mm ", "addmm", "bmm", "convolution", "_slow_conv2d_forward", "max_pool2d", "avg_pool2d",
               "upsample_bilinear2d", "cat ", "stack ", "index_select", "embedding", "gather", "scatter",
               "index_add", "index_copy", "nll_loss", "searchsorted", "f16 0-dim * Python 1e5",
               "int8 0-dim + Python 200"):
        assert op in names, op
    quick = [c for c in drill.corpus() if c.quick]
    assert 8 <= sum(1 for c in quick if c.compile) <= 14


def test_every_variant_hits_the_recorded_signature(tmp_path):
    """Adversarial inputs are only a test of the compiled kernel if they share its key
    (globals aside: those change what the key should be)."""
    for i, c in enumerate(drill.corpus()):
        if not c.compile:
            continue
        keys = []
        for j, v in enumerate(c.variants("cpu")):
            p = tmp_path / f"{i}-{j}.json"
            with aoti_farm.record(p, devices=("cpu",)):
                drill.run_call(c, v.inputs, v.glob)
            keys.append(sorted(e.sig.key for e in load_trace(p).entries))
        if c.name.startswith("convolution"):
            pass   # CPU convolution: mkldnn_convolution is not recordable (the CUDA drill covers it)
        else:
            assert keys[0], f"{c.name}: nothing recorded"
        for v, k in zip(c.variants("cpu"), keys):
            if k:     # a call eager rejects before any op runs records nothing
                assert k == keys[0], f"{c.name}: variant {v.label!r} has another signature"


def test_wrong_values_name_the_inputs_that_differ():
    """A WRONG line shows inputs -> eager vs served for elementwise ops, so a colleague can
    reproduce it without the log."""
    case = drill.Case("floor_divide", "division", None, None, torch.ops.aten.floor_divide.default)
    a, b = torch.tensor([1.0, -math.inf, 2.0]), torch.tensor([0.1, -1.0, 1.0])
    served = torch.tensor([10.0, math.inf, 2.0])
    why = drill.compare(case, (a, b), [torch.floor_divide(a, b)], None, [served], None)
    assert "-> eager 9.0, served 10.0" in why and "(-inf, -1.0) -> eager nan, served inf" in why, why


def test_edges_of_the_finite_contract_are_told_from_real_differences():
    """Under ``finite`` a served call that differs from eager only in a zero's sign, or on a
    call with a non-finite input, is an edge (counted apart); any other difference stays
    WRONG, and under ``strict`` (``Plan.contract``) the run loop asks no edge class at all."""
    c = _case()
    x = torch.tensor([1.0, -2.0])
    assert drill.edge_class(c, (x,), [torch.tensor([0.0, 1.0])], [torch.tensor([-0.0, 1.0])]) == "sign of zero"
    assert drill.edge_class(c, (torch.tensor([math.inf, 1.0]),), [torch.tensor([math.inf, 1.0])],
                            [torch.tensor([math.nan, 1.0])]) == "non-finite inputs"
    # finite inputs: a wrong value, NaN where eager has a number, an infinity lost: real
    assert drill.edge_class(c, (x,), [torch.tensor([9.0])], [torch.tensor([10.0])]) is None
    assert drill.edge_class(c, (x,), [torch.tensor([1.0])], [torch.tensor([math.nan])]) is None
    assert drill.edge_class(c, (x,), [torch.tensor([math.inf])], [torch.tensor([1e30])]) is None
    # a call the hook must leave to eager is never an edge
    eager_only = drill.Case("neg", "unary", lambda t: torch.neg(t), lambda dev: [], compile=False)
    assert drill.edge_class(eager_only, (x,), [torch.tensor([0.0])], [torch.tensor([-0.0])]) is None
    assert drill.Plan().contract == "finite"
