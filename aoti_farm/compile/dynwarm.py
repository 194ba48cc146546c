"""``aoti-farm warm --dynamic auto``: what one shape-class compile does, and its report row.

``auto`` groups the warm's signatures into shape classes (:mod:`aoti_farm.dynamic.shapes`) and
compiles one shape-general kernel (:mod:`aoti_farm.dynamic.dyncompile`, on the exact kernels' compile
path: the ``Compiler`` and :func:`aoti_farm.compile.job.compile_and_publish`) for every class with at
least two distinct shapes.  The members a published class covers leave the exact warm;
everything else -- classes of one shape, signatures with no layout class, the members of
a class that gets no shape-general kernel (export, Inductor or verification refused it,
or its widest shape is over the memory budget: the reason is in the report) -- is
compiled exactly, as with ``off``.

The class compiles run on the farm's Ray pool, in the same long-lived compile actors as
the exact compiles (:mod:`aoti_farm.workers.classtasks`); this module is the part that
needs no Ray: :func:`compile_class` (one class through the job: memory budget, lease,
compile, verify across the range, publish; any failure but the host's is the members'
fallback) and :func:`class_row` (its report row).
"""

from __future__ import annotations

import time

from aoti_farm.dynamic import shapes as SH
from aoti_farm.errors import UserError

MODES = ("auto", "off")


def check_mode(v: str, where: str = "dynamic") -> str:
    if v not in MODES:
        raise UserError(f"{where}: {v!r} is not one of auto, off; fix --dynamic, AOTI_FARM_DYNAMIC or [farm] dynamic")
    return v


def compile_class(cache, cls: SH.ShapeClass, compiler, fp, memory_budget, *, owner: str,
                  lease_ttl: float | None = None, on_start=None) -> dict:
    """Compile and publish one class in this process, on the one compile path
    (:func:`aoti_farm.compile.job.compile_and_publish` with ``compiler``, the farm's
    ``Compiler``, and ``fp``, its fingerprint for the class's device);
    ``Outcome.to_dict()``: status ``compiled``/``cached`` (evidence: ``ranges``,
    ``serve_range``), ``busy`` (another compiler holds the class's lease) or ``failed`` (no
    shape-general kernel: the reason is ``error``; the caller compiles the members
    exactly).  ``CompileInfraError`` (this host could not compile: retried) is raised;
    nothing else is: whatever else fails a class compile, its members are compiled exactly."""
    from aoti_farm.compile.faults import CompileInfraError
    from aoti_farm.compile.job import FAILED, Outcome, compile_and_publish

    t0 = time.perf_counter()
    try:
        kw = {} if lease_ttl is None else {"lease_ttl": lease_ttl}
        return compile_and_publish(cache, compiler, fp, cls, owner=owner, memory_budget=memory_budget,
                                   on_start=on_start, **kw).to_dict()
    except CompileInfraError:
        raise
    except Exception as e:  # noqa: BLE001 -- a class that cannot be built is compiled exactly
        return Outcome(cls.key, FAILED, time.perf_counter() - t0,
                       error=f"{type(e).__name__}: {e}"[:500]).to_dict()


def class_row(cls: SH.ShapeClass, status: str, out: dict) -> dict:
    """The warm report's row for a class: ``status`` is compiled, cached or fallback."""
    ranges = {n: [lo, hi] for n, lo, hi in cls.ranges}
    ev = out.get("evidence") or {}
    row = {"kind": "shape_class", "key": cls.key, "op": cls.op, "description": cls.describe(),
           "device": cls.device, "members": [m.key for m in cls.members], "ranges": ev.get("ranges") or ranges,
           "status": status, "seconds": float(out.get("seconds") or 0.0), "worker": out.get("worker", ""),
           "attempts": int(out.get("attempts") or 0)}
    if status in ("compiled", "cached"):
        row.update({"serve_range": ev.get("serve_range"), "phases": out.get("phases") or {}})
    else:
        row.update({"error": out.get("error"), "evidence": ev})
    return row


def covered(cls: SH.ShapeClass, row: dict) -> set:
    """Keys of the members a published class (its row's ranges) covers."""
    served = SH.ShapeClass(cls.op, cls.group, cls.dims,
                           tuple(sorted((n, lo, hi) for n, (lo, hi) in row["ranges"].items())), cls.example,
                           cls.members)
    return {m.key for m in cls.members if served.bind(m.args) is not None}


def range_text(r) -> str:
    if not isinstance(r, dict):
        return "at no sampled shape" if r is None else "-"
    return " ".join(f"{n}={lo}..{hi}" for n, (lo, hi) in r.items())


__all__ = ["MODES", "check_mode", "compile_class", "class_row", "covered", "range_text"]
