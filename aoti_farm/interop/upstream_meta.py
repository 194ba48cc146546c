"""The metadata of torch's own AOTI-eager cache (``torch._inductor.aoti_eager``).

Upstream's C++ ``AOTIPythonKernelHolder`` (registered by
``torch.library.Library(ns, "IMPL")._impl_with_aoti_compile(op, "CPU")``) reads, once when
it is registered, ``load_aoti_eager_cache(ns, op, device)``: by default the file
``$TORCHINDUCTOR_CACHE_DIR/aoti_eager/<ns>/<device>/<op>.json``, a list of
``{"meta_info": [...], "kernel_path": "<relative to the device dir>"}``.  On each call it
builds the same metadata from the call's arguments and serves the first item whose
metadata equals it.  The rules of that lookup, which this module reproduces exactly
(checked against a cache written by upstream itself, see tests/e2e/test_upstream.py):

* an argument whose value equals the schema default is left out; ``arg_order`` counts
  only the arguments that are kept, in schema order.  The comparison is ``IValue``'s,
  which is type-strict: ``alpha=1`` is the default, ``alpha=1.0`` is not;
* a ``None`` for an ``Optional[Tensor]`` without a default takes an ``arg_order`` slot
  but has no metadata; a ``None`` for any other argument is not supported by the holder;
* tensors: device_type, device_index (-1 on CPU), dtype, sizes, strides,
  requires_grad (always False here), dispatch_key_set (the raw key set of a plain dense
  tensor of that dtype and device);
* Python numbers: ``dtype`` int -> torch.int32, float -> torch.float32, bool ->
  torch.bool (upstream's ``supported_builtin_dtype_torch_dtype``) and ``scalar_value``;
  a ``float`` schema argument is always a float, an ``int`` one always an int;
* str -> ``string_value``; dtype -> ``dtype_value``; layout -> ``layout_value``;
  device -> ``device_type_value``/``device_index_value``;
* int/float/bool lists and memory formats (other than their defaults) are not supported
  by the holder: such signatures are skipped with that reason.

:mod:`aoti_farm.interop.upstream` writes (``export_upstream``) and reads (``import_upstream``) that
layout with these.
:func:`meta_info` with ``as_objects=True`` is the already-converted form that upstream's
``register_aoti_compile_backend`` load functions return (used by
``aoti_farm.runtime.upstream``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from aoti_farm import signature as S
from aoti_farm.errors import Ineligible

LIB_SUBDIR = "aoti_farm"
DEVICES = ("cpu", "cuda")


# --- the metadata upstream's holder matches ------------------------------------------------


def _scalar_dtypes() -> dict[type, torch.dtype]:
    try:
        from torch._inductor.aoti_eager import supported_builtin_dtype_torch_dtype

        return supported_builtin_dtype_torch_dtype()
    except ImportError:  # pragma: no cover - torch without aoti_eager
        return {int: torch.int32, float: torch.float32, bool: torch.bool}


@lru_cache(maxsize=None)
def _dispatch_key_set(dtype: str, device: str) -> int:
    """Raw dispatch key set of a plain dense tensor, as the holder records it."""
    if device != "cpu" and not torch.cuda.is_available():
        raise Ineligible(f"a {device} tensor's dispatch key set can only be computed on a host with a GPU")
    t = torch.empty(0, dtype=S.dtype_from_name(dtype), device=device)
    return int(torch._C._dispatch_keys(t).raw_repr())


def _base(kind: str) -> str:
    return kind[4:] if kind.startswith("opt:") else kind


def _ivalue(kind: str, enc: tuple) -> tuple:
    """What the C++ IValue of an encoded argument looks like, for default comparison."""
    tag, base = enc[0], _base(kind)
    if tag == "N":
        return ("none",)
    if base == "float" and tag in ("i", "f"):
        return ("double", float(enc[1]))
    if base == "int" and tag == "i":
        return ("int", int(enc[1]))
    if tag == "b":
        return ("bool", enc[1])
    if tag == "i":
        return ("int", enc[1])
    if tag == "f":
        return ("double", enc[1])
    return enc


def _is_default(info: S.OpInfo, i: int, enc: tuple) -> bool:
    d = info.defaults[i]
    if d is S.NO_DEFAULT:
        return False
    try:
        denc = S.encode_value(info.kinds[i], d)
    except (Ineligible, KeyError, TypeError, ValueError):
        return False
    return _ivalue(info.kinds[i], enc) == _ivalue(info.kinds[i], denc)


def _tensor_meta(enc: tuple, as_objects: bool) -> dict:
    _, dt, sizes, strides, dev = enc
    dtype = S.dtype_from_name(dt)
    dtype_type, index = ("cpu", -1) if dev == "cpu" else (dev.split(":")[0], int(dev.split(":")[1]))
    return {"is_dynamic": False, "device_type": dtype_type, "device_index": index,
            "dtype": dtype if as_objects else str(dtype), "sizes": list(sizes), "strides": list(strides),
            "requires_grad": False, "dispatch_key_set": _dispatch_key_set(dt, dev)}


def meta_info(sig: S.Signature, *, as_objects: bool = False) -> list[dict]:
    """The ``meta_info`` list upstream's holder computes for a call of ``sig``.

    ``as_objects=False``: the JSON form (dtype/layout as strings, like upstream writes);
    True: the form ``load_aoti_eager_cache`` hands the holder (torch objects).
    Raises :class:`Ineligible` when the holder cannot serve such a call."""
    info = sig.info()
    device = sig.device
    py_dtype = _scalar_dtypes()
    out: list[dict] = []
    order = 0
    for i, (name, kind, enc) in enumerate(zip(info.arg_names, info.kinds, sig.args)):
        if _is_default(info, i, enc):
            continue
        tag, base = enc[0], _base(kind)
        m: dict[str, Any] | None
        if tag == "T":
            m = _tensor_meta(enc, as_objects)
        elif tag == "TL":
            m = {"tensor_list": [_tensor_meta(t, as_objects) for t in enc[1] if t[0] == "T"]}
        elif tag == "N":
            if base != "opt_tensor":
                raise Ineligible(f"argument {name!r} is None without being its default; upstream's holder "
                                 "cannot take None for a non-tensor argument")
            m = None  # takes an arg_order slot, no metadata (as the holder does)
        elif tag in ("b", "i", "f"):
            iv = _ivalue(kind, enc)
            pytype = {"bool": bool, "int": int, "double": float}[iv[0]]
            value = pytype(iv[1])
            dt = py_dtype[pytype]
            m = {"is_dynamic": False, "device_type": device, "device_index": -1 if device == "cpu" else 0,
                 "dtype": dt if as_objects else str(dt), "scalar_value": value}
        elif tag == "s":
            m = {"string_value": enc[1]}
        elif tag == "dtype":
            d = S.dtype_from_name(enc[1])
            m = {"dtype_value": d if as_objects else str(d)}
        elif tag == "layout":
            lay = S.LAYOUTS[enc[1]]
            m = {"layout_value": lay if as_objects else str(lay)}
        elif tag == "dev":
            dtype_, _, idx = enc[1].partition(":")
            m = {"device_type_value": dtype_, "device_index_value": int(idx) if idx else None}
        else:
            what = {"mf": "memory format", "il": "int list", "fl": "float list", "bl": "bool list"}.get(tag, tag)
            raise Ineligible(f"argument {name!r} is a {what} other than its default; upstream's holder "
                             "does not support such arguments")
        if m is not None:
            m["arg_order"] = order
            out.append(m)
        order += 1
    # The holder matches metadata only, so metadata that fits two bindings of the schema
    # (addmm(beta=2) vs addmm(alpha=2): one scalar at the same arg_order) would make it
    # serve this kernel for the other call.  Such calls are never handed to it.
    try:
        back = signature_from_meta(sig.op, out, device, S.describe(sig))
    except ValueError as e:
        raise Ineligible(f"upstream's metadata cannot identify this call: {e}") from None
    if back.key != sig.key:
        raise Ineligible(f"upstream's metadata of this call describes another call, {S.describe(back)}")
    return out


def op_file_names(op: str) -> tuple[str, list[str]]:
    """(namespace, [json stems]) for a qualified op: ``aten::add.Tensor`` -> ('aten',
    ['add.Tensor']); a default overload gets both ``relu`` (what ``_impl_with_aoti_compile``
    registers for an OpOverload) and ``relu.default``."""
    ns, _, rest = op.partition("::")
    if "." in rest:
        return ns, [rest]
    return ns, [rest, f"{rest}.default"]


# --- reading metadata back into a Signature --------------------------------------------------


def _dtype_name(v: Any, where: str) -> str:
    s = str(v).split(".")[-1]
    try:
        S.dtype_from_name(s)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return s


def _meta_tensor(m: Any, device: str, where: str) -> tuple:
    if not isinstance(m, dict):
        raise ValueError(f"{where}: must be an object")
    for f in ("dtype", "sizes", "strides", "device_type"):
        if f not in m:
            raise ValueError(f"{where}: missing field {f!r}")
    if m.get("is_dynamic"):
        raise ValueError(f"{where}: dynamic shapes are not supported")
    if m["device_type"] != device:
        raise ValueError(f"{where}: device_type {m['device_type']!r} in the {device} directory")
    idx = m.get("device_index", -1)
    dev = "cpu" if device == "cpu" else f"{device}:{idx if isinstance(idx, int) and idx >= 0 else 0}"
    d = {"dtype": _dtype_name(m["dtype"], f"{where}.dtype"), "sizes": m["sizes"], "strides": m["strides"],
         "device": dev}
    return S.tensor_from_json(d, where)


def _meta_candidate(kind: str, m: dict, device: str, where: str) -> tuple | None:
    """The encoding of one metadata item for a schema argument of ``kind``, or None when
    the item cannot be that argument."""
    base = _base(kind)
    if "tensor_list" in m:
        if base not in ("tensor_list", "opt_tensor_list"):
            return None
        items = m["tensor_list"]
        if not isinstance(items, list):
            raise ValueError(f"{where}.tensor_list: must be a list")
        return ("TL", tuple(_meta_tensor(t, device, f"{where}.tensor_list[{k}]") for k, t in enumerate(items)))
    if "scalar_value" in m:
        dt = _dtype_name(m.get("dtype"), f"{where}.dtype")
        v = m["scalar_value"]
        if dt == "bool":
            enc: tuple = ("b", bool(v))
        elif dt in S.INT_DTYPES:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{where}.scalar_value: {v!r} is not an integer")
            enc = ("i", v)
        elif dt in S.FLOAT_DTYPES:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{where}.scalar_value: {v!r} is not a number")
            enc = ("f", float(v))
        else:
            raise ValueError(f"{where}.dtype: scalar of dtype {dt} is not supported")
        ok = {"scalar": ("b", "i", "f"), "int": ("i",), "float": ("f",), "bool": ("b",)}.get(base, ())
        return enc if enc[0] in ok else None
    if "string_value" in m:
        return ("s", str(m["string_value"])) if base == "str" else None
    if "dtype_value" in m:
        return ("dtype", _dtype_name(m["dtype_value"], f"{where}.dtype_value")) if base == "dtype" else None
    if "layout_value" in m:
        name = str(m["layout_value"]).split(".")[-1]
        return ("layout", name) if base == "layout" and name in S.LAYOUTS else None
    if "memory_format_value" in m:
        name = str(m["memory_format_value"]).split(".")[-1]
        return ("mf", name) if base == "mf" and name in S.MEMORY_FORMATS else None
    if "device_type_value" in m:
        if base != "device":
            return None
        t, idx = m["device_type_value"], m.get("device_index_value")
        return ("dev", "cpu" if t == "cpu" else f"{t}:{idx if isinstance(idx, int) else 0}")
    if "sizes" in m:
        return _meta_tensor(m, device, where) if base in ("tensor", "opt_tensor") else None
    raise ValueError(f"{where}: not a metadata item upstream writes (no sizes/scalar_value/...)")


def signature_from_meta(op: str, meta: Any, device: str, where: str = "meta_info") -> S.Signature:
    """Rebuild the Signature a ``meta_info`` list describes, using the op's schema to
    restore left-out defaults.  ValueError (naming ``where``) when it is malformed or
    matches no binding, or more than one, of the schema's arguments."""
    info = S.op_info(S.resolve_op(op))
    if info.ineligible:
        raise ValueError(f"{where}: {op} is never served by aoti-farm: {info.ineligible}")
    if not isinstance(meta, list) or not all(isinstance(m, dict) for m in meta):
        raise ValueError(f"{where}: must be a list of objects")
    for k, m in enumerate(meta):
        o = m.get("arg_order")
        if isinstance(o, bool) or not isinstance(o, int) or o < 0:
            raise ValueError(f"{where}[{k}].arg_order: missing or not a non-negative integer")
    items = sorted(enumerate(meta), key=lambda km: km[1]["arg_order"])
    n = len(info.arg_names)
    found: dict[str, tuple] = {}

    def walk(i: int, j: int, order: int, acc: list) -> None:
        if len(found) > 1:
            return
        if i == n:
            if j == len(items):
                sig = S.Signature(info.name, tuple(acc))
                found.setdefault(sig.key, sig.args)
            return
        kind = info.kinds[i]
        if j < len(items) and items[j][1]["arg_order"] == order:
            k, m = items[j]
            enc = _meta_candidate(kind, m, device, f"{where}[{k}]")
            if enc is not None:
                walk(i + 1, j + 1, order + 1, acc + [enc])
        if info.defaults[i] is not S.NO_DEFAULT:
            try:
                denc = S.encode_value(kind, info.defaults[i])
            except Ineligible:
                denc = None
            if denc is not None:
                walk(i + 1, j, order, acc + [denc])
        if _base(kind) == "opt_tensor" and (j == len(items) or items[j][1]["arg_order"] > order):
            walk(i + 1, j, order + 1, acc + [("N",)])

    walk(0, 0, 0, [])
    if not found:
        raise ValueError(f"{where}: does not match the arguments of {info.name} "
                         f"({', '.join(info.arg_names)})")
    if len(found) > 1:
        raise ValueError(f"{where}: matches the arguments of {info.name} in more than one way")
    (args,) = found.values()
    return S.Signature(info.name, args)
