"""The differential drill's corpus (:mod:`aoti_farm.runtime.drill` runs it): one
:class:`Case` per op family the recorder supports, plus each known divergence of a served
kernel from eager (docs/verification.md), each with its input sets (:class:`Variant`: a
random one, the one recorded and compiled, and adversarial ones: signed zeros, +-inf, NaN,
exact quotients, huge and tiny magnitudes, integer extremes, indices at and past their
bounds), some under a changed global (:data:`GLOBALS`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

INF, NAN = math.inf, math.nan

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
