"""Signatures: the identity of one aten op call, and its stable key.

A signature is the qualified op name plus every argument of the op's schema, bound and
normalised the same way no matter how the call was spelled: positional or keyword, a
default left out or passed explicitly.  Each argument is encoded as a small tagged tuple:

    ("T", dtype, sizes, strides, device)        a tensor
    ("N",)                                       None (an optional left empty)
    ("TL", (tensor|None, ...))                   a tensor list (Tensor[] / Tensor?[])
    ("b"|"i"|"f", value)                         a Python bool / int / float, exact value
    ("s", value)                                 a str
    ("dtype"|"layout"|"mf", name)                torch.dtype / torch.layout / memory_format
    ("dev", "cpu" | "cuda:0")                    a torch.device
    ("il"|"fl"|"bl", (v, ...))                   int / float / bool lists

The tuple of encodings is hashable, so the runtime hook uses it directly as its in-memory
lookup key; the *signature key* is the sha256 of the canonical msgpack form of named,
tagged fields (see :func:`key_fields`).  The recorder and the hook both go through
:func:`encode_call`, so a recorded call and a served call always agree.

Value ranges of integer tensors are *hints* (not part of the key): they let
:func:`materialize` build in-range index tensors for embedding/gather/index_select.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgpack
import torch

from aoti_farm.errors import Ineligible, UserError

KEY_VERSION = 1

# --- dtype / layout / memory-format names ----------------------------------------------

_DTYPES: dict[str, torch.dtype] = {
    str(d).split(".")[-1]: d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.complex64, torch.complex128,
    )
}
_DTYPE_NAME: dict[torch.dtype, str] = {v: k for k, v in _DTYPES.items()}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}
_LAYOUT_NAME = {v: k for k, v in _LAYOUTS.items()}
_MEMFMTS = {
    "contiguous_format": torch.contiguous_format,
    "channels_last": torch.channels_last,
    "preserve_format": torch.preserve_format,
    "channels_last_3d": torch.channels_last_3d,
}
_MEMFMT_NAME = {v: k for k, v in _MEMFMTS.items()}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")

#: Largest tensor (elements) a trace may describe; beyond this it is "absurd".
MAX_NUMEL = 1 << 31
#: Every integer of a signature (a size, a stride, a scalar, a list item, a range) is an
#: int64, as in torch's schemas; anything else is refused (ValueError) when parsed, and a
#: call that passes one is never served (Ineligible).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def is_int64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def _float(v: Any, where: str) -> float:
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{where}: {str(v)[:40]}... is too large for a float") from None


_CUDA_DEV = re.compile(r"cuda:(0|[1-9][0-9]{0,5})")


def _device_ok(v: Any) -> bool:
    """'cpu' or 'cuda:N' in canonical form (the form the recorder writes)."""
    return isinstance(v, str) and (v == "cpu" or _CUDA_DEV.fullmatch(v) is not None)


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (one of {', '.join(_DTYPES)})") from None


def dtype_name(d: torch.dtype) -> str:
    return _DTYPE_NAME[d]


# --- ops --------------------------------------------------------------------------------


def op_name(op: torch._ops.OpOverload) -> str:
    """Qualified name with overload: ``aten::add.Tensor``, ``aten::relu`` for default."""
    s = op._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


#: One identifier of a qualified op name (namespace, op, overload).
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@lru_cache(maxsize=8192)   # successes only: a finite set of real ops
def resolve_op(name: str) -> torch._ops.OpOverload:
    """``aten::add.Tensor`` -> torch.ops.aten.add.Tensor; raises ValueError if unknown.

    The name is looked up in torch's operator registry (the schemas registered under
    ``ns::op``) before any attribute of ``torch.ops`` is touched, and what comes back
    must be an OpOverload of exactly that name: a crafted name such as
    ``aten::add.__class__`` or ``aten::__dict__`` is an unknown op, never some other
    Python object (``aten::__and__.Tensor`` is a real op and resolves)."""
    if not isinstance(name, str):
        raise ValueError(f"op {name!r} is not a string")
    ns, sep, rest = name.partition("::")
    if not sep or not ns or not rest:
        raise ValueError(f"op {name[:200]!r} is not a qualified name like 'aten::add.Tensor'")
    base, dot, overload = rest.partition(".")
    overload = overload or ("" if dot else "default")
    if not all(_IDENT.fullmatch(x) for x in (ns, base, overload)):
        raise ValueError(f"unknown op or overload {name[:200]!r}")
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"{ns}::{base}")
    except RuntimeError:
        schemas = []
    if (overload if overload != "default" else "") not in {s.overload_name for s in schemas}:
        raise ValueError(f"unknown op or overload {name[:200]!r}")
    try:
        packet = getattr(getattr(torch.ops, ns), base)
        op = getattr(packet, overload) if isinstance(packet, torch._ops.OpOverloadPacket) else None
    except (AttributeError, RuntimeError):
        op = None
    if not isinstance(op, torch._ops.OpOverload) or op_name(op) != (f"{ns}::{base}" if overload == "default"
                                                                    else f"{ns}::{base}.{overload}"):
        raise ValueError(f"unknown op or overload {name[:200]!r}")
    return op


# Schema argument kinds we can represent.  Keyed by Argument.real_type's string.
_KINDS = {
    "Tensor": "tensor", "Optional[Tensor]": "opt_tensor",
    "List[Tensor]": "tensor_list", "List[Optional[Tensor]]": "opt_tensor_list",
    "int": "int", "SymInt": "int", "float": "float", "bool": "bool", "number": "scalar",
    "str": "str", "ScalarType": "dtype", "Layout": "layout", "Device": "device",
    "MemoryFormat": "mf", "List[int]": "int_list", "List[SymInt]": "int_list",
    "List[float]": "float_list", "List[bool]": "bool_list",
}


@dataclass(frozen=True)
class OpInfo:
    """What the hook and the recorder need to know about one op, computed once."""

    name: str
    op: Any
    arg_names: tuple[str, ...]
    kinds: tuple[str, ...]       # per argument; "opt:" prefix for Optional[...]
    defaults: tuple[Any, ...]    # per argument; _NODEFAULT when required
    kwarg_only: tuple[bool, ...]
    n_returns: int
    ineligible: str | None       # reason the op can never be served, or None


_NODEFAULT = object()


def _kind(t: str) -> str | None:
    if t in _KINDS:
        return _KINDS[t]
    if t.startswith("Optional[") and t[9:-1] in _KINDS and not t[9:-1].startswith(("Tensor", "List[Tensor")):
        return "opt:" + _KINDS[t[9:-1]]
    return None


@lru_cache(maxsize=None)
def op_info(op: torch._ops.OpOverload) -> OpInfo:
    s = op._schema
    names, kinds, defaults, kwo = [], [], [], []
    reason = None
    for a in s.arguments:
        k = _kind(str(a.real_type))
        if k is None and reason is None:
            reason = f"argument {a.name!r} has type {a.real_type} that aoti-farm cannot represent"
        if a.alias_info is not None and reason is None:
            reason = f"argument {a.name!r} aliases or is mutated ({'write' if a.alias_info.is_write else 'alias'})"
        names.append(a.name)
        kinds.append(k or "?")
        defaults.append(a.default_value if a.has_default_value() else _NODEFAULT)
        kwo.append(a.kwarg_only)
    if reason is None:
        if not s.returns:
            reason = "op returns nothing"
        for r in s.returns:
            if str(r.real_type) != "Tensor":
                reason = f"op returns {r.real_type}, not Tensor"
                break
            if r.alias_info is not None:
                reason = "op returns an alias of an input"
                break
    if reason is None and torch.Tag.nondeterministic_seeded in op.tags:
        reason = "op is random (nondeterministic_seeded)"
    if reason is None and torch.Tag.dynamic_output_shape in op.tags:
        reason = "op has a data-dependent output shape"
    if reason is None and torch.Tag.data_dependent_output in op.tags:
        reason = "op has a data-dependent output"
    return OpInfo(op_name(op), op, tuple(names), tuple(kinds), tuple(defaults), tuple(kwo),
                  len(s.returns), reason)


# --- encoding ---------------------------------------------------------------------------


_DEVICE_STR: dict = {}


def _device_str(d: torch.device) -> str:
    s = _DEVICE_STR.get(d)
    if s is None:
        s = _DEVICE_STR[d] = "cpu" if d.type == "cpu" else f"{d.type}:{d.index if d.index is not None else 0}"
    return s


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
        return ("T", _DTYPE_NAME[t.dtype], tuple(t.shape), t.stride(), _device_str(t.device))
    except KeyError:
        raise Ineligible(f"dtype {t.dtype}") from None


def _encode(kind: str, v: Any) -> tuple:
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
            return ("f", v)
        raise Ineligible(f"scalar of type {type(v).__name__}")
    if k == "str":
        return ("s", str(v))
    if k == "dtype":
        return ("dtype", _DTYPE_NAME[v])
    if k == "layout":
        return ("layout", _LAYOUT_NAME[v])
    if k == "mf":
        return ("mf", _MEMFMT_NAME[v])
    if k == "device":
        return ("dev", _device_str(torch.device(v)))
    if k == "int_list":
        il = tuple(int(x) for x in v)
        if not all(INT64_MIN <= x <= INT64_MAX for x in il):
            raise Ineligible("integer outside int64")
        return ("il", il)
    if k == "float_list":
        return ("fl", tuple(float(x) for x in v))
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
            if v is _NODEFAULT:
                raise Ineligible(f"missing argument {name!r}")
        out.append(_encode(info.kinds[i], v))
    return tuple(out)


# --- Signature --------------------------------------------------------------------------


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(i) for i in x) if isinstance(x, (list, tuple)) else x


@dataclass(frozen=True)
class Signature:
    op: str
    args: tuple                     # encoded, one per schema argument
    hints: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def device(self) -> str:
        """'cuda' if any tensor argument lives on CUDA, else 'cpu'."""
        for a in self.args:
            for t in (a[1] if a[0] == "TL" else (a,)):
                if t[0] == "T" and t[4].startswith("cuda"):
                    return "cuda"
        return "cpu"

    @property
    def key(self) -> str:
        return _key(self.op, self.args)

    def info(self) -> OpInfo:
        return op_info(resolve_op(self.op))

    def to_obj(self) -> dict:
        """msgpack/JSON-safe form (used by manifests, queue files and traces)."""
        names = self.info().arg_names
        return {"op": self.op, "args": [arg_to_json(n, a) for n, a in zip(names, self.args)],
                **({"hints": self.hints} if self.hints else {})}

    @classmethod
    def from_obj(cls, obj: dict) -> "Signature":
        """Inverse of :meth:`to_obj`; raises ValueError naming the bad field."""
        return parse_signature(obj)


def key_fields(op: str, args: tuple) -> list[tuple[str, Any]]:
    """The named, tagged fields hashed into a signature key (print with `aoti-farm key`)."""
    return [("key_version", KEY_VERSION), ("op", op)] + [
        (f"arg{i}", list(a)) for i, a in enumerate(args)
    ]


def canonical_bytes(fields: list[tuple[str, Any]]) -> bytes:
    try:
        return msgpack.packb([[k, _listify(v)] for k, v in fields], use_bin_type=True)
    except OverflowError:  # parse_signature and encode_call admit int64 only; never here
        raise ValueError("a signature integer is outside int64") from None


def _listify(x: Any) -> Any:
    return [_listify(i) for i in x] if isinstance(x, (list, tuple)) else x


@lru_cache(maxsize=65536)
def _key(op: str, args: tuple) -> str:
    return hashlib.sha256(canonical_bytes(key_fields(op, args))).hexdigest()


def from_call(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Signature:
    info = op_info(op)
    if info.ineligible:
        raise Ineligible(info.ineligible)
    return Signature(info.name, encode_call(info, args, kwargs))


# --- JSON form (traces) -----------------------------------------------------------------


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


def _tensor_from_json(d: dict, where: str) -> tuple:
    for f in ("dtype", "sizes", "strides", "device"):
        if f not in d:
            raise ValueError(f"{where}: missing field {f!r}")
    if d["dtype"] not in _DTYPES:
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
    if not _device_ok(dev):
        raise ValueError(f"{where}.device: {str(dev)[:40]!r} is not 'cpu' or 'cuda:N'")
    if "range" in d:
        _check_range(d["range"], f"{where}.range")
    return ("T", d["dtype"], tuple(sizes), tuple(strides), dev)


def _check_range(r: Any, where: str) -> None:
    """A value-range hint: [low, high], numbers within int64's range (NaN is not), low <= high."""
    def ok(x: Any) -> bool:
        return is_int64(x) or (isinstance(x, float) and INT64_MIN <= x <= INT64_MAX)

    if not (isinstance(r, list) and len(r) == 2 and ok(r[0]) and ok(r[1]) and r[0] <= r[1]):
        raise ValueError(f"{where}: must be [low, high], numbers within int64's range, with low <= high")


def _check_hints(hints: Any, info: "OpInfo", where: str) -> dict:
    """Hints decoded from a trace, manifest or queue item: per tensor (list) argument
    ``{"range": [lo, hi]}`` or ``{"items": [{"range": ...} | None, ...]}``."""
    if not isinstance(hints, dict):
        raise ValueError(f"{where}: must be an object")
    for name, h in hints.items():
        w = f"{where}.{str(name)[:40]}"
        if name not in info.arg_names:
            raise ValueError(f"{w}: {info.name} has no argument of that name")
        if not isinstance(h, dict) or not set(h) <= {"range", "items"}:
            raise ValueError(f"{w}: must be an object with 'range' or 'items'")
        if "range" in h:
            _check_range(h["range"], f"{w}.range")
        if "items" in h:
            items = h["items"]
            if not isinstance(items, list) or len(items) > 1024:
                raise ValueError(f"{w}.items: must be a list (of at most 1024 items)")
            for j, it in enumerate(items):
                if it is not None:
                    if not isinstance(it, dict) or set(it) != {"range"}:
                        raise ValueError(f"{w}.items[{j}]: must be null or an object with a 'range'")
                    _check_range(it["range"], f"{w}.items[{j}].range")
    return hints


def _arg_from_json(kind: str, d: Any, where: str) -> tuple:
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError(f"{where}: must be an object with a 'kind'")
    jk = d["kind"]
    if jk == "none":
        enc: tuple = ("N",)
    elif jk == "tensor":
        enc = _tensor_from_json(d, where)
    elif jk == "tensor_list":
        items = d.get("items")
        if not isinstance(items, list):
            raise ValueError(f"{where}.items: must be a list")
        enc = ("TL", tuple(("N",) if isinstance(x, dict) and x.get("kind") == "none"
                           else _tensor_from_json(x, f"{where}.items[{i}]") for i, x in enumerate(items)))
    elif jk in _JSON_TAG:
        tag, v = _JSON_TAG[jk], d.get("value")
        ok = {
            "b": isinstance(v, bool),
            "i": is_int64(v),
            "f": isinstance(v, (int, float)) and not isinstance(v, bool) or v in ("inf", "-inf", "nan"),
            "s": isinstance(v, str),
            "dtype": isinstance(v, str) and v in _DTYPES, "layout": isinstance(v, str) and v in _LAYOUTS,
            "mf": isinstance(v, str) and v in _MEMFMTS,
            "dev": _device_ok(v),
            "il": isinstance(v, list) and all(is_int64(x) for x in v),
            "fl": isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v),
            "bl": isinstance(v, list) and all(isinstance(x, bool) for x in v),
        }[tag]
        if not ok:
            raise ValueError(f"{where}.value: {_short(v)} is not a valid {jk}"
                             + (" (integers are int64)" if tag in ("i", "il") else ""))
        if tag == "f":
            v = _float(v, f"{where}.value")
        if tag in ("il", "fl", "bl"):
            v = tuple(_float(x, f"{where}.value") if tag == "fl" else x for x in v)
        enc = (tag, v)
    else:
        raise ValueError(f"{where}.kind: unknown kind {jk!r}")
    base = kind[4:] if kind.startswith("opt:") else kind
    accepts = _ACCEPTS.get(base, set()) | ({"N"} if kind.startswith("opt") else set())
    if enc[0] not in accepts:
        raise ValueError(f"{where}: kind {jk!r} does not match the schema type ({kind})")
    if enc[0] == "f" and base == "float":
        enc = ("f", float(enc[1]))
    return enc


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def parse_signature(obj: Any, where: str = "signature") -> Signature:
    """Validate and decode the JSON/msgpack form; ValueError names the failing field."""
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
            enc.append(_arg_from_json(kind, a, f"{where}.args[{i}]"))
            if "range" in a:
                _check_range(a["range"], f"{where}.args[{i}].range")
                hints[name_] = {"range": list(a["range"])}
        elif default is not _NODEFAULT:
            try:
                enc.append(_encode(kind, default))
            except Ineligible as e:
                raise ValueError(f"{where}.args: default of {name_!r}: {e}") from None
        else:
            raise ValueError(f"{where}.args: missing required argument {name_!r} of {name}")
    if obj.get("hints") is not None:
        hints.update(_check_hints(obj["hints"], info, f"{where}.hints"))
    return Signature(info.name, tuple(enc), hints)


# --- example inputs -----------------------------------------------------------------------


def _storage_size(sizes: tuple, strides: tuple) -> int:
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(sizes, strides))


def make_tensor(enc: tuple, gen: torch.Generator, value_range: list | None = None,
                device_override: str | None = None) -> torch.Tensor:
    _, dt, sizes, strides, dev = enc
    dtype = _DTYPES[dt]
    n = _storage_size(sizes, strides)
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


def _decode_scalar(a: tuple) -> Any:
    tag, v = a[0], (a[1] if len(a) > 1 else None)
    return {
        "N": lambda: None, "b": lambda: v, "i": lambda: v, "f": lambda: v, "s": lambda: v,
        "dtype": lambda: _DTYPES[v], "layout": lambda: _LAYOUTS[v], "mf": lambda: _MEMFMTS[v],
        "dev": lambda: torch.device(v), "il": lambda: list(v), "fl": lambda: list(v),
        "bl": lambda: list(v),
    }[tag]()


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
            v = [None if t[0] == "N" else make_tensor(t, gen, (items_h[i] if i < len(items_h) else None) or rng)
                 for i, t in enumerate(a[1])]
        else:
            v = _decode_scalar(a)
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


__all__ = [
    "Signature", "OpInfo", "op_info", "resolve_op", "op_name", "encode_call", "from_call",
    "key_fields", "canonical_bytes", "materialize", "parse_signature", "describe",
    "tensor_positions", "UserError",
]
