"""Named counters: the one counter shape of every component.

A :class:`Counters` holds integer counters by name, and keyed families of them (a path of
names: ``("fallbacks", reason)``, ``("per_op", op, "hits")``).  Increments take no lock:
each thread adds to a dict of its own (created on its first increment), so a hit path
pays one thread-local lookup and one dict update, and no increment is ever lost between
threads (``x += 1`` on a shared attribute can lose one when the GIL switches threads
between the read and the write).  :meth:`snapshot` sums the threads' dicts into a plain,
nested dict (declared names present with 0), which is what ``stats()`` methods return;
:func:`delta` is the difference of two snapshots (what tests assert on).

    c = Counters("hits", "misses", fallbacks={})
    c.inc("hits")
    c.inc("fallbacks", "requires_grad")
    c.snapshot()   # {"hits": 1, "misses": 0, "fallbacks": {"requires_grad": 1}}
"""

from __future__ import annotations

import threading
from typing import Any


class Counters:
    """Integer counters of one component; thread-safe increments without a lock."""

    def __init__(self, *names: str, **families: dict):
        self._names = tuple(names)
        self._families = tuple(families)
        self._tls = threading.local()
        self._dicts: list[dict] = []          # one per thread that counted (kept after it exits)
        self._register = threading.Lock()     # taken once per thread, on its first increment

    def _dicts_new(self) -> dict:
        d: dict = {}
        with self._register:
            self._dicts.append(d)
        self._tls.d = d
        return d

    def inc(self, *path: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``path`` (a name, or a family and its keys)."""
        try:
            d = self._tls.d
        except AttributeError:
            d = self._dicts_new()
        k = path[0] if len(path) == 1 else path
        d[k] = d.get(k, 0) + n

    def get(self, *path: str) -> int:
        """One counter's current total."""
        k = path[0] if len(path) == 1 else path
        with self._register:
            dicts = list(self._dicts)
        return sum(d.get(k, 0) for d in dicts)

    def snapshot(self) -> dict:
        """Every counter as a nested dict of ints (a copy)."""
        out: dict[str, Any] = {n: 0 for n in self._names}
        for f in self._families:
            out[f] = {}
        with self._register:
            dicts = list(self._dicts)
        for d in dicts:
            for k, v in d.copy().items():   # dict.copy is atomic under the GIL
                if isinstance(k, tuple):
                    node = out
                    for part in k[:-1]:
                        nxt = node.get(part)
                        if not isinstance(nxt, dict):
                            nxt = node[part] = {}
                        node = nxt
                    node[k[-1]] = node.get(k[-1], 0) + v
                else:
                    out[k] = out.get(k, 0) + v
        return out


def delta(before: dict, after: dict) -> dict:
    """``after - before`` for two snapshots (nested dicts of ints): only the counters that
    changed; a family appears when one of its keys changed."""
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, dict):
            d = delta(b if isinstance(b, dict) else {}, v)
            if d:
                out[k] = d
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            diff = v - (b if isinstance(b, (int, float)) and not isinstance(b, bool) else 0)
            if diff:
                out[k] = diff
    for k, b in before.items():   # a counter that went away (never for Counters)
        if k not in after and isinstance(b, (int, float)) and not isinstance(b, bool) and b:
            out[k] = -b
    return out


__all__ = ["Counters", "delta"]
