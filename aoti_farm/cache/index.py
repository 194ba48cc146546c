"""An index of a cache for explaining misses: every namespace's keys listed once, each
entry's key fields read from its manifest once (bounded, link-safe, never hashed), and the
entries of one op aligned so the nearest one to a signature is found in one vectorised
pass (:class:`OpGroup`).  Used by :mod:`aoti_farm.report.explain` and the serving hook's
``explain_misses``.

Key fields are the named fields of a signature's JSON form (``Signature.to_obj()``):
``self.sizes``, ``self.strides``, ``self.dtype``, ``self.device`` per tensor, the value per
scalar argument (``alpha``), ``name.len`` and ``name[i].*`` per tensor list -- what
``signature.key_fields`` hashes, by argument name.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import msgpack

from aoti_farm.security import safeio
from aoti_farm.cache.store import MANIFEST, Cache


# --- flattened key fields ----------------------------------------------------------------------


def flatten_args(args: list) -> dict[str, tuple]:
    """The named key fields of a signature's JSON args (``Signature.to_obj()["args"]``):
    ``self.sizes``, ``self.dtype``, ``alpha`` ... -> (kind, value)."""
    out: dict[str, tuple] = {}
    for a in args:
        if not isinstance(a, dict):
            continue
        _flat_one(a, str(a.get("name")), out)
    return out


def _frozen(v: Any) -> Any:
    """A hashable form of a JSON value (a manifest from another writer may hold anything).
    Exact types first: this runs for every field of every entry of a namespace."""
    t = type(v)
    if t is list or t is tuple:
        tup = tuple(v)
        try:
            hash(tup)      # flat (sizes, strides): already hashable, nothing to recurse into
            return tup
        except TypeError:
            return tuple(map(_frozen, v))
    if t is dict or isinstance(v, dict):
        return repr(sorted(v.items(), key=repr))
    if isinstance(v, (list, tuple)):   # subclasses
        return tuple(map(_frozen, v))
    return v


def _flat_one(a: dict, name: str, out: dict) -> None:
    kind = _frozen(a.get("kind"))
    if kind == "tensor":
        g = a.get
        out[name + ".dtype"] = ("tensor", _frozen(g("dtype")))
        out[name + ".sizes"] = ("tensor", _frozen(g("sizes")))
        out[name + ".strides"] = ("tensor", _frozen(g("strides")))
        out[name + ".device"] = ("tensor", _frozen(g("device")))
    elif kind == "tensor_list":
        items = a.get("items") or []
        out[f"{name}.len"] = ("int", len(items))
        for i, it in enumerate(items):
            if isinstance(it, dict):
                _flat_one(it, f"{name}[{i}]", out)
    elif kind == "none":
        out[name] = ("none", None)
    else:
        out[name] = (kind, _frozen(a.get("value")))


def _show(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ",".join(_show(x) for x in v) + "]"
    if v is None:
        return "None"
    return str(v)


def field_diff(mine: dict[str, tuple], theirs: dict[str, tuple]) -> list[tuple[str, str, str]]:
    """(field, ours, theirs) for every field that differs (type too: 2 vs 2.0)."""
    out = []
    for k in list(mine) + [k for k in theirs if k not in mine]:
        a, b = mine.get(k), theirs.get(k)
        if a == b and (a is None or type(a[1]) is type(b[1])):
            continue
        sa = "absent" if a is None else _show(a[1])
        sb = "absent" if b is None else _show(b[1])
        if sa == sb and a is not None and b is not None:
            sa, sb = f"{sa} ({a[0]})", f"{sb} ({b[0]})"
        out.append((k, sa, sb))
    return out


def category(diff: list[tuple[str, str, str]]) -> str:
    """What kind of difference a miss is: shape, strides, dtype, device or (scalar)
    argument; "none" when no key field differs."""
    kinds = set()
    for k, _, _ in diff:
        tail = k.rsplit(".", 1)[-1] if "." in k else ""
        kinds.add({"sizes": "shape", "len": "shape", "strides": "strides", "dtype": "dtype",
                   "device": "device"}.get(tail, "argument"))
    for c in ("shape", "strides", "dtype", "device", "argument"):
        if c in kinds:
            return c
    return "none"   # every key field equal: another key version of the same signature


_ABSENT = ("absent", None)


def _nums(row: tuple) -> tuple[int, ...]:
    """The integers of a row's list fields (sizes, strides, int lists), for closeness."""
    out: list[int] = []
    for v in row:
        x = v[1]
        if type(x) is tuple:             # what _frozen makes of a list
            out.extend([i for i in x if type(i) is int])   # not bool, not float
            out.append(-len(x) * 1000)   # another rank is far
    return tuple(out)


class OpGroup:
    """The published entries of one op under one fingerprint, as rows aligned on the
    op's key fields.  The nearest entry to a signature has the fewest fields that differ,
    then the closest sizes (summed absolute differences of its list fields' integers),
    then the smallest key.

    Plain Python, no torch op: a serving hook explains its misses with this index
    (``explain_misses``), and a torch op here would enter the very hook it explains
    (counted as a miss, queued, and explained in turn)."""

    def __init__(self, items: list[tuple[str, dict]]):
        fields: list[str] = []
        seen: set[str] = set()
        for _, f in items:
            for k in f:
                if k not in seen:
                    seen.add(k)
                    fields.append(k)
        self.fields = fields
        self.keys = [k for k, _ in items]          # sorted by the caller: ties -> smallest key
        self.flats = [f for _, f in items]
        rows = [tuple([f.get(k, _ABSENT) for k in fields]) for f in self.flats]
        # each field's distinct values numbered in order of appearance
        self.ids: list[dict] = [{} for _ in fields]
        cols = []
        for j, k in enumerate(fields):
            d = self.ids[j]
            cols.append([d.setdefault(v, len(d)) for v in [f.get(k, _ABSENT) for f in self.flats]])
        self._ids = [tuple(c[i] for c in cols) for i in range(len(items))]   # (entries, fields)
        self._nums = [_nums(r) for r in rows]

    def __len__(self) -> int:
        return len(self.keys)

    def nearest(self, q: dict) -> tuple[str, dict]:
        qrow = [q.get(k, _ABSENT) for k in self.fields]
        qid = [self.ids[j].get(v, -1) for j, v in enumerate(qrow)]
        qn = _nums(tuple(qrow))
        best, best_i = None, 0
        for i, (ids, nums) in enumerate(zip(self._ids, self._nums)):
            differ = sum(1 for a, b in zip(ids, qid) if a != b)
            w = max(len(nums), len(qn))
            far = sum(abs(a - b) for a, b in zip(nums + (0,) * (w - len(nums)), qn + (0,) * (w - len(qn))))
            score = (differ, min(far + 1000 * abs(len(nums) - len(qn)), (1 << 40) - 1))
            if best is None or score < best:   # the first minimum: the smallest key among equals
                best, best_i = score, i
        return self.keys[best_i], self.flats[best_i]


# --- the index ----------------------------------------------------------------------------------


def _norm(v: Any) -> Any:
    return json.loads(json.dumps(v, default=list))


def fingerprint_diff(mine: dict, theirs: dict) -> list[tuple[str, str, str]]:
    """(field, ours, theirs) of two fingerprints' fields (JSON-normalised)."""
    a, b = _norm(mine), _norm(theirs or {})
    return [(k, _fp_show(a.get(k)), _fp_show(b.get(k))) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _fp_show(v: Any) -> str:
    if isinstance(v, str):
        return v if v and " " not in v else json.dumps(v)
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


class Namespace:
    """One fingerprint namespace: its keys listed once, its manifests read on demand."""

    def __init__(self, index: "CacheIndex", fp_id: str):
        self.index, self.fp_id = index, fp_id
        base = os.path.join(index.root, fp_id)
        self.keys = _list_keys(os.path.join(base, "entries"), lambda n: n if len(n) == 64 else None)
        self.failed = _list_keys(os.path.join(base, "failed"),
                                 lambda n: n[:-8] if n.endswith(".msgpack") and len(n) == 72 else None)
        try:
            self.queued = {n[:-8] for n in os.listdir(os.path.join(base, "queue"))
                           if n.endswith(".msgpack") and len(n) == 72}
        except OSError:
            self.queued = set()
        self._fields: dict | None | bool = False
        self._by_op: dict[str, OpGroup] | None = None

    @property
    def fields(self) -> dict | None:
        """The namespace's fingerprint fields (its ``fingerprint.json``), None if unreadable."""
        if self._fields is False:
            try:
                raw = safeio.read_bounded(str(self.index.cache.root / self.fp_id / "fingerprint.json"),
                                          max_bytes=safeio.RECORD_MAX, uids=self.index.uids)
                v = json.loads(raw)
                self._fields = v if isinstance(v, dict) else None
            except (OSError, ValueError):
                self._fields = None
        return self._fields  # type: ignore[return-value]

    def by_op(self) -> dict[str, OpGroup]:
        """op -> the readable entries of that op (manifests read once)."""
        if self._by_op is None:
            out: dict[str, list[tuple[str, dict]]] = {}
            # One descriptor for the entries directory (opened without following a link):
            # every manifest below is opened relative to it, not by its whole path again.
            try:
                dfd: int | None = os.open(os.path.join(self.index.root, self.fp_id, "entries"),
                                          os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                dfd = None
            try:
                for k in sorted(self.keys):
                    got = self.index.signature_fields(self.fp_id, k, dfd)
                    if got is not None:
                        out.setdefault(got[0], []).append((k, got[1]))
            finally:
                if dfd is not None:
                    os.close(dfd)
            self._by_op = {op: OpGroup(items) for op, items in out.items()}
        return self._by_op


def _list_keys(base, name_key) -> set[str]:
    out: set[str] = set()
    try:
        shards = [e.path for e in os.scandir(base) if len(e.name) == 2]
    except OSError:
        return out
    for sh in shards:
        try:
            for n in os.listdir(sh):
                k = name_key(n)
                if k is not None:
                    out.add(k)
        except OSError:
            continue
    return out


class CacheIndex:
    """Every namespace of a cache, listed once; manifests read lazily and memoised by key."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self.root = str(cache.root)
        self.uids = None if cache.allow_insecure else safeio.allowed_uids()
        self.built_at = time.monotonic()
        self.namespaces: dict[str, Namespace] = {fp: Namespace(self, fp) for fp in cache.fingerprint_ids()}
        self._manifests: dict[tuple[str, str], dict | Exception] = {}
        self._sigs: dict[tuple[str, str], tuple[str, dict] | None] = {}
        self.manifests_read = 0

    def manifest(self, fp_id: str, key: str, entries_fd: int | None = None) -> dict:
        """A manifest, bounded and link-safe (no hash checked); raises OSError/ValueError.
        ``entries_fd``: an open descriptor of the namespace's ``entries`` directory."""
        got = self._manifests.get((fp_id, key))
        if got is None:
            try:
                if entries_fd is None:
                    raw = safeio.read_bounded(f"{self.root}/{fp_id}/entries/{key[:2]}/{key}/{MANIFEST}",
                                              max_bytes=safeio.MANIFEST_MAX, uids=self.uids)
                else:
                    raw = safeio.read_bounded(f"{key[:2]}/{key}/{MANIFEST}", entries_fd,
                                              max_bytes=safeio.MANIFEST_MAX, uids=self.uids,
                                              what=f"{self.root}/{fp_id}/entries/{key[:2]}/{key}/{MANIFEST}")
                self.manifests_read += 1
                m = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                got = m if isinstance(m, dict) else ValueError("manifest is not a map")
            except (OSError, ValueError) as e:
                got = e
            except Exception as e:  # noqa: BLE001 -- msgpack raises several types for garbage
                got = ValueError(f"manifest is not msgpack ({type(e).__name__})")
            self._manifests[(fp_id, key)] = got
        if isinstance(got, Exception):
            raise got
        return got

    def signature_fields(self, fp_id: str, key: str, entries_fd: int | None = None) -> tuple[str, dict] | None:
        """(op, flattened key fields) of a published entry, or None when unreadable."""
        k = (fp_id, key)
        if k not in self._sigs:
            try:
                s = self.manifest(fp_id, key, entries_fd)["signature"]
                self._sigs[k] = (str(s["op"]), flatten_args(s["args"]))
            except Exception:  # noqa: BLE001 -- unreadable: never a candidate
                self._sigs[k] = None
            self._manifests.pop(k, None)  # only the fields are kept (memory)
        return self._sigs[k]
