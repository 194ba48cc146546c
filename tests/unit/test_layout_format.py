"""The memory format a tensor's strides suggest (aoti_farm.dynamic.shapes.memory_format) is torch's
own, size-1 dims included; verification compares it, and a shape class never mixes
tensors whose size-1 strides suggest different formats (the third pass's served-wrong
case: a channels-last ``[N, C, 1, 1]`` served contiguous-strided results)."""

from __future__ import annotations

import itertools
import random

import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format

from aoti_farm.dynamic import shapes
from aoti_farm.compile.tolerance import compare

NAMES = {torch.contiguous_format: "contiguous", torch.channels_last: "channels_last",
         torch.channels_last_3d: "channels_last_3d"}


def _cases(n: int = 400):
    rng = random.Random(0)
    for _ in range(n):
        rank = rng.choice((3, 4, 5))
        sizes = [rng.choice((0, 1, 1, 2, 3)) for _ in range(rank)]
        base = torch.empty(sizes)
        if rng.random() < 0.5:
            fmt = torch.channels_last if rank == 4 else torch.channels_last_3d if rank == 5 else None
            if fmt is not None:
                base = base.contiguous(memory_format=fmt)
        strides = list(base.stride())
        for d in range(rank):   # size-1 dims: any stride
            if sizes[d] == 1 and rng.random() < 0.5:
                strides[d] = rng.choice((0, 1, 2, 3, 6, 9))
        yield tuple(sizes), tuple(strides)


def test_memory_format_is_torchs_answer():
    for sizes, strides in _cases():
        t = torch.empty_strided(sizes, strides)
        assert shapes.memory_format(sizes, strides) == NAMES[suggest_memory_format(t)], (sizes, strides)


def test_memory_format_is_what_cpp_allocates_like():
    """The C++ answer, read off an op that allocates its output in the input's suggested
    format (upsample_nearest2d/3d): the output is laid out channels-last exactly when the
    input's strides say so."""
    seen = set()
    for sizes, strides in _cases():
        if len(sizes) not in (4, 5) or 0 in sizes:
            continue
        t = torch.empty_strided(sizes, strides).fill_(1.0)
        out = F.interpolate(t, size=(2,) * (len(sizes) - 2), mode="nearest")
        fmt = torch.channels_last if len(sizes) == 4 else torch.channels_last_3d
        as_contiguous = torch.empty(out.shape).stride()
        as_channels_last = torch.empty(out.shape, memory_format=fmt).stride()
        if as_contiguous == as_channels_last:
            continue   # C == 1: the output cannot tell
        assert out.stride() in (as_contiguous, as_channels_last), out.stride()
        want = "contiguous" if out.stride() == as_contiguous else NAMES[fmt]
        got = shapes.memory_format(sizes, strides)
        assert got == want, (sizes, strides, out.stride())
        seen.add(got)
    assert {"contiguous", "channels_last", "channels_last_3d"} <= seen


def test_compare_refuses_a_result_whose_size1_strides_suggest_another_format():
    c = 8
    eager = torch.sigmoid(torch.randn(2, c, 1, 1))                    # strides (C, 1, 1, 1)
    kernel = torch.empty_strided((2, c, 1, 1), (c, 1, c, c)).copy_(eager)
    assert eager.stride() == (c, 1, 1, 1)
    ev = compare(eager, [kernel])
    assert ev is not None and ev["problem"] == "memory format", ev
    assert ev["eager_format"] == "contiguous" and ev["kernel_format"] == "channels_last"
    # a size-1 stride that decides nothing is no difference
    same = torch.empty_strided((2, c, 1, 1), (c, 1, 1, 5)).copy_(eager)
    assert shapes.memory_format(same.shape, same.stride()) == "contiguous"
    assert compare(eager, [same]) is None


def test_a_class_never_mixes_size1_strides_of_another_format():
    c = 3
    contiguous = shapes.tensor_layout((5, c, 1, 1), (c, 1, 1, 1))
    channels_last = shapes.tensor_layout((5, c, 1, 1), (c, 1, c, c))
    assert contiguous is not None
    assert channels_last is None   # the strided class: its exact strides are the class's
    # dense tensors whose size-1 strides agree with their order's keep their class
    for sizes in itertools.product((1, 2, 3), repeat=4):
        t = torch.empty(sizes)
        assert shapes.tensor_layout(tuple(sizes), t.stride()) is not None


# --- precision on ill-conditioned inputs (tolerance.precision) ----------------------------------


def test_precision_refuses_a_kernel_less_accurate_than_eager_where_eager_is_accurate():
    from aoti_farm.compile.tolerance import precision

    truth = torch.tensor([0.967412, 0.5], dtype=torch.float64)
    eager = truth.float()
    kernel = torch.tensor([0.967580, 0.5])
    ev = precision(eager, [kernel], truth)
    assert ev is not None and ev["problem"] == "precision" and ev["first_index"] == 0, ev
    assert precision(eager, [eager.clone()], truth) is None
    # where eager itself is off by more than the tolerance, the output is not judged here
    off = torch.tensor([0.968, 0.5])
    assert precision(off, [kernel], truth) is None
    # non-finite positions are the edge cases' to judge
    assert precision(torch.tensor([float("inf"), 0.5]), [torch.tensor([1.0, 0.5])],
                     torch.tensor([float("inf"), 0.5], dtype=torch.float64)) is None


def test_precision_cases_are_ill_conditioned_and_finite():
    from aoti_farm.compile import adversarial
    from aoti_farm import signature as S

    sig = S.from_call(torch.ops.aten.mean.dim, (torch.empty(4, 64), [1]), {})
    args, kwargs = S.materialize(sig, seed=0)
    got = {n: a for n, a, _ in adversarial.cases(sig, args, kwargs) if n in adversarial.PRECISION_CASES}
    assert set(got) == set(adversarial.PRECISION_CASES) - {"diagonal cancellation"}   # not square
    off = got["large offset"][0]
    assert bool(torch.isfinite(off).all()) and float(off.mean()) > 2e4 and float(off.std()) < 10
    can = got["cancellation"][0]
    assert bool((can.abs() >= 1e4).all()) and float(can.double().sum(1).abs().max()) == 0.0
    srt = got["sorted cancellation"][0]   # each row: x then the same -x, so partial sums reach half its mass
    assert bool((srt.abs() >= 1e4).all()) and float(srt.double().sum(1).abs().max()) == 0.0
    assert bool((srt[:, :32] > 0).all()) and torch.equal(srt[:, 32:], -srt[:, :32])
    # a square input (trace): its diagonal cancels, a transposed one's too (strides kept)
    for x in (torch.empty(8, 8), torch.empty(2, 6, 6).transpose(1, 2)):
        sig = S.from_call(torch.ops.aten.trace.default if x.dim() == 2 else torch.ops.aten.sum.dim_IntList,
                          (x,) if x.dim() == 2 else (x, [1]), {})
        args, kwargs = S.materialize(sig, seed=0)
        cases = {n: a for n, a, _ in adversarial.cases(sig, args, kwargs)}
        d = cases["diagonal cancellation"][0]
        assert d.stride() == args[0].stride()
        diag = torch.diagonal(d.double(), dim1=-2, dim2=-1)
        assert float(diag.sum(-1).abs().max()) == 0.0 and bool((diag.abs() >= 1e4).all())
    # a 0-dim input beside a matrix (add(x, 0-dim)): every precision case is built
    sig = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(16, 16), torch.empty(())), {})
    args, kwargs = S.materialize(sig, seed=0)
    names = [n for n, _, _ in adversarial.cases(sig, args, kwargs)]
    assert [n for n in names if n in adversarial.PRECISION_CASES] == list(adversarial.PRECISION_CASES)
