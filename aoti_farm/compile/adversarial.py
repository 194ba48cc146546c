"""Adversarial verification inputs: the values random normal inputs never hit.

A kernel that matches eager on ``randn`` can still differ where IEEE or integer arithmetic
has edges: ``floor(a / b)`` against eager's ``floor_divide`` (``1.0 // 0.1`` is 9.0 in
eager, 10.0 from ``floor(10.000000000000002)``), infinities in ``remainder`` and floor
division, the sign of a zero, integer extremes, and indices that eager rejects (negative
or out of range) where Inductor wraps or reads past the end.  :func:`cases` derives a few
small input sets from the random ones, chosen by each input's kind; the compiler's
verification runs each through eager and the kernel, and refuses a kernel that raises
where eager does not (or the reverse) or returns something else.

Each case changes one thing, so a case on which eager raises (any negative index) does
not hide the others.  Values stay within what each input admits: float tensors get
special values, integer tensors integer extremes (not as indices or divisors: see
:func:`_int_pattern`), index tensors indices at and past their bound.  Tensors keep their
size, strides and device: the kernel was built for them.
"""

from __future__ import annotations

from typing import Any

import torch

from aoti_farm import signature as S
from aoti_farm.signature import storage_size

INF, NAN = float("inf"), float("nan")

#: Values of the "finite special values" case: signed zeros and exact quotients (1.0 and
#: 0.1: ``1.0 // 0.1``).  With k values, input i of a call gets value ``values[(j // k**i) %
#: k]`` at storage element j, so two inputs of k*k elements meet in every pair.
FINITE = (0.0, -0.0, 1.0, 0.1, -1.0, 5.0, 3.0, 10.0)

#: Values of the "infinities and NaN" case, with finite partners (``-inf // -1``,
#: ``remainder(5.0, inf)``, ``remainder(-0.0, inf)``).  Its own case, so a refusal says
#: whether a kernel differs from eager only where an input is not finite.
NONFINITE = (INF, -INF, NAN, 0.0, -0.0, 1.0, -1.0, 5.0)

#: Argument names that hold indices into another input (see :func:`index_bound`).
INDEX_ARGS = S.INDEX_ARGS

#: Ops whose integer tensors size an allocation or a loop (never given extremes).
_SIZE_OPS = ("aten::repeat_interleave", "aten::bincount", "aten::histc", "aten::multinomial",
             "aten::randint", "aten::arange", "aten::one_hot", "aten::_unique2", "aten::unique_dim")


def _on_cpu(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A copy of the storage ``t`` spans, as a 1-D tensor (``_view`` rebuilds ``t``'s view)."""
    n = storage_size(tuple(t.shape), tuple(t.stride()))
    return t.as_strided((n,), (1,), t.storage_offset()).clone()


def _view(t: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    return flat.as_strided(tuple(t.shape), tuple(t.stride()))


def _pattern(values: list, n: int, i: int, dtype: torch.dtype, device) -> torch.Tensor:
    k = len(values)
    j = torch.arange(n)
    idx = (j // (k ** i)) % k if i < 3 else (j * 7 + i) % k
    return torch.tensor(values, dtype=torch.float64)[idx].to(dtype).to(device) if dtype.is_floating_point \
        else torch.tensor(values, dtype=torch.int64)[idx].to(dtype).to(device)


#: The float cases, in the order they run.  The last two keep the random values and put a
#: few non-finite ones among them: a kernel that blends neighbours (``a + (b - a) * w``
#: against eager's ``a * (1 - w) + b * w`` in bilinear upsampling) turns an infinity next to
#: a finite value into NaN, which a tensor made only of special values never shows; and
#: two NaNs in one window tell which of them a kernel's argmax picks.
FLOAT_CASES = ("finite special values", "infinities and NaN", "magnitudes", "isolated infinities",
               "isolated NaN")

#: The cases whose inputs are not all finite: a difference there is an edge note, not a
#: refusal, under the finite contract (checks.edge_class).
NONFINITE_CASES = ("infinities and NaN", "isolated infinities", "isolated NaN")
#: Ops that reduce (besides the norms, every op with "norm" in its name): where a sum of
#: squares of the magnitudes case overflows, eager's and a kernel's ways of accumulating
#: differ by more than rounding (checks.edge_class).
REDUCING_OPS = frozenset({"sum", "nansum", "mean", "nanmean", "var", "std", "var_mean", "std_mean", "norm",
                          "linalg_vector_norm", "logsumexp", "_softmax", "_log_softmax", "softmax", "log_softmax",
                          "prod", "cumsum", "cumprod", "trace", "mm", "bmm", "addmm", "matmul", "linear", "dot",
                          "mv", "addmv", "baddbmm", "addbmm", "convolution", "_convolution", "cdist", "dist",
                          "_euclidean_dist", "rms_norm", "_fused_rms_norm",
                          # the backends a convolution reaches below the dispatcher's CompositeImplicit level
                          "cudnn_convolution", "cudnn_convolution_transpose", "mkldnn_convolution",
                          "miopen_convolution", "_conv_depthwise2d", "_slow_conv2d_forward",
                          "slow_conv_dilated2d", "slow_conv3d_forward", "convolution_overrideable"})

#: The precision cases: ill-conditioned finite inputs, on which a kernel must be at least as
#: accurate as eager wherever eager is accurate (``tolerance.precision``, against a float64
#: reference): a large offset with a small spread (a variance of ``3e4 + N(0, 1)`` rows),
#: and cancellation (pairs ``x, -x`` of neighbouring elements, ``x = 1e4 + |N(0, 1)|``: a
#: row's sum or mean is exactly 0); sorted cancellation (each row's first half ``x``, its
#: second half the same ``-x``: a sum in any order passes through half the row's mass
#: before it cancels, where neighbouring pairs cancel at once in a sequential sum); and,
#: for an input square in its last two dims, the same on its diagonal (``trace``).
#: Eager's CPU kernels accumulate some reductions in float64 or pairwise, a generated
#: kernel in float32 lanes; random normal and special values never tell them apart.
PRECISION_CASES = ("large offset", "cancellation", "sorted cancellation", "diagonal cancellation")
#: (offset, cancelling magnitude) per narrow float dtype: its spread of 1 stays resolved.
ILL_CONDITIONED = {torch.float32: (3e4, 1e4), torch.float16: (64.0, 1e2), torch.bfloat16: (8.0, 1e2)}

#: The index cases, in the order they run, each with the index value it puts first: the
#: last in-bounds index, then the two that put an index out of its bounds
#: (:data:`BAD_INDEX_CASES`, where eager raises).
INDEX_CASES = ("index at the bound", "negative index", "index out of range")
BAD_INDEX_CASES = INDEX_CASES[1:]


def _sprinkle(t: torch.Tensor, case: str) -> torch.Tensor:
    """The random storage of ``t`` with a few non-finite values: +inf and -inf far apart
    ("isolated infinities"), or NaNs in adjacent pairs ("isolated NaN")."""
    flat = _flat(t)
    j = torch.arange(flat.numel(), device=flat.device)
    if case == "isolated infinities":
        flat[j % 7 == 3] = INF
        flat[j % 11 == 5] = -INF
    else:
        flat[(j % 13 == 2) | (j % 13 == 3)] = NAN
    return flat


def float_values(dtype: torch.dtype, case: str) -> list:
    """The values of a float case for ``dtype``.  Magnitudes: its huge (a quarter of its
    max: a few of them overflow whatever the order of a sum), its smallest normal, and
    exact quotients."""
    if case == "finite special values":
        return list(FINITE)
    if case == "infinities and NaN":
        return list(NONFINITE)
    fi = torch.finfo(dtype)
    return [fi.max / 4, fi.tiny, -fi.tiny, 1.0, 0.1, 2.0, -3.0, fi.max / 4]


def _int_pattern(dtype: torch.dtype, i: int) -> list:
    """Integer extremes.  The first integer input gets the extremes and zero; later ones (a
    divisor, an exponent, a shift) get no zero and no negative: an integer division by zero
    or ``INT_MIN / -1`` in a kernel is a SIGFPE that would kill the verifying process."""
    ii = torch.iinfo(dtype)
    if i == 0:
        return [0, 1, -1 if ii.min < 0 else 2, ii.min, ii.max, 2, 7 if ii.min >= 0 else -7, 3]
    return [1, 2, 7, ii.max, 3]


def index_bound(op: str, name: str, j: int | None, values: dict) -> int | None:
    """The exclusive upper bound of the index tensor ``name`` (item ``j`` of a list) of
    ``op``, from the other arguments' ``values`` (by name); None when unknown.  Which size
    it is: :func:`aoti_farm.signature.index_table`."""
    ranks = {k: v.dim() for k, v in values.items() if isinstance(v, torch.Tensor)}
    where = S.index_table(op, j, ranks, values.get("dim"))
    if where is None:
        return None
    arg, d = where
    return 1 if d is None else int(values[arg].shape[d])


def _values(sig: S.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name (positional ones by position, the rest by name)."""
    info = sig.info()
    values: dict[str, Any] = {}
    for i, name in enumerate(info.arg_names):
        if i < len(args) and not info.kwarg_only[i]:
            values[name] = args[i]
        elif name in kwargs:
            values[name] = kwargs[name]
    return values


def _is_index(name: str, t: torch.Tensor) -> bool:
    return name in INDEX_ARGS and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def index_guards(sig: S.Signature, args: tuple, kwargs: dict) -> list[tuple[int, int, int]] | None:
    """The index guards of an exact CPU kernel: ``(runner input position, lo, hi)`` per index
    argument, or None where there is none or one cannot be bounded.

    A call whose every index lies in ``[lo, hi)`` (0 and the bound eager checks against) is
    served by the kernel; any other call runs eager, which raises (or wraps a negative
    index) as it always does.  So the kernel never meets an index it would check inside an
    OpenMP region, where a failed check ends the process, and its verification need not
    run the cases the guard sends to eager (:func:`violates`).  A negative index always
    goes to eager, whatever the op does with it: the guard only narrows what is served."""
    if sig.device != "cpu":
        return None
    bounds = _index_bounds(sig, args, kwargs)
    return None if bounds is None else [(pos, 0, b) for pos, b in bounds]


def _index_bounds(sig: S.Signature, args: tuple, kwargs: dict) -> list[tuple[int, int]] | None:
    """``(runner input position, bound)`` of every index tensor of the call (items of a
    tensor list included), or None where there is none or one cannot be bounded."""
    values = _values(sig, args, kwargs)
    names = sig.info().arg_names
    out = []
    for pos, (i, j) in enumerate(S.tensor_positions(sig)):
        v = values.get(names[i])
        t = v if j is None else (v[j] if isinstance(v, (list, tuple)) and j < len(v) else None)
        if isinstance(t, torch.Tensor) and _is_index(names[i], t):
            b = index_bound(sig.op, names[i], j, values)
            if b is None or b < 1:
                return None
            out.append((pos, b))
    return out or None


def violates(guards: list | None, tensors: list) -> bool:
    """Whether the runner inputs ``tensors`` hold an index outside its guard's range."""
    for pos, lo, hi in guards or ():
        t = tensors[pos]
        if t.numel() and (int(t.min()) < lo or int(t.max()) >= hi):
            return True
    return False


def _square(t: torch.Tensor) -> bool:
    return t.dim() >= 2 and t.shape[-1] == t.shape[-2] >= 2


def _halves_cancel(t: torch.Tensor, noise: torch.Tensor, size: float, diagonal: bool) -> torch.Tensor:
    """``noise`` (``t``'s storage, float64) with each innermost row of ``t`` -- or, with
    ``diagonal``, each diagonal of its last two dims -- made ``x, -x``: its first half
    ``x = size + |noise|``, its second half the same values negated, so the row (diagonal)
    sums to exactly 0.  A 0-dim tensor, one whose elements share storage (an expanded
    one), or a diagonal case of a non-square tensor keeps its values."""
    flat = noise.clone()
    if (t.dim() == 0 or storage_size(tuple(t.shape), tuple(t.stride())) != t.numel()
            or (diagonal and not _square(t))):
        return flat
    v = _view(t, flat)
    rows = torch.diagonal(v, dim1=-2, dim2=-1) if diagonal else v
    h = rows.shape[-1] // 2
    if h:
        x = size + rows[..., :h].abs()
        rows[..., :h] = x
        rows[..., h:2 * h] = -x
    return flat


def cases(sig: S.Signature, args: tuple, kwargs: dict) -> list[tuple[str, tuple, dict]]:
    """(name, args, kwargs) of the adversarial cases of a call whose random inputs are
    ``args``/``kwargs`` (from :func:`aoti_farm.signature.materialize`); the inputs given
    are not changed."""
    info = sig.info()
    names = list(info.arg_names)
    values = _values(sig, args, kwargs)
    # every tensor input: (name, list index or None, tensor)
    slots = []
    for name in names:
        v = values.get(name)
        if isinstance(v, torch.Tensor):
            slots.append((name, None, v))
        elif isinstance(v, (list, tuple)):
            slots.extend((name, j, t) for j, t in enumerate(v) if isinstance(t, torch.Tensor))

    def build(repl: dict) -> tuple[tuple, dict]:
        """The call with the tensors of ``repl`` ((name, j) -> tensor) replaced."""
        new = {}
        for name in names:
            if name not in values:
                continue
            v = values[name]
            if isinstance(v, (list, tuple)) and any((name, j) in repl for j in range(len(v))):
                v = [repl.get((name, j), t) for j, t in enumerate(v)]
            elif (name, None) in repl:
                v = repl[(name, None)]
            new[name] = v
        a = tuple(new[n] for i, n in enumerate(names) if n in new and not info.kwarg_only[i] and
                  (i < len(args)))
        kw = {n: new[n] for i, n in enumerate(names) if n in new and (info.kwarg_only[i] or i >= len(args))}
        return a, kw

    out: list[tuple[str, tuple, dict]] = []
    floats = [(n, j, t) for n, j, t in slots if t.is_floating_point() and t.numel()]
    ints = [(n, j, t) for n, j, t in slots if not t.is_floating_point() and not t.is_complex()
            and t.dtype != torch.bool and t.numel() and not _is_index(n, t)]
    if sig.op.split(".")[0] in _SIZE_OPS:
        ints = []
    # index tensors in their bounds in every case but the one that moves them out
    bounds, valid = {}, {}
    for n, j, t in slots:
        if _is_index(n, t) and t.numel():
            b = index_bound(sig.op, n, j, values)
            if b is not None and b >= 1:
                bounds[(n, j)] = b
                valid[(n, j)] = _view(t, _flat(t).remainder(b))
    for case in FLOAT_CASES:
        repl = dict(valid)
        for i, (n, j, t) in enumerate(floats):
            if case.startswith("isolated"):
                flat = _sprinkle(t, case)
            else:
                flat = _pattern(float_values(t.dtype, case), _flat(t).numel(), i, t.dtype, t.device)
            repl[(n, j)] = _view(t, flat)
        if case == "finite special values":
            for i, (n, j, t) in enumerate(ints):
                flat = _pattern(_int_pattern(t.dtype, i), _flat(t).numel(), i, t.dtype, t.device)
                repl[(n, j)] = _view(t, flat)
        if len(repl) > len(valid):
            out.append((case, *build(repl)))
    narrow = [(n, j, t) for n, j, t in floats if t.dtype in ILL_CONDITIONED]
    for case in PRECISION_CASES if narrow else ():
        if case == "diagonal cancellation" and not any(_square(t) for _, _, t in narrow):
            continue
        repl = dict(valid)
        for n, j, t in narrow:
            offset, size = ILL_CONDITIONED[t.dtype]
            noise = _flat(t).double()
            if case == "large offset":
                flat = offset + noise
            elif case == "cancellation":   # x, -x in neighbouring elements: sums along the innermost dim cancel exactly
                k = torch.arange(noise.numel(), device=noise.device)
                flat = (1 - 2 * (k % 2)) * (size + noise.abs()[k - k % 2])
            else:
                flat = _halves_cancel(t, noise, size, diagonal=case == "diagonal cancellation")
            repl[(n, j)] = _view(t, flat.to(t.dtype))
        out.append((case, *build(repl)))
    if not all(_on_cpu(t) for t in valid.values()):
        bounds = {}   # eager's bound check on CUDA is a device-side assert: see unverifiable()
    for (n, j), bound in bounds.items():
        t = valid[(n, j)]
        where = n if j is None else f"{n}[{j}]"
        for case, v in zip(INDEX_CASES, (bound - 1, -1, bound)):
            flat = _flat(t)
            first = flat[0].item()
            if case == "index at the bound":
                # a swap, so no index value appears more often than before (duplicates make
                # index_copy/scatter results depend on the order of the writes)
                flat[flat == v] = first
            flat[0] = v
            out.append((f"{case} ({where}={v})", *build({**valid, (n, j): _view(t, flat)})))
    return out


#: CUDA ops whose eager kernel meets every index outside ``[0, bound)``, negative ones
#: included, with a device-side assert (``CUDA_KERNEL_ASSERT``: ``index_select``'s and so
#: ``embedding``'s, ``gather``'s).  Their kernels are built so that every such index fails
#: a device assert too (:func:`cuda_index_bounds`, :mod:`aoti_farm.build.tritonscan`).
CUDA_ASSERTING_OPS = ("aten::embedding", "aten::index_select", "aten::gather")


def cuda_index_bounds(sig: S.Signature, args: tuple, kwargs: dict) -> list[tuple[int, int]] | None:
    """``(runner input position, bound)`` of every index tensor of a CUDA call of one of
    :data:`CUDA_ASSERTING_OPS`, or None (another op or device, or a bound unknown).

    Eager asserts on a negative index where Inductor's generated code wraps it (``i + n``
    where ``i < 0``) and then asserts only ``0 <= i + n < n``: a kernel built as Inductor
    writes it would return row ``n - 1`` for ``-1``.  So the exported graph maps each
    negative index to ``bound`` first (``aoti_farm.compile.graph.OpModule``), which the
    kernel's own assert then rejects, as eager's does."""
    if sig.device != "cuda" or sig.op.split(".")[0] not in CUDA_ASSERTING_OPS:
        return None
    return _index_bounds(sig, args, kwargs)


def unverifiable(sig: S.Signature, args: tuple, kwargs: dict, exact: bool = True) -> str | None:
    """Why a kernel of ``sig`` cannot be verified as serving needs it, or None.

    An index argument on CUDA: eager rejects an index out of range through a device-side
    assert, which leaves the process's CUDA context unusable (every later CUDA call in it
    fails), so neither eager's error nor the kernel's behaviour on such an index can be
    observed in a compile process, and a kernel that reads out of bounds where eager
    raises could not be told from one that raises.  Such a kernel is refused (eager serves
    the op) rather than served unchecked, except for the ops of
    :data:`CUDA_ASSERTING_OPS`: their kernels are built to assert on every index eager
    asserts on, and the generated code is read to confirm it before verification
    (:mod:`aoti_farm.build.tritonscan`); exact kernels only (``exact``: a shape class's kernel
    is still refused)."""
    if sig.device != "cuda":
        return None
    if exact and cuda_index_bounds(sig, args, kwargs) is not None:
        return None
    info = sig.info()
    for i, name in enumerate(info.arg_names):
        v = args[i] if i < len(args) and not info.kwarg_only[i] else kwargs.get(name)
        items = v if isinstance(v, (list, tuple)) else [v]
        for t in items:
            if isinstance(t, torch.Tensor) and name in INDEX_ARGS and not t.is_floating_point() \
                    and not t.is_complex() and t.dtype != torch.bool:
                return (f"unsupported on CUDA: the bounds of index argument '{name}' cannot be checked "
                        f"(eager raises through a device-side assert)")
    return None
