"""Install-time trials: route only ops that have a kernel that wins on this host.

Under ``serve="faster"`` with a routing policy that follows the entries
(``route="servable-at-install"``, the default with ``on_miss="ignore"``, or
``"servable"``), an op is routed when one of its entries looked faster than eager *on the
compile host*.  The on-host trial (``runtime/gate.py``) may still decline every one of
them here; a routed op whose every call then runs eager pays the routing (the native
path's key and lookup, 1.5-4 µs a call inside a model on a 2-core VM) for nothing.  On a
tiny BERT on the CPU that alone made the hooked model slower than eager.

So ``install()`` runs the on-host trials of the routed ops' candidate entries itself, in
the installing thread (the thread that usually serves), before it returns: each entry is
verified and loaded, then timed through the dispatcher against eager on inputs of the
signature it was compiled for (``runtime/trial.py``).  The ops left with no entry that
won here are unrouted at once.  Entries are tried until ``budget_s`` seconds have gone;
the rest stay undecided, keep their ops routed, and are decided on their first call as
before.  Shape-class entries are decided per call (their gate is per range).

Only exact entries this host would serve are tried: ones whose compile-time ratio passes
the gate.  The result, ``stats()["install_trial"]``: the entries tried, the seconds spent,
the ops unrouted and the entries left undecided.
"""

from __future__ import annotations

import logging
import time

from aoti_farm import signature as S
from . import trial
from .calls import Call, gatherer

log = logging.getLogger("aoti_farm.hook")


def candidates(indexes: dict, gate, bad, routed: set[str]) -> list[tuple[str, str]]:
    """(device, key) of the exact entries of the ``routed`` ops that the gate could serve
    and has not decided yet: ops with the fewest such entries first (an op is unrouted only
    once all of them are decided, so a short budget decides whole ops), stable order."""
    out = []
    for device, idx in indexes.items():
        for k in sorted(idx.keys):
            m = idx.meta.get(k)
            if (m is None or m.op not in routed or m.shape_class or k in bad
                    or gate.decision(k) is not None or not m.may_serve(gate.ratio)):
                continue
            out.append((m.op, device, k))
    per_op: dict[str, int] = {}
    for op, _, _ in out:
        per_op[op] = per_op.get(op, 0) + 1
    out.sort(key=lambda t: (per_op[t[0]], t[0], t[1], t[2]))
    return [(device, k) for _, device, k in out]


def run(hook, budget_s: float) -> dict:
    """Decide ``hook``'s candidate entries here, within ``budget_s`` seconds; returns the
    summary kept as ``stats()["install_trial"]``.  Never raises (a trial that fails
    declines its kernel; anything else leaves the entry undecided)."""
    t0 = time.monotonic()
    routed = set(hook._routes.routed or ())
    todo = candidates(hook._index, hook.gate, hook._kernels.bad, routed)
    tried = won = 0
    left = len(todo)
    for device, key in todo:
        if time.monotonic() - t0 >= budget_s:
            break
        left -= 1
        try:
            call = _call_for(hook, device, key)
            handle = hook._kernels.load(call) if call is not None else None
            if handle is None:
                continue   # refused or not loadable: not served either way (counted there)
            ok = trial.confirm_now(hook.gate, hook.cache, hook.fps[device], call, handle, hook._routes.bypassed)
        except Exception as e:  # noqa: BLE001 -- decided on its first call instead
            log.debug("install-time trial of %s: %s", key[:12], e)
            left += 1
            continue
        tried += 1
        won += bool(ok)
    return {"tried": tried, "faster_here": won, "undecided": left,
            "seconds": round(time.monotonic() - t0, 3), "budget_s": budget_s}


def _call_for(hook, device: str, key: str) -> Call | None:
    """The Call of a published entry, from its manifest's signature."""
    e = hook.cache.open_entry(hook.fps[device], key)
    try:
        sig = S.parse_signature(e.manifest["signature"])
    finally:
        e.close()
    if sig.key != key or sig.device != device:
        return None
    return Call(sig, key, device, gather=gatherer(sig))
