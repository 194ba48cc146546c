"""`aoti-farm warm`: plan the work, then compile it on a Ray pool (`serve` is
:mod:`aoti_farm.workers.serve`).

warm
  1. :func:`load_signatures` reads every ``--model`` trace and dedupes by key.
  2. :func:`plan` fingerprints per device and drops what the cache already has
     (``Cache.list_keys``: one directory scan per namespace, not a stat per key) or has
     recorded as failing.  A CUDA signature is planned as "to do" unless this host has a
     GPU: its fingerprint is computed by the GPU actor that compiles it.
  3. Nothing left: done, without importing Ray.  Otherwise :func:`start_ray` (embedded
     ``ray.init()``, or ``--address``/``$RAY_ADDRESS``), one actor pool sized from
     ``ray.cluster_resources()`` (:func:`aoti_farm.workers.placement.pool_sizes`) and the
     :class:`~aoti_farm.workers.scheduler.Scheduler` (bounded in-flight, timeouts, retries,
     leases).  Exit 0 when every signature is in the cache, 1 when some failed, 2 on bad
     input (a :class:`UserError`, raised before anything is written).

serve
  Polls the miss queue (:mod:`aoti_farm.cache.queue`) of every fingerprint namespace its
  workers compile for and drains it with the same pool, until SIGTERM/SIGINT; then it
  abandons in-flight work (kills the actors, breaks their leases), shuts Ray down and
  exits 0.

Ray is imported only here and in ``aoti_farm.workers``, and only when there is work.
An embedded Ray starts without its dashboard (nobody could reach it: it lives for one
run); ``AOTI_FARM_DEV=ray_dashboard=1`` starts it (when Ray's dashboard dependencies are
installed).  ``warm`` starts an embedded Ray *while* planning when some signature is in no
namespace of the cache (so Ray is surely needed), and builds the host's per-host compile
products meanwhile (see :func:`start_host_prep`).

Warm-up measurement (2-core host, torch 2.13 CPU, one process, /tmp/wu.py-style): the
first AOTInductor compile in a process takes ~9-10 s, later ones ~5.5 s.  With warm-up
"none" the actor starts in 4.2 s and its first compile takes 10.0 s; with "light"
(imports, fingerprint, a torch.export of a trivial op) it starts in 5.4 s and its first
compile takes 8.9 s: the same 14.3 s in all, but the 1.1 s moves into start-up, where it
overlaps with the other actors starting, so "light" is the default.  "compile" would pay
a whole ~9 s trivial compile to save ~3.5 s, so it only suits long-lived `serve` pools.
"""


from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

from aoti_farm.config import FarmConfig
from .raysetup import make_scheduler, start_ray, stop_ray


def open_farm_cache(cfg: FarmConfig, signing_key: bytes | None):
    """The farm's cache, created if needed; ``signing_key``: the resolved key's bytes
    (``aoti_farm.config.signing_key``), None for no signing."""
    from aoti_farm.cache.opening import open_cache

    return open_cache(cfg.cache_dir, create=True, write=True, signing_key=signing_key)


# --- planning -------------------------------------------------------------------------------


def load_signatures(paths: list[str]) -> list:
    """Every signature of every trace, deduped by key, in first-seen order."""
    from aoti_farm.trace import load_trace

    seen: dict[str, object] = {}
    for p in paths:
        for e in load_trace(p).entries:
            seen.setdefault(e.sig.key, e.sig)
    return list(seen.values())


@dataclass
class Plan:
    todo: list = field(default_factory=list)        # [scheduler.Task]
    done: list = field(default_factory=list)        # [scheduler.Result] already cached or recorded failing
    fingerprints: dict = field(default_factory=dict)  # device -> Fingerprint (computed locally)

    @property
    def total(self) -> int:
        return len(self.todo) + len(self.done)


def plan(sigs: list, cache, inductor_options: dict | None = None, memory_budget: int | None = None) -> Plan:
    """Split ``sigs`` into work and what the cache already answers (see module doc).
    Work whose example inputs alone exceed ``memory_budget`` (None: the host default) is
    refused here, ``failed`` with the reason (:mod:`aoti_farm.budget`; no failure record);
    the compile path checks the whole estimate before compiling."""
    from aoti_farm import budget
    from aoti_farm.fingerprint import fingerprint
    from .placement import route
    from .scheduler import Result, Task

    out = Plan()
    cuda_here = None
    keys: dict[str, tuple[set, set]] = {}
    for sig in sigs:
        kind = route(sig)
        dev = "cpu" if kind == "cpu" else "cuda:0"
        over = budget.refusal(sig, memory_budget, outputs=False)   # inputs alone: no meta run here
        if over is not None:
            out.done.append(Result(sig.key, sig.op, "failed", error=over[0], evidence=over[1]))
            continue
        if dev not in out.fingerprints:
            if dev != "cpu":
                if cuda_here is None:
                    import torch

                    cuda_here = torch.cuda.is_available()
                if not cuda_here:
                    out.todo.append(Task(sig, kind, None))
                    continue
            fp = out.fingerprints[dev] = fingerprint(dev, inductor_options)
            keys[dev] = (cache.list_keys(fp.id), cache.failed_keys(fp.id))
        fp = out.fingerprints[dev]
        have, failed = keys[dev]
        if sig.key in have:
            out.done.append(Result(sig.key, sig.op, "cached", fp_id=fp.id))
        elif sig.key in failed and (rec := cache.failure(fp.id, sig.key)) is not None:   # a bad record: None
            out.done.append(Result(sig.key, sig.op, "failed", attempts=int(rec.get("attempts") or 0),
                                   error=f"recorded failure: {rec.get('reason')} (clear it with "
                                         f"`aoti-farm cache` to retry)", evidence=rec.get("evidence") or {},
                                   fp_id=fp.id))
        else:
            out.todo.append(Task(sig, kind, fp.id))
    return out


def surely_work(sigs: list, cache, memory_budget: int | None = None) -> dict[str, int]:
    """Per pool kind, how many signatures have neither an entry nor a failure record
    under *any* fingerprint namespace of ``cache`` (one directory scan per namespace, no
    fingerprint needed) and fit the memory budget (inputs alone, as :func:`plan`):
    ``warm`` must compile at least these, whatever this host's fingerprint is."""
    from aoti_farm import budget
    from .placement import route

    known: set = set()
    for fp_id in cache.fingerprint_ids():
        known |= cache.list_keys(fp_id)
        known |= cache.failed_keys(fp_id)
    out = {"cpu": 0, "gpu": 0}
    for s in sigs:
        if s.key not in known and budget.refusal(s, memory_budget, outputs=False) is None:
            out[route(s)] += 1
    return out


#: Below this many cores the driver leaves the per-host products to the actors' first
#: compiles: start-up is CPU-bound there, and a compile in the driver (its own imports,
#: a trivial kernel) would take the CPU from the actors' imports (2-core VM: the first
#: actor's compile builds them while the second waits on their locks, at no extra cost).
PREP_MIN_CORES = 4


def start_host_prep(cfg: FarmConfig, n_cpu: int, timeline: dict,
                    compiler_factory: Callable | None) -> threading.Thread | None:
    """Build this host's per-host compile products (:mod:`aoti_farm.compile.hostprep`: ISA
    probe, precompiled headers, the split build's common object, the loader probe) in a
    child process watched by a thread of the driver, while Ray and the actors start, so that no actor's first
    compile builds them and the others queue behind it.  Only for an embedded Ray (the
    actors run on this host) with at least two CPU signatures to compile, and the real
    compiler; nothing waits for it (compiles wait on each product's own lock; on a fresh
    host its own ISA probe waits on the lock of :func:`isa_probe_in_child`'s)."""
    if (n_cpu < 2 or compiler_factory is not None or cfg.address
            or (os.cpu_count() or 1) < PREP_MIN_CORES):
        return None

    def run() -> None:
        from aoti_farm.compile import hostprep

        t0 = time.time()
        out = hostprep.prepare_in_child(cfg.inductor_options)   # a child: not under this interpreter's lock
        timeline["host_prep"] = {"span": [t0, time.time()], **{k: out.get(k) for k in ("status", "build", "error")
                                                                if out.get(k) is not None}}

    th = threading.Thread(target=run, name="aoti-farm-hostprep", daemon=True)
    th.start()
    return th


def start_native_build(cfg: FarmConfig, n: int, timeline: dict, compiler_factory: Callable | None):
    """The hit path's extension, built from now where it is not built yet
    (:func:`aoti_farm.compile.hostprep.start_native_build`: every compile's speed
    measurement needs it, and the first one would build it while the others wait): for an
    embedded Ray (the actors run on this host) with ``n`` >= 1 signatures to compile, and
    the real compiler.  ``AOTI_FARM_DEV=native_early=0``: None (the first compile builds it)."""
    from aoti_farm import config

    if n < 1 or compiler_factory is not None or cfg.address or config.dev("native_early") == "0":
        return None
    from aoti_farm.compile import hostprep

    proc = hostprep.start_native_build()
    if proc is not None:
        timeline["native_build_started"] = time.time()
    return proc


def isa_probe_in_child(n_cpu: int, compiler_factory: Callable | None):
    """On a fresh many-core host, the planner's ISA probe in a child
    (:class:`aoti_farm.compile.hostprep.IsaChild`, started here, awaited by
    :func:`await_isa_probe`) while this process starts Ray: probing here would import
    Inductor into the driver and hold its interpreter lock while ``import ray`` and
    ``ray.init`` need it.  None where it does not apply (no CPU signature, fewer than
    :data:`PREP_MIN_CORES` cores, a test double compiler, a known host: its memo is
    found without importing torch, :func:`aoti_farm.compile.hostprep.isa_memo_known`); a failed
    child: :func:`plan` probes here as before."""
    if n_cpu < 1 or compiler_factory is not None or (os.cpu_count() or 1) < PREP_MIN_CORES:
        return None
    from aoti_farm.compile import hostprep

    return None if hostprep.isa_memo_known() else hostprep.IsaChild()


def start_isa_probe(compiler_factory: Callable | None):
    """:func:`isa_probe_in_child` at ``warm``'s start, before the driver reads the traces:
    reading them imports torch, and the probe (Inductor's check builds) is the longest
    step before the plan on a fresh host, so it should not wait for that import.  The
    job's CPU signatures are not known yet: it starts as if there were one (a job without
    one does not wait for it).  ``AOTI_FARM_DEV=fresh_isa=0``: None, and
    :func:`isa_then_plan` starts it after the traces are read."""
    from aoti_farm import config

    return None if config.dev("fresh_isa") == "0" else isa_probe_in_child(1, compiler_factory)


def await_isa_probe(isa, sigs: list, timeline: dict) -> None:
    """Wait for the probe's child (None: nothing) and note it in the timeline, where the
    plan needs the CPU's fingerprint (a CPU signature in ``sigs``).  A job without one
    does not wait for a probe started before it could know: the child ends on its own
    (``warm`` stops it if the command ends first)."""
    from .placement import CPU, route

    if isa is None or not any(route(s) == CPU for s in sigs):
        return
    out = isa.result()
    done = out.get("done_at") if isinstance(out.get("done_at"), (int, float)) else isa.end   # the child's own end
    timeline["isa_child"] = {"span": [isa.t0, done or time.time()],
                             **{k: out.get(k) for k in ("status", "import_s", "probe_s", "steps", "error") if k in out}}


def embedded_ray_args(cfg: FarmConfig, sigs: list, compiler_factory: Callable | None) -> dict:
    """:func:`start_ray`'s sizing of an embedded Ray for ``sigs`` (all of the job's
    signatures, or what the plan left): as many CPUs as the pool can use
    (:func:`aoti_farm.workers.placement.embedded_cpus`), and, when Ray is so sized and the
    actors run the real compiler with a warm-up, Ray's prestarted workers import the
    actors' modules (:mod:`aoti_farm.workers.actor_preload`).  Nothing for a cluster."""
    if cfg.address:
        return {}
    from .placement import CPU, route

    n_cpu = sum(route(s) == CPU for s in sigs)
    return embedded_ray_args_for(cfg, n_cpu, len(sigs) - n_cpu, compiler_factory)


def embedded_ray_args_for(cfg: FarmConfig, n_cpu: int, n_gpu: int, compiler_factory: Callable | None) -> dict:
    """:func:`embedded_ray_args` from counts of CPU and GPU signatures (upper bounds)."""
    if cfg.address:
        return {}
    from .placement import embedded_cpus

    cores = _host_cpus()
    n = embedded_cpus(cores, cpu_workers=cfg.cpu_workers, n_cpu_sigs=n_cpu, n_gpu_sigs=n_gpu)
    # below PREP_MIN_CORES start-up is CPU-bound: the workers' imports would only take the
    # CPU from the planner's ISA probe and Ray's own start (the 2-core VM keeps its path)
    real = n is not None and compiler_factory is None and cfg.warmup != "none"
    preload = real and cores >= PREP_MIN_CORES
    # only CPU actors: they are forked from one process that imported torch
    # (workers/forkserver.py); "1" also where cores are few (the tests' 2-core VM)
    from . import forkclient

    mode = forkclient.mode()
    fork = real and n_gpu == 0 and n_cpu > 0 and (mode == "1" or (mode == "auto" and preload))
    # no GPU signature, so no GPU actor: the workers see no GPU (raysetup.start_ray)
    return {"num_cpus": n, "preload": preload and not fork, "hide_gpus": n_gpu == 0, "fork_server": fork}


def _host_cpus() -> int:
    """The CPUs Ray would advertise here by default (it honours cgroup limits)."""
    try:
        from ray._private.utils import get_num_cpus   # Ray internal (2.60.0); else os.cpu_count()

        return max(1, int(get_num_cpus()))
    except Exception:  # noqa: BLE001 -- a Ray without it
        return os.cpu_count() or 1


def isa_then_plan(cfg: FarmConfig, sigs: list, cache, sure: dict, timeline: dict,
                  compiler_factory: Callable | None, isa=None) -> Plan:
    """:func:`plan`, after a many-core host's ISA probe in a child: ``isa``, the one
    :func:`start_isa_probe` started, else one started now (:func:`isa_probe_in_child`)."""
    if isa is None:
        isa = isa_probe_in_child(sure["cpu"], compiler_factory)
    await_isa_probe(isa, sigs, timeline)
    return plan(sigs, cache, cfg.inductor_options, cfg.memory_budget)


def _plan_while_starting(cfg: FarmConfig, sigs: list, cache, sure: dict, timeline: dict, event: Callable,
                         compiler_factory: Callable | None, isa=None):
    """(plan, ray, started, scheduler, host-prep thread): :func:`plan` runs in a thread
    while this one starts Ray and an actor pool sized for the ``sure`` signatures (their
    warm-up starts at once); the host preparation starts as soon as the plan is known."""
    box: dict = {}
    planned = threading.Event()
    # the signatures in no namespace are compiled whatever the plan says: prepare the host
    # for them at once (its imports overlap a fresh host's ISA probe in the planner)
    box["prep"] = start_host_prep(cfg, sure["cpu"], timeline, compiler_factory)
    start_native_build(cfg, sure["cpu"] + sure["gpu"], timeline, compiler_factory)

    def run() -> None:
        try:
            box["plan"] = isa_then_plan(cfg, sigs, cache, sure, timeline, compiler_factory, isa)
            if box["prep"] is None:
                box["prep"] = start_host_prep(cfg, sum(t.kind == "cpu" for t in box["plan"].todo), timeline,
                                              compiler_factory)
            if "native_build_started" not in timeline:
                start_native_build(cfg, len(box["plan"].todo), timeline, compiler_factory)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller's thread
            box["error"] = e
        finally:
            planned.set()

    th = threading.Thread(target=run, name="aoti-farm-plan", daemon=True)
    th.start()
    ray = sched = None
    started = False
    try:
        import ray as _ray  # noqa: F401 -- timed apart from ray.init

        timeline["ray_imported"] = time.time()
        ray, started = start_ray(cfg, **embedded_ray_args(cfg, sigs, compiler_factory))
        timeline["ray_started"] = time.time()
        if not planned.is_set():
            from .placement import pool_sizes

            sizes = pool_sizes(ray.cluster_resources(), cpu_workers=cfg.cpu_workers, gpu_workers=cfg.gpu_workers,
                               gpus_per_worker=cfg.gpus_per_worker, n_cpu_tasks=sure["cpu"],
                               n_gpu_tasks=sure["gpu"])
            sched = make_scheduler(ray, cfg, cache, sizes, compiler_factory=compiler_factory, on_event=event)
            timeline["actors_requested"] = time.time()
    finally:
        planned.wait()
        if "error" in box or ray is None:
            if sched is not None:
                sched.shutdown()
            if started:
                stop_ray(ray)
    if "error" in box:
        raise box["error"]
    return box["plan"], ray, started, sched, box.get("prep")


# --- warm -----------------------------------------------------------------------------------


def warm(cfg: FarmConfig, models: list[str], *, report: str | None = None, stream: TextIO | None = None,
         compiler_factory: Callable | None = None, on_event: Callable | None = None,
         counters_out: dict | None = None, signing_key: bytes | None = None) -> int:
    """Compile every signature of ``models`` into the cache; exit code 0/1 (UserError: 2).
    ``signing_key``: the resolved key's bytes (None: no signing)."""
    from aoti_farm.report.progress import Progress, command_start_time, write_report

    # wall-clock marks for the report (where a run's time goes: see "timeline")
    timeline: dict = {"process_start": command_start_time(), "warm_start": time.time(), "workers": []}
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    from aoti_farm.startup import notices

    notices.drop(notices.TORCH_NOTICES)   # before anything here imports torch
    from aoti_farm.startup import pycache

    timeline["pycache"] = pycache.apply(here=True)   # before any child starts (aoti_farm/startup/pycache.py)
    from aoti_farm.startup import pyprecompile

    # a fresh bytecode cache: compile what every process here will import, in parallel, now
    precompiled = pyprecompile.start(timeline["pycache"]) if compiler_factory is None else None
    # a many-core host's ISA probe starts now, in a child: reading the traces imports torch
    isa = start_isa_probe(compiler_factory)
    try:
        sigs = load_signatures(models)
        cache = open_farm_cache(cfg, signing_key)
        classes = None
        if getattr(cfg, "dynamic", "off") == "auto":   # class compiles on the same pool (workers/classtasks.py)
            from .classtasks import ClassWork

            classes = ClassWork(cfg, cache, stream, plan)
            sigs = classes.split(sigs)   # the members of classes to compile leave the exact plan
    except BaseException:
        if isa is not None:
            isa.cancel()   # the command fails before its plan: the probe's answer is not wanted
        if precompiled is not None:
            precompiled.cancel()
        raise
    timeline["loaded"] = time.time()
    progress = Progress(len(sigs), stream)   # p.total: every signature, deduped by key

    def event(kind: str, data: dict) -> None:
        if kind == "worker_ready":
            i = data.get("info") or {}
            timeline["workers"].append({"pid": i.get("pid"), "created_at": i.get("created_at"),
                                        "warmup_span": i.get("warmup_span"), "ready_seen": time.time(),
                                        "phases": i.get("warmup_phases"), "host_steps": i.get("host_steps"),
                                        "cuda_visible_devices": i.get("cuda_visible_devices"),
                                        "omp_wait_policy": i.get("omp_wait_policy"),
                                        "fork": i.get("fork"), "proxy_imported_torch": i.get("proxy_imported_torch")})
        elif kind == "dispatch" and "first_dispatch" not in timeline:
            timeline["first_dispatch"] = time.time()
        if classes is None or not classes.event(kind, data):   # a class task's events: classtasks.py
            progress.event(kind, data)
        if on_event:
            on_event(kind, data)

    sched = prep = ray = None
    started = False
    counters = None
    results: dict = {}
    try:
        if sum((sure := surely_work(sigs, cache, cfg.memory_budget)).values()):
            # Some signatures are in no namespace of the cache at all, so Ray is needed
            # whatever this host's fingerprint is: start Ray and the actors now, and plan
            # meanwhile (on a fresh host planning probes the CPU's vector ISA, ~10 s of
            # g++; Ray's start is mostly waiting, and the actors' imports overlap both).
            p, ray, started, sched, prep = _plan_while_starting(cfg, sigs, cache, sure, timeline, event,
                                                                compiler_factory, isa)
        else:
            await_isa_probe(isa, sigs, timeline)
            p = plan(sigs, cache, cfg.inductor_options, cfg.memory_budget)
            prep = start_host_prep(cfg, sum(t.kind == "cpu" for t in p.todo), timeline, compiler_factory)
            start_native_build(cfg, len(p.todo) + len(classes.tasks if classes else ()), timeline, compiler_factory)
        timeline["planned"] = time.time()
        results = {r.key: r for r in p.done}
        for r in p.done:
            if r.status in ("cached", "failed"):
                progress.tally.counts.inc(r.status)
        if p.todo or (classes is not None and classes.tasks):
            if ray is None:
                ray, started = start_ray(cfg, **embedded_ray_args(cfg, [t.sig for t in p.todo + (classes.tasks if classes
                                                                                        else [])], compiler_factory))
                timeline["ray_started"] = time.time()
            from .placement import pool_sizes

            sizes = pool_sizes(ray.cluster_resources(), cpu_workers=cfg.cpu_workers, gpu_workers=cfg.gpu_workers,
                               gpus_per_worker=cfg.gpus_per_worker,
                               n_cpu_tasks=sum(t.kind == "cpu" for t in p.todo) + (classes.n_tasks["cpu"] if classes else 0),
                               n_gpu_tasks=sum(t.kind == "gpu" for t in p.todo) + (classes.n_tasks["gpu"] if classes else 0))
            if sched is None:
                sched = make_scheduler(ray, cfg, cache, sizes, compiler_factory=compiler_factory, on_event=event)
                timeline["actors_requested"] = time.time()
            else:
                sched.ensure_workers(sizes)   # the early pool was sized for the sure part only
            if classes is not None:
                classes.start(sched, progress)   # first: the long compiles; a fallback adds its members
            for t in p.todo:
                sched.add(t)
            sched.run()
            results.update(sched.results)
            counters = sched.stats()
    finally:
        if isa is not None:
            isa.cancel()   # done when the plan awaited it; else (no CPU signature, a plan that raised) stopped
        if sched is not None:
            timeline["scheduler_done"] = time.time()
            sched.shutdown()
        if started:
            stop_ray(ray)
            timeline["ray_shutdown"] = time.time()
        if prep is not None:
            prep.join(timeout=120)   # one compile, normally long done; never leave it half-way
        if precompiled is not None:
            timeline["precompile"] = precompiled.result()   # short-lived children, long done
    from aoti_farm.signature import describe

    rows = []
    if classes is not None:
        results.update(classes.fallback_done)
        sigs = sigs + classes.fallback
    for s in sigs:
        r = results[s.key].to_dict()
        r["description"] = describe(s)
        r["device"] = s.device
        rows.append(r)
    rows += classes.rows() if classes is not None else []
    from aoti_farm.report.progress import attach_speed

    attach_speed(rows, cache, cfg.inductor_options)   # each kernel's measured speed-up
    mark_refusals(rows, cache)
    progress.finish(rows)
    from aoti_farm.report.progress import startup_line

    line = startup_line(timeline)
    if line:
        progress._log(line)
    if counters_out is not None and counters is not None:
        counters_out.update(counters)
    if report:
        timeline["end"] = time.time()
        write_report(report, rows, {"cache_dir": str(cache.root), "models": list(models),
                                    "pool": counters, "timeline": timeline})
    return 1 if any(r["status"] == "failed" and not r.get("refused") for r in rows) else 0


def mark_refusals(rows: list[dict], cache) -> None:
    """Set ``refused`` on each failed row that verification refused and that the cache
    records: the kernel was built and is not eager's (or cannot be checked as serving
    needs), a final, deterministic outcome after which eager serves the signature
    (:data:`aoti_farm.compile.verify.VERIFICATION_REFUSALS`).  Such a row does not fail
    ``warm``.  Everything else does: an unrecorded failure (timeouts, lost workers, the
    memory budget), a signature eager rejects, an Inductor error, a bug of aoti-farm."""
    from aoti_farm.compile.verify import is_verification_refusal

    for r in rows:
        if r.get("status") != "failed" or (r.get("evidence") or {}).get("bug") or not r.get("fp_id"):
            continue
        try:
            rec = cache.failure(r["fp_id"], r["key"])
        except Exception:   # an unreadable record: not known to be a refusal
            rec = None
        r["refused"] = rec is not None and is_verification_refusal(rec.get("reason"))
