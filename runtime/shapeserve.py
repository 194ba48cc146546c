"""Serving shape-general kernels: which class entry, if any, covers an exact call.

The hook asks :meth:`ShapeIndex.call_for` only when a call's exact key is not published
(exact first).  The answer comes from the group of the call (:func:`aoti_farm.dynamic.shapes.group_of`:
op, non-tensor arguments, dtypes, ranks, devices, layout classes), the class keys hinted
for that group (``<root>/<fp>/classes/<group key>/<class key>``, see
:mod:`aoti_farm.dynamic.dyncompile`) that are published in the hook's index, and each class's
range check (:meth:`aoti_farm.dynamic.shapes.ShapeClass.bind`: fixed dims equal, tied dims
agree, every symbol in its range).  Under the speed gate (``serve="faster"``) a class
serves only inside its ``speed["serve_range"]`` (where it beat eager at every sampled
shape, :func:`aoti_farm.dynamic.dyncompile.gate`).  A call that a class covers
outside that range is a hit the gate declines: :meth:`declined` names the class, the hook
counts the call ``gated`` (eager, remembered natively) and queues nothing (an exact kernel
of the same op at a shape where the class lost would lose the same way).  A call outside
every class's range is a miss, as before; what it queues is the ``widen`` policy (:mod:`aoti_farm.compile.widen`): its exact
signature, or (``auto``, the default, when the call is near a range) a class kernel with
the range widened to cover it (:meth:`widen_request`, read by the miss writer).

A class is read from its manifest and kept only when it hashes to the key it is
published under, so the class matched is the one :meth:`aoti_farm.cache.store.Cache.open_entry`
verifies when the hook loads the kernel.  Answers are remembered per exact signature
until the index changes (:meth:`changed`); the native path remembers its decision per
exact call, so a hit on a class kernel costs what an exact hit costs.
"""

from __future__ import annotations

import logging
import threading

from aoti_farm.dynamic import shapes as SH
from aoti_farm.compile import widen as W
from aoti_farm.metrics.counters import Counters
from aoti_farm.dynamic.dyncompile import hinted_keys

log = logging.getLogger("aoti_farm.shapes")

#: Most exact signatures whose answer is remembered.
MEMO_LIMIT = 65536


class ShapeIndex:
    def __init__(self, cache, fps: dict, make_call, gated: bool = True, widen: str = "auto"):
        self.cache, self.fps, self._make_call = cache, fps, make_call
        self.gated = gated        # serve="faster": a class serves only inside its speed["serve_range"]
        self.widen = W.check_policy(widen)   # what a call outside every range queues (aoti_farm/compile/widen.py)
        self._widen: dict[str, dict] = {}           # exact key -> the widened class to queue (to_obj form)
        self._lock = threading.Lock()
        self._gen = 0
        self._memo: dict[str, tuple] = {}            # exact key -> (generation, class call or None)
        self._declined: dict[str, tuple] = {}        # exact key -> (generation, class key): covered, gated
        self._groups: dict[tuple, list] = {}         # (fp id, group key) -> [ShapeClass]
        self._parsed: dict[str, object] = {}         # class key -> ShapeClass | None (unreadable)
        self._serve: dict[str, object] = {}          # class key -> serve_range ({symbol: [lo, hi]}) or None
        # matched: exact signatures served by a class entry; outside: signatures of a group
        # with class entries, outside every range; widen_requests: of those, the ones whose
        # miss asks for a widened class; errors: unreadable hints or manifests (skipped)
        # gated: exact signatures a class covers outside its serve_range (served eager)
        self.counters = Counters("matched", "outside", "widen_requests", "errors", "gated")

    def changed(self) -> None:
        """The index changed: every answer is decided again."""
        with self._lock:
            self._gen += 1
            self._groups.clear()
            self._declined.clear()

    def call_for(self, call, keys: set, bad) -> object | None:
        """A call object keyed by the class entry covering ``call`` (published in ``keys``,
        not in ``bad``), or None.  Never raises."""
        memo = self._memo.get(call.key)
        gen = self._gen
        if memo is not None and memo[0] == gen:
            c = memo[1]
            return c if c is not None and c.key in keys and c.key not in bad else None
        try:
            cls = self._match(call, keys, bad)
        except Exception as e:  # noqa: BLE001 -- a serving process never sees the farm's errors
            log.warning("shape classes: %s", e)
            self.counters.inc("errors")
            cls = None
        c = None
        if cls is not None:
            c = self._make_call(call.sig, cls.key, call.device, gather=call.gather)
            self.counters.inc("matched")
        if len(self._memo) < MEMO_LIMIT:
            self._memo[call.key] = (gen, c)
        return c

    def _match(self, call, keys: set, bad):
        sig = call.sig
        g = SH.group_of(sig.op, sig.args)
        fp = self.fps.get(call.device)
        if g is None or fp is None:
            return None
        gk = SH.group_key(g)
        cands = self._groups.get((fp.id, gk))
        if cands is None:
            cands = []
            for k in hinted_keys(self.cache, fp.id, gk):
                if k not in keys:
                    continue   # a stale hint, or not yet in this process's index
                if k not in self._parsed:
                    self._parsed[k] = self._read(fp.id, k)
                if self._parsed[k] is not None:
                    cands.append(self._parsed[k])
            # the narrowest range first: a sub-range kernel wins over a wider one
            cands.sort(key=lambda c: sum(hi - lo for _, lo, hi in c.ranges))
            self._groups[(fp.id, gk)] = cands
        covering = None
        for cls in cands:
            env = cls.bind(sig.args) if cls.key not in bad else None
            if env is not None and (not self.gated or _inside(env, self._serve.get(cls.key))):
                return cls
            if env is not None and covering is None:
                covering = cls
        if covering is not None:   # covered, where the class did not beat eager: gated
            if len(self._declined) < MEMO_LIMIT:
                self._declined[call.key] = (self._gen, covering.key)
            self.counters.inc("gated")
            return None
        if cands:
            self.counters.inc("outside")
            w = W.request(self.widen, cands, sig)
            if w is not None and len(self._widen) < MEMO_LIMIT:
                self._widen[call.key] = w.to_obj()
                self.counters.inc("widen_requests")
        return None

    def declined(self, key: str) -> str | None:
        """The class key covering exact signature ``key`` where the speed gate declines it
        (outside its ``serve_range``), or None; valid after :meth:`call_for` returned None."""
        d = self._declined.get(key)
        return d[1] if d is not None and d[0] == self._gen else None

    def widen_request(self, call) -> dict | None:
        """The widened class a miss of ``call`` queues (``ShapeClass.to_obj()``), or None
        (its exact signature); asked by the miss writer's thread.  Never raises."""
        return self._widen.get(call.key)

    def _read(self, fp_id: str, key: str):
        try:
            m = self.cache.read_manifest(self.cache.entry_dir(fp_id, key))
            cls = SH.parse_class(m.get("shape_class"))
        except Exception as e:  # noqa: BLE001
            log.warning("shape class %s unreadable: %s", key[:12], e)
            self.counters.inc("errors")
            return None
        if cls.key != key:
            self.counters.inc("errors")
            return None
        sp = m.get("speed")
        self._serve[key] = sp.get("serve_range") if isinstance(sp, dict) else None
        return cls

    def stats(self) -> dict:
        return self.counters.snapshot()


def _inside(env: dict, serve) -> bool:
    """Whether symbol values ``env`` lie in the speed gate's ``serve_range`` (None: the
    kernel won nowhere, or the entry has no speed: never)."""
    if not isinstance(serve, dict):
        return False
    try:
        return all(serve[n][0] <= v <= serve[n][1] for n, v in env.items())
    except (KeyError, TypeError, IndexError):
        return False


__all__ = ["ShapeIndex"]
