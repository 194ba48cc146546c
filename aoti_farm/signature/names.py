"""The names a signature uses for torch values, and the limits of its integers.

dtype, layout and memory-format names (both ways), the canonical device form, and the
int64 rule: every integer of a signature (a size, a stride, a scalar, a list item, a
range) is an int64, as in torch's schemas.
"""

from __future__ import annotations

import re
import struct
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


class BitsFloat(float):
    """A float that equals another float only when their bits are equal.

    Encodings are compared as tuples (the hook's memo, the recorder's table, the key's
    cache), and Python's ``-0.0 == 0.0`` would let ``leaky_relu(x, -0.0)`` find the kernel
    built for ``0.0``.  Only the floats whose value equality is not bit equality (signed
    zeros, NaN) are made one (:func:`exact_float`), so every other scalar stays a plain
    float and costs nothing more.  msgpack packs it as the float it is, so keys are
    unchanged."""

    __slots__ = ()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, float) and struct.pack("<d", self) == struct.pack("<d", other)

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        # a plain float equal to it hashes alike (0.0 and -0.0 hash to 0 and merely collide)
        return float.__hash__(self) if float.__eq__(self, self) else hash(struct.pack("<d", self))

    def __reduce__(self):
        return (BitsFloat, (float(self),))


def exact_float(v: float) -> float:
    """``v`` as a float whose equality is bit equality (see :class:`BitsFloat`)."""
    if v == 0.0 or v != v:
        return BitsFloat(v)
    return float(v)


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
