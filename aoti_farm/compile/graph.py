"""The graph a signature compiles as: the op with its non-tensor arguments baked in
(:class:`OpModule`), and what the compiler may put around it so that the kernel returns
what eager returns -- eager's output strides (size-1 dims restrided; every output forced
into eager's strides on the layout retry), float64 computing with eager's output dtypes
(the precision retry), negative CUDA indices mapped to the bound, and an op AOTInductor
can run only through its proxy executor traced as an equivalent one (:func:`substitute`).

Every graph built here is verified against eager as every kernel is
(:mod:`aoti_farm.compile.verify`)."""

from __future__ import annotations

import importlib

import torch

from aoti_farm import signature as S


def output_strides(out) -> list | None:
    """Per output of eager's result, its strides (None for a non-tensor)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(o.stride()) if isinstance(o, torch.Tensor) else None for o in outs]


def _only_size1_differ(sizes, have, want) -> bool:
    return len(have) == len(want) and all(h == w or n == 1 for n, h, w in zip(sizes, have, want))


class OpModule(torch.nn.Module):
    """forward(*tensors) -> op(*args) with every non-tensor argument baked in.

    ``eager_strides`` (exact kernels): eager's output strides.  Where the traced output's
    strides differ from them only in size-1 dims (the op's meta function lays a
    channels-last ``[N, C, 1, 1]`` result out as its input, eager's TensorIterator
    contiguously), the output is restrided to eager's: the same elements at the same
    addresses (a size-1 dim's stride addresses nothing), so no copy, and the memory
    format torch later suggests for the result is eager's (:func:`tolerance.compare`
    checks it)."""

    def __init__(self, sig: S.Signature, args: tuple, kwargs: dict, eager_strides: list | None = None,
                 upcast: list | None = None, out_of_range: list | None = None, force_strides: bool = False):
        super().__init__()
        self.eager_strides = eager_strides
        # every output laid out as eager lays it out (AOTICompiler.compile's layout retry)
        self.force_strides = force_strides and bool(eager_strides)
        self.upcast = upcast   # eager's output dtypes: computed in float64, returned in these
        # (input position, bound): a negative index becomes ``bound``, which the kernel's
        # own index assert rejects as eager's CUDA kernel rejects the negative one
        # (adversarial.cuda_index_bounds)
        self.out_of_range = out_of_range or []
        sub = substitute(sig, args, kwargs)
        self.op = sub or S.resolve_op(sig.op)
        self.traced_as = getattr(sub, "traced_as", None)   # the op the kernel runs, where substituted
        self.positions = S.tensor_positions(sig)
        self.template_args = list(args)
        self.template_kwargs = dict(kwargs)
        self.n_pos = len(args)
        self.names = sig.info().arg_names

    def forward(self, *tensors):
        if self.out_of_range:
            tensors = list(tensors)
            for pos, bound in self.out_of_range:
                t = tensors[pos]
                tensors[pos] = torch.where(t < 0, torch.full_like(t, bound), t)
            tensors = tuple(tensors)
        if self.upcast:   # computed in float64, returned in eager's dtypes (see aoti_farm.compile.compiler.AOTICompiler.compile)
            tensors = tuple(t.to(torch.float64) if t.dtype in _NARROW_FLOATS else t for t in tensors)
        args = [list(a) if isinstance(a, list) else a for a in self.template_args]
        kwargs = {k: (list(v) if isinstance(v, list) else v) for k, v in self.template_kwargs.items()}
        for t, (i, j) in zip(tensors, self.positions):
            if i < self.n_pos:
                if j is None:
                    args[i] = t
                else:
                    args[i][j] = t
            else:
                name = self.names[i]
                if j is None:
                    kwargs[name] = t
                else:
                    kwargs[name][j] = t
        out = self.op(*args, **kwargs)
        if self.upcast:
            out = _narrow_back(out, self.upcast)
        if not self.eager_strides:
            return out
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if self.force_strides:
            importlib.import_module("torch._inductor.inductor_prims")   # registers inductor_force_stride_order

            outs = [torch.ops.prims.inductor_force_stride_order.default(o, list(want))
                    if isinstance(o, torch.Tensor) and want is not None else o
                    for o, want in zip(outs, self.eager_strides)]
        for n, (o, want) in enumerate(zip(outs, self.eager_strides)):
            if (isinstance(o, torch.Tensor) and want is not None and tuple(o.stride()) != want
                    and _only_size1_differ(o.shape, o.stride(), want)):
                outs[n] = o.as_strided(o.shape, want, o.storage_offset())
        return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


def _cudnn_flags_now() -> tuple:
    """What ``at::convolution`` passes ``cudnn_convolution`` for (benchmark, deterministic,
    allow_tf32) under this process's globals (``at::_convolution``)."""
    cudnn = torch.backends.cudnn
    return (bool(cudnn.benchmark), bool(cudnn.deterministic or torch.are_deterministic_algorithms_enabled()),
            bool(cudnn.allow_tf32))


#: (op, device) that :func:`substitute` may trace as another op.
SUBSTITUTED = frozenset({("aten::cudnn_convolution", "cuda")})


def substitute(sig: S.Signature, args, kwargs):
    """The op to trace in place of ``sig.op`` where AOTInductor can run only the other, or None.

    ``aten::cudnn_convolution`` (what a CUDA ``conv2d`` reaches) has no C shim, so its
    kernel would need AOTInductor's proxy executor, which the farm never serves.  It is
    traced as ``aten::convolution(input, weight, None, stride, padding, dilation, False,
    0, groups)``, which has a shim and reaches ``cudnn_convolution`` with the same
    arguments exactly when the call's ``benchmark``, ``deterministic`` and ``allow_tf32``
    are what ``at::_convolution`` derives from the globals now.  The compile runs under
    the serving conditions it records (:mod:`aoti_farm.signature.conditions`: cuDNN's
    switches and deterministic mode among them) and the hook serves the kernel only under
    the same, so a call whose flags differ from those globals (a direct call of the op)
    is refused, not substituted.  The kernel is verified against eager's
    ``cudnn_convolution`` as every kernel is; a served kernel's inner call runs eager's
    own (the hook never serves inside a kernel)."""
    if (sig.op, sig.device) not in SUBSTITUTED:
        return None
    names = sig.info().arg_names
    bound = dict(zip(names, args))
    bound.update(kwargs)
    want = ("benchmark", "deterministic", "allow_tf32")
    if not torch.backends.cudnn.enabled or tuple(bool(bound.get(k)) for k in want) != _cudnn_flags_now():
        return None

    def convolution(*a, **k):
        b = dict(zip(names, a))
        b.update(k)
        pad = list(b["padding"])
        return torch.ops.aten.convolution.default(b["self"], b["weight"], None, list(b["stride"]), pad,
                                                  list(b["dilation"]), False, [0] * len(pad), b["groups"])
    convolution.traced_as = "aten::convolution"
    return convolution


#: Floating dtypes narrower than float64: an exact kernel refused as less accurate than
#: eager is built again computing in float64 (:meth:`aoti_farm.compile.compiler.AOTICompiler.compile`).
_NARROW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _narrow_back(out, dtypes: list):
    """``out`` with each float64 output cast to eager's dtype for it."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    outs = [o.to(d) if isinstance(o, torch.Tensor) and d is not None and o.dtype != d else o
            for o, d in zip(outs, dtypes)]
    return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


class NotUpcastable(Exception):
    """The float64 build does not apply to this signature (:func:`upcast_dtypes`)."""


def upcast_dtypes(tensors, eager_out) -> list | None:
    """Eager's output dtypes where the float64 build of a precision refusal applies: every
    floating input of one narrow dtype (float32, float16, bfloat16), every output a tensor;
    else None."""
    dts = {t.dtype for t in tensors if t.is_floating_point()}
    if len(dts) != 1 or next(iter(dts)) not in _NARROW_FLOATS:
        return None
    outs = eager_out if isinstance(eager_out, (tuple, list)) else (eager_out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    return [o.dtype for o in outs]
