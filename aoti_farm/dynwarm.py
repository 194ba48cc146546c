"""``aoti-farm warm --dynamic auto``: shape-general kernels before the exact warm.

``auto`` groups the warm's signatures into shape classes (:mod:`aoti_farm.shapes`) and
compiles one shape-general kernel (:mod:`aoti_farm.dyncompile`) for every class with at
least two distinct shapes.  The members a published class covers leave the exact warm;
everything else -- classes of one shape, signatures with no layout class, the members of
a class that gets no shape-general kernel (export, Inductor or verification refused it:
the reason is in the report) and members outside a gate-narrowed range -- is compiled
exactly, as with ``off``.

Class compiles run in a pool of spawned processes (``cpu_workers``, default the host's
cores), each importing torch once; the exact warm then uses Ray as usual.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import TextIO

from aoti_farm import shapes as SH
from aoti_farm.errors import UserError

MODES = ("auto", "off")


def check_mode(v: str, where: str = "dynamic") -> str:
    if v not in MODES:
        raise UserError(f"{where}: {v!r} is not one of auto, off; fix --dynamic, AOTI_FARM_DYNAMIC or [farm] dynamic")
    return v


def _one(root: str, signing_key, allow_insecure: bool, options: dict, cls: SH.ShapeClass, budget_bytes) -> dict:
    """Compile and publish one class (in a pool process or here); a report row."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    from aoti_farm import budget, leases
    from aoti_farm.cache import Cache
    from aoti_farm.dyncompile import ClassCompiler, compile_and_publish_class
    from aoti_farm.fingerprint import fingerprint

    t0 = time.perf_counter()
    row = {"kind": "shape_class", "key": cls.key, "op": cls.op, "description": cls.describe(),
           "device": cls.device, "members": [m.key for m in cls.members],
           "ranges": {n: [lo, hi] for n, lo, hi in cls.ranges}}
    try:
        widest = cls.point({n: hi for n, (lo, hi) in cls.symbols.items()})
        over = budget.refusal(widest, budget_bytes)
        if over is not None:
            return {**row, "status": "fallback", "error": f"widest shape: {over[0]}", "seconds": 0.0}
        comp = ClassCompiler(options)
        cache = Cache(root, signing_key=signing_key, allow_insecure=allow_insecure)
        fp = fingerprint("cuda:0" if cls.device == "cuda" else "cpu", comp.options())
        out = compile_and_publish_class(cache, comp, fp, cls, owner=leases.new_owner("warm-dynamic"))
    except Exception as e:  # noqa: BLE001 -- a class that cannot be built is compiled exactly
        return {**row, "status": "fallback", "error": f"{type(e).__name__}: {e}"[:500],
                "seconds": time.perf_counter() - t0}
    if out.status in ("compiled", "cached"):
        served = out.evidence.get("ranges") or row["ranges"]
        return {**row, "key": out.key, "status": out.status, "seconds": out.seconds, "ranges": served,
                "serve_range": out.evidence.get("serve_range"), "phases": out.phases}
    status = "fallback" if out.status == "failed" else out.status   # busy: someone else builds it
    return {**row, "status": status, "error": out.error, "evidence": out.evidence, "seconds": out.seconds}


def warm_classes(cfg, sigs: list, cache, stream: TextIO | None = None) -> tuple[list, list[dict]]:
    """(signatures left for the exact warm, one report row per class compiled)."""
    stream = stream or sys.stderr
    cls, _loose = SH.classes(sigs)
    todo = [c for c in cls if SH.distinct_shapes(c) >= 2]
    if not todo:
        return sigs, []
    args = (str(cache.root), cache.signing_key, cache.allow_insecure, dict(cfg.inductor_options or {}))
    workers = max(1, min(len(todo), cfg.cpu_workers or os.cpu_count() or 1))
    stream.write(f"dynamic: {len(todo)} shape classes ({sum(len(c.members) for c in todo)} signatures), "
                 f"{workers} processes\n")
    if workers == 1:
        rows = [_one(*args, c, cfg.memory_budget) for c in todo]
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            rows = list(ex.map(_one, *zip(*[(*args, c, cfg.memory_budget) for c in todo])))
    covered: set = set()
    for c, r in zip(todo, rows):
        stream.write(f"{r['status']:8} {r['key'][:16]} {r['description']} "
                     f"(faster than eager: {_range_text(r.get('serve_range'))}) "
                     f"{r.get('seconds', 0):.1f}s"
                     + (f": {r['error']}" if r.get("error") else "") + "\n")
        if r["status"] in ("compiled", "cached"):
            served = SH.ShapeClass(c.op, c.group, c.dims, tuple(sorted((n, lo, hi) for n, (lo, hi) in r["ranges"].items())),
                                   c.example, c.members)
            covered |= {m.key for m in c.members if served.bind(m.args) is not None}
    n_ok = sum(r["status"] in ("compiled", "cached") for r in rows)
    stream.write(f"dynamic: {n_ok} shape-general kernels cover {len(covered)} signatures; "
                 f"{len(rows) - n_ok} classes fall back to exact kernels\n")
    return [s for s in sigs if s.key not in covered], rows


def _range_text(r) -> str:
    if not isinstance(r, dict):
        return "at no sampled shape" if r is None else "-"
    return " ".join(f"{n}={lo}..{hi}" for n, (lo, hi) in r.items())


__all__ = ["MODES", "check_mode", "warm_classes"]
