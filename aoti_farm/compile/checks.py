"""One verification case, kernel against eager: the checks :mod:`aoti_farm.compile.verify`'s
loop runs on every input set.

* :func:`check_case` -- both raise, or both return the same thing (edge notes for the
  differences the finite contract does not call differences: :func:`edge_class`,
  :func:`edge_note`; docs/verification.md "The contract");
* :func:`check_precision` -- at least eager's accuracy against float64 on ill-conditioned inputs;
* the tolerance of one comparison (:func:`stated_tolerance`, with :func:`eager_flags` on CUDA);
* the proxy-executor memo: ops whose kernels call AOTInductor's proxy executor, which a
  bare ``kernel.so`` cannot (:func:`known_proxy_op`, :func:`remember_proxy_op`,
  :func:`needs_proxy_executor`).
"""

from __future__ import annotations

import json
import os

import torch

from aoti_farm import signature as S
from aoti_farm.cache.failures import PROXY_EXECUTOR_REFUSAL
from aoti_farm.compile import adversarial
from aoti_farm.compile.faults import _first_line
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.tolerance import compare, flag_tolerance, length_tolerance, precision
from aoti_farm.errors import CompileRefused


def eager_flags() -> dict:
    """The global flags that change what eager's CUDA convolutions and matmuls return
    (recorded in the manifest's verification as ``flags``; tolerance.flag_tolerance reads them)."""
    return {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


def stated_tolerance(sig: S.Signature, args: tuple, kwargs: dict, expected) -> tuple[float, float]:
    """Extra (rtol, atol) of one comparison: the length-scaled one (sums, scans, matrix
    products) plus, on CUDA, TF32's where eager ran with it allowed."""
    a = length_tolerance(sig, args, kwargs, expected)
    b = flag_tolerance(sig, args, kwargs, eager_flags() if sig.device == "cuda" else None)
    return a[0] + b[0], a[1] + b[1]


#: The host's memo of ops whose kernels need the proxy executor, per torch build.
_PROXY_MEMO_MAX = 1 << 20


def _proxy_memo_path() -> str:
    from aoti_farm.security.fsutil import memo_dir

    return os.path.join(memo_dir(), f"proxy-ops-{torch.version.git_version[:12]}.json")


def known_proxy_op(op: str, device: str) -> bool:
    """Whether an earlier compile on this host (same torch build) found that ``op``'s kernel
    on ``device`` needs AOTInductor's proxy executor: then a new signature of it is refused
    before Inductor runs (a 2.5 s compile for nothing otherwise: every shape of a U-Net's
    ``cudnn_convolution``).  Whether an op falls back to a shim-less kernel depends on
    Inductor's lowerings, decompositions and the device, which only a compile settles, so
    the first signature of such an op is compiled and its generated source decides
    (:func:`needs_proxy_executor`); the memo is private (:mod:`aoti_farm.security.private`) and read
    bounded.  Unreadable or absent: False."""
    from aoti_farm.security.safeio import read_bounded

    try:
        d = json.loads(read_bounded(_proxy_memo_path(), max_bytes=_PROXY_MEMO_MAX, uids=(os.getuid(),)))
    except Exception:  # noqa: BLE001 -- no memo (or an unreadable one): compile and see
        return False
    return isinstance(d, dict) and op in (d.get(device) or [])


def remember_proxy_op(op: str, device: str) -> None:
    """Add ``op`` on ``device`` to the memo (:func:`known_proxy_op`); never raises."""
    try:
        from aoti_farm.security.safeio import read_bounded
        from aoti_farm.security.private import atomic_write

        path = _proxy_memo_path()
        try:
            d = json.loads(read_bounded(path, max_bytes=_PROXY_MEMO_MAX, uids=(os.getuid(),)))
        except Exception:  # noqa: BLE001
            d = {}
        if not isinstance(d, dict):
            d = {}
        ops = [o for o in (d.get(device) or []) if isinstance(o, str)]
        if op not in ops:
            d[device] = sorted(ops + [op])
            atomic_write(path, json.dumps(d).encode())
    except Exception:  # noqa: BLE001 -- a memo is an optimisation
        pass


def needs_proxy_executor(build_dir: str) -> bool:
    """Whether the wrapper AOTInductor generated calls its proxy executor: an op without a
    C shim (``_logcumsumexp``, ``cudnn_convolution`` on torch 2.11-2.13) becomes such a call,
    which a bare ``kernel.so`` cannot make.  On CPU the call then raises; on CUDA the shim
    logs the error and the kernel returns whatever its output buffer held, so the
    generated source, not the kernel's behaviour, is what tells it."""
    try:
        names = [n for n in os.listdir(build_dir) if n.endswith(".cpp") and ".wrapper" in n]
    except OSError:
        return False
    for n in names:
        try:
            with open(os.path.join(build_dir, n), "rb") as f:
                if b"aoti_torch_proxy_executor_call_function" in f.read(64 << 20):
                    return True
        except OSError:
            continue
    return False


def _raises(fn) -> tuple[object, BaseException | None]:
    try:
        with torch.no_grad():
            return fn(), None
    except Exception as e:  # noqa: BLE001 -- eager's or the kernel's error is the result here
        return None, e


def check_case(sig: S.Signature, op, runner, name: str, args: tuple, kwargs: dict,
               eager: tuple | None = None, kernel: tuple | None = None, notes: list | None = None) -> None:
    """One case (adversarial, or random inputs on which one side raised): eager and the
    kernel must both raise, or both return the same thing; CompileRefused otherwise
    (evidence names the case and the error).  ``eager``/``kernel``: (result, error) already
    run.

    ``notes`` (the verification's edge notes, docs/verification.md "The contract"): a
    difference the finite contract does not call one is appended there instead of refused:
    on an edge case (:func:`edge_class`: non-finite inputs, or magnitudes whose sum of
    squares overflows a reduction's accumulation), any difference; on any case, the sign of
    a zero result (the values are then compared without it)."""
    if notes is not None:
        cls = edge_class(sig, name, args, kwargs)
        if cls is not None:
            try:
                check_case(sig, op, runner, name, args, kwargs, eager, kernel)
            except CompileRefused as e:
                if e.reason == PROXY_EXECUTOR_REFUSAL:
                    raise
                _note(notes, edge_note(cls, name, e.evidence or {}, e.reason))
            return
    expected, e_err = eager or _raises(lambda: op(*args, **kwargs))
    got, k_err = kernel or _raises(lambda: runner.run(flat_tensors(sig, args, kwargs)))
    if e_err is not None and k_err is not None:
        return
    if e_err is not None:
        raise CompileRefused(f"kernel does not raise where eager raises: {name}",
                             {"case": name, "eager_error": f"{type(e_err).__name__}: {_first_line(e_err)}"})
    if k_err is not None and "proxy executor" in str(k_err):
        # an op without a C shim compiles to a call of AOTInductor's proxy executor, which a
        # bare kernel.so has no way to run: unsupported, recorded once (never infrastructure)
        remember_proxy_op(sig.op, sig.device)
        raise CompileRefused(PROXY_EXECUTOR_REFUSAL,
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    if k_err is not None:
        raise CompileRefused(f"kernel raises where eager does not: {name}",
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    extra = stated_tolerance(sig, args, kwargs, expected)
    bad = compare(expected, got, extra)
    if bad is not None and notes is not None and bad.get("problem") == "sign of zero":
        _note(notes, edge_note("sign of zero", name, bad))
        bad = compare(expected, got, extra, zero_sign=False)
    if bad is not None:
        bad["case"] = name
        raise CompileRefused(f"kernel disagrees with eager on adversarial inputs: {name}", bad)


#: The classes of edge notes (docs/verification.md, "The contract"): differences the finite
#: contract does not call differences, recorded on the entry; ``contract="strict"`` serves
#: no kernel that has one.
EDGE_CLASSES = ("sign of zero", "non-finite inputs", "overflowing magnitudes")


def edge_class(sig: S.Signature, case: str, args: tuple, kwargs: dict) -> str | None:
    """The edge class of adversarial case ``case`` of this call, or None (an ordinary case,
    where every difference is refused): the cases whose inputs are not finite, and the
    magnitudes case where the op reduces or normalises and the sum of squares of a
    floating input overflows its dtype (a result eager itself gets only by accumulating
    otherwise: a Welford mean against a sum, float64 against float32)."""
    if case in adversarial.NONFINITE_CASES:
        return "non-finite inputs"
    if case != "magnitudes":
        return None
    ins = [t for t in flat_tensors(sig, args, kwargs) if t.is_floating_point() and t.numel()]
    name = sig.op.split("::")[-1].split(".")[0]
    reduces = "norm" in name or name in adversarial.REDUCING_OPS
    for t in ins:
        if reduces and float(t.detach().double().square().sum()) > torch.finfo(t.dtype).max:
            return "overflowing magnitudes"
    return None


def edge_note(cls: str, case: str, evidence: dict, reason: str | None = None) -> dict:
    """One edge note: its class, the case, and the difference (the evidence's problem and
    first values: small enough for a manifest)."""
    keep = {k: evidence[k] for k in ("output", "problem", "flat_index", "first_index", "eager", "kernel")
            if k in evidence}
    return {"class": cls, "case": case, **keep, **({"reason": reason} if reason else {})}


def _note(notes: list, note: dict) -> None:
    """At most one note per (class, case)."""
    if not any(n["class"] == note["class"] and n["case"] == note["case"] for n in notes):
        notes.append(note)


def _widened(x):
    """``x`` with every narrow float tensor as a float64 copy (lists too)."""
    if isinstance(x, torch.Tensor):
        return x.double() if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_widened(v) for v in x)
    return x


def check_precision(sig: S.Signature, op, runner, name: str, args: tuple, kwargs: dict) -> None:
    """A precision case (ill-conditioned finite inputs: :data:`adversarial.PRECISION_CASES`):
    the kernel must be at least as accurate as eager against the same call in float64,
    wherever eager is (:func:`tolerance.precision`).  A case eager or the float64 call
    rejects is skipped (raising is the edge cases' to check); the kernel raising where
    eager does not is refused as anywhere."""
    wide_args, wide_kwargs = _widened(args), _widened(kwargs)
    expected, e_err = _raises(lambda: op(*args, **kwargs))
    if e_err is not None:
        return
    got, k_err = _raises(lambda: runner.run(flat_tensors(sig, args, kwargs)))
    if k_err is not None:
        raise CompileRefused(f"kernel raises where eager does not: {name}",
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    truth, t_err = _raises(lambda: op(*wide_args, **wide_kwargs))
    if t_err is not None:
        return
    bad = precision(expected, got, truth, stated_tolerance(sig, args, kwargs, expected))
    if bad is not None:
        bad["case"] = name
        raise CompileRefused(f"kernel less accurate than eager on ill-conditioned inputs: {name}", bad)
