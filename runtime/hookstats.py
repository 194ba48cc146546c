"""``Hook.stats()``: every collaborator's counters in one dict, with the native path's folded in.

The Python side counts in :class:`aoti_farm.metrics.counters.Counters` (the hook's per-call
counters, the kernel table's, the miss writer's, the workers'); the native hit path counts
in C++ (``fastpath.cpp``), summed over every native registration of the hook
(``runtime/routes.py``).  Keys, for ``stats()``'s readers (tests, ``runtime/metrics.py``,
``aoti-farm run``'s stats files):

* ``calls``, ``hits``, ``misses``, ``failed_signatures``, ``fallbacks`` (by reason),
  ``per_op`` (op -> hits/misses/fallbacks), ``served_after_miss``, ``gated``,
  ``gate_pending``: the per-call outcomes;
* ``kernels_loaded``, ``kernels_dropped``, ``load_errors``, ``load_unsafe``,
  ``kernel_errors``, ``integrity_failures`` (+ ``_by_kind``), ``foreign``;
* ``queued``, ``queue_dedup``, ``queue_dropped``, ``queue_errors``, ``queued_waiting``,
  ``miss_to_hit_seconds``, ``eager_while_pending_seconds``;
* ``workers_started``, ``worker_errors``, ``rescans``, ``poll_errors``;
* ``serve``, ``gate_trials``, ``gated_signatures``, ``gate_errors``, ``gate_remembered`` (decisions
  taken from this host's memo, no trial), ``gate_trial_seconds`` (the gate thread's); ``thread_room`` (the hook's compiles beside serving: no thread count ever lowered);
  ``serving``; ``routed_ops``; ``route``; ``install_trial`` (``runtime/pretrial.py``); ``shape_classes``; ``native``; ``miss_reasons``; ``metrics``;
* ``summary``: what a user asks first (:func:`summary`): calls, served, the hit rate, gated,
  and why the other calls were not served, by outcome.

After ``uninstall()`` (the stats ``aoti-farm run`` writes at exit) ``routed_ops`` and
``native["active"]`` describe the hook as it served, not the empty registration left
behind (``uninstalled`` is then true).
"""

from __future__ import annotations

from . import metrics as metrics_mod

#: The native counters of calls the Python side never saw, by fallback reason.
_NATIVE_FALLBACKS = (("wrapped Python number", "wrapped_numbers"), ("requires_grad", "requires_grad"),
                     ("conjugate or negative view", "conj_neg_views"))


def summary(s: dict) -> dict:
    """``calls``, ``served`` (hits), ``hit_rate`` (served / calls), and ``not_served``: the
    other calls by why (``gated``: a kernel exists but loses to eager here; ``gate_pending``:
    its on-host trial was not done yet; ``missed``: no kernel, queued; ``failed``: its compile
    failed; ``ineligible``: the call cannot be served, by reason), plus ``top_reason``."""
    calls = s.get("calls", 0)
    served = s.get("hits", 0)
    fb = dict(s.get("fallbacks", {}))
    not_served = {"gated": s.get("gated", 0), "gate_pending": s.get("gate_pending", 0),
                  "missed": s.get("misses", 0), "failed": s.get("failed_signatures", 0),
                  "ineligible": sum(fb.values())}
    top = max(not_served, key=not_served.get) if any(not_served.values()) else None
    return {"calls": calls, "served": served, "hit_rate": round(served / calls, 4) if calls else 0.0,
            "not_served": not_served, "ineligible_by_reason": fb, "top_reason": top}


def _as_served(hook, s: dict) -> None:
    """After uninstall: what the hook routed and whether it served natively."""
    served_as = getattr(hook, "served_as", None)
    if served_as is None:
        return
    s["uninstalled"] = True
    s["routed_ops"] = served_as["routed_ops"]
    s["native"]["active"] = served_as["native_active"]
    if served_as["native_active"]:
        s["native"].pop("reason", None)


def merged_stats(hook) -> dict:
    s = _merged(hook)
    _as_served(hook, s)
    s["summary"] = summary(s)
    return s


def _merged(hook) -> dict:
    s = hook.counters.snapshot()
    for part in (hook._kernels.counters.snapshot(), hook._writer.stats(), hook._workers.counters.snapshot()):
        s.update(part)
    for oc in s["per_op"].values():
        for k in ("hits", "misses", "fallbacks"):
            oc.setdefault(k, 0)
    s["thread_room"] = hook._room.stats()
    g = hook.gate.stats()
    s["serve"] = g["policy"]
    s["gate_trials"], s["gated_signatures"], s["gate_errors"] = g["gate_trials"], g["gated_signatures"], g["gate_errors"]
    # decisions taken from this host's memo (aoti_farm/speedgate/hostgate.py); the background trials' seconds
    s["gate_remembered"], s["gate_trial_seconds"] = g["remembered"], g["trial_seconds"]
    s["serving"] = hook._not_serving is None   # False: nothing intercepted (see Hook)
    s["routed_ops"] = len(hook.ops)
    s["route"] = hook.route
    s["install_trial"] = hook.install_trial
    s["shape_classes"] = hook._shapes.stats()
    routes = hook._routes
    n = routes.native_stats()
    if n is None:
        why = "no op routed" if not hook.ops and routes.mode != "off" else None
        s["native"] = {"active": False,
                       "reason": routes.error or why or ("off" if routes.mode == "off" else "building")}
        return metrics_mod.with_miss_reasons(s, hook._metrics)
    _fold_native(s, n, {i: r for r, i in hook._ineligible_ids.items()})
    reason = {} if routes.nreg is not None else {"reason": routes.error or "no op routed"}
    s["native"] = {"active": routes.nreg is not None, **reason,
                   **{k: n.get(k, 0) for k in ("slow_calls", "remembered", "forgotten_full", "unkeyable",
                                               "callback_errors", "kernels", "trial_calls", "typed_boxed")},
                   "typed_ops": list(n.get("typed_ops", ()))}
    return metrics_mod.with_miss_reasons(s, hook._metrics)


def _fold_native(s: dict, n: dict, reasons: dict) -> None:
    s["hits"] += n["hits"]
    s["user_errors"] = s.get("user_errors", 0) + n.get("user_errors", 0)   # eager raised too: kept
    s["misses"] += n["misses"]
    s["failed_signatures"] += n["failed_signatures"]
    s["calls"] += n["hits"] + n["misses"] + n["failed_signatures"] + n.get("gated", 0)
    s["gated"] += n.get("gated", 0)
    for reason, k in _NATIVE_FALLBACKS:
        if n.get(k):
            s["fallbacks"][reason] = s["fallbacks"].get(reason, 0) + n[k]
            s["calls"] += n[k]
    for rid, k in n.get("ineligible", {}).items():   # remembered natively, counted there
        reason = reasons.get(rid, "ineligible")
        s["fallbacks"][reason] = s["fallbacks"].get(reason, 0) + k
        s["calls"] += k
    for name, (h, m, f) in n.get("per_slot", {}).items():
        oc = s["per_op"].setdefault(name, {"hits": 0, "misses": 0, "fallbacks": 0})
        oc["hits"] += h
        oc["misses"] += m
        oc["fallbacks"] += f
