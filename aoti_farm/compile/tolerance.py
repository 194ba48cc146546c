"""When a kernel's outputs agree with eager's: per-dtype tolerances, and extra tolerance for
outputs that sum many terms (scans, sums, matrix products), whose rounding depends on the
order of the additions.  Used by :mod:`aoti_farm.compile.compiler`'s verification."""

from __future__ import annotations

import math
from typing import Any

import torch

from aoti_farm import signature as S
from aoti_farm.dynamic.shapes import memory_format

#: (rtol, atol) per output dtype.  Integers and bools compare exactly.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}

#: Scans that add their terms: output element i of a row sums the row's first i+1 terms.
SUM_SCANS = {"aten::cumsum", "aten::logcumsumexp", "aten::_logcumsumexp"}
#: Scans that multiply their terms (rounding errors compound relative to the value).
PRODUCT_SCANS = {"aten::cumprod"}
#: Reductions whose output is a plain sum of input elements (same units as the input).
SUMS = {"aten::sum", "aten::nansum"}
#: Reductions whose output is such a sum divided by its number of terms: the sum's bound
#: divided by the same (two float32 means of ``1e4``-sized terms that cancel differ by
#: ~1e-4 while a term's own rounding is ~1e-3).
MEANS = {"aten::mean"}
#: Matrix products: each output element sums K products; (first, second) operand among the
#: floating tensor inputs in schema order.
MATMULS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1), "aten::dot": (0, 1),
           "aten::vdot": (0, 1), "aten::mv": (0, 1), "aten::linear": (0, 1), "aten::addmm": (1, 2),
           "aten::baddbmm": (1, 2), "aten::addbmm": (1, 2), "aten::addmv": (1, 2)}


def _mean_abs(t: torch.Tensor) -> float:
    with torch.no_grad():
        v = float(t.detach().abs().double().mean()) if t.numel() else 0.0
    return v if math.isfinite(v) else 0.0


def length_tolerance(sig: S.Signature, args: tuple, kwargs: dict, expected: Any) -> tuple[float, float]:
    """(extra rtol, extra atol) for calls whose output elements each sum many terms: scans
    (``cumsum``, ``logcumsumexp``; ``cumprod`` multiplies), ``sum``/``nansum`` (``mean``:
    the sum's bound over its count) and matrix products.  Every other op keeps the dtype's fixed tolerance.

    Two correct kernels that add in different orders (a sequential scan against a blocked
    or tree scan, as on CUDA) differ by rounding errors that grow with the number of terms
    L: about ``eps * L * mean|term|`` in the accumulation precision, for an output in the
    input's units (measured on randn rows: a tree scan of 16,384 float32 values differs
    from ATen's by up to 6.7e-5, where the bound gives 1.6e-3, and by more than the fixed
    float32 tolerance at 340 of 4M elements, near the zero crossings of the running sum).
    A wrong kernel (shifted, short, on the wrong dim) is off by whole terms, about
    ``mean|term|``, and is still refused."""
    from aoti_farm.compile.runner import flat_tensors

    op = sig.op.split(".")[0]
    if op not in SUM_SCANS and op not in PRODUCT_SCANS and op not in SUMS and op not in MEANS and op not in MATMULS:
        return 0.0, 0.0
    ins = [t for t in flat_tensors(sig, args, kwargs) if t.is_floating_point() or t.is_complex()]
    outs = [t for t in (list(expected) if isinstance(expected, (tuple, list)) else [expected])
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if not ins or not outs:
        return 0.0, 0.0
    wide = any(t.dtype in (torch.float64, torch.complex128) for t in ins)
    eps = torch.finfo(torch.float64 if wide else torch.float32).eps
    x = args[0] if args and isinstance(args[0], torch.Tensor) else ins[0]
    if op in SUM_SCANS or op in PRODUCT_SCANS:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if not isinstance(dim, int) or x.dim() == 0:
            return 0.0, 0.0
        terms = int(x.shape[dim])
        return (eps * terms, 0.0) if op in PRODUCT_SCANS else (0.0, eps * terms * _mean_abs(x))
    if op in SUMS or op in MEANS:
        terms = max(1, x.numel() // max(1, min(t.numel() for t in outs)))
        return 0.0, eps * (1 if op in MEANS else terms) * _mean_abs(x)
    i, j = MATMULS[op]
    if len(ins) <= max(i, j) or ins[i].dim() == 0:
        return 0.0, 0.0
    terms = int(ins[i].shape[-1])
    return 0.0, eps * terms * _mean_abs(ins[i]) * _mean_abs(ins[j])


#: Convolutions (input, weight first): each output element sums Cin/groups * kernel-size products.
CONVOLUTIONS = {"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv1d",
                "aten::conv2d", "aten::conv3d", "aten::cudnn_convolution_relu", "aten::cudnn_convolution_add_relu",
                "aten::convolution_overrideable", "aten::conv_transpose2d", "aten::cudnn_convolution_transpose"}

#: TF32's unit roundoff (10 explicit mantissa bits).
TF32_EPS = 2.0 ** -11


def flag_tolerance(sig: S.Signature, args: tuple, kwargs: dict, flags: dict | None) -> tuple[float, float]:
    """(extra rtol, extra atol) for a CUDA float32 matmul or convolution when eager ran with
    TF32 allowed (``flags``: :func:`aoti_farm.compile.checks.eager_flags`, recorded in the
    manifest's verification).  Eager then rounds its operands to TF32 (10 mantissa bits)
    and a correct kernel that rounds differently (or not at all) differs by about
    ``eps_tf32 * K * mean|a| * mean|b|`` for K products per output element: refusing it
    as "disagrees with eager" is a false rejection.  A wrong kernel is off by whole terms."""
    if not flags or sig.device != "cuda":
        return 0.0, 0.0
    op = sig.op.split(".")[0]
    if op in MATMULS and flags.get("matmul_allow_tf32"):
        i, j = MATMULS[op]
        from aoti_farm.compile.runner import flat_tensors

        ins = [t for t in flat_tensors(sig, args, kwargs) if t.dtype == torch.float32]
        if len(ins) <= max(i, j) or ins[i].dim() == 0:
            return 0.0, 0.0
        k = int(ins[i].shape[-1])
        return TF32_EPS * 2, 2 * TF32_EPS * k * _mean_abs(ins[i]) * _mean_abs(ins[j])
    if op in CONVOLUTIONS and flags.get("cudnn_allow_tf32"):
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        w = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else None
        if x is None or w is None or x.dtype != torch.float32 or w.dim() < 2:
            return 0.0, 0.0
        k = int(math.prod(w.shape[1:]))
        return TF32_EPS * 2, 2 * TF32_EPS * k * _mean_abs(x) * _mean_abs(w)
    return 0.0, 0.0


def compare(expected: Any, got: list[torch.Tensor], extra: tuple[float, float] = (0.0, 0.0), *,
            zero_sign: bool = True) -> dict | None:
    """None if ``got`` matches eager's ``expected``, else the evidence of the mismatch:
    output count, dtype, shape, device, strides (of dims longer than 1), the memory format
    the strides suggest (size-1 dims' strides included: :func:`shapes.memory_format`), NaN in the same
    places, infinities equal with their sign (``isclose`` is exact on them), zeros of the
    same sign where both are zero, then values within the tolerance.  ``extra`` = (rtol,
    atol) added to the dtype's tolerances (:func:`length_tolerance`).  ``zero_sign=False``:
    the sign of a zero result is not compared (the verification records it as an edge note)."""
    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    if len(exp) != len(got):
        return {"problem": "output count", "eager": len(exp), "kernel": len(got)}
    for n, (e, g) in enumerate(zip(exp, got)):
        if not isinstance(g, torch.Tensor):
            return {"output": n, "problem": "not a tensor"}
        if e.dtype != g.dtype:
            return {"output": n, "problem": "dtype", "eager": str(e.dtype), "kernel": str(g.dtype)}
        if e.shape != g.shape:
            return {"output": n, "problem": "shape", "eager": list(e.shape), "kernel": list(g.shape)}
        if e.device != g.device:
            return {"output": n, "problem": "device", "eager": str(e.device), "kernel": str(g.device)}
        if any(se != sg for se, sg, sz in zip(e.stride(), g.stride(), e.shape) if sz > 1):
            return {"output": n, "problem": "strides", "eager": list(e.stride()), "kernel": list(g.stride())}
        # size-1 dims' strides decide the memory format torch suggests for the result, and
        # what a later op allocates like it (interpolate, empty_like): they must agree too
        if memory_format(e.shape, e.stride()) != memory_format(g.shape, g.stride()):
            return {"output": n, "problem": "memory format", "eager": list(e.stride()), "kernel": list(g.stride()),
                    "eager_format": memory_format(e.shape, e.stride()),
                    "kernel_format": memory_format(g.shape, g.stride())}
        if e.dtype in TOLERANCES:
            rtol, atol = TOLERANCES[e.dtype]
            rtol, atol = rtol + extra[0], atol + extra[1]
            ec, gc = e.detach().cpu().to(torch.complex128 if e.is_complex() else torch.float64), g.detach().cpu().to(
                torch.complex128 if g.is_complex() else torch.float64)
            g_nan = torch.isnan(gc) if not gc.is_complex() else torch.isnan(gc.real) | torch.isnan(gc.imag)
            e_nan = torch.isnan(ec) if not ec.is_complex() else torch.isnan(ec.real) | torch.isnan(ec.imag)
            if bool((g_nan & ~e_nan).any()):
                idx = int((g_nan & ~e_nan).flatten().nonzero()[0])
                return {"output": n, "problem": "NaN where eager has a number", "flat_index": idx}
            if bool((e_nan & ~g_nan).any()):
                idx = int((e_nan & ~g_nan).flatten().nonzero()[0])
                return {"output": n, "problem": "a number where eager has NaN", "flat_index": idx,
                        "kernel": complex(gc.flatten()[idx]).real if not gc.is_complex() else str(gc.flatten()[idx])}
            if zero_sign and not ec.is_complex():
                # the sign of a zero is part of the result (1/x, atan2, copysign see it):
                # where both are zero, the sign bits must agree
                zs = (ec == 0) & (gc == 0) & (torch.signbit(ec) != torch.signbit(gc))
                if bool(zs.any()):
                    idx = int(zs.flatten().nonzero()[0])
                    return {"output": n, "problem": "sign of zero", "flat_index": idx,
                            "eager": float(ec.flatten()[idx]), "kernel": float(gc.flatten()[idx])}
            ok = torch.isclose(gc, ec, rtol=rtol, atol=atol, equal_nan=True)
            if not bool(ok.all()):
                diff = (gc - ec).abs().flatten()
                bad = (~ok).flatten().nonzero()
                i = int(bad[0])
                return {"output": n, "problem": "values", "mismatched": int(bad.numel()),
                        "numel": e.numel(), "first_index": i, "eager": complex(ec.flatten()[i]).real if not ec.is_complex() else str(ec.flatten()[i]),
                        "kernel": complex(gc.flatten()[i]).real if not gc.is_complex() else str(gc.flatten()[i]),
                        "max_abs_err": float(diff[~diff.isnan()].max()) if bool((~diff.isnan()).any()) else math.nan,
                        "rtol": rtol, "atol": atol}
        elif not torch.equal(e.cpu(), g.cpu()):
            bad = (e.cpu() != g.cpu()).flatten().nonzero()
            return {"output": n, "problem": "values", "mismatched": int(bad.numel()), "numel": e.numel(),
                    "first_index": int(bad[0])}
    return None


def precision(expected: Any, got: list, truth: Any, extra: tuple[float, float] = (0.0, 0.0)) -> dict | None:
    """None if ``got`` is at least as accurate as eager's ``expected`` against ``truth`` (the
    same call in float64), else the evidence.  Per narrow-float output where eager is
    accurate everywhere it is finite (within the dtype's tolerance of ``truth``): every
    element of the kernel's within eager's own error plus that tolerance (plus ``extra``,
    :func:`length_tolerance`) of ``truth``.  Where eager itself is off by more than the
    tolerance somewhere, it accumulates no wider than the kernel does and the output is
    not judged here (the comparison with eager holds it).  Positions where any of the three
    is not finite are left to the edge cases."""
    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    tru = list(truth) if isinstance(truth, (tuple, list)) else [truth]
    for n, (e, g, t) in enumerate(zip(exp, got, tru)):
        if not (isinstance(e, torch.Tensor) and isinstance(g, torch.Tensor) and isinstance(t, torch.Tensor)):
            continue
        if e.dtype not in (torch.float32, torch.float16, torch.bfloat16) or e.shape != t.shape or g.shape != e.shape:
            continue
        rtol, atol = TOLERANCES[e.dtype]
        ec, gc, tc = (x.detach().cpu().double() for x in (e, g, t))
        finite = torch.isfinite(ec) & torch.isfinite(gc) & torch.isfinite(tc)
        if not bool(finite.any()):
            continue
        bound = atol + rtol * tc.abs()
        e_err, g_err = (ec - tc).abs(), (gc - tc).abs()
        if bool((finite & (e_err > bound)).any()):
            continue   # eager is not accurate here either
        bad = finite & (g_err > e_err + bound + extra[1] + extra[0] * tc.abs())
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            return {"output": n, "problem": "precision", "mismatched": int(bad.sum()), "numel": e.numel(),
                    "first_index": i, "float64": float(tc.flatten()[i]), "eager": float(ec.flatten()[i]),
                    "kernel": float(gc.flatten()[i]), "kernel_error": float(g_err.flatten()[i]),
                    "eager_error": float(e_err.flatten()[i]), "rtol": rtol, "atol": atol}
    return None
