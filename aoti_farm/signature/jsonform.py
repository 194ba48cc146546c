"""The JSON/msgpack form of a signature's arguments (traces, manifests, queue items).

:func:`arg_to_json` writes one encoded argument; :func:`decode_args` validates and decodes
an object's ``op``, ``args`` and ``hints``, raising ValueError that names the failing
field.  :func:`aoti_farm.signature.parse_signature` builds the Signature from them.
"""

from __future__ import annotations

import math
from typing import Any

from aoti_farm.errors import Ineligible
from aoti_farm.signature.encoding import encode_value
from aoti_farm.signature.names import (DTYPES, INT64_MAX, INT64_MIN, LAYOUTS, MAX_NUMEL, MEMORY_FORMATS, device_ok,
                                       is_int64, short_repr, to_float, exact_float)
from aoti_farm.signature.ops import NO_DEFAULT, OpInfo, op_info, resolve_op


def arg_to_json(name: str, a: tuple) -> dict:
    tag = a[0]
    if tag == "T":
        return {"name": name, "kind": "tensor", "dtype": a[1], "sizes": list(a[2]),
                "strides": list(a[3]), "device": a[4]}
    if tag == "N":
        return {"name": name, "kind": "none"}
    if tag == "TL":
        return {"name": name, "kind": "tensor_list",
                "items": [arg_to_json(f"{name}[{i}]", t) for i, t in enumerate(a[1])]}
    kinds = {"b": "bool", "i": "int", "f": "float", "s": "str", "dtype": "dtype",
             "layout": "layout", "mf": "memory_format", "dev": "device",
             "il": "int_list", "fl": "float_list", "bl": "bool_list"}
    v = a[1]
    if tag == "f" and not math.isfinite(v):
        v = repr(v)  # JSON has no inf/nan literal; "inf", "-inf", "nan"
    return {"name": name, "kind": kinds[tag], "value": list(v) if isinstance(v, tuple) else v}


_JSON_TAG = {"bool": "b", "int": "i", "float": "f", "str": "s", "dtype": "dtype",
             "layout": "layout", "memory_format": "mf", "device": "dev",
             "int_list": "il", "float_list": "fl", "bool_list": "bl"}

#: which encoded tags each schema kind accepts
_ACCEPTS = {
    "tensor": {"T"}, "opt_tensor": {"T", "N"}, "tensor_list": {"TL"},
    "opt_tensor_list": {"TL"}, "int": {"i"}, "float": {"f", "i"}, "bool": {"b"},
    "scalar": {"b", "i", "f"}, "str": {"s"}, "dtype": {"dtype"}, "layout": {"layout"},
    "device": {"dev"}, "mf": {"mf"}, "int_list": {"il"}, "float_list": {"fl"},
    "bool_list": {"bl"},
}


def tensor_from_json(d: dict, where: str) -> tuple:
    """A tensor argument's JSON object -> its ("T", ...) encoding; ValueError names the field."""
    for f in ("dtype", "sizes", "strides", "device"):
        if f not in d:
            raise ValueError(f"{where}: missing field {f!r}")
    if d["dtype"] not in DTYPES:
        raise ValueError(f"{where}.dtype: unknown dtype {d['dtype']!r}")
    sizes, strides = d["sizes"], d["strides"]
    for f, v in (("sizes", sizes), ("strides", strides)):
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"{where}.{f}: must be a list of integers")
        if not all(is_int64(x) for x in v):
            raise ValueError(f"{where}.{f}: a value is outside int64")
        if any(x < 0 for x in v):
            raise ValueError(f"{where}.{f}: negative value in {v}")
    if len(sizes) != len(strides):
        raise ValueError(f"{where}.strides: has {len(strides)} entries for {len(sizes)} sizes")
    numel = math.prod(sizes)
    if numel > MAX_NUMEL:
        raise ValueError(f"{where}.sizes: {sizes} has {numel} elements, over the limit of {MAX_NUMEL}")
    dev = d["device"]
    if not device_ok(dev):
        raise ValueError(f"{where}.device: {str(dev)[:40]!r} is not 'cpu' or 'cuda:N'")
    if "range" in d:
        check_range(d["range"], f"{where}.range")
    return ("T", d["dtype"], tuple(sizes), tuple(strides), dev)


def check_range(r: Any, where: str) -> None:
    """A value-range hint: [low, high], numbers within int64's range (NaN is not), low <= high."""
    def ok(x: Any) -> bool:
        return is_int64(x) or (isinstance(x, float) and INT64_MIN <= x <= INT64_MAX)

    if not (isinstance(r, list) and len(r) == 2 and ok(r[0]) and ok(r[1]) and r[0] <= r[1]):
        raise ValueError(f"{where}: must be [low, high], numbers within int64's range, with low <= high")


def check_hints(hints: Any, info: OpInfo, where: str) -> dict:
    """Hints decoded from a trace, manifest or queue item: per tensor (list) argument
    ``{"range": [lo, hi]}`` or ``{"items": [{"range": ...} | None, ...]}``."""
    if not isinstance(hints, dict):
        raise ValueError(f"{where}: must be an object")
    for name, h in hints.items():
        w = f"{where}.{short_repr(name)}"   # a name from the file: escaped and capped like a value
        if name not in info.arg_names:
            raise ValueError(f"{w}: {info.name} has no argument of that name")
        if not isinstance(h, dict) or not set(h) <= {"range", "items"}:
            raise ValueError(f"{w}: must be an object with 'range' or 'items'")
        if "range" in h:
            check_range(h["range"], f"{w}.range")
        if "items" in h:
            items = h["items"]
            if not isinstance(items, list) or len(items) > 1024:
                raise ValueError(f"{w}.items: must be a list (of at most 1024 items)")
            for j, it in enumerate(items):
                if it is not None:
                    if not isinstance(it, dict) or set(it) != {"range"}:
                        raise ValueError(f"{w}.items[{j}]: must be null or an object with a 'range'")
                    check_range(it["range"], f"{w}.items[{j}].range")
    return hints


def arg_from_json(kind: str, d: Any, where: str) -> tuple:
    """One argument's JSON object -> its encoding, checked against the schema ``kind``."""
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError(f"{where}: must be an object with a 'kind'")
    jk = d["kind"]
    if jk == "none":
        enc: tuple = ("N",)
    elif jk == "tensor":
        enc = tensor_from_json(d, where)
    elif jk == "tensor_list":
        items = d.get("items")
        if not isinstance(items, list):
            raise ValueError(f"{where}.items: must be a list")
        enc = ("TL", tuple(("N",) if isinstance(x, dict) and x.get("kind") == "none"
                           else tensor_from_json(x, f"{where}.items[{i}]") for i, x in enumerate(items)))
    elif jk in _JSON_TAG:
        tag, v = _JSON_TAG[jk], d.get("value")
        ok = {
            "b": isinstance(v, bool),
            "i": is_int64(v),
            "f": isinstance(v, (int, float)) and not isinstance(v, bool) or v in ("inf", "-inf", "nan"),
            "s": isinstance(v, str),
            "dtype": isinstance(v, str) and v in DTYPES, "layout": isinstance(v, str) and v in LAYOUTS,
            "mf": isinstance(v, str) and v in MEMORY_FORMATS,
            "dev": device_ok(v),
            "il": isinstance(v, list) and all(is_int64(x) for x in v),
            "fl": isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v),
            "bl": isinstance(v, list) and all(isinstance(x, bool) for x in v),
        }[tag]
        if not ok:
            raise ValueError(f"{where}.value: {short_repr(v)} is not a valid {jk}"
                             + (" (integers are int64)" if tag in ("i", "il") else ""))
        if tag == "f":
            v = exact_float(to_float(v, f"{where}.value"))
        if tag in ("il", "fl", "bl"):
            v = tuple(exact_float(to_float(x, f"{where}.value")) if tag == "fl" else x for x in v)
        enc = (tag, v)
    else:
        raise ValueError(f"{where}.kind: unknown kind {jk!r}")
    base = kind[4:] if kind.startswith("opt:") else kind
    accepts = _ACCEPTS.get(base, set()) | ({"N"} if kind.startswith("opt") else set())
    if enc[0] not in accepts:
        raise ValueError(f"{where}: kind {jk!r} does not match the schema type ({kind})")
    if enc[0] == "f" and base == "float":
        enc = ("f", exact_float(float(enc[1])))
    return enc


def decode_args(obj: Any, where: str) -> tuple[str, tuple, dict]:
    """Validate and decode the JSON/msgpack form: (op name, encoded args, hints)."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: must be an object")
    name = obj.get("op")
    if not isinstance(name, str):
        raise ValueError(f"{where}.op: missing or not a string")
    try:
        info = op_info(resolve_op(name))
    except ValueError as e:
        raise ValueError(f"{where}.op: {e}") from None
    args = obj.get("args")
    if not isinstance(args, list):
        raise ValueError(f"{where}.args: must be a list")
    by_name = {}
    for i, a in enumerate(args):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise ValueError(f"{where}.args[{i}]: must be an object with a 'name'")
        if a["name"] not in info.arg_names:
            raise ValueError(f"{where}.args[{i}].name: {name} has no argument {a['name']!r}")
        by_name[a["name"]] = (i, a)
    enc, hints = [], {}
    for name_, kind, default in zip(info.arg_names, info.kinds, info.defaults):
        if name_ in by_name:
            i, a = by_name[name_]
            enc.append(arg_from_json(kind, a, f"{where}.args[{i}]"))
            if "range" in a:
                check_range(a["range"], f"{where}.args[{i}].range")
                hints[name_] = {"range": list(a["range"])}
        elif default is not NO_DEFAULT:
            try:
                enc.append(encode_value(kind, default))
            except Ineligible as e:
                raise ValueError(f"{where}.args: default of {name_!r}: {e}") from None
        else:
            raise ValueError(f"{where}.args: missing required argument {name_!r} of {name}")
    if obj.get("hints") is not None:
        hints.update(check_hints(obj["hints"], info, f"{where}.hints"))
    return info.name, tuple(enc), hints
