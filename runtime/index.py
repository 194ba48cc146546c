"""The serving hook's in-memory index of one fingerprint namespace.

Published and failed keys, listed through :class:`aoti_farm.cache.store.Cache` by shard
(``shard_stamps`` / ``shard_keys``): a refresh stats every shard directory and lists again
only those whose stamp ``(mtime_ns, nlink)`` changed, which is cheap at 10,000 entries.
New entries become hits, removed ones stop being served.

With ``with_meta`` the index also reads, once per new key, what routing needs from its
manifest (:class:`EntryMeta`: the op, and whether the speed gate could ever serve it);
see ``Hook`` for why (an op with nothing servable is not intercepted at all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import Fingerprint
from aoti_farm.speedgate.speed import compile_ratio

log = logging.getLogger("aoti_farm.hook")

KINDS = ("entries", "failed")


@dataclass(frozen=True)
class EntryMeta:
    """What routing knows of a published entry without verifying it (a hint: serving
    verifies everything again)."""

    op: str | None               # None: the manifest could not be read
    ratio: float | None          # the compile-time kernel/eager ratio (exact entries)
    serve_range: bool            # a class entry with a range where it beat eager
    shape_class: bool

    def may_serve(self, gate_ratio: float | None) -> bool:
        """Whether the speed gate (``gate_ratio``; None: ``serve="always"``) can serve it."""
        if self.op is None:
            return False
        if gate_ratio is None:
            return True
        if self.shape_class:
            return self.serve_range
        return self.ratio is not None and self.ratio <= gate_ratio


def read_meta(cache: Cache, fp_id: str, key: str) -> EntryMeta:
    try:
        m = cache.read_manifest(cache.entry_dir(fp_id, key))
        op = str(m["signature"]["op"])
    except Exception as e:  # noqa: BLE001 -- unreadable: not routed (it could not be loaded)
        log.debug("manifest of %s unreadable: %s", key[:12], e)
        return EntryMeta(None, None, False, False)
    sp = m.get("speed")
    return EntryMeta(op, compile_ratio(sp), isinstance(sp, dict) and isinstance(sp.get("serve_range"), dict),
                     m.get("shape_class") is not None)


class Index:
    """Published (``keys``) and failed (``failed``) keys of one namespace."""

    def __init__(self, cache: Cache, fp: Fingerprint, with_meta: bool = False):
        self.cache, self.fp = cache, fp
        self.keys: set[str] = set()
        self.failed: set[str] = set()
        self.meta: dict[str, EntryMeta] = {}
        self.with_meta = with_meta
        self._stamps: dict[tuple[str, str], tuple[int, int]] = {}
        self._shard: dict[tuple[str, str], set[str]] = {}

    def refresh(self) -> tuple[set[str], set[str], int]:
        """List again the changed shards; returns (added keys, removed keys, shards listed)."""
        added: set[str] = set()
        removed: set[str] = set()
        n = 0
        for kind, target in (("entries", self.keys), ("failed", self.failed)):
            stamps = self.cache.shard_stamps(self.fp.id, kind)
            for sk in [k for k in self._stamps if k[0] == kind and k[1] not in stamps]:
                gone = self._shard.pop(sk, set())
                self._stamps.pop(sk, None)
                target.difference_update(gone)
                if kind == "entries":
                    removed |= gone
            for name, stamp in stamps.items():
                sk = (kind, name)
                if self._stamps.get(sk) == stamp:
                    continue
                try:
                    now = self.cache.shard_keys(self.fp.id, kind, name)
                except OSError:
                    continue
                self._stamps[sk] = stamp
                n += 1
                before = self._shard.get(sk, set())
                self._shard[sk] = now
                target.difference_update(before - now)
                target.update(now)
                if kind == "entries":
                    added |= now - before
                    removed |= before - now
        for k in removed:
            self.meta.pop(k, None)
        if self.with_meta:
            for k in added:
                self.meta[k] = read_meta(self.cache, self.fp.id, k)
        return added, removed, n

    def shards_changed(self, names: Iterable[str]) -> bool:
        """Whether any of these shards (``key[:2]``) changed since the last refresh: a few
        stats, for watching the keys this process is waiting for."""
        names = list(names)
        for kind in KINDS:
            for name, stamp in self.cache.shard_stamps(self.fp.id, kind, names).items():
                if self._stamps.get((kind, name)) != stamp:
                    return True
        return False


def servable_ops(indexes: dict, bad, gate) -> set[str]:
    """The ops with at least one entry a hook could serve: published (with a readable
    manifest: ``with_meta``), not refused or failing here (``bad``), and allowed by the
    speed ``gate`` (faster on the compile host, not declined by this host's trial)."""
    ratio = gate.ratio if gate.active else None
    ops: set[str] = set()
    for idx in indexes.values():
        for k in list(idx.keys):
            m = idx.meta.get(k)
            if m is None or m.op in ops or k in bad or gate.decision(k) is False:
                continue
            if m.may_serve(ratio):
                ops.add(m.op)
    return ops


def losing_ops(indexes: dict, bad, gate) -> set[str]:
    """The ops this host knows cannot pay (``route="paying"``): every published entry of
    the op is refused here, or barred by the speed ``gate`` (slower on the compile host,
    or declined by this host's trial).  Routing such an op would only add the hook's
    cost to each of its calls (a gated call runs eager after the hook's own lookup), so
    it is left unrouted and costs exactly eager; an op with no entry at all stays routed
    (its misses must be seen to be queued), and so does one with an entry undecided here."""
    if not gate.active:
        return set()
    known: set[str] = set()
    for idx in indexes.values():
        for k in list(idx.keys):
            m = idx.meta.get(k)
            if m is not None and m.op is not None:
                known.add(m.op)
    return known - servable_ops(indexes, bad, gate)
