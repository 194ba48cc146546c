"""Ops: resolving a qualified name in torch's registry, and what a signature needs to know
about an op's schema (:class:`OpInfo`, computed once per op)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch


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

#: ``OpInfo.defaults`` of an argument that has no default (a required argument).
NO_DEFAULT = object()


@dataclass(frozen=True)
class OpInfo:
    """What the hook and the recorder need to know about one op, computed once."""

    name: str
    op: Any
    arg_names: tuple[str, ...]
    kinds: tuple[str, ...]       # per argument; "opt:" prefix for Optional[...]
    defaults: tuple[Any, ...]    # per argument; NO_DEFAULT when required
    kwarg_only: tuple[bool, ...]
    n_returns: int
    ineligible: str | None       # reason the op can never be served, or None


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
        defaults.append(a.default_value if a.has_default_value() else NO_DEFAULT)
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
