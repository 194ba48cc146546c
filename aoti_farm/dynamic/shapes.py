"""Shape classes: signatures that differ only in tensor sizes.

Two signatures are in one *group* when they have the same op, the same non-tensor
arguments (exact values), and per tensor argument the same dtype, device, rank and layout
class: the stride order of its dense dims, its broadcast (stride-0) dims, and its dims of
size 0 or 1 (with their sizes).  A tensor that is not dense in its stride order (a slice
of a larger buffer: a KV cache's ``[B, H, n, D]`` view of ``[B, H, N, D]``, one of q/k/v
split from a fused projection, a column of a growing ``[2, n]`` buffer) has the *strided*
layout class: the order of its strides, its strides of 0 or 1 (with their values) and its
dims of size 0 or 1.  Its sizes and its strides of >= 2 may vary: the class learns them
like sizes.  A stride that stays the same (the buffer's, while the slice grows: a KV
cache) is fixed, and AOTInductor compiles symbolic sizes with constant strides; a stride
that changes from call to call (a ``[2, 1]`` column of a ``[2, n]`` buffer has stride
``n``: GPT-2 decode's int64 ``add``) is a symbol with its observed range, compiled as a
symbolic input stride (:mod:`aoti_farm.dynamic.stridesym`).

A *class* is a group plus a size pattern learnt from a trace: each tensor dim of size
>= 2 (and each stride >= 2 of a strided tensor) is either fixed (the same in every
member) or a symbol ``s0, s1, ...``; positions that are equal in every member share a
symbol (a stride always equal to a size is tied to it).  Each symbol has the observed
range ``[lo, hi]``.  ``dims`` holds per tensor its sizes' pattern, followed, for a
strided tensor, by its strides' pattern (so a dense class's key is what it was).  The class key is the sha256 of the canonical named fields (op, per
argument the pattern, the ranges) under a field ``class_version``, so it can never equal
a signature key (whose fields start with ``key_version``).

A call is *in* a class when it is in the class's group, its fixed dims match, its tied
dims agree and each symbol's value lies in its range (:meth:`ShapeClass.bind`).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

from aoti_farm import signature as S

CLASS_VERSION = 1
#: Most symbols one class may have (a hint against absurd manifests).
MAX_SYMBOLS = 64


# --- layout classes ---------------------------------------------------------------------


def memory_format(sizes, strides) -> str:
    """The memory format torch suggests for a tensor of these sizes and strides
    (``Tensor.suggest_memory_format()``): ``channels_last`` (rank 4) or
    ``channels_last_3d`` (rank 5) when the strides are like channels-last, else
    ``contiguous``.  The strides of size-1 dims count here: ``[N, C, 1, 1]`` with strides
    ``(C, 1, C, C)`` is channels-last, with ``(C, 1, 1, 1)`` contiguous, and ops that
    allocate "like" an input (``interpolate``, ``empty_like``) follow it.  c10's
    ``is_channels_last_strides_2d_s4``/``_3d_s5``, as ported in
    ``torch._prims_common.are_strides_like_channels_last_or_false``
    (tests/unit/test_layout_format.py holds this to torch's own answer)."""
    n = len(sizes)
    if n not in (4, 5) or strides[1] == 0:
        return "contiguous"
    low = 0
    for d in ((1, 3, 2, 0) if n == 4 else (1, 4, 3, 2, 0)):
        if sizes[d] == 0 or strides[d] < low or (d == 0 and low == strides[1]):
            return "contiguous"
        low = strides[d] * sizes[d]
    return "channels_last" if n == 4 else "channels_last_3d"


def tensor_layout(sizes: tuple, strides: tuple) -> tuple | None:
    """(order, bcast, small) of a tensor, or None when it is not dense in its stride order
    or when its size-1 dims' strides decide another memory format than the dense strides
    of that order would (:func:`memory_format`: such a tensor's class must keep its exact
    strides, the strided class does).

    ``order``: the dims of size >= 2 and non-zero stride, outermost first; ``bcast``: the
    dims of size >= 2 with stride 0; ``small``: ``(dim, size)`` of the dims of size 0 or 1."""
    small = tuple((d, s) for d, s in enumerate(sizes) if s <= 1)
    bcast = tuple(d for d, (s, st) in enumerate(zip(sizes, strides)) if s > 1 and st == 0)
    dense = [d for d, s in enumerate(sizes) if s > 1 and strides[d] != 0]
    order = tuple(sorted(dense, key=lambda d: (-strides[d], -d)))
    expect = 1
    for d in reversed(order):
        if strides[d] != expect:
            return None
        expect *= sizes[d]
    if small and memory_format(sizes, strides) != memory_format(sizes, dense_strides(sizes, order, bcast)):
        return None
    return order, bcast, small


def dense_strides(sizes: tuple, order: tuple, bcast: tuple) -> tuple:
    """Strides of a tensor of ``sizes`` laid out densely in ``order`` (size-0/1 dims get
    the contiguous stride, broadcast dims 0)."""
    strides = [0] * len(sizes)
    expect = 1
    for d in reversed(order):
        strides[d] = expect
        expect *= sizes[d]
    inner = 1
    for d in range(len(sizes) - 1, -1, -1):   # size-0/1 dims: any stride; the contiguous one
        if d not in order and d not in bcast:
            strides[d] = inner
        if d in order:
            inner = max(inner, strides[d] * sizes[d])
    return tuple(strides)


def _tensors(args: tuple) -> list[tuple[int, int | None, tuple]]:
    """(arg index, item index or None, encoded tensor) of every tensor argument."""
    out = []
    for i, a in enumerate(args):
        if a[0] == "T":
            out.append((i, None, a))
        elif a[0] == "TL":
            out.extend((i, j, t) for j, t in enumerate(a[1]) if t[0] == "T")
    return out


#: The layout tag of a tensor that is not dense in its stride order (its strides are in the pattern).
STRIDED = "strided"


def stride_order(sizes: tuple, strides: tuple) -> tuple:
    """Every dim, the largest stride first (ties: the later dim first)."""
    return tuple(sorted(range(len(sizes)), key=lambda d: (-strides[d], -d)))


def overlaps(sizes: tuple, strides: tuple) -> bool:
    """Whether two elements of a tensor of these sizes and strides may share memory (every
    stride >= 1 of a dim of size >= 2 must pass the extent of the dims inside it; stride-0
    dims are in the group already)."""
    extent = 1
    for st, sz in sorted((st, sz) for st, sz in zip(strides, sizes) if sz > 1 and st > 0):
        if st < extent:
            return True
        extent = max(extent, st * (sz - 1) + 1)
    return False


def _group_arg(a: tuple) -> tuple | None:
    if a[0] == "T":
        lay = tensor_layout(a[2], a[3])
        if lay is None:   # strided: the order of its strides, its strides 0/1, its size-0/1 dims,
            # and whether its elements overlap (an in-place op raises on that where eager does)
            return ("T", a[1], len(a[2]), a[4], STRIDED, stride_order(a[2], a[3]),
                    tuple((d, st) for d, st in enumerate(a[3]) if st <= 1),
                    tuple((d, s) for d, s in enumerate(a[2]) if s <= 1), overlaps(a[2], a[3]))
        return ("T", a[1], len(a[2]), a[4], *lay)
    if a[0] == "TL":
        items = tuple(("N",) if t[0] == "N" else _group_arg(t) for t in a[1])
        return None if any(x is None for x in items) else ("TL", items)
    return a


def _is_strided(g: tuple) -> bool:
    return g[0] == "T" and len(g) > 4 and g[4] == STRIDED


def _tensor_groups(gargs: tuple) -> list[tuple]:
    """The group entry of every tensor argument, in :func:`_tensors` order."""
    out = []
    for g in gargs:
        if g[0] == "T":
            out.append(g)
        elif g[0] == "TL":
            out.extend(x for x in g[1] if x[0] == "T")
    return out


def _values(t: tuple, strided: bool) -> tuple:
    """What a class's pattern describes of an encoded tensor: its sizes, and its strides
    when it is strided."""
    return tuple(t[2]) + tuple(t[3]) if strided else tuple(t[2])


def group_of(op: str, args: tuple) -> tuple | None:
    """The group (everything but the sizes of dims >= 2 and a strided tensor's strides
    >= 2) of an encoded call, or None when an argument has no layout class."""
    out = []
    for a in args:
        g = _group_arg(a)
        if g is None:
            return None
        out.append(g)
    return (op, tuple(out))


def group_key(group: tuple) -> str:
    """sha256 hex of a group (the serving index's key; not a signature or class key)."""
    op, args = group
    fields = [("group_version", CLASS_VERSION), ("op", op)] + [(f"arg{i}", list(a)) for i, a in enumerate(args)]
    return hashlib.sha256(S.canonical_bytes(fields)).hexdigest()


# --- classes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeClass:
    op: str
    group: tuple                      # group_of(...)[1]: per argument
    dims: tuple                       # per tensor (in _tensors order): per dim an int or a symbol name
    ranges: tuple                     # ((name, lo, hi), ...) sorted by name
    example: S.Signature | None = field(default=None, compare=False, hash=False)
    members: tuple = field(default=(), compare=False, hash=False)   # member signatures (from a trace)

    # -- identity
    def key_fields(self) -> list[tuple[str, Any]]:
        return ([("class_version", CLASS_VERSION), ("op", self.op)]
                + [(f"arg{i}", list(a)) for i, a in enumerate(self.group)]
                + [("dims", [list(d) for d in self.dims]), ("ranges", [list(r) for r in self.ranges])])

    @cached_property   # the fields are frozen: hashed once (the hook matches classes on its miss path)
    def key(self) -> str:
        return hashlib.sha256(S.canonical_bytes(self.key_fields())).hexdigest()

    @property
    def group_key(self) -> str:
        return group_key((self.op, self.group))

    @property
    def device(self) -> str:
        return self.example.device if self.example is not None else "cpu"

    @property
    def symbols(self) -> dict[str, tuple[int, int]]:
        return {n: (lo, hi) for n, lo, hi in self.ranges}

    @cached_property   # derived from the frozen group: once (bind() reads it on every match)
    def strided(self) -> tuple:
        """Per tensor (in :func:`_tensors` order): whether it is strided (its pattern in
        ``dims`` is its sizes followed by its strides)."""
        return tuple(_is_strided(g) for g in _tensor_groups(self.group))

    @property
    def stride_symbols(self) -> set:
        """The symbols that stand for a stride (compiled as symbolic input strides)."""
        out = set()
        for pat, strided, g in zip(self.dims, self.strided, _tensor_groups(self.group)):
            if strided:
                out.update(p for p in pat[g[2]:] if isinstance(p, str))
        return out

    @property
    def varies(self) -> bool:
        return any(lo != hi for _, lo, hi in self.ranges)

    # -- membership
    def bind(self, args: tuple) -> dict[str, int] | None:
        """Symbol values of an encoded call of this class's op, or None when the call is
        outside the class (another group, a fixed dim differs, tied dims disagree, or a
        symbol is out of its range)."""
        g = group_of(self.op, args)
        if g is None or g[1] != self.group:
            return None
        tens = _tensors(args)
        if len(tens) != len(self.dims):
            return None
        env: dict[str, int] = {}
        for (_, _, t), pat, strided in zip(tens, self.dims, self.strided):
            vals = _values(t, strided)
            if len(vals) != len(pat):
                return None
            for v, p in zip(vals, pat):
                if isinstance(p, int):
                    if v != p:
                        return None
                elif env.setdefault(p, v) != v:
                    return None
        rng = self.symbols
        for n, v in env.items():
            lo, hi = rng[n]
            if not lo <= v <= hi:
                return None
        return env

    def contains(self, sig: S.Signature) -> bool:
        return sig.op == self.op and self.bind(sig.args) is not None

    def point(self, env: dict[str, int], hints: dict | None = None) -> S.Signature:
        """The member signature with symbol values ``env`` (dense strides; a strided
        tensor takes the strides of the class's pattern)."""
        tens = iter(zip(_tensors(self.example.args), self.dims))
        args = []
        for a in self.example.args:
            if a[0] == "T":
                args.append(self._sized(a, next(tens)[1], env))
            elif a[0] == "TL":
                items = []
                for t in a[1]:
                    items.append(t if t[0] == "N" else self._sized(t, next(tens)[1], env))
                args.append(("TL", tuple(items)))
            else:
                args.append(a)
        return S.Signature(self.op, tuple(args), dict(self.hints_at(env) if hints is None else hints))

    def hints_at(self, env: dict[str, int]) -> dict:
        """Value-range hints for example inputs at ``env``: those of the members no larger
        than ``env`` in every symbol (an index valid for a smaller table is valid for a
        larger one: embedding, gather, index_select), else of the smallest member."""
        if not self.members:
            return dict(self.example.hints)
        below, smallest = [], None
        for m in self.members:
            e = self.bind(m.args)
            if e is None:
                continue
            if all(e[n] <= env.get(n, e[n]) for n in e):
                below.append(m)
            if smallest is None or sum(e.values()) < smallest[0]:
                smallest = (sum(e.values()), m)
        pick = below or ([smallest[1]] if smallest else [])
        return _union_hints(pick) if pick else dict(self.example.hints)

    @staticmethod
    def _sized(t: tuple, pat: tuple, env: dict) -> tuple:
        vals = tuple(p if isinstance(p, int) else env[p] for p in pat)
        rank = len(t[2])
        sizes = vals[:rank]
        lay = tensor_layout(t[2], t[3])
        if lay is None:   # the strided layout class: the strides are the pattern's
            return ("T", t[1], sizes, vals[rank:], t[4])
        order, bcast, _ = lay
        return ("T", t[1], sizes, dense_strides(sizes, order, bcast), t[4])

    # -- forms
    def to_obj(self) -> dict:
        """msgpack/JSON-safe form (the manifest's ``shape_class``)."""
        return {"op": self.op, "group": _plain(self.group), "dims": _plain(self.dims),
                "ranges": _plain(self.ranges), "example": self.example.to_obj() if self.example else None}

    def describe(self) -> str:
        parts = []
        for pat, g in zip(self.dims, _tensor_groups(self.group)):
            rank = g[2]
            one = "[" + ",".join(str(p) for p in pat[:rank]) + "]"
            if _is_strided(g):   # a strided tensor: its strides too
                one += ":(" + ",".join(str(p) for p in pat[rank:]) + ")"
            parts.append(one)
        rng = " ".join(f"{n}={lo}..{hi}" for n, lo, hi in self.ranges)
        return f"{self.op}({', '.join(parts)}) {rng}".rstrip()

    def ranges_text(self) -> str:
        return " ".join(f"{n}={lo}..{hi}" for n, lo, hi in self.ranges)


def _plain(x: Any) -> Any:
    return [_plain(i) for i in x] if isinstance(x, (list, tuple)) else x


def _tup(x: Any) -> Any:
    return tuple(_tup(i) for i in x) if isinstance(x, list) else x


def parse_class(obj: Any, where: str = "shape_class") -> ShapeClass:
    """Inverse of :meth:`ShapeClass.to_obj`; ValueError naming the bad field.  The example
    must be a member of the class."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a map")
    op = obj.get("op")
    if not isinstance(op, str):
        raise ValueError(f"{where}.op: not a string")
    ex = S.parse_signature(obj.get("example"), f"{where}.example")
    if ex.op != op:
        raise ValueError(f"{where}.example: op {ex.op!r} != {op!r}")
    ranges = obj.get("ranges")
    if not isinstance(ranges, list) or len(ranges) > MAX_SYMBOLS:
        raise ValueError(f"{where}.ranges: not a list of at most {MAX_SYMBOLS}")
    rs = []
    for r in ranges:
        if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and S.is_int64(r[1])
                and S.is_int64(r[2]) and 2 <= r[1] <= r[2]):
            raise ValueError(f"{where}.ranges: bad range {str(r)[:80]}")
        rs.append(tuple(r))
    dims = obj.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, list) for d in dims):
        raise ValueError(f"{where}.dims: not a list of lists")
    names = {r[0] for r in rs}
    for d in dims:
        for p in d:
            if not (S.is_int64(p) or (isinstance(p, str) and p in names)):
                raise ValueError(f"{where}.dims: {str(p)[:40]} is neither a size nor a symbol of ranges")
    g = group_of(op, ex.args)
    if g is None:
        raise ValueError(f"{where}.example: an argument has no layout class")
    cls = ShapeClass(op, g[1], _tup(dims), tuple(rs), ex)
    if _plain(cls.group) != obj.get("group"):
        raise ValueError(f"{where}.group: does not match the example's")
    if cls.bind(ex.args) is None:
        raise ValueError(f"{where}.example: not a member of the class")
    return cls


# --- learning classes from a trace ------------------------------------------------------------


def classes(sigs: Iterable[S.Signature]) -> tuple[list[ShapeClass], list[S.Signature]]:
    """Group ``sigs`` into classes.  Returns (classes, loose): ``loose`` are signatures
    with no layout class.  A class of one member has no symbols."""
    groups: dict[tuple, list[S.Signature]] = {}
    loose = []
    for s in sigs:
        g = group_of(s.op, s.args)
        if g is None:
            loose.append(s)
        else:
            groups.setdefault((g, index_pins(s)), []).append(s)
    out = []
    for ((op, gargs), _pins), members in groups.items():
        out.append(_learn(op, gargs, members))
    return out, loose


def index_pins(sig: S.Signature) -> tuple:
    """``(argument, dim, size)`` of every size of ``sig`` that bounds an index argument
    (:func:`aoti_farm.signature.index_table`: the table an index selects from).  Members
    whose pins differ are in different classes, so such a size is never a symbol: a class
    kernel of an index op is served behind one constant index guard, as an exact kernel
    is (the verification's ``class_index_guards``).  Serving needs nothing of this: a
    pinned size is a fixed dim of its class, which :meth:`ShapeClass.bind` checks."""
    try:
        info = sig.info()
    except Exception:  # noqa: BLE001 -- an op this torch lacks: nothing to pin
        return ()
    named = dict(zip(info.arg_names, sig.args))
    ranks = {n: len(a[2]) for n, a in named.items() if a[0] == "T"}
    dim = named.get("dim")
    dim = dim[1] if isinstance(dim, tuple) and len(dim) == 2 and dim[0] == "i" else None
    pins = []
    for i, j in S.tensor_positions(sig):   # as adversarial._index_bounds walks a call's tensors
        t = sig.args[i] if j is None else sig.args[i][1][j]
        if info.arg_names[i] not in S.INDEX_ARGS or t[1] not in S.INT_DTYPES:
            continue   # an index is an integer tensor (adversarial._is_index)
        where = S.index_table(sig.op, j, ranks, dim)
        if where is not None and where[1] is not None:
            pins.append((where[0], where[1], named[where[0]][2][where[1]]))
    return tuple(pins)


def _learn(op: str, gargs: tuple, members: list[S.Signature]) -> ShapeClass:
    members = list({m.key: m for m in members}.values())
    strided = [_is_strided(g) for g in _tensor_groups(gargs)]
    shapes = [[_values(t, st) for (_, _, t), st in zip(_tensors(m.args), strided)] for m in members]
    # each dim position of size >= 2: its vector of values over the members
    pos = [(ti, d) for ti, sz in enumerate(shapes[0]) for d in range(len(sz))]
    vec = {p: tuple(sh[p[0]][p[1]] for sh in shapes) for p in pos}
    names: dict[tuple, str] = {}
    dims = [list(sz) for sz in shapes[0]]
    for p in pos:
        v = vec[p]
        if v[0] <= 1 or len(set(v)) == 1:
            continue   # fixed (sizes and strides of 0/1 are in the group, so the same in all members)
        if v not in names:
            names[v] = f"s{len(names)}"
        dims[p[0]][p[1]] = names[v]
    ranges = tuple(sorted((n, min(v), max(v)) for v, n in names.items()))
    # the example: the member with the largest sizes (every symbol at its widest)
    example = max(members, key=lambda m: (sum(sum(t[2]) for _, _, t in _tensors(m.args)), m.key))
    hints = _union_hints(members)
    ex = S.Signature(example.op, example.args, hints)
    return ShapeClass(op, gargs, tuple(tuple(d) for d in dims), ranges, ex, tuple(members))


def _union_hints(members: list[S.Signature]) -> dict:
    """Value-range hints widened over the members (example inputs stay in range)."""
    out: dict = {}
    for m in members:
        for k, v in m.hints.items():
            mine = out.get(k)
            if mine is None:
                out[k] = v
            elif isinstance(mine, dict) and isinstance(v, dict) and "range" in mine and "range" in v:
                out[k] = {**mine, "range": [min(mine["range"][0], v["range"][0]), max(mine["range"][1], v["range"][1])]}
    return out


def distinct_shapes(cls: ShapeClass) -> int:
    """Distinct sizes (and strides, of strided tensors) among the members."""
    if not cls.members:
        return 1
    return len({tuple(_values(t, st) for (_, _, t), st in zip(_tensors(m.args), cls.strided)) for m in cls.members})


# --- sample points for verification -------------------------------------------------------------


def sample_points(cls: ShapeClass, n_random: int = 3, seed: int = 0) -> list[dict[str, int]]:
    """Symbol values to verify a class kernel at: every symbol at its low end, at its high
    end, an odd value in range, ``n_random`` random interior points, and each observed
    member.  Duplicates removed; order kept."""
    rng = cls.symbols
    if not rng:
        return [{}]
    rnd = random.Random(seed)
    pts = [{n: lo for n, (lo, hi) in rng.items()}, {n: hi for n, (lo, hi) in rng.items()}]
    odd = {}
    for n, (lo, hi) in rng.items():
        mid = (lo + hi) // 2
        cand = [v for v in (mid | 1, mid - 1 | 1, lo | 1, hi - (1 - hi % 2)) if lo <= v <= hi and v % 2]
        odd[n] = cand[0] if cand else lo
    pts.append(odd)
    for _ in range(n_random):
        pts.append({n: (rnd.randint(lo + 1, hi - 1) if hi - lo >= 2 else rnd.randint(lo, hi)) for n, (lo, hi) in rng.items()})
    for m in cls.members:
        env = cls.bind(m.args)
        if env is not None:
            pts.append(env)
    seen, out = set(), []
    for p in pts:
        k = tuple(sorted(p.items()))
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def export_point(cls: ShapeClass) -> dict[str, int]:
    """Symbol values for the export's example inputs: in range and pairwise distinct where
    possible (export would otherwise tie equal sizes), and distinct from the fixed sizes."""
    fixed = {p for pat in cls.dims for p in pat if isinstance(p, int)}
    ex = cls.bind(cls.example.args) or {}
    taken, env = set(fixed), {}
    for n, (lo, hi) in sorted(cls.symbols.items()):
        v = ex.get(n, hi)
        if v in taken:
            v = next((c for c in range(hi, lo - 1, -1) if c not in taken), v)
        env[n] = v
        taken.add(v)
    return env


__all__ = ["ShapeClass", "classes", "group_of", "group_key", "parse_class", "sample_points", "export_point",
           "tensor_layout", "memory_format", "dense_strides", "stride_order", "overlaps", "distinct_shapes", "CLASS_VERSION", "STRIDED"]
