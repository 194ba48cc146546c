"""Example inputs for a signature (random data of the right dtype, size and strides) and
its short human form."""

from __future__ import annotations

from typing import Any

import torch

from aoti_farm.errors import Ineligible
from aoti_farm.signature.key import Signature
from aoti_farm.signature.names import DTYPES, FLOAT_DTYPES, INT64_MAX, INT_DTYPES, LAYOUTS, MEMORY_FORMATS


def storage_size(sizes: tuple, strides: tuple) -> int:
    """Elements of the storage a tensor of these sizes and strides spans."""
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(sizes, strides))


def make_tensor(enc: tuple, gen: torch.Generator, value_range: list | None = None,
                device_override: str | None = None) -> torch.Tensor:
    _, dt, sizes, strides, dev = enc
    dtype = DTYPES[dt]
    n = storage_size(sizes, strides)
    if dt in FLOAT_DTYPES:
        if value_range:
            base = torch.empty(n, dtype=torch.float64).uniform_(value_range[0], value_range[1], generator=gen)
        else:
            base = torch.randn(n, dtype=torch.float64, generator=gen)
        base = base.to(dtype)
    elif dt == "bool":
        base = torch.randint(0, 2, (n,), generator=gen).bool()
    elif dt in INT_DTYPES:
        lo, hi = (int(value_range[0]), int(value_range[1])) if value_range else (
            0, 15)  # without a recorded range: small and non-negative, safe as an index
        base = torch.randint(lo, min(hi, INT64_MAX - 1) + 1, (n,), generator=gen, dtype=torch.int64).to(dtype)
    elif dt.startswith("complex"):
        base = torch.randn(n, dtype=dtype, generator=gen)
    else:
        raise Ineligible(f"dtype {dt}")
    target = device_override or dev
    if target != "cpu":
        base = base.to(target)
    return base.as_strided(sizes, strides)


def decode_value(a: tuple) -> Any:
    """The Python value of a non-tensor argument's encoding (``("i", 2)`` -> 2)."""
    tag, v = a[0], (a[1] if len(a) > 1 else None)
    return {
        "N": lambda: None, "b": lambda: v, "i": lambda: v, "f": lambda: v, "s": lambda: v,
        "dtype": lambda: DTYPES[v], "layout": lambda: LAYOUTS[v], "mf": lambda: MEMORY_FORMATS[v],
        "dev": lambda: torch.device(v), "il": lambda: list(v), "fl": lambda: list(v),
        "bl": lambda: list(v),
    }[tag]()


def _item_range(items: list, i: int) -> list | None:
    """The value range of item ``i`` of a tensor list: its hint is ``{"range": [lo, hi]}``
    or None (jsonform.check_hints), and the range, not the hint, is what make_tensor takes."""
    h = items[i] if i < len(items) else None
    return h.get("range") if isinstance(h, dict) else None


def materialize(sig: Signature, seed: int = 0) -> tuple[tuple, dict]:
    """Example (args, kwargs) for a signature: random data of the right dtype, size and
    strides; integer tensors take the recorded value range (so indices are in range)."""
    gen = torch.Generator().manual_seed(seed)
    info = sig.info()
    args, kwargs = [], {}
    for name, a, kwo in zip(info.arg_names, sig.args, info.kwarg_only):
        rng = (sig.hints.get(name) or {}).get("range")
        if a[0] == "T":
            v: Any = make_tensor(a, gen, rng)
        elif a[0] == "TL":
            items_h = sig.hints.get(name, {}).get("items") or []
            v = [None if t[0] == "N" else make_tensor(t, gen, _item_range(items_h, i) or rng)
                 for i, t in enumerate(a[1])]
        else:
            v = decode_value(a)
        (kwargs.__setitem__(name, v) if kwo else args.append(v))
    return tuple(args), kwargs


def tensor_positions(sig: Signature) -> list[tuple[int, int | None]]:
    """(arg index, list index or None) of every tensor input, in runner-input order."""
    out = []
    for i, a in enumerate(sig.args):
        if a[0] == "T":
            out.append((i, None))
        elif a[0] == "TL":
            out.extend((i, j) for j, t in enumerate(a[1]) if t[0] == "T")
    return out


def describe(sig: Signature) -> str:
    """Short human form: aten::add.Tensor(f32[64,128], f32[64,128], alpha=2)"""
    parts = []
    for name, a in zip(sig.info().arg_names, sig.args):
        if a[0] == "T":
            parts.append(f"{a[1]}{list(a[2])}" + ("" if a[4] == "cpu" else f"@{a[4]}"))
        elif a[0] == "TL":
            parts.append("[" + ", ".join(f"{t[1]}{list(t[2])}" if t[0] == "T" else "None" for t in a[1]) + "]")
        elif a[0] != "N":
            parts.append(f"{name}={a[1]!r}")
    return f"{sig.op}({', '.join(parts)})"
