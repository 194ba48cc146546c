"""Encoding a call: every argument of the op's schema as a small tagged tuple.

This is the one normalisation shared by the recorder and the runtime hook
(:func:`encode_call`); the tags are listed in the package docstring.
"""

from __future__ import annotations

from typing import Any

import torch

from aoti_farm.errors import Ineligible
from aoti_farm.signature.names import (DTYPE_NAMES, INT64_MAX, INT64_MIN, LAYOUT_NAMES, MEMORY_FORMAT_NAMES,
                                       device_str, exact_float)
from aoti_farm.signature.ops import NO_DEFAULT, OpInfo

_WRAPPED_DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex128)


def encode_tensor(t: torch.Tensor) -> tuple:
    if t.layout is not torch.strided:
        raise Ineligible("non-strided tensor")
    if t.is_conj() or t.is_neg():
        # a lazy conjugate/negative view: the AOTI runner would read the raw data
        raise Ineligible("conjugate or negative view")
    if t.dim() == 0 and t.dtype in _WRAPPED_DTYPES and t.device.type == "cpu":
        # Possibly a Python scalar wrapped by C++ (torch.allclose calls add(x, 1.0)).
        # Wrapped numbers take part in type promotion unlike 0-dim tensors, and torch
        # offers Python no way to tell them apart, so every such tensor is left to eager.
        raise Ineligible("0-dim CPU double/long/bool tensor (maybe a wrapped Python number)")
    try:
        return ("T", DTYPE_NAMES[t.dtype], tuple(t.shape), t.stride(), device_str(t.device))
    except KeyError:
        raise Ineligible(f"dtype {t.dtype}") from None


def encode_value(kind: str, v: Any) -> tuple:
    """One argument's encoding for its schema ``kind`` (an ``OpInfo.kinds`` item)."""
    if v is None:
        if kind.startswith("opt") or kind == "opt_tensor":
            return ("N",)
        raise Ineligible("None for a required argument")
    k = kind[4:] if kind.startswith("opt:") else kind
    if k in ("tensor", "opt_tensor"):
        if not isinstance(v, torch.Tensor):
            raise Ineligible(f"expected a tensor, got {type(v).__name__}")
        return encode_tensor(v)
    if k in ("tensor_list", "opt_tensor_list"):
        return ("TL", tuple(("N",) if x is None else encode_tensor(x) for x in v))
    if k in ("int", "float", "bool", "scalar"):
        if isinstance(v, bool):
            return ("b", v)
        if isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise Ineligible("integer outside int64")
            return ("i", v)
        if isinstance(v, float):
            return ("f", exact_float(v))   # -0.0 is not 0.0 (keys compare bits)
        raise Ineligible(f"scalar of type {type(v).__name__}")
    if k == "str":
        return ("s", str(v))
    if k == "dtype":
        return ("dtype", DTYPE_NAMES[v])
    if k == "layout":
        return ("layout", LAYOUT_NAMES[v])
    if k == "mf":
        return ("mf", MEMORY_FORMAT_NAMES[v])
    if k == "device":
        return ("dev", device_str(torch.device(v)))
    if k == "int_list":
        il = tuple(int(x) for x in v)
        if not all(INT64_MIN <= x <= INT64_MAX for x in il):
            raise Ineligible("integer outside int64")
        return ("il", il)
    if k == "float_list":
        return ("fl", tuple(exact_float(float(x)) for x in v))
    if k == "bool_list":
        return ("bl", tuple(bool(x) for x in v))
    raise Ineligible(f"argument kind {kind}")


def encode_call(info: OpInfo, args: tuple, kwargs: dict) -> tuple:
    """Bind a call to the op's schema and encode every argument.

    Raises :class:`Ineligible` when the call cannot be represented.  This is the one
    normalisation shared by the recorder and the runtime hook.
    """
    out = []
    n = len(args)
    for i, name in enumerate(info.arg_names):
        if i < n and not info.kwarg_only[i]:
            v = args[i]
        elif name in kwargs:
            v = kwargs[name]
        else:
            v = info.defaults[i]
            if v is NO_DEFAULT:
                raise Ineligible(f"missing argument {name!r}")
        out.append(encode_value(info.kinds[i], v))
    return tuple(out)
