"""trace.json: the unique op signatures a model calls, with call counts.

A trace is a versioned, human-readable JSON document::

    {"format": "aoti-farm-trace", "version": 1,
     "entries": [
       {"order": 0, "count": 3, "op": "aten::add.Tensor",
        "args": [{"name": "self", "kind": "tensor", "dtype": "float32",
                  "sizes": [8, 16], "strides": [16, 1], "device": "cpu"},
                 {"name": "other", "kind": "tensor", ...},
                 {"name": "alpha", "kind": "int", "value": 2}]}]}

``args`` is exactly ``Signature.to_obj()["args"]`` (see :mod:`aoti_farm.signature`);
an integer tensor may carry ``"range": [lo, hi]``, a hint for building in-range example
inputs that is not part of the key.  There is one entry per unique signature, with its
call count and the order in which it was first seen.  The JSON Schema is
``configs/trace.schema.json``.

Every validation error is a :class:`UserError` with one line naming the file, the entry
index and the field, and saying how to fix it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from aoti_farm.errors import UserError
from aoti_farm.signature import INT64_MAX, Signature, describe, is_int64, parse_signature, short_repr

FORMAT = "aoti-farm-trace"
VERSION = 1

#: Entries beyond this many in one file are refused (a trace is unique signatures).
MAX_ENTRIES = 1_000_000
#: Largest trace file read, in bytes.
MAX_BYTES = 256 << 20
#: Most dimensions a tensor in a trace may have.
MAX_RANK = 64


@dataclass
class TraceEntry:
    sig: Signature
    count: int = 1
    order: int = 0

    @property
    def key(self) -> str:
        return self.sig.key

    def to_obj(self) -> dict:
        obj = self.sig.to_obj()
        args = obj["args"]
        for a in args:  # range hints go back onto their tensor arguments
            h = self.sig.hints.get(a["name"])
            if a["kind"] == "tensor" and isinstance(h, dict) and "range" in h:
                a["range"] = list(h["range"])
        out = {"order": self.order, "count": self.count, "op": obj["op"], "args": args}
        extra = {k: v for k, v in self.sig.hints.items()
                 if not (isinstance(v, dict) and set(v) == {"range"} and any(a["name"] == k for a in args))}
        if extra:
            out["hints"] = extra
        return out


class Trace:
    """An ordered list of unique entries."""

    def __init__(self, entries: Iterable[TraceEntry] = ()):
        self.entries: list[TraceEntry] = list(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i: int) -> TraceEntry:
        return self.entries[i]

    @property
    def signatures(self) -> list[Signature]:
        return [e.sig for e in self.entries]

    def to_obj(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "entries": [e.to_obj() for e in self.entries]}

    def dumps(self) -> str:
        """Pretty JSON, one argument per line (diffs well, reads well)."""
        def one(x) -> str:
            return json.dumps(x, separators=(", ", ": "))

        parts = []
        for e in self.to_obj()["entries"]:
            head = ", ".join(f"{one(k)}: {one(v)}" for k, v in e.items() if k != "args")
            args = ",\n".join(f"    {one(a)}" for a in e["args"])
            parts.append(f"  {{{head},\n   \"args\": [\n{args}\n   ]}}")
        body = ",\n".join(parts)
        return (f'{{"format": {one(FORMAT)}, "version": {VERSION}, "entries": [\n'
                + body + ("\n" if parts else "") + "]}\n")


def _fix(path) -> str:
    return f"fix the entry or re-record the trace ({path})"


def parse_trace(doc, path: str = "<trace>", check: Callable[[Signature], str | None] | None = None) -> Trace:
    """Validate a decoded trace document; raises UserError (one line).  ``check`` (e.g.
    the memory budget, :mod:`aoti_farm.budget`) returns a reason to refuse an entry, or None."""
    if not isinstance(doc, dict):
        raise UserError(f"trace {path}: top level must be a JSON object with 'format', 'version', 'entries'; re-record it")
    if doc.get("format") != FORMAT:
        raise UserError(f"trace {path}: field 'format' is {doc.get('format')!r}, expected {FORMAT!r}; "
                        f"this is not an aoti-farm trace (record one with `aoti-farm record`)")
    ver = doc.get("version")
    if ver != VERSION:
        raise UserError(f"trace {path}: field 'version' is {ver!r}, this aoti-farm reads version {VERSION}; "
                        f"re-record the trace or upgrade aoti-farm")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise UserError(f"trace {path}: field 'entries' must be a list; fix the file")
    if len(entries) > MAX_ENTRIES:
        raise UserError(f"trace {path}: {len(entries)} entries, over the limit of {MAX_ENTRIES}; split the trace")
    out = []
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        where = f"entries[{i}]"
        if not isinstance(e, dict):
            raise UserError(f"trace {path}: {where}: must be an object; {_fix(path)}")
        count = e.get("count", 1)
        if not is_int64(count) or count < 1:
            raise UserError(f"trace {path}: {where}.count: {short_repr(count)} is not a positive int64; {_fix(path)}")
        order = e.get("order", i)
        if not is_int64(order) or order < 0:
            raise UserError(f"trace {path}: {where}.order: {short_repr(order)} is not a non-negative int64; {_fix(path)}")
        unknown = set(e) - {"order", "count", "op", "args", "hints"}
        if unknown:
            raise UserError(f"trace {path}: {where}: unknown field(s) {', '.join(short_repr(k) for k in sorted(map(str, unknown))[:5])}; {_fix(path)}")
        try:
            sig = parse_signature({k: e[k] for k in ("op", "args", "hints") if k in e}, where)
        except ValueError as err:
            msg = " ".join(str(err).split())
            raise UserError(f"trace {path}: {msg}; {_fix(path)}") from None
        except Exception as err:  # noqa: BLE001 -- anything odd in an entry is the input's fault
            msg = " ".join(str(err).split())[:300]
            raise UserError(f"trace {path}: {where}: cannot parse ({type(err).__name__}: {msg}); {_fix(path)}") from None
        _check_extent(e.get("args"), where, path)
        reason = sig.info().ineligible
        if reason:
            raise UserError(f"trace {path}: {where}.op: {sig.op} can never be served ({reason}); "
                            f"remove the entry from the trace")
        reason = check(sig) if check is not None else None
        if reason:
            raise UserError(f"trace {path}: {where}: {describe(sig)}: {reason}")
        if sig.key in seen:
            # Duplicates are legal input (hand-merged files); fold them.
            out[seen[sig.key]].count = min(out[seen[sig.key]].count + count, INT64_MAX)   # stays readable
            continue
        seen[sig.key] = len(out)
        out.append(TraceEntry(sig, count, order))
    out.sort(key=lambda t: t.order)
    return Trace(out)


def _check_extent(args, where: str, path: str) -> None:
    """Sizes are checked by parse_signature; also refuse absurd ranks and strides (an
    example input is allocated from sizes *and* strides)."""
    from aoti_farm.signature import MAX_NUMEL, storage_size

    for j, a in enumerate(args or []):
        tensors = [(f"{where}.args[{j}]", a)] if isinstance(a, dict) and a.get("kind") == "tensor" else []
        if isinstance(a, dict) and a.get("kind") == "tensor_list":
            tensors = [(f"{where}.args[{j}].items[{k}]", t) for k, t in enumerate(a.get("items") or [])
                       if isinstance(t, dict) and t.get("kind") == "tensor"]
        for w, t in tensors:
            sizes, strides = t["sizes"], t["strides"]
            if len(sizes) > MAX_RANK:
                raise UserError(f"trace {path}: {w}.sizes: {len(sizes)} dimensions, over the limit of {MAX_RANK}; "
                                f"{_fix(path)}")
            n = storage_size(tuple(sizes), tuple(strides))
            if n > MAX_NUMEL:
                raise UserError(f"trace {path}: {w}.strides: {strides} span {n} elements, over the limit of "
                                f"{MAX_NUMEL}; {_fix(path)}")


def load_trace(path: str | os.PathLike, check: Callable[[Signature], str | None] | None = None) -> Trace:
    """Read and validate a trace file; raises UserError naming file, entry and field
    (``check``: see :func:`parse_trace`)."""
    p = str(path)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise UserError(f"trace {p}: no such file; pass the path of a trace recorded with `aoti-farm record`") from None
    except IsADirectoryError:
        raise UserError(f"trace {p}: is a directory; pass a trace.json file") from None
    except OSError as e:
        raise UserError(f"trace {p}: unreadable ({e.strerror}); fix its permissions") from None
    if len(raw) > MAX_BYTES:
        raise UserError(f"trace {p}: {len(raw)} bytes, over the limit of {MAX_BYTES}; a trace holds unique "
                        f"signatures only, so merge duplicates (`aoti-farm trace merge`) or split it")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"trace {p}: not UTF-8 text (byte {e.start}); pass a JSON trace file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"trace {p}: malformed JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                        f"fix the file or re-record it") from None
    except RecursionError:
        raise UserError(f"trace {p}: malformed JSON (nested too deeply); re-record it") from None
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit limit
        raise UserError(f"trace {p}: malformed JSON ({' '.join(str(e).split())[:120]}); fix the file or re-record it") from None
    return parse_trace(doc, p, check)


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write atomically (temporary file in the same directory, fsync, rename)."""
    from aoti_farm.security.fsutil import atomic_write

    p = Path(path)
    try:
        atomic_write(p, trace.dumps().encode())
    except OSError as e:
        raise UserError(f"trace {p}: cannot write ({e.strerror}); pass a writable path") from None


def merge(traces: Iterable[Trace]) -> Trace:
    """Dedupe by key, sum counts, order by first appearance (trace order, then entry order)."""
    out: list[TraceEntry] = []
    seen: dict[str, TraceEntry] = {}
    for t in traces:
        for e in sorted(t.entries, key=lambda x: x.order):
            if e.key in seen:
                seen[e.key].count = min(seen[e.key].count + e.count, INT64_MAX)   # stays readable
                _merge_hints(seen[e.key].sig.hints, e.sig.hints)
                continue
            ne = TraceEntry(Signature(e.sig.op, e.sig.args, dict(e.sig.hints)), e.count, len(out))
            seen[e.key] = ne
            out.append(ne)
    return Trace(out)


def _merge_hints(into: dict, other: dict) -> None:
    """Keep hints the first entry lacked; widen value ranges to cover both."""
    for k, v in other.items():
        mine = into.get(k)
        if mine is None:
            into[k] = v
        elif isinstance(mine, dict) and isinstance(v, dict) and "range" in mine and "range" in v:
            lo = min(mine["range"][0], v["range"][0])
            hi = max(mine["range"][1], v["range"][1])
            into[k] = {**mine, "range": [lo, hi]}


__all__ = ["FORMAT", "VERSION", "Trace", "TraceEntry", "load_trace", "save_trace", "merge", "parse_trace"]
