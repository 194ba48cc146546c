"""Shape-class compiles on the farm's Ray pool (``aoti-farm warm --dynamic auto``).

A class compile is one scheduler task (:class:`aoti_farm.workers.scheduler.Task` with
``method="compile_class"``) dispatched to the same long-lived
:class:`~aoti_farm.workers.compile_actor.CompileActor`\\ s as the exact compiles, so it gets
their warm torch and Inductor, and the scheduler's timeouts, retries, busy parking and
lease breaking.  Its key is the class key: the lease, the entry and the hint are the class's
(:func:`aoti_farm.compile.dynwarm.compile_class`: the actor's own ``Compiler`` through
:func:`aoti_farm.compile.job.compile_and_publish`, as for an exact task).

Driver side, :class:`ClassWork`:

1. :meth:`ClassWork.split` groups the warm's signatures into classes; each class with at
   least two distinct shapes is a task, and its members leave the exact plan.  A class
   already published under this host's fingerprint is ``cached`` at once.
2. :meth:`ClassWork.start` adds the class tasks to the scheduler before the exact ones
   (they are the long compiles: the ready queue is first in, first out).
3. :meth:`ClassWork.event` takes the scheduler's events for class keys.  A class that
   gets no shape-general kernel (the compile path's ``failed``: export, Inductor or
   verification refused it, or its widest shape is over the memory budget) falls back:
   its members are planned like any signature (:func:`aoti_farm.workers.warm.plan`, passed in) and
   added to the same scheduler as exact tasks.  So exact compiles run beside class
   compiles, and a fallback's members start as soon as the class is refused.
4. :meth:`ClassWork.rows` gives one report row per class (status compiled, cached or
   ``fallback`` with the reason) and the members' exact results.

The pool's counters (``Scheduler.stats()``) count a class as one task: a fallback is
``failed`` there; the report's row says ``fallback``, and only its members' own results
decide the exit code.

``aoti-farm serve``: a queue item that asks for a widened class (the miss policy of
:mod:`aoti_farm.compile.widen`) is a :class:`WidenJob` task (:func:`queued_task`) on the same
method: the actor runs :func:`aoti_farm.compile.widen.compile_queued` (the class, else the exact
signature) and the task keeps the queue item's key.

Actor side, :func:`compile_in_actor` (``CompileActor.compile_class``): never raises; a
:class:`~aoti_farm.compile.faults.CompileInfraError` comes back as status ``error`` (the
scheduler retries it), any other failure as ``failed`` (the fallback).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Callable, TextIO

from aoti_farm.compile import dynwarm
from aoti_farm.dynamic import shapes as SH
from aoti_farm import signature as S

METHOD = "compile_class"


class ClassJob:
    """What a scheduler task carries for a class: ``key``, ``op``, ``device`` and
    ``to_obj()`` (the class with its members: the members are sampled by the
    verification and give the example inputs' value hints)."""

    def __init__(self, cls: SH.ShapeClass):
        self.cls = cls

    key = property(lambda self: self.cls.key)
    op = property(lambda self: self.cls.op)
    device = property(lambda self: self.cls.device)

    def to_obj(self) -> dict:
        return {"shape_class": self.cls.to_obj(), "members": [m.to_obj() for m in self.cls.members]}


class WidenJob:
    """A queued miss that asks for a widened class (:mod:`aoti_farm.compile.widen`): the task's key
    is the queued signature's, so ``serve`` retires the queue item as for an exact task."""

    def __init__(self, sig, widen_obj: dict):
        self.sig, self.widen = sig, widen_obj

    key = property(lambda self: self.sig.key)
    op = property(lambda self: self.sig.op)
    device = property(lambda self: self.sig.device)

    def to_obj(self) -> dict:
        return {"signature": self.sig.to_obj(), "widen": self.widen}


def queued_task(sig, widen_obj, kind: str, fp_id: str | None):
    """``aoti-farm serve``'s task for a queue item: a :class:`WidenJob` when the item asks for
    a usable widened class, else the exact signature's task."""
    from aoti_farm.compile.widen import parse_request
    from .scheduler import Task

    if parse_request(widen_obj, sig) is not None:
        return Task(WidenJob(sig, widen_obj), kind, fp_id, method=METHOD)
    return Task(sig, kind, fp_id)


def parse_job(obj: dict) -> SH.ShapeClass:
    """Inverse of :meth:`ClassJob.to_obj` (ValueError naming the bad field)."""
    if not isinstance(obj, dict):
        raise ValueError("class task: not a map")
    cls = SH.parse_class(obj.get("shape_class"), "class task.shape_class")
    members = tuple(S.parse_signature(m, f"class task.members[{i}]") for i, m in enumerate(obj.get("members") or []))
    return SH.ShapeClass(cls.op, cls.group, cls.dims, cls.ranges, cls.example, members)


# --- actor side --------------------------------------------------------------------------------


def compile_in_actor(actor, obj: dict, attempts: int = 1) -> dict:
    """One class in a compile actor (see module doc); ``Outcome.to_dict()`` plus ``span``
    and ``actor`` (its ``info()``), as ``CompileActor.compile`` returns."""
    from aoti_farm.compile.faults import CompileInfraError
    from . import metrics as farm_metrics

    t0, w0 = time.perf_counter(), time.time()
    try:
        actor._setup()
        if isinstance(obj, dict) and "signature" in obj:   # a queued miss asking for a widened class
            from aoti_farm.compile.widen import compile_queued

            sig = S.parse_signature(obj["signature"])
            out = compile_queued(actor._cache, actor._compiler, actor._fp, sig, obj.get("widen"), owner=actor._owner,
                                 memory_budget=actor.memory_budget, lease_ttl=actor.lease_ttl,
                                 attempts=attempts).to_dict()
        else:
            cls = parse_job(obj)
            out = dynwarm.compile_class(actor._cache, cls, actor._compiler, actor._fp, actor.memory_budget,
                                        owner=actor._owner, lease_ttl=actor.lease_ttl)
    except Exception as e:  # noqa: BLE001 -- CompileInfraError and anything unexpected: retried
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        kind = "infrastructure" if isinstance(e, CompileInfraError) else type(e).__name__
        out = {"key": "", "status": "error",   # the scheduler keys results by its task "seconds": time.perf_counter() - t0,
               "worker": f"{socket.gethostname()}:{os.getpid()}", "error": f"{kind}: {msg}",
               "evidence": {}, "phases": {}}
    out["span"] = (w0, time.time())
    out["actor"] = actor.info()
    farm_metrics.record_compile(actor.device, out)
    return out


# --- driver side -------------------------------------------------------------------------------


class ClassWork:
    def __init__(self, cfg, cache, stream: TextIO | None = None, plan: Callable | None = None):
        """``plan``: :func:`aoti_farm.workers.warm.plan` (passed in: warm imports this module)."""
        self.cfg, self.cache, self._plan = cfg, cache, plan
        self.stream = stream or sys.stderr
        self.classes: dict[str, SH.ShapeClass] = {}   # class key -> class (of >= 2 shapes)
        self.tasks: list = []                         # scheduler Tasks still to run
        self.outcomes: dict[str, tuple[str, dict]] = {}   # class key -> (row status, outcome dict)
        self.fallback: list = []                      # member signatures compiled exactly
        self.fallback_done: dict = {}                 # key -> scheduler Result planned without a compile
        self._sched = self._progress = None

    # -- 1. planning
    def split(self, sigs: list) -> list:
        """The signatures left for the exact plan; class tasks (or cached classes) for the rest."""
        from aoti_farm.compile.compiler import AOTICompiler
        from aoti_farm.fingerprint import fingerprint
        from .placement import route
        from .scheduler import Task

        cls, _loose = SH.classes(sigs)
        todo = [c for c in cls if SH.distinct_shapes(c) >= 2]
        if not todo:
            return sigs
        members: set = set()
        cuda_here = None
        comp = AOTICompiler(self.cfg.inductor_options)   # for a cached class only: its hint, its serve range
        opts = comp.options()
        fps: dict = {}
        for c in todo:
            self.classes[c.key] = c
            members |= {m.key for m in c.members}
            kind = route(c.example)
            fp_id = None
            if c.device != "cpu" and cuda_here is None:
                cuda_here = torch_cuda()
            if c.device == "cpu" or cuda_here:   # a CUDA fingerprint only where there is a GPU
                dev = "cpu" if c.device == "cpu" else "cuda:0"
                if dev not in fps:
                    fps[dev] = fingerprint(dev, opts)
                fp_id = fps[dev].id
                if self.cache.has_entry(fp_id, c.key):
                    out = dynwarm.compile_class(self.cache, c, comp, fps[dev], self.cfg.memory_budget,
                                                owner="warm-dynamic")   # cached: the hint, the serve range
                    if out["status"] == "cached":
                        self._finish_class(c, out)
                        continue
            self.tasks.append(Task(ClassJob(c), kind, fp_id, method=METHOD))
        self.stream.write(f"dynamic: {len(todo)} shape classes ({sum(len(c.members) for c in todo)} signatures), "
                          f"{len(self.tasks)} to compile on the pool\n")
        return [s for s in sigs if s.key not in members]

    @property
    def n_tasks(self) -> dict:
        return {k: sum(t.kind == k for t in self.tasks) for k in ("cpu", "gpu")}

    # -- 2. on the pool
    def start(self, sched, progress) -> None:
        self._sched, self._progress = sched, progress
        for t in self.tasks:
            sched.add(t)

    def event(self, kind: str, data: dict) -> bool:
        """True when the event is a class task's (handled here, not by the progress display)."""
        key = data["result"].key if kind == "done" else data.get("key")
        c = self.classes.get(key) if key else None
        if c is None:
            return False
        if kind == "done":
            r = data["result"]
            out = {"key": r.key, "status": r.status, "seconds": r.seconds, "worker": r.worker, "error": r.error,
                   "evidence": r.evidence, "phases": r.phases, "attempts": r.attempts}
            self._finish_class(c, out)
        elif kind == "retry":
            self.stream.write(f"retry    {key[:16]} {c.describe()} ({data.get('reason')})\n")
        return True

    def _finish_class(self, c: SH.ShapeClass, out: dict) -> None:
        status = out["status"] if out["status"] in ("compiled", "cached") else "fallback"
        self.outcomes[c.key] = (status, out)
        row = dynwarm.class_row(c, status, out)
        self.stream.write(f"{status:8} {c.key[:16]} {c.describe()} "
                          f"(faster than eager: {dynwarm.range_text(row.get('serve_range'))}) {row['seconds']:.1f}s"
                          + (f" [{row['worker']}]" if row.get("worker") else "")
                          + (f": {row['error']}" if row.get("error") else "") + "\n")
        left = [m for m in c.members if m.key not in (dynwarm.covered(c, row) if status != "fallback" else set())]
        if left:
            self._exact(left)

    def _exact(self, sigs: list) -> None:
        """Members that no class kernel covers: planned like any signature, compiled exactly."""
        self.fallback += sigs
        p = self._plan(sigs, self.cache, self.cfg.inductor_options, self.cfg.memory_budget)
        for r in p.done:
            self.fallback_done[r.key] = r
        if self._progress is not None:
            self._progress.tally.total += len(sigs)
            for r in p.done:
                if r.status in ("cached", "failed"):
                    self._progress.tally.counts.inc(r.status)
        if p.todo:
            if self._sched is None:   # before the pool (a cached class): with the exact plan
                self.tasks += p.todo
            else:
                for t in p.todo:
                    self._sched.add(t)

    # -- 3. the report
    def rows(self) -> list[dict]:
        """One report row per class (and the summary line on the stream)."""
        if self.outcomes:
            self.stream.write(self.summary() + "\n")
        return [dynwarm.class_row(self.classes[k], st, out) for k, (st, out) in self.outcomes.items()]

    def summary(self) -> str:
        ok = [k for k, (st, _) in self.outcomes.items() if st != "fallback"]
        cov = set()
        for k in ok:
            cov |= dynwarm.covered(self.classes[k], dynwarm.class_row(self.classes[k], *self.outcomes[k]))
        return (f"dynamic: {len(ok)} shape-general kernels cover {len(cov)} signatures; "
                f"{len(self.outcomes) - len(ok)} classes fall back to exact kernels")


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


__all__ = ["ClassJob", "ClassWork", "METHOD", "WidenJob", "compile_in_actor", "parse_job", "queued_task"]
