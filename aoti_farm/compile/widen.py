"""The miss policy for calls outside every shape class's range: queue the exact signature,
or a class kernel with a widened range.

A serving call whose group has class entries but which lies outside every class's range
(:mod:`aoti_farm.dynamic.shapes`: its fixed dims and tied dims match a class, one of its symbols
does not fit) is a miss.  What the miss queues is the hook's ``widen`` policy
(``install(settings=Settings(widen=...))``, ``[hook] widen`` in TOML, ``AOTI_FARM_WIDEN``):

``"auto"`` (the default)
    widen when the call is near the range: every symbol of the call is at most twice the
    class's high end and at least half its low end.  Traffic that outgrows a range a
    little usually keeps doing so (longer prompts, bigger batches), and one class kernel
    then serves all of it, where exact kernels would miss once per new size.  A call far
    outside (an outlier) queues its exact signature: a class verified up to a huge size
    would cost that size's compile and verification memory for a single call.
``"always"``
    widen whatever the distance (the widest shape must still fit the memory budget).
``"off"``
    queue the exact signature, as before shape classes.

The widened class is the class's pattern with each range stretched to cover the call,
rounded outwards to powers of two (:func:`widened`), so that processes missing at 100 and
at 120 ask for the same class ``[lo, 128]`` and one compile serves both (the class key is
the lease).  The request rides in the exact signature's queue item as the optional field
``widen`` (:func:`aoti_farm.cache.queue.enqueue`): the item keeps its key, so deduplication,
``cache verify`` and a drainer that ignores the field (it compiles the exact signature)
work as before.

A drainer that knows the field (:func:`compile_queued`: the hook's compile worker,
``aoti-farm serve``'s actors) compiles the widened class first -- the same verification
across the range and atomic publish as ``warm --dynamic auto`` -- and the exact signature
when the class gets no kernel (refused: remembered per process, so the next request for
the same class goes straight to exact) or when the class's speed gate range leaves the
call out (``serve="faster"`` would not serve it from the class).  A request is checked
before use: a class that does not contain the queued signature, or with more symbols or
different fixed dims, is ignored (the exact signature is compiled).
"""

from __future__ import annotations

from aoti_farm.dynamic import shapes as SH
from aoti_farm.config import WIDEN as POLICIES
from aoti_farm.config import check_widen as check_policy

#: ``auto``: how far outside a range (a factor on each end) a call may be and still widen it.
AUTO_FACTOR = 2
#: Class keys whose widened kernel was refused in this process (go straight to exact).
_REFUSED: set[str] = set()


def _pow2_up(v: int) -> int:
    return 1 << (max(1, v) - 1).bit_length()


def _pow2_down(v: int) -> int:
    return max(2, 1 << (max(1, v).bit_length() - 1))


def unbounded_env(cls: SH.ShapeClass, args: tuple) -> dict | None:
    """The call's symbol values when it has the class's pattern (group, fixed dims, tied
    dims), whatever the ranges; None when it does not."""
    wide = SH.ShapeClass(cls.op, cls.group, cls.dims, tuple((n, 2, 1 << 62) for n, _, _ in cls.ranges),
                         cls.example)
    return wide.bind(args)


def widened(cls: SH.ShapeClass, env: dict) -> SH.ShapeClass:
    """``cls`` with each range stretched to cover ``env``, rounded outwards to powers of two."""
    rs = []
    for n, lo, hi in cls.ranges:
        v = env[n]
        rs.append((n, min(lo, _pow2_down(v)) if v < lo else lo, max(hi, _pow2_up(v)) if v > hi else hi))
    return SH.ShapeClass(cls.op, cls.group, cls.dims, tuple(rs), cls.example)


def request(policy: str, classes: list, sig) -> SH.ShapeClass | None:
    """The widened class a miss of ``sig`` should queue under ``policy``, or None (queue the
    exact signature): None too when a class already contains the call (it missed for
    another reason, e.g. the speed gate: widening would not help)."""
    if policy == "off":
        return None
    best = None
    for cls in classes:
        env = unbounded_env(cls, sig.args)
        if env is None:
            continue
        rng = cls.symbols
        if all(rng[n][0] <= v <= rng[n][1] for n, v in env.items()):
            return None
        if policy == "auto" and not all(rng[n][0] <= AUTO_FACTOR * v and v <= AUTO_FACTOR * rng[n][1]
                                        for n, v in env.items()):
            continue
        w = widened(cls, env)
        cost = sum(hi - lo for _, lo, hi in w.ranges) - sum(hi - lo for _, lo, hi in cls.ranges)
        if best is None or cost < best[0]:
            best = (cost, w)
    return None if best is None else best[1]


def parse_request(obj, sig) -> SH.ShapeClass | None:
    """The queued request as a class containing ``sig``, or None (absent or unusable: the
    exact signature is compiled)."""
    if obj is None:
        return None
    try:
        cls = SH.parse_class(obj, "queue item.widen")
    except ValueError:
        return None
    if cls.op != sig.op or not cls.varies or cls.bind(sig.args) is None:
        return None
    return cls


def compile_queued(cache, compiler, fp, sig, widen_obj, *, owner: str, memory_budget=None, **exact_kw):
    """Compile a queued miss: the widened class it asks for, else (or also, see module doc)
    its exact signature, both with :func:`aoti_farm.compile.job.compile_and_publish` and ``compiler``
    (``exact_kw``: its keyword arguments).  Returns an :class:`aoti_farm.compile.job.Outcome` for the queued key:
    ``compiled``/``cached`` when the key is now served (by the class or its own kernel),
    ``busy`` when another compiler holds the class's lease (look again later).
    ``evidence["widened"]``: the class key and ranges, when a class was published."""
    from aoti_farm.compile import dynwarm, job

    cls = parse_request(widen_obj, sig)
    ev: dict = {}
    if cls is not None and cls.key not in _REFUSED:
        if exact_kw.get("on_start") is not None:
            exact_kw["on_start"]()   # the compile begins (the serving hook makes room for it)
        out = dynwarm.compile_class(cache, cls, compiler, fp, memory_budget, owner=owner,
                                    **({"lease_ttl": exact_kw["lease_ttl"]} if "lease_ttl" in exact_kw else {}))
        if out["status"] == job.BUSY:
            return job.Outcome(sig.key, job.BUSY, out.get("seconds", 0.0), out.get("worker", ""))
        if out["status"] in (job.COMPILED, job.CACHED):
            ranges = {n: [lo, hi] for n, lo, hi in cls.ranges}
            ev = {"widened": {"key": cls.key, "ranges": ranges, "status": out["status"]}}
            serve = (out.get("evidence") or {}).get("serve_range")
            env = cls.bind(sig.args)
            if isinstance(serve, dict) and all(n in serve and serve[n][0] <= v <= serve[n][1] for n, v in env.items()):
                return job.Outcome(sig.key, out["status"], out.get("seconds", 0.0), out.get("worker", ""),
                                   evidence=ev, phases=out.get("phases") or {})
            ev["widened"]["outside_serve_range"] = True   # the gate would not serve it: the exact kernel too
        else:
            _REFUSED.add(cls.key)
            ev = {"widen_refused": {"key": cls.key, "error": out.get("error")}}
    res = job.compile_and_publish(cache, compiler, fp, sig, owner=owner, memory_budget=memory_budget, **exact_kw)
    res.evidence = {**(res.evidence or {}), **ev}
    return res


__all__ = ["POLICIES", "AUTO_FACTOR", "check_policy", "request", "widened", "unbounded_env", "parse_request",
           "compile_queued"]
