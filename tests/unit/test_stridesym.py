"""aoti_farm/dynamic/stridesym.py: the graph of a shape class whose strides are symbols, and the
proof that what the trace assumed holds across the class (tracing only: fake tensors, no
compile; the compile and the verification are in tests/e2e/test_real_models.py)."""

from __future__ import annotations

import pytest
import torch

from aoti_farm.dynamic import shapes as SH, stridesym
from aoti_farm import signature as S
from aoti_farm.compile.runner import flat_tensors

from unit.test_shapes import T, add


def _decode_add_class():
    (c,), _ = SH.classes([add(T((1, 1), dt="int64"), T((2, 1), (n, 1), dt="int64")) for n in range(8, 40)])
    return c


def _inputs(cls):
    sig = cls.point(SH.export_point(cls))
    args, kwargs = S.materialize(sig)
    return sig, flat_tensors(sig, args, kwargs)


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *ts):
        return self.fn(*ts)


def test_the_decode_add_traces_with_a_symbolic_stride_constrained_to_its_range():
    c = _decode_add_class()
    _, tensors = _inputs(c)
    gm, fakes = stridesym.trace(c, _Fn(torch.add), tensors)
    st = fakes[1].stride()
    assert isinstance(st[0], torch.SymInt) and st[1] == 1 and tuple(fakes[1].size()) == (2, 1)
    env = fakes[1].fake_mode.shape_env
    vr = env.var_to_range[st[0].node.expr]
    assert (int(vr.lower), int(vr.upper)) == (8, 39)
    assert tuple(fakes[0].stride()) == (1, 1) and not env.guards
    assert any(n.target is torch.ops.aten.add.Tensor for n in gm.graph.nodes)


@pytest.mark.parametrize("branch,why", [
    (lambda st, hint: st > hint - 1, "does not hold across"),     # true at the hint, not at 8
    (lambda st, hint: st < hint + 1, "does not hold across"),     # true at the hint, not at 39
    (lambda st, hint: st == hint, "specialised"),                 # one value of the range
])
def test_an_assumption_that_does_not_hold_across_the_range_is_refused(branch, why):
    """A branch on the stride taken at the example's value (ShapeEnv narrows its own range
    to that side: the proof uses the class's range, not ShapeEnv's)."""
    c = _decode_add_class()
    _, tensors = _inputs(c)
    hint = tensors[1].stride(0)
    assert 8 < hint < 39
    with pytest.raises(stridesym.Unsupported, match=why):
        stridesym.trace(c, _Fn(lambda a, b: a + b if branch(b.stride(0), hint) else a - b), tensors)


def test_an_assumption_the_range_implies_is_kept():
    c = _decode_add_class()
    _, tensors = _inputs(c)
    stridesym.trace(c, _Fn(lambda a, b: a + b if b.stride(0) >= 8 else a - b), tensors)


def test_a_fixed_stride_of_a_tensor_of_symbolic_sizes_next_to_a_stride_symbol_is_refused():
    """ShapeEnv would make the fixed stride 4 a symbol (INFER_STRIDE with symbolic sizes):
    the class would be compiled more general than its pattern says, so it is refused (the
    members are compiled exactly)."""
    sigs = [S.Signature("aten::neg", (T((3, n, 2), (st, 4, 1)),)) for n, st in ((2, 40), (3, 90), (4, 160))]
    (c,), _ = SH.classes(sigs)
    assert c.dims == ((3, "s0", 2, "s1", 4, 1),) and c.stride_symbols == {"s1"}
    _, tensors = _inputs(c)
    with pytest.raises(stridesym.Unsupported, match="fixed size or stride 4"):
        stridesym.trace(c, _Fn(torch.neg), tensors)


def test_tied_sizes_may_be_unified_by_the_trace():
    """add needs both operands' rows equal: the trace unifies the two symbols, which the
    class ties (one name), so it is kept."""
    sigs = [add(T((n, 4), (st, 1)), T((n, 4))) for n, st in ((4, 40), (8, 90), (12, 160))]
    (c,), _ = SH.classes(sigs)
    assert c.dims == (("s0", 4, "s1", 1), ("s0", 4)) and c.stride_symbols == {"s1"}
    _, tensors = _inputs(c)
    gm, fakes = stridesym.trace(c, _Fn(torch.add), tensors)
    assert fakes[0].size(0) is not None
