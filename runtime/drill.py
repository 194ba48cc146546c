"""The differential drill: do served calls return what eager returns?

A corpus of op cases (one per op family the recorder supports, plus each known divergence
of a served kernel from eager: docs/verification.md) is recorded, compiled into a fresh
cache, then replayed under the serving hook
with ``serve="always"`` (so the speed gate hides no wrong kernel) and compared with eager
call by call: values within :mod:`aoti_farm.tolerance`, dtype, shape, strides, the sign of
zeros, NaN/inf positions, and errors (eager raises => the served call raises the same type).

Each case has a random input set (the one recorded and compiled) and adversarial sets of
the same signature (signed zeros, +-inf, NaN, exact quotients 1.0 / 0.1, huge and tiny
magnitudes, integer extremes, indices at the bounds, negative and out of range), some under
a changed global (``torch.set_default_dtype(torch.float64)``, TF32 on CUDA).  Every set
runs at each thread count asked for (1, 2 and ``os.cpu_count()`` by default), under the hook
on the native hit path (``native="auto"``) and on the Python one (``native="off"``), and
once under ``aoti_farm.record``.  Cases marked ``compile=False`` are calls the hook must
leave to eager (a Python number next to 0-dim tensors): they check that an unserved call is
eager's own call.

Served or not is read from :meth:`Hook.stats` around each call (``hits``; otherwise the
fallback reason, miss, failed signature, gate or kernel error: ``runtime/hookstats.py``).

The replay runs in child processes: a wrong kernel reading out of bounds may crash its
process, and the drill must then report the case as wrong and go on.  Used by
``scripts/drill_differential.py`` (the full drill) and ``tests/e2e/test_drill_differential.py``
(its quick form).  Nothing here imports Ray: the full drill compiles through ``python -m
aoti_farm warm`` in a child.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from aoti_farm import spawn

INF, NAN = math.inf, math.nan

SERVED, DECLINED, WRONG = "served-equal", "declined", "WRONG"
#: A served call that differs from eager only where the contract in force does not call it
#: a difference (docs/verification.md, "The contract"): under ``finite`` (the default) the
#: sign of a zero result, and any result of a call with a non-finite input.  Counted apart,
#: never as equal; under ``strict`` (``Plan.contract``) such a call is WRONG.
EDGE = "served-edge"


def _non_finite(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and x.numel() > 0 and not bool(torch.isfinite(x).all())
    if isinstance(x, (list, tuple)):
        return any(_non_finite(y) for y in x)
    return isinstance(x, float) and not math.isfinite(x)


def edge_class(case: "Case", inputs: tuple, eager: list, got: list) -> str | None:
    """Where a served result differs from eager's (``compare`` said so) only as the finite
    contract allows, the class of that edge ("non-finite inputs", "sign of zero"); None
    for a real difference.  Errors and unserved calls never reach here."""
    from aoti_farm.tolerance import compare as tol_compare

    if not case.compile or len(eager) != len(got):
        return None
    if _non_finite(inputs):
        return "non-finite inputs"
    if tol_compare(eager, got, _extra(case, inputs, eager), zero_sign=False) is not None:
        return None
    for e, g in zip(eager, got):
        if e.is_floating_point():
            ec, gc = e.detach().cpu(), g.detach().cpu()
            if not (torch.equal(torch.isnan(ec), torch.isnan(gc)) and torch.equal(torch.isinf(ec), torch.isinf(gc))):
                return None
    return "sign of zero"

#: Floating specials: signed zeros, infinities, NaN, exact quotients, huge and tiny values.
F_SPECIALS = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.1, -0.1, 3.0, 5.0, 0.5, 1e30, -1e30, 1e-30, -1e-38]
F16_SPECIALS = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.1, -0.1, 3.0, 5.0, 0.5, 6e4, -6e4, 1e-7, -6e-8]


def i_specials(dtype) -> list[int]:
    ii = torch.iinfo(dtype)
    return [ii.min, ii.max, 0, -1, 1, 7, -7, 2, ii.min + 1, ii.max - 1, 3, -3, 100, -100, 5, -5]


# -- input builders ----------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape, dtype=torch.float32, seed=0, device="cpu"):
    return torch.randn(shape, generator=_gen(seed), dtype=torch.float32).to(dtype).to(device)


def randint(lo, hi, shape, dtype=torch.int64, seed=0, device="cpu"):
    return torch.randint(lo, hi, shape, generator=_gen(seed), dtype=torch.int64).to(dtype).to(device)


def fill(values, shape, dtype, device="cpu"):
    """``values`` cycled over ``shape``."""
    n = math.prod(shape)
    vals = [values[i % len(values)] for i in range(n)]
    return torch.tensor(vals, dtype=torch.float64 if dtype.is_floating_point else torch.int64).to(dtype).reshape(
        shape).to(device)


def pairs(values, dtype, device="cpu"):
    """(a, b), both [n, n]: every (values[i], values[j]) combination once."""
    n = len(values)
    a = fill([values[i // n] for i in range(n * n)], (n, n), dtype, device)
    b = fill([values[i % n] for i in range(n * n)], (n, n), dtype, device)
    return a, b


@dataclass
class Variant:
    label: str
    inputs: tuple
    glob: str | None = None        # a global changed around eager and served alike (GLOBALS)


@dataclass
class Case:
    name: str
    family: str
    call: Callable                  # call(*inputs) -> tensor | tuple of tensors
    variants: Callable              # variants(device) -> [Variant]; the first is the recorded one
    op: Any = None                  # the aten op, for the length-scaled tolerance
    compile: bool = True            # False: a call the hook must leave to eager
    quick: bool = False
    devices: tuple = ("cpu", "cuda")


@contextlib.contextmanager
def _default_dtype(dt):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _tf32(on: bool):
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


GLOBALS = {None: contextlib.nullcontext, "default_dtype=float64": lambda: _default_dtype(torch.float64),
           "tf32=on": lambda: _tf32(True), "tf32=off": lambda: _tf32(False)}

aten = torch.ops.aten


def _float_unary(shape, dtype, specials, seed, extra=()):
    def v(dev):
        return [Variant("random", (randn(shape, dtype, seed, dev),)),
                Variant("specials", (fill(specials, shape, dtype, dev),)), *[x(dev) for x in extra]]
    return v


def _binary_pairs(dtype, seed, specials=None, zero_div=False):
    """Random [n, n] operands, then every pair of specials (integers: without, then with, a
    zero divisor: a zero anywhere makes eager raise for the whole call)."""
    def v(dev):
        if dtype.is_floating_point:
            sp = specials or (F16_SPECIALS if dtype == torch.float16 else F_SPECIALS)
            n = len(sp)
            out = [Variant("random", (randn((n, n), dtype, seed, dev), randn((n, n), dtype, seed + 1, dev))),
                   Variant("specials x specials", pairs(sp, dtype, dev))]
            return out
        sp = i_specials(dtype)
        n = len(sp)
        a, b = pairs(sp, dtype, dev)
        nz = b.clone()
        nz[nz == 0] = 1
        r = randint(-50, 50, (n, n), dtype, seed, dev), randint(1, 20, (n, n), dtype, seed + 1, dev)
        out = [Variant("random", r), Variant("int extremes, no zero divisor", (a, nz))]
        if zero_div and dev == "cpu":   # CUDA integer division by zero raises nothing: undefined
            out.append(Variant("zero divisor", (a, b)))
            out.append(Variant("random after error", r))
        return out
    return v


def _index_variants(n_rows, make, seed=0):
    """Index inputs: random in range, at the bounds, negative, out of range (then a random
    one again: a kernel must not be dropped because eager rejected a call)."""
    def v(dev):
        out = [Variant("random", make(dev, None)), Variant("index at bounds", make(dev, "bounds"))]
        if dev == "cpu":   # on CUDA eager's bounds check is a device-side assert: the context is lost
            out += [Variant("negative index", make(dev, "neg")), Variant("index out of range", make(dev, "oob")),
                    Variant("random after error", make(dev, None))]
        return out
    return v


def _idx(kind, n_rows, shape, dev, seed=3):
    t = randint(0, n_rows, shape, torch.int64, seed)
    flat = t.flatten()
    if kind == "bounds":
        flat[0], flat[-1] = 0, n_rows - 1
    elif kind == "neg":
        flat[-1] = -1
    elif kind == "oob":
        flat[-1] = n_rows
    return flat.reshape(shape).to(dev)


def _uniq_idx(kind, n_rows, k, dev):
    t = torch.randperm(n_rows, generator=_gen(5))[:k].clone()
    if kind == "bounds":
        t[0], t[-1] = 0, n_rows - 1
    elif kind == "neg":
        t[-1] = -1
    elif kind == "oob":
        t[-1] = n_rows
    return t.to(dev)


def corpus() -> list[Case]:
    """Every op family the recorder supports, and each known divergence from eager
    (docs/verification.md)."""
    f32, f16, i32, i64, i8 = torch.float32, torch.float16, torch.int32, torch.int64, torch.int8
    C = []

    def case(*a, **k):
        C.append(Case(*a, **k))

    # -- elementwise unary (float32, float16, int) ---------------------------------------------
    case("sigmoid f32 [16,16]", "unary", lambda x: aten.sigmoid.default(x), _float_unary((16, 16), f32, F_SPECIALS, 1),
         aten.sigmoid.default)
    case("exp f16 [16,16]", "unary", lambda x: aten.exp.default(x), _float_unary((16, 16), f16, F16_SPECIALS, 2),
         aten.exp.default)
    case("sigmoid int64 [8,8] (default dtype)", "unary/global", lambda x: aten.sigmoid.default(x),
         lambda dev: [Variant("random", (randint(-10, 10, (8, 8), i64, 3, dev),)),
                      Variant("int extremes", (fill(i_specials(i64), (8, 8), i64, dev),)),
                      Variant("random", (randint(-10, 10, (8, 8), i64, 3, dev),), "default_dtype=float64")],
         aten.sigmoid.default, quick=True)
    case("neg int32 [16,16]", "unary", lambda x: aten.neg.default(x),
         lambda dev: [Variant("random", (randint(-50, 50, (16, 16), i32, 4, dev),)),
                      Variant("int extremes", (fill(i_specials(i32), (16, 16), i32, dev),))], aten.neg.default)
    for slope, quick in ((0.0, True), (-0.0, True)):
        case(f"leaky_relu slope {slope!r} [16,16]", "unary/signed zero",
             (lambda s: lambda x: aten.leaky_relu.default(x, s))(slope),
             lambda dev: [Variant("random", (randn((16, 16), f32, 5, dev),)),
                          Variant("negatives and signed zeros", (fill([-1.0, -0.0, 0.0, -2.5, -INF, 1.0], (16, 16),
                                                                       f32, dev),))],
             aten.leaky_relu.default, quick=quick)
    # -- elementwise binary, 0-dim and Python scalars -------------------------------------------
    case("add f32 [16,16]+[16,16]", "binary", lambda a, b: aten.add.Tensor(a, b), _binary_pairs(f32, 10),
         aten.add.Tensor)
    case("mul f32 [16,16]*[16,16]", "binary", lambda a, b: aten.mul.Tensor(a, b), _binary_pairs(f32, 11),
         aten.mul.Tensor, quick=True)
    case("mul f16 [16,16]*[16,16]", "binary", lambda a, b: aten.mul.Tensor(a, b), _binary_pairs(f16, 12),
         aten.mul.Tensor)
    case("add f32 [16,16] + 0-dim f32", "binary/0-dim", lambda a, b: aten.add.Tensor(a, b),
         lambda dev: [Variant("random", (randn((16, 16), f32, 13, dev), randn((), f32, 14, dev))),
                      Variant("specials + -0.0", (fill(F_SPECIALS, (16, 16), f32, dev), torch.tensor(-0.0, device=dev))),
                      Variant("specials + inf", (fill(F_SPECIALS, (16, 16), f32, dev), torch.tensor(INF, device=dev)))],
         aten.add.Tensor, quick=True)
    case("mul f32 [16,16] * Python 2.5", "binary/Python scalar", lambda a: a * 2.5,
         lambda dev: [Variant("random", (randn((16, 16), f32, 15, dev),)),
                      Variant("specials", (fill(F_SPECIALS, (16, 16), f32, dev),))], aten.mul.Tensor, compile=False)
    case("mul f16 0-dim * Python 1e5 (unserved)", "binary/unserved", lambda a: a * 1e5,
         lambda dev: [Variant("0.0010006", (torch.tensor(0.0010006, dtype=f16, device=dev),))], aten.mul.Tensor,
         compile=False, quick=True)
    case("mul f16 0-dim * Python 0.1 (unserved)", "binary/unserved", lambda a: a * 0.1,
         lambda dev: [Variant("3.0", (torch.tensor(3.0, dtype=f16, device=dev),))], aten.mul.Tensor,
         compile=False, quick=True)
    case("add int8 0-dim + Python 200 (unserved)", "binary/unserved", lambda a: a + 200,
         lambda dev: [Variant("3", (torch.tensor(3, dtype=i8, device=dev),))], aten.add.Tensor,
         compile=False, quick=True)
    # -- comparison ----------------------------------------------------------------------------
    case("lt f32 [16,16]", "comparison", lambda a, b: aten.lt.Tensor(a, b), _binary_pairs(f32, 16), aten.lt.Tensor)
    case("eq int32 [16,16]", "comparison", lambda a, b: aten.eq.Tensor(a, b), _binary_pairs(i32, 17), aten.eq.Tensor)
    # -- floor division, remainder, rounding modes ---------------------------------------------
    case("floor_divide f32 [16,16]", "division", lambda a, b: aten.floor_divide.default(a, b),
         _binary_pairs(f32, 20), aten.floor_divide.default, quick=True)
    case("div rounding_mode=floor f32 [16,16]", "division", lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="floor"),
         _binary_pairs(f32, 21), aten.div.Tensor_mode)
    case("div rounding_mode=trunc f32 [16,16]", "division", lambda a, b: aten.div.Tensor_mode(a, b, rounding_mode="trunc"),
         _binary_pairs(f32, 22), aten.div.Tensor_mode)
    case("remainder f32 [16,16]", "division", lambda a, b: aten.remainder.Tensor(a, b), _binary_pairs(f32, 23),
         aten.remainder.Tensor, quick=True)
    case("floor_divide int32 [16,16]", "division/int", lambda a, b: aten.floor_divide.default(a, b),
         _binary_pairs(i32, 24, zero_div=True), aten.floor_divide.default, quick=True)
    case("remainder int32 [16,16]", "division/int", lambda a, b: aten.remainder.Tensor(a, b),
         _binary_pairs(i32, 25, zero_div=True), aten.remainder.Tensor)

    def _int_div(dev):
        v = _binary_pairs(i32, 26)(dev)
        return v + [Variant("random", v[0].inputs, "default_dtype=float64")]
    case("div true int32/int32 (default dtype)", "division/global", lambda a, b: aten.div.Tensor(a, b), _int_div,
         aten.div.Tensor, quick=True)
    # -- reductions ----------------------------------------------------------------------------
    red = _float_unary((64, 256), f32, F_SPECIALS, 30)
    case("sum f32 [64,256] dim 1", "reduction", lambda x: aten.sum.dim_IntList(x, [1]), red, aten.sum.dim_IntList)
    case("mean f32 [64,256] dim 1", "reduction", lambda x: aten.mean.dim(x, [1]), red, aten.mean.dim)
    case("amax f32 [64,256] dim 1", "reduction", lambda x: aten.amax.default(x, [1]), red, aten.amax.default)
    case("argmax f32 [64,256] dim 1", "reduction", lambda x: aten.argmax.default(x, 1), red, aten.argmax.default)
    case("var_mean f32 [2,32,64,64] dim (2,3) correction 1 keepdim (U-Net)", "reduction",
         lambda x: aten.var_mean.correction(x, [2, 3], correction=1, keepdim=True),
         lambda dev: [Variant("random", (randn((2, 32, 64, 64), f32, 31, dev) * 3 + 1,)),
                      Variant("specials", (fill(F_SPECIALS, (2, 32, 64, 64), f32, dev),))],
         aten.var_mean.correction, quick=True)
    case("var_mean f32 [64,256] dim 1 correction 0", "reduction",
         lambda x: aten.var_mean.correction(x, [1], correction=0, keepdim=False), red, aten.var_mean.correction)
    # -- scans ---------------------------------------------------------------------------------
    case("cumsum f32 [8,1024] dim 1", "scan", lambda x: aten.cumsum.default(x, 1),
         _float_unary((8, 1024), f32, F_SPECIALS, 40), aten.cumsum.default)
    case("_logcumsumexp f32 [8,256] dim 1", "scan", lambda x: aten._logcumsumexp.default(x, 1),
         _float_unary((8, 256), f32, F_SPECIALS, 41), aten._logcumsumexp.default)
    # -- norms, softmax ------------------------------------------------------------------------
    case("native_layer_norm f32 [8,64]", "norm",
         lambda x, w, b: aten.native_layer_norm.default(x, [64], w, b, 1e-5),
         lambda dev: [Variant("random", (randn((8, 64), f32, 50, dev), randn(64, f32, 51, dev), randn(64, f32, 52, dev))),
                      Variant("specials", (fill(F_SPECIALS, (8, 64), f32, dev), randn(64, f32, 51, dev),
                                           randn(64, f32, 52, dev)))], aten.native_layer_norm.default)
    case("native_group_norm f32 [2,32,16,16] 8 groups", "norm",
         lambda x, w, b: aten.native_group_norm.default(x, w, b, 2, 32, 256, 8, 1e-5),
         lambda dev: [Variant("random", (randn((2, 32, 16, 16), f32, 53, dev), randn(32, f32, 54, dev),
                                         randn(32, f32, 55, dev))),
                      Variant("specials", (fill(F_SPECIALS, (2, 32, 16, 16), f32, dev), randn(32, f32, 54, dev),
                                           randn(32, f32, 55, dev)))], aten.native_group_norm.default)
    case("_softmax f32 [8,128] dim -1", "softmax", lambda x: aten._softmax.default(x, -1, False),
         _float_unary((8, 128), f32, F_SPECIALS, 56), aten._softmax.default)
    # -- matrix products -----------------------------------------------------------------------
    def _mm(shapes, seed):
        def v(dev):
            r = tuple(randn(s, f32, seed + i, dev) for i, s in enumerate(shapes))
            sp = tuple(fill(F_SPECIALS[i:] + F_SPECIALS[:i], s, f32, dev) for i, s in enumerate(shapes))
            out = [Variant("random", r), Variant("specials", sp)]
            if dev == "cuda":
                out.append(Variant("random", r, "tf32=on"))
            return out
        return v
    case("mm f32 [32,64]x[64,32]", "matmul", lambda a, b: aten.mm.default(a, b), _mm([(32, 64), (64, 32)], 60),
         aten.mm.default)
    case("addmm f32 [32]+[32,64]x[64,32]", "matmul", lambda c, a, b: aten.addmm.default(c, a, b),
         _mm([(32,), (32, 64), (64, 32)], 62), aten.addmm.default)
    case("bmm f32 [4,16,32]x[4,32,16]", "matmul", lambda a, b: aten.bmm.default(a, b),
         _mm([(4, 16, 32), (4, 32, 16)], 65), aten.bmm.default)
    # -- convolution, pooling, upsampling ------------------------------------------------------
    case("convolution f32 [2,8,16,16] w[16,8,3,3] pad 1", "conv",
         lambda x, w, b: aten.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
         _mm([(2, 8, 16, 16), (16, 8, 3, 3), (16,)], 70), aten.convolution.default)
    # on CPU, convolution reaches mkldnn_convolution, which the recorder cannot serve; with
    # mkldnn off (or no mkldnn) it reaches _slow_conv2d_forward, which it can
    case("_slow_conv2d_forward f32 [2,8,16,16] w[16,8,3,3] pad 1", "conv",
         lambda x, w, b: aten._slow_conv2d_forward.default(x, w, [3, 3], b, [1, 1], [1, 1]),
         _mm([(2, 8, 16, 16), (16, 8, 3, 3), (16,)], 71), aten._slow_conv2d_forward.default, devices=("cpu",))
    case("max_pool2d_with_indices f32 [2,8,16,16] k2", "pool",
         lambda x: aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2]),
         _float_unary((2, 8, 16, 16), f32, F_SPECIALS, 73), aten.max_pool2d_with_indices.default)
    case("avg_pool2d f32 [2,8,16,16] k2", "pool", lambda x: aten.avg_pool2d.default(x, [2, 2], [2, 2]),
         _float_unary((2, 8, 16, 16), f32, F_SPECIALS, 74), aten.avg_pool2d.default)
    case("upsample_bilinear2d f32 [2,8,8,8]->16x16", "upsample",
         lambda x: aten.upsample_bilinear2d.default(x, [16, 16], False),
         _float_unary((2, 8, 8, 8), f32, F_SPECIALS, 75), aten.upsample_bilinear2d.default)
    # -- cat / stack ---------------------------------------------------------------------------
    cat_v = _binary_pairs(f32, 80)
    case("cat f32 2x[16,16] dim 1", "cat", lambda a, b: aten.cat.default([a, b], 1), cat_v, aten.cat.default)
    case("stack f32 2x[16,16] dim 0", "cat", lambda a, b: aten.stack.default([a, b], 0), cat_v, aten.stack.default)
    # -- index ops -----------------------------------------------------------------------------
    case("index_select f32 [16,8] dim 0 idx[5]", "index",
         lambda x, i: aten.index_select.default(x, 0, i),
         _index_variants(16, lambda dev, k: (randn((16, 8), f32, 90, dev), _idx(k, 16, (5,), dev))),
         aten.index_select.default, quick=True)
    case("embedding f32 w[16,8] idx[4,5]", "index", lambda w, i: aten.embedding.default(w, i),
         _index_variants(16, lambda dev, k: (randn((16, 8), f32, 91, dev), _idx(k, 16, (4, 5), dev))),
         aten.embedding.default)
    case("gather f32 [8,16] dim 1 idx[8,4]", "index", lambda x, i: aten.gather.default(x, 1, i),
         _index_variants(16, lambda dev, k: (randn((8, 16), f32, 92, dev), _idx(k, 16, (8, 4), dev))),
         aten.gather.default)
    case("scatter.src f32 [8,16] dim 1 idx[8,4]", "index", lambda x, i, s: aten.scatter.src(x, 1, i, s),
         _index_variants(16, lambda dev, k: (randn((8, 16), f32, 93, dev), _idx(k, 16, (8, 4), dev),
                                             randn((8, 4), f32, 94, dev))), aten.scatter.src)
    case("index_add f32 [16,8] dim 0 idx[5]", "index", lambda x, i, s: aten.index_add.default(x, 0, i, s),
         _index_variants(16, lambda dev, k: (randn((16, 8), f32, 95, dev), _uniq_idx(k, 16, 5, dev),
                                             randn((5, 8), f32, 96, dev))), aten.index_add.default)
    case("index_copy f32 [16,8] dim 0 idx[5]", "index", lambda x, i, s: aten.index_copy.default(x, 0, i, s),
         _index_variants(16, lambda dev, k: (randn((16, 8), f32, 97, dev), _uniq_idx(k, 16, 5, dev),
                                             randn((5, 8), f32, 98, dev))), aten.index_copy.default)

    def _nll(dev, k):
        t = _idx(k, 10, (8,), dev, seed=7)
        if k == "bounds":
            t[1] = -100     # the default ignore_index
        return (torch.log_softmax(randn((8, 10), f32, 99, dev), 1), t)
    case("nll_loss_forward f32 [8,10] mean", "index", lambda x, t: aten.nll_loss_forward.default(x, t, None, 1, -100),
         _index_variants(10, _nll), aten.nll_loss_forward.default)

    def _ss(dev):
        seq = randn(64, f32, 100, dev)
        srt = torch.argsort(seq)
        vals = randn(32, f32, 101, dev)
        sp = fill(F_SPECIALS, (32,), f32, dev)
        return [Variant("random", (seq, vals, srt)), Variant("specials", (seq, sp, srt))]
    case("searchsorted f32 seq[64] v[32] sorter=", "search",
         lambda s, v, o: aten.searchsorted.Tensor(s, v, sorter=o), _ss, aten.searchsorted.Tensor, quick=True)
    return C


# -- comparing one call --------------------------------------------------------------------------


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_call(case: Case, inputs: tuple, glob: str | None):
    """(outputs, None) or (None, exception type name and message)."""
    with GLOBALS[glob]():
        try:
            out = case.call(*inputs)
            if any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- eager's own errors are part of the comparison
            return None, (type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in _as_list(out)], None


def _extra(case: Case, inputs: tuple, expected) -> tuple[float, float]:
    from aoti_farm import signature as S
    from aoti_farm.tolerance import length_tolerance

    if case.op is None or not all(isinstance(t, torch.Tensor) for t in inputs):
        return 0.0, 0.0
    try:
        args = _aten_args(case, inputs)
        if args is None:
            return 0.0, 0.0
        sig = S.from_call(case.op, args, {})
        return length_tolerance(sig, args, {}, expected)
    except Exception:  # noqa: BLE001 -- no extra tolerance: the dtype's own
        return 0.0, 0.0


def _aten_args(case: Case, inputs: tuple):
    """The positional aten arguments of the cases the tolerance scales (scans, sums, matrix
    products): their calls pass exactly these."""
    op = case.op
    if op in (aten.cumsum.default,):
        return (inputs[0], 1)
    if op in (aten.sum.dim_IntList,):
        return (inputs[0], [1])
    if op in (aten.mm.default, aten.bmm.default, aten.addmm.default):
        return tuple(inputs)
    return None


def compare(case: Case, inputs: tuple, eager, eager_err, got, got_err) -> str | None:
    """None when the served result is eager's, else what differs."""
    if eager_err or got_err:
        if eager_err and got_err:
            return None if eager_err[0] == got_err[0] else f"eager raises {eager_err[0]}, served raises {got_err[0]}: {got_err[1]}"
        if eager_err:
            return f"eager raises {eager_err[0]} ({eager_err[1]}), served returned a result"
        return f"served raises {got_err[0]} ({got_err[1]}), eager returned a result"
    if not case.compile:
        return compare_bytes(eager, got)
    return compare_outputs(case, inputs, eager, got)


def compare_bytes(eager: list, got: list) -> str | None:
    """An unserved call is eager's own call: the same dtype, shape, strides and bytes."""
    if len(eager) != len(got):
        return f"{len(got)} outputs, eager {len(eager)}"
    for n, (e, g) in enumerate(zip(eager, got)):
        for what, a, b in (("dtype", e.dtype, g.dtype), ("shape", list(e.shape), list(g.shape)),
                           ("strides", e.stride(), g.stride())):
            if a != b:
                return f"output {n}: {what}: eager {a}, served {b}"
        eb, gb = e.detach().cpu().contiguous(), g.detach().cpu().contiguous()
        if not torch.equal(eb.reshape(-1).view(torch.uint8), gb.reshape(-1).view(torch.uint8)):
            return f"output {n}: not eager's bytes: eager {eb.flatten()[:4].tolist()}, served {gb.flatten()[:4].tolist()}"
    return None


def compare_outputs(case: Case, inputs: tuple, eager: list, got: list) -> str | None:
    from aoti_farm.tolerance import compare as tol_compare

    if len(eager) != len(got):
        return f"{len(got)} outputs, eager {len(eager)}"
    extra = _extra(case, inputs, eager)
    ev = tol_compare(eager, got, extra)
    if ev is not None:
        return _evidence_text(ev, eager, got) + _examples(inputs, eager, got, ev.get("output", 0), extra)
    for n, (e, g) in enumerate(zip(eager, got)):
        if e.is_floating_point():
            ec, gc = e.detach().cpu(), g.detach().cpu()
            both0 = (ec == 0) & (gc == 0)
            diff = both0 & (torch.signbit(ec) != torch.signbit(gc))
            if bool(diff.any()):
                i = int(diff.flatten().nonzero()[0])
                return (f"output {n}: sign of zero at flat index {i}: eager {float(ec.flatten()[i])!r}, "
                        f"served {float(gc.flatten()[i])!r}")
            for what, f in (("NaN", torch.isnan), ("inf", torch.isinf)):
                if not torch.equal(f(ec), f(gc)):
                    return f"output {n}: {what} positions differ"
    return None


def _examples(inputs: tuple, eager: list, got: list, n: int, extra: tuple[float, float], k: int = 3) -> str:
    """Up to ``k`` differing elements of output ``n`` as ``op inputs -> eager vs served``
    (the inputs shown where they have the output's shape: elementwise ops)."""
    from aoti_farm.tolerance import TOLERANCES

    if n >= len(eager) or n >= len(got) or eager[n].shape != got[n].shape or eager[n].dtype != got[n].dtype:
        return ""
    e, g = eager[n].detach().cpu(), got[n].detach().cpu()
    if e.dtype in TOLERANCES and not e.is_complex():
        rtol, atol = TOLERANCES[e.dtype]
        bad = ~torch.isclose(g.double(), e.double(), rtol=rtol + extra[0], atol=atol + extra[1], equal_nan=True)
    else:
        bad = e != g
    # differing finite values first (1.0 // 0.1), then the ones involving NaN or inf
    finite = (torch.isfinite(e) & torch.isfinite(g)) if e.is_floating_point() else torch.ones_like(bad)
    idx = (bad & finite).flatten().nonzero().flatten().tolist() + (bad & ~finite).flatten().nonzero().flatten().tolist()
    shown, seen = [], set()
    for i in idx:
        ins = tuple(float(t.detach().cpu().flatten()[i]) if t.dtype.is_floating_point else int(t.detach().cpu().flatten()[i])
                    for t in inputs if isinstance(t, torch.Tensor) and t.shape == e.shape)
        if ins in seen:
            continue
        seen.add(ins)
        shown.append(f"({', '.join(map(repr, ins))}) -> eager {e.flatten()[i].item()!r}, served {g.flatten()[i].item()!r}"
                     if ins else f"[{i}] eager {e.flatten()[i].item()!r}, served {g.flatten()[i].item()!r}")
        if len(shown) == k:
            break
    return f"; e.g. {'; '.join(shown)}" if shown else ""


def _evidence_text(ev: dict, eager, got) -> str:
    p = ev.get("problem")
    o = ev.get("output", 0)
    if p == "values":
        s = f"output {o}: values at {ev.get('mismatched')}/{ev.get('numel')}"
        if "eager" in ev:
            s += f", first flat index {ev['first_index']}: eager {ev['eager']!r}, served {ev['kernel']!r}"
            if ev.get("max_abs_err") is not None and not (isinstance(ev["max_abs_err"], float) and math.isnan(ev["max_abs_err"])):
                s += f", max abs err {ev['max_abs_err']:.4g}"
        else:
            e, g = eager[o].flatten(), got[o].flatten()
            i = ev.get("first_index", 0)
            s += f", first flat index {i}: eager {e[i].item()!r}, served {g[i].item()!r}"
        return s
    if "eager" in ev:
        return f"output {o}: {p}: eager {ev['eager']}, served {ev['kernel']}"
    return f"output {o}: {p}"


# -- the replay in a child process ----------------------------------------------------------------


def _delta(before: dict, after: dict) -> dict:
    d = {}
    for k in ("hits", "misses", "failed_signatures", "gated", "gate_pending", "kernel_errors",
              "kernels_dropped", "load_errors", "load_unsafe", "integrity_failures"):
        x = after.get(k, 0) - before.get(k, 0)
        if x:
            d[k] = x
    fb = {r: n - before.get("fallbacks", {}).get(r, 0) for r, n in after.get("fallbacks", {}).items()}
    fb = {r: n for r, n in fb.items() if n}
    if fb:
        d["fallbacks"] = fb
    return d


def decline_reason(d: dict) -> str:
    """Why a call was not served, from the hook's counters around it (runtime/hookstats.py)."""
    parts = []
    if d.get("fallbacks"):
        parts += [f"fallback: {r}" for r in sorted(d["fallbacks"])]
    if d.get("failed_signatures"):
        parts.append("failed signature (no servable kernel: compile refused or failed)")
    if d.get("kernel_errors"):
        parts.append("kernel raised; dropped")
    elif d.get("kernels_dropped"):
        parts.append("kernel dropped")
    if d.get("load_errors") or d.get("load_unsafe") or d.get("integrity_failures"):
        parts.append("kernel not loadable")
    if d.get("gated") or d.get("gate_pending"):
        parts.append("speed gate")
    if d.get("misses") and not parts:
        parts.append("miss: no entry for this signature")
    return "; ".join(parts) or "not routed to the hook (op has no servable entry)"


def child_main(spec_path: str) -> int:
    """Replay the cases named in the spec under one hook mode and write one JSON line per
    call (after a ``begin`` line per case: the parent names a case whose call crashed us)."""
    import warnings

    warnings.filterwarnings("ignore")
    with open(spec_path) as f:
        spec = json.load(f)
    dev, mode, threads = spec["device"], spec["mode"], spec["threads"]
    contract = spec.get("contract", "finite")
    cases = {c.name: c for c in corpus()}
    todo = [cases[n] for n in spec["cases"] if n not in set(spec.get("skip", []))]
    out = open(spec["out"], "a", buffering=1)
    # eager first, with no hook installed, at each thread count
    plan = []
    for c in todo:
        for vi, v in enumerate(c.variants(dev)):
            for t in threads:
                torch.set_num_threads(t)
                e, ee = run_call(c, v.inputs, v.glob)
                plan.append((c, vi, v, t, e, ee))
    from aoti_farm.runtime import Settings, install

    hook = install(cache_dir=spec["cache_dir"], devices=(dev,), on_miss="ignore", serve="always", contract=contract,
                   settings=Settings(native=mode, poll_interval=3600.0))
    try:
        current = None
        served_before: dict[str, bool] = {}
        for c, vi, v, t, e, ee in plan:
            if c.name != current:
                current = c.name
                out.write(json.dumps({"begin": c.name}) + "\n")
            torch.set_num_threads(t)
            before = hook.stats()
            g, ge = run_call(c, v.inputs, v.glob)
            if dev == "cuda":
                torch.cuda.synchronize()
            d = _delta(before, hook.stats())
            served = bool(d.get("hits"))
            why = compare(c, v.inputs, e, ee, g, ge)
            rec = {"case": c.name, "mode": f"native={mode}", "variant": v.label, "glob": v.glob, "threads": t,
                   "served": served, "counters": d, "eager_error": ee and ee[0], "served_error": ge and ge[0]}
            if why is None and ee is None and d.get("kernel_errors"):
                why = ("the served kernel raised on a call eager accepts (the hook fell back to eager and "
                       "dropped the kernel)")
            edge = (edge_class(c, v.inputs, e, g) if why is not None and served and ee is None and ge is None
                    and contract == "finite" else None)
            if edge is not None:
                rec.update(status=EDGE, why=f"{edge}: {why}")
            elif why is not None:
                rec.update(status=WRONG, why=why)
            elif served:
                rec.update(status=SERVED)
            else:
                rec.update(status=DECLINED, why=decline_reason(d))
            if v.label == "random" and v.glob is None:
                served_before.setdefault(c.name, served)
            if v.label == "random after error" and served_before.get(c.name) and not served and why is None:
                rec.update(status=WRONG, why="kernel dropped after eager raised a user error: a later valid "
                                             f"call was not served ({decline_reason(d)})")
            out.write(json.dumps(rec) + "\n")
        out.write(json.dumps({"done": True}) + "\n")
    finally:
        hook.uninstall()
    return 0


# -- the parent ------------------------------------------------------------------------------------


@dataclass
class Plan:
    device: str = "cpu"
    threads: list = field(default_factory=lambda: sorted({1, 2, os.cpu_count() or 1}))
    quick: bool = False
    ray: bool = True
    modes: tuple = ("auto", "off")
    log: Callable = print
    #: the serving contract the replay hooks run under and the drill judges by
    #: (docs/verification.md, "The contract"; the script resolves it like any setting)
    contract: str = "finite"


def select(plan: Plan) -> list[Case]:
    return [c for c in corpus() if plan.device in c.devices and (c.quick or not plan.quick)]


def record_check(cases: list[Case], plan: Plan, workdir: str) -> tuple[dict, list[dict]]:
    """Record each compiled case's first (random) call into its own trace, and run every
    call of every case under ``aoti_farm.record``, compared with eager.  Returns
    ({case: [signature dicts]}, records)."""
    from aoti_farm.runtime.recorder import record
    from aoti_farm.trace import load_trace

    sigs, recs = {}, []
    torch.set_num_threads(1)
    for i, c in enumerate(cases):
        vs = c.variants(plan.device)
        if c.compile:
            p = os.path.join(workdir, f"case{i}.json")
            with record(p, devices=(plan.device,)):
                run_call(c, vs[0].inputs, vs[0].glob)
            sigs[c.name] = [e.sig for e in load_trace(p).entries]
        for v in vs:
            e, ee = run_call(c, v.inputs, v.glob)
            with record(os.path.join(workdir, "all.json"), devices=(plan.device,)):
                g, ge = run_call(c, v.inputs, v.glob)
            why = compare(c, v.inputs, e, ee, g, ge)
            rec = {"case": c.name, "mode": "record", "variant": v.label, "glob": v.glob, "threads": 1,
                   "served": False, "status": WRONG if why else DECLINED, "why": why or "recording (eager's call)"}
            recs.append(rec)
    return sigs, recs


def compile_all(sigs: dict, plan: Plan, cache_dir: str, workdir: str) -> dict:
    """Compile every recorded signature into ``cache_dir``; {key: error or None}."""
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    uniq = {}
    for ss in sigs.values():
        for s in ss:
            uniq.setdefault(s.key, s)
    plan.log(f"drill: compiling {len(uniq)} signatures ({'Ray farm: aoti-farm warm' if plan.ray else 'in-process'})")
    if plan.ray:
        trace = os.path.join(workdir, "drill_trace.json")
        save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(uniq.values())]), trace)
        report = os.path.join(workdir, "warm_report.json")
        p = subprocess.run([*spawn.python("-m", "aoti_farm", "warm", "--model", trace), "--cache-dir", cache_dir,
                            "--dynamic", "off", "--report", report], capture_output=True, text=True)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"aoti-farm warm exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
        try:
            with open(report) as f:
                rows = json.load(f)
        except (OSError, ValueError):
            rows = {}
        items = rows.get("signatures", []) if isinstance(rows, dict) else []
        by_key = {r.get("key"): r for r in items if isinstance(r, dict)}
        out = {}
        for k in uniq:
            r = by_key.get(k)
            r = r or {}
            err = str(r.get("error") or r.get("status") or "not compiled")
            out[k] = None if r.get("status") in ("compiled", "cached") else (
                f"attempts {r.get('attempts', '?')}: {err[:100]}")
        return out
    from aoti_farm.cache.store import Cache
    from aoti_farm.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.job import compile_and_publish

    cache, fp = Cache(cache_dir), fingerprint(plan.device)
    compiler = AOTICompiler(measure_speed=not plan.quick)
    out = {}
    for k, s in uniq.items():
        try:
            o = compile_and_publish(cache, compiler, fp, s, owner="drill")
        except Exception as e:  # noqa: BLE001 -- an infrastructure error (the farm would retry it)
            out[k] = f"compile raised {type(e).__name__} (an infrastructure error to the farm: retried): " + \
                (str(e).splitlines() or [""])[0][:160]
            plan.log(f"drill:   {s.op}: {out[k]}")
            continue
        out[k] = None if o.status in ("compiled", "cached") else (o.error or o.status)
        plan.log(f"drill:   {s.op}: {o.status}{'' if out[k] is None else ' (' + str(out[k])[:100] + ')'}")
    return out


def replay(cases: list[Case], plan: Plan, cache_dir: str, workdir: str) -> list[dict]:
    """Each hook mode in a child process; a child that dies marks its case WRONG and the
    replay goes on without it."""
    recs = []
    names = [c.name for c in cases]
    for mode in plan.modes:
        skip: list[str] = []
        for attempt in range(len(names) + 1):
            out = os.path.join(workdir, f"replay-{mode}-{attempt}.jsonl")
            spec = os.path.join(workdir, f"spec-{mode}-{attempt}.json")
            with open(spec, "w") as f:
                json.dump({"device": plan.device, "mode": mode, "threads": plan.threads, "cases": names,
                           "skip": skip, "cache_dir": cache_dir, "out": out, "contract": plan.contract}, f)
            p = subprocess.run([*spawn.python("-c"), "import sys; from aoti_farm.runtime import drill; "
                                "sys.exit(drill.child_main(sys.argv[1]))", spec], capture_output=True, text=True)
            lines = []
            if os.path.exists(out):
                with open(out) as f:
                    lines = [json.loads(x) for x in f if x.strip()]
            recs += [x for x in lines if "case" in x]
            if any(x.get("done") for x in lines):
                break
            begun = [x["begin"] for x in lines if "begin" in x]
            if not begun:
                raise RuntimeError(f"drill replay (native={mode}) exited {p.returncode} before any case: "
                                   f"{p.stderr.strip()[-600:]}")
            recs.append({"case": begun[-1], "mode": f"native={mode}", "variant": "?", "glob": None, "threads": None,
                         "served": True, "status": WRONG,
                         "why": f"the serving process died (exit {p.returncode}) during this case"})
            skip.append(begun[-1])
    return recs


def summarize(cases: list[Case], recs: list[dict], compile_errors: dict, sigs: dict,
              contract: str = "finite") -> list[tuple]:
    """One (case, status, text, calls served) per case."""
    rows = []
    for c in cases:
        mine = [r for r in recs if r["case"] == c.name]
        wrong = [r for r in mine if r["status"] == WRONG]
        hook_calls = [r for r in mine if r["mode"] != "record"]
        served = [r for r in hook_calls if r["served"] and r["status"] != WRONG]
        n_served = sum(1 for r in hook_calls if r["served"])
        if wrong:
            seen, parts = set(), []
            for r in wrong:
                if r["why"] in seen:
                    continue
                seen.add(r["why"])
                where = f"{r['mode']}, {r['variant']}" + (f", {r['glob']}" if r.get("glob") else "") + (
                    f", {r['threads']} thr" if r.get("threads") else "")
                parts.append(f"[{where}] {r['why']}")
            more = f" (+{len(wrong) - 3} more)" if len(parts) > 3 else ""
            ncalls = f"{len(wrong)}/{len(mine)} calls"
            rows.append((c.name, WRONG, f"WRONG ({ncalls}: " + "; ".join(parts[:3]) + more + ")", n_served))
        elif served:
            dec = sorted({r["why"] for r in hook_calls if not r["served"]})
            edges = sorted({r["why"].split(":", 1)[0] for r in hook_calls if r["status"] == EDGE})
            note = f" ({len(served)}/{len(hook_calls)} calls served" + (
                f"; the rest declined: {'; '.join(dec)}" if dec else "") + (
                f"; differing only at an edge of the {contract} contract: {', '.join(edges)}" if edges else "") + ")"
            rows.append((c.name, EDGE if edges else SERVED, (EDGE if edges else SERVED) + note, n_served))
        else:
            reasons = sorted({r["why"] for r in hook_calls})
            errs = sorted({str(compile_errors.get(s.key))[:120] for s in sigs.get(c.name, [])
                           if compile_errors.get(s.key)})
            if errs:
                reasons.append("compile: " + "; ".join(errs))
            if c.compile and not sigs.get(c.name):
                reasons.append("nothing recorded for this call")
            if not c.compile:
                reasons.append("not compiled: a call the hook must leave to eager")
            rows.append((c.name, DECLINED, f"declined ({'; '.join(reasons)})", n_served))
    return rows


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run(plan: Plan, out_dir: str | None = None) -> tuple[int, list[tuple], str]:
    """The whole drill; returns (number of WRONG cases, per-case rows (case, status, line,
    calls served), summary line)."""
    cases = select(plan)
    workdir = tempfile.mkdtemp(prefix="aoti-farm-drill-")
    cache_dir = os.path.join(workdir, "cache")
    os.makedirs(cache_dir, mode=0o700)
    try:
        from aoti_farm.runtime import native

        if "auto" in plan.modes and not native.disabled():
            native.build()
        sigs, recs = record_check(cases, plan, workdir)
        compile_errors = compile_all(sigs, plan, cache_dir, workdir)
        recs += replay(cases, plan, cache_dir, workdir)
        rows = summarize(cases, recs, compile_errors, sigs, plan.contract)
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    n = {s: sum(1 for r in rows if r[1] == s) for s in (SERVED, EDGE, DECLINED, WRONG)}
    dev = plan.device
    if dev == "cuda":
        dev += f" ({torch.cuda.get_device_name(0)})"
    summary = (f"drill: {len(rows)} op-cases: {n[SERVED]} served-equal, {n[EDGE]} served differing only at a "
               f"{plan.contract}-contract edge, {n[DECLINED]} declined, {n[WRONG]} WRONG; "
               f"{len(recs)} calls; device {dev}; threads {','.join(map(str, plan.threads))}; machine {machine()}; "
               f"torch {torch.__version__}; {'quick' if plan.quick else 'full'}, "
               f"{'Ray warm' if plan.ray else 'in-process compile'}; "
               f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "drill.json"), "w") as f:
            # published: the case's signatures with a kernel in the drill's cache (compile_all said
            # no error); a case without one (a correct refusal) can only be declined
            published = {c.name: sorted(s.key for s in sigs.get(c.name, []) if compile_errors.get(s.key, "") is None)
                         for c in cases}
            json.dump({"summary": summary, "cases": [{"case": a, "status": b, "line": c, "served_calls": d,
                                                      "published": published.get(a, [])} for a, b, c, d in rows],
                       "calls": recs, "compile_errors": compile_errors}, f, indent=1, default=str)
    return n[WRONG], rows, summary
