"""The names a signature uses for torch values, and the limits of its integers.

dtype, layout and memory-format names (both ways), the canonical device form, and the
int64 rule: every integer of a signature (a size, a stride, a scalar, a list item, a
range) is an int64, as in torch's schemas.
"""

from __future__ import annotations

import re
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    str(d).split(".")[-1]: d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.complex64, torch.complex128,
    )
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
LAYOUT_NAMES = {v: k for k, v in LAYOUTS.items()}
MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
    "channels_last_3d": torch.channels_last_3d,
}
MEMORY_FORMAT_NAMES = {v: k for k, v in MEMORY_FORMATS.items()}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")

#: Largest tensor (elements) a trace may describe; beyond this it is "absurd".
MAX_NUMEL = 1 << 31
#: Every integer of a signature is an int64; anything else is refused (ValueError) when
#: parsed, and a call that passes one is never served (Ineligible).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def is_int64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def to_float(v: Any, where: str) -> float:
    """``float(v)``; a number too large for a float is a ValueError naming ``where``."""
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{where}: {str(v)[:40]}... is too large for a float") from None


_CUDA_DEV = re.compile(r"cuda:(0|[1-9][0-9]{0,5})")


def device_ok(v: Any) -> bool:
    """'cpu' or 'cuda:N' in canonical form (the form the recorder writes)."""
    return isinstance(v, str) and (v == "cpu" or _CUDA_DEV.fullmatch(v) is not None)


_DEVICE_STR: dict = {}


def device_str(d: torch.device) -> str:
    """The canonical form of a device: 'cpu' or 'cuda:N' (index 0 when none is given)."""
    s = _DEVICE_STR.get(d)
    if s is None:
        s = _DEVICE_STR[d] = "cpu" if d.type == "cpu" else f"{d.type}:{d.index if d.index is not None else 0}"
    return s


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (one of {', '.join(DTYPES)})") from None


def short_repr(v: Any) -> str:
    """``repr(v)``, cut to 60 characters, for error messages about untrusted values."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."
