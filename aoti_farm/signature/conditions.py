"""The globals that change an op's result without being one of its arguments.

``torch.set_default_dtype(torch.float64)`` makes ``int_tensor / int_tensor`` and
``sigmoid(int_tensor)`` float64; the TF32 flags, cuBLAS's reduced-precision reductions and
the cuDNN/oneDNN switches choose other algorithms (other values) for matmuls and
convolutions; deterministic mode chooses other kernels for scatters and index ops.  None of
them is in a call's arguments, so none is in its signature.

They are a **condition of serving**, not part of the key: a kernel is compiled and
verified in a fresh compile process, under torch's defaults (:data:`DEFAULTS`), and Inductor
bakes some of them in (the default dtype into type promotion, TF32 into its matmul
templates), so a kernel is served only while every one of them is what it was verified
under; otherwise the call runs eager, counted by the first field that differs
(``conditions: default_dtype=float64``).  A compiler that compiles under other values
uses :func:`applied` around compile *and* verification and records :func:`as_dict` in the
manifest as ``conditions``; the hook reads that field (absent: :data:`DEFAULTS`).

The native hit path keys every call by the same values (``fastpath.cpp``:
``key_conditions``), so a decision remembered under one setting is never replayed under
another.  ``aoti-farm key`` prints them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from aoti_farm.signature.names import DTYPE_NAMES, dtype_from_name

_C = torch._C


def _matmul_precision() -> str:
    # torch 2.13 raises here once a program mixed its legacy and new precision APIs
    try:
        return _C._get_float32_matmul_precision()
    except RuntimeError:
        return "mixed"


#: (name, getter, setter, devices whose results it changes) of every condition; the
#: getters are torch's own C functions, read on every hit of the Python path.
_CPU, _CUDA, _BOTH = ("cpu",), ("cuda",), ("cpu", "cuda")
_FIELDS: tuple = (
    ("default_dtype", torch.get_default_dtype, torch.set_default_dtype, _BOTH),
    ("matmul_allow_tf32", _C._get_cublas_allow_tf32, _C._set_cublas_allow_tf32, _CUDA),
    ("cudnn_allow_tf32", _C._get_cudnn_allow_tf32, _C._set_cudnn_allow_tf32, _CUDA),
    # "medium" lets oneDNN run float32 matmuls in bfloat16 on CPU too
    ("float32_matmul_precision", _matmul_precision, _C._set_float32_matmul_precision, _BOTH),
    ("cublas_fp16_reduction", _C._get_cublas_allow_fp16_reduced_precision_reduction,
     lambda v: _C._set_cublas_allow_fp16_reduced_precision_reduction(*v), _CUDA),
    ("cublas_bf16_reduction", _C._get_cublas_allow_bf16_reduced_precision_reduction,
     lambda v: _C._set_cublas_allow_bf16_reduced_precision_reduction(*v), _CUDA),
    ("cublas_fp16_accumulation", _C._get_cublas_allow_fp16_accumulation, _C._set_cublas_allow_fp16_accumulation,
     _CUDA),
    ("cpu_fp16_reduction", _C._get_cpu_allow_fp16_reduced_precision_reduction,
     _C._set_cpu_allow_fp16_reduced_precision_reduction, _CPU),
    ("cudnn_enabled", _C._get_cudnn_enabled, _C._set_cudnn_enabled, _CUDA),
    ("cudnn_deterministic", _C._get_cudnn_deterministic, _C._set_cudnn_deterministic, _CUDA),
    ("cudnn_benchmark", _C._get_cudnn_benchmark, _C._set_cudnn_benchmark, _CUDA),
    ("mkldnn_enabled", _C._get_mkldnn_enabled, _C._set_mkldnn_enabled, _CPU),
    ("mkldnn_deterministic", _C._get_mkldnn_deterministic, _C._set_mkldnn_deterministic, _CPU),
    ("deterministic_algorithms", _C._get_deterministic_algorithms, torch.use_deterministic_algorithms, _BOTH),
)
NAMES: tuple[str, ...] = tuple(f[0] for f in _FIELDS)
_GETTERS = tuple(f[1] for f in _FIELDS)
#: per device, the indices of the fields that change its results
_INDICES = {d: tuple(i for i, f in enumerate(_FIELDS) if d in f[3]) for d in _BOTH}

#: What a fresh process has (a compile actor's, a verification child's): what every
#: kernel without a manifest ``conditions`` field was compiled and verified under.
DEFAULTS: tuple = (torch.float32, False, True, "highest", (True, True), (True, True), False, False,
                   True, False, False, True, False, False)


def current() -> tuple:
    """This process's values, in :data:`NAMES` order."""
    return tuple(g() for g in _GETTERS)


def for_device(device: str, values: tuple = DEFAULTS) -> dict[str, Any]:
    """``{name: value}`` of the fields that change ``device``'s results (``aoti-farm key``)."""
    return {NAMES[i]: _jsonable(values[i]) for i in _INDICES.get(device, _INDICES["cuda"])}


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return DTYPE_NAMES[v]
    return list(v) if isinstance(v, tuple) else v


def as_dict(values: tuple | None = None) -> dict[str, Any]:
    """``{name: value}`` (JSON/msgpack-safe: tuples become lists) of ``values`` (default: now)."""
    vals = current() if values is None else values
    return {n: _jsonable(v) for n, v in zip(NAMES, vals)}


def from_dict(d: Any) -> tuple:
    """The tuple form of a manifest's ``conditions`` (missing fields: :data:`DEFAULTS`);
    anything malformed reads as values no process has (never served)."""
    if d is None:
        return DEFAULTS
    if not isinstance(d, dict):
        return ("malformed",) * len(NAMES)
    out = []
    for n, dflt in zip(NAMES, DEFAULTS):
        v = d.get(n, dflt)
        if n == "default_dtype" and isinstance(v, str):
            try:
                v = dtype_from_name(v)
            except (KeyError, ValueError):
                v = "malformed"
        out.append(tuple(v) if isinstance(v, list) else v)
    return tuple(out)


def mismatch(device: str = "cuda", expected: tuple = DEFAULTS) -> str | None:
    """None when this process's values of the fields that change ``device``'s results are
    ``expected``'s; else ``"name=value"`` of the first that differs (the counted reason a
    kernel is not served)."""
    for i in _INDICES.get(device, _INDICES["cuda"]):
        v = _GETTERS[i]()
        if v != expected[i]:
            return f"{NAMES[i]}={_jsonable(v)}"
    return None


@contextlib.contextmanager
def applied(values: tuple | dict) -> Iterator[None]:
    """Set every condition to ``values`` inside the block (for a compiler that compiles and
    verifies a kernel under a recorded setting); restores the previous values after."""
    vals = from_dict(values) if isinstance(values, dict) else values
    before = current()
    try:
        _set(vals)
        yield
    finally:
        _set(before)


def _set(vals: tuple) -> None:
    # the precision first: setting it also sets the cuBLAS TF32 flag, set after it
    for i in sorted(range(len(_FIELDS)), key=lambda i: _FIELDS[i][0] != "float32_matmul_precision"):
        _FIELDS[i][2](vals[i])
