"""`aoti-farm warm` and `aoti-farm serve`: plan the work, then compile it on a Ray pool.

warm
  1. :func:`load_signatures` reads every ``--model`` trace and dedupes by key.
  2. :func:`plan` fingerprints per device and drops what the cache already has
     (``Cache.list_keys``: one directory scan per namespace, not a stat per key) or has
     recorded as failing.  A CUDA signature is planned as "to do" unless this host has a
     GPU: its fingerprint is computed by the GPU actor that compiles it.
  3. Nothing left: done, without importing Ray.  Otherwise :func:`start_ray` (embedded
     ``ray.init()``, or ``--address``/``$RAY_ADDRESS``), one actor pool sized from
     ``ray.cluster_resources()`` (:func:`aoti_farm.workers.pool.pool_sizes`) and the
     :class:`~aoti_farm.workers.pool.Scheduler` (bounded in-flight, timeouts, retries,
     leases).  Exit 0 when every signature is in the cache, 1 when some failed, 2 on bad
     input (a :class:`UserError`, raised before anything is written).

serve
  Polls the miss queue (:mod:`aoti_farm.missq`) of every fingerprint namespace its
  workers compile for and drains it with the same pool, until SIGTERM/SIGINT; then it
  abandons in-flight work (kills the actors, breaks their leases), shuts Ray down and
  exits 0.

Ray is imported only here and in ``aoti_farm.workers``, and only when there is work.
An embedded Ray starts without its dashboard (nobody could reach it: it lives for one
run); ``AOTI_FARM_RAY_DASHBOARD=1`` starts it (when Ray's dashboard dependencies are
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

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, TextIO

from aoti_farm.config import FarmConfig, resolve
from aoti_farm.errors import FarmError, UserError


# --- command line ---------------------------------------------------------------------------


def _pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", default=None, help="cache directory (default: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm)")
    p.add_argument("--config", default=None, help="TOML config file, table [farm] (default: $AOTI_FARM_CONFIG); "
                   "see configs/farm.toml")
    p.add_argument("--address", default=None, help="Ray cluster: 'auto' or host:port (default: $RAY_ADDRESS, "
                   "else an embedded local Ray)")
    p.add_argument("--cpu-workers", type=int, default=None, metavar="N", help="CPU compile actors (default: cluster CPUs)")
    p.add_argument("--gpu-workers", type=int, default=None, metavar="N",
                   help="GPU compile actors (default: cluster GPUs / --gpus-per-worker)")
    p.add_argument("--gpus-per-worker", type=float, default=None, metavar="F",
                   help="fraction of a GPU per GPU actor (default 0.25: four actors share a GPU)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="per-signature compile timeout (default 600)")
    p.add_argument("--retries", type=int, default=None, metavar="K",
                   help="retries after infrastructure failures (default 2); compile errors are never retried")
    p.add_argument("--max-in-flight", type=int, default=None, metavar="N", help="compile calls in flight (default 2 x workers)")
    p.add_argument("--lease-ttl", type=float, default=None, metavar="S", help="lease time-to-live (default 30)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="refuse signatures whose compile would need more memory than this, per compile (6G, 512M; "
                        "default: $AOTI_FARM_MEMORY_BUDGET, else a quarter of the host's memory)")


def add_warm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", required=True, metavar="TRACE",
                   help="trace.json to warm (repeatable; duplicates across traces are compiled once)")
    _pool_args(p)
    p.add_argument("--report", default=None, metavar="FILE",
                   help="write a JSON report: per signature key, op, status, seconds, worker, attempts, error")
    p.add_argument("--dynamic", default=None, choices=("auto", "off"),
                   help="auto: one shape-general kernel per shape class with >= 2 distinct shapes, exact kernels "
                        "for the rest (default: $AOTI_FARM_DYNAMIC, [farm] dynamic, else off)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    _pool_args(p)
    p.add_argument("--poll-interval", type=float, default=None, metavar="S", help="miss-queue polling (default 1)")
    p.add_argument("--metrics-port", default=None, metavar="PORT",
                   help="serve the farm's counters in the Prometheus format on PORT (the first free of "
                        "PORT..PORT+63; 0: any free port; default $AOTI_FARM_METRICS_PORT, else none)")


def config_from(ns: argparse.Namespace) -> FarmConfig:
    names = ("cache_dir", "address", "cpu_workers", "gpu_workers", "gpus_per_worker", "timeout", "retries",
             "max_in_flight", "lease_ttl", "poll_interval", "memory_budget", "dynamic")
    cfg = resolve(FarmConfig, cli={n: getattr(ns, n, None) for n in names}, config_path=getattr(ns, "config", None))
    if cfg.cpu_workers == 0 and cfg.gpu_workers == 0:
        raise UserError("--cpu-workers 0 and --gpu-workers 0: no workers; allow at least one")
    return cfg


def warm_command(ns: argparse.Namespace) -> int:
    cfg = config_from(ns)
    if ns.report:
        _check_writable(ns.report)
    return warm(cfg, ns.model, report=ns.report)


def serve_command(ns: argparse.Namespace) -> int:
    from aoti_farm.runtime.metrics import port_setting

    port = port_setting(ns.metrics_port) if ns.metrics_port is not None else port_setting(None)
    return serve(config_from(ns), install_signals=True, metrics_port=port)


def _check_writable(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise UserError(f"--report {path}: directory {d} does not exist; create it or pass another path")
    if os.path.isdir(path):
        raise UserError(f"--report {path}: is a directory; pass a file path")
    if not os.access(d, os.W_OK):
        raise UserError(f"--report {path}: directory {d} is not writable; pass another path")


def _signing_key(cfg: FarmConfig) -> bytes | None:
    from aoti_farm.cache import load_signing_key

    # fails closed: an empty or unreadable key is a UserError, never "no signing"
    return load_signing_key(path=cfg.signing_key_file, source="signing_key_file")


def _open_cache(cfg: FarmConfig):
    from aoti_farm.cache_cmds import open_cache

    key = _signing_key(cfg)
    cache = open_cache(cfg.cache_dir, create=True, write=True, signing_key=key)
    cache.signing_key = key
    return cache


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
    todo: list = field(default_factory=list)        # [pool.Task]
    done: list = field(default_factory=list)        # [pool.Result] already cached or recorded failing
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
    from aoti_farm.workers.pool import Result, Task, route

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
    from aoti_farm.workers.pool import route

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
    """Build this host's per-host compile products (:mod:`aoti_farm.hostprep`: ISA
    probe, precompiled headers, the split build's common object, the loader probe) in a
    thread of the driver, while Ray and the actors start, so that no actor's first
    compile builds them and the others queue behind it.  Only for an embedded Ray (the
    actors run on this host) with at least two CPU signatures to compile, and the real
    compiler; nothing waits for it (compiles wait on each product's own lock)."""
    if (n_cpu < 2 or compiler_factory is not None or (cfg.address or os.environ.get("RAY_ADDRESS"))
            or (os.cpu_count() or 1) < PREP_MIN_CORES):
        return None

    def run() -> None:
        from aoti_farm import hostprep

        t0 = time.time()
        out = hostprep.prepare(cfg.inductor_options)
        timeline["host_prep"] = {"span": [t0, time.time()], **{k: out.get(k) for k in ("status", "build", "error")
                                                                if out.get(k) is not None}}

    th = threading.Thread(target=run, name="aoti-farm-hostprep", daemon=True)
    th.start()
    return th


def _plan_while_starting(cfg: FarmConfig, sigs: list, cache, sure: dict, timeline: dict, event: Callable,
                         compiler_factory: Callable | None):
    """(plan, ray, started, scheduler, host-prep thread): :func:`plan` runs in a thread
    while this one starts Ray and an actor pool sized for the ``sure`` signatures (their
    warm-up starts at once); the host preparation starts as soon as the plan is known."""
    box: dict = {}
    planned = threading.Event()
    # the signatures in no namespace are compiled whatever the plan says: prepare the host
    # for them at once (its imports overlap a fresh host's ISA probe in the planner)
    box["prep"] = start_host_prep(cfg, sure["cpu"], timeline, compiler_factory)

    def run() -> None:
        try:
            box["plan"] = plan(sigs, cache, cfg.inductor_options, cfg.memory_budget)
            if box["prep"] is None:
                box["prep"] = start_host_prep(cfg, sum(t.kind == "cpu" for t in box["plan"].todo), timeline,
                                              compiler_factory)
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
        ray, started = start_ray(cfg)
        timeline["ray_started"] = time.time()
        if not planned.is_set():
            from aoti_farm.workers.pool import pool_sizes

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


# --- Ray ------------------------------------------------------------------------------------


def start_ray(cfg: FarmConfig):
    """(ray, started_here).  Reuses an already initialised Ray (tests, notebooks)."""
    import logging

    import ray

    if ray.is_initialized():
        return ray, False
    address = cfg.address or os.environ.get("RAY_ADDRESS") or None
    # "local", not None: ray.init(address=None) would join any cluster `ray start` left in
    # /tmp/ray/ray_current_cluster on this host instead of starting the embedded one.
    kw: dict = {"address": address or "local", "logging_level": logging.WARNING}
    if address is None and os.environ.get("AOTI_FARM_RAY_DASHBOARD") != "1":
        # the embedded Ray lives for one run and its address is printed nowhere
        kw["include_dashboard"] = False
    global _EMBEDDED_ENV
    if address is None:
        quiet_embedded_ray()
        # The embedded Ray's workers inherit this environment: give it the actors'
        # variables now, so the actors need no runtime_env and take the workers Ray
        # prestarts (pool.actor_options).  Not LD_PRELOAD: Ray's own binaries get none.
        from aoti_farm.workers.pool import worker_env

        os.environ.update({k: v for k, v in worker_env().items() if k != "LD_PRELOAD"})
    try:
        ray.init(**kw)
    except ConnectionError as e:
        raise UserError(f"--address {address}: no Ray cluster there ({' '.join(str(e).split())[:160]}); "
                        f"start one with `ray start --head` or leave --address/RAY_ADDRESS unset") from None
    _EMBEDDED_ENV = dict(os.environ) if address is None else None
    return ray, True


#: The environment an embedded Ray started by :func:`start_ray` gave its workers (None:
#: no embedded Ray, or a cluster whose workers' environment this process does not know).
_EMBEDDED_ENV: dict | None = None


#: Ray's notices, by logger, that a user of the embedded one-run Ray cannot act on: it
#: turns token authentication on for a new local cluster and says so at WARNING level on
#: every run.  Only these exact messages are dropped; every other warning still shows.
EMBEDDED_RAY_NOTICES = {
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled for this Ray cluster",),
}


class _DropNotices:
    def __init__(self, prefixes: tuple):
        self.prefixes = prefixes

    def filter(self, record) -> bool:
        try:
            return not str(record.getMessage()).startswith(self.prefixes)
        except Exception:  # noqa: BLE001 -- a record that cannot format: keep it
            return True


def quiet_embedded_ray() -> None:
    """Drop :data:`EMBEDDED_RAY_NOTICES` (once per process)."""
    import logging

    for name, prefixes in EMBEDDED_RAY_NOTICES.items():
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropNotices) for f in lg.filters):
            lg.addFilter(_DropNotices(prefixes))


def stop_ray(ray) -> None:
    """``ray.shutdown()`` of a Ray this process started.  Ray stops the node's processes
    one by one, each with a grace period, and its autoscaler monitor only exits on its next
    1 s tick; on the embedded one-node Ray the monitor has nothing to save, so it is killed
    first (1.4 s -> 0.35 s here).  A driver of a cluster (--address) only disconnects."""
    try:
        node = ray._private.worker._global_node
        if node is not None and node.head:
            for info in node.all_processes.get("monitor", []):
                if info.process is not None and info.process.poll() is None:
                    info.process.kill()
    except Exception:  # noqa: BLE001 -- a Ray without these internals: a plain shutdown
        pass
    ray.shutdown()
    global _EMBEDDED_ENV
    _EMBEDDED_ENV = None


def make_scheduler(ray, cfg: FarmConfig, cache, sizes: dict, *, compiler_factory: Callable | None = None,
                   on_event: Callable | None = None):
    from aoti_farm.workers.compile_actor import CompileActor
    from aoti_farm.workers.pool import Scheduler, actor_options, worker_env

    remote_cls = ray.remote(CompileActor)
    # the actors check the memory budget before each compile (job.compile_and_publish);
    # spelled as in this environment when it says the same, so an embedded Ray's actors,
    # which inherit it, need no runtime_env for it
    env = None
    if cfg.memory_budget:
        from aoti_farm import budget

        same = budget.current()[1] == budget.ENV and budget.current()[0] == cfg.memory_budget
        env = {**worker_env(), budget.ENV: os.environ[budget.ENV] if same else str(cfg.memory_budget)}

    def make_actor(kind: str):
        return remote_cls.options(**actor_options(kind, cfg.gpus_per_worker, env, inherited=_EMBEDDED_ENV)).remote(
            str(cache.root), kind, cfg.inductor_options, cfg.lease_ttl, cache.signing_key, compiler_factory,
            cfg.warmup)

    return Scheduler(ray, cache, make_actor, sizes, timeout=cfg.timeout, retries=cfg.retries,
                     lease_ttl=cfg.lease_ttl, max_in_flight=cfg.max_in_flight, on_event=on_event)


# --- warm -----------------------------------------------------------------------------------


def warm(cfg: FarmConfig, models: list[str], *, report: str | None = None, stream: TextIO | None = None,
         compiler_factory: Callable | None = None, on_event: Callable | None = None,
         counters_out: dict | None = None) -> int:
    """Compile every signature of ``models`` into the cache; exit code 0/1 (UserError: 2)."""
    from aoti_farm.progress import Progress, process_start_time, write_report
    from aoti_farm.signature import describe

    # wall-clock marks for the report (where a run's time goes: see "timeline")
    timeline: dict = {"process_start": process_start_time(), "warm_start": time.time(), "workers": []}
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    sigs = load_signatures(models)
    cache = _open_cache(cfg)
    class_rows: list = []
    if getattr(cfg, "dynamic", "off") == "auto":   # shape-general kernels first (aoti_farm/dynwarm.py)
        from aoti_farm.dynwarm import warm_classes

        sigs, class_rows = warm_classes(cfg, sigs, cache, stream)
    timeline["loaded"] = time.time()
    progress = Progress(len(sigs), stream)   # p.total: every signature, deduped by key

    def event(kind: str, data: dict) -> None:
        if kind == "worker_ready":
            i = data.get("info") or {}
            timeline["workers"].append({"pid": i.get("pid"), "created_at": i.get("created_at"),
                                        "warmup_span": i.get("warmup_span"), "ready_seen": time.time(),
                                        "phases": i.get("warmup_phases"), "host_steps": i.get("host_steps")})
        elif kind == "dispatch" and "first_dispatch" not in timeline:
            timeline["first_dispatch"] = time.time()
        progress.event(kind, data)
        if on_event:
            on_event(kind, data)

    ray = sched = prep = None
    started = False
    counters = None
    results: dict = {}
    try:
        sure = surely_work(sigs, cache, cfg.memory_budget)
        if sum(sure.values()):
            # Some signatures are in no namespace of the cache at all, so Ray is needed
            # whatever this host's fingerprint is: start Ray and the actors now, and plan
            # meanwhile (on a fresh host planning probes the CPU's vector ISA, ~10 s of
            # g++; Ray's start is mostly waiting, and the actors' imports overlap both).
            p, ray, started, sched, prep = _plan_while_starting(cfg, sigs, cache, sure, timeline, event,
                                                                compiler_factory)
        else:
            p = plan(sigs, cache, cfg.inductor_options, cfg.memory_budget)
            prep = start_host_prep(cfg, sum(t.kind == "cpu" for t in p.todo), timeline, compiler_factory)
        timeline["planned"] = time.time()
        results = {r.key: r for r in p.done}
        for r in p.done:
            progress.tally.cached += r.status == "cached"
            progress.tally.failed += r.status == "failed"
        if p.todo:
            if ray is None:
                ray, started = start_ray(cfg)
                timeline["ray_started"] = time.time()
            from aoti_farm.workers.pool import pool_sizes

            sizes = pool_sizes(ray.cluster_resources(), cpu_workers=cfg.cpu_workers, gpu_workers=cfg.gpu_workers,
                               gpus_per_worker=cfg.gpus_per_worker,
                               n_cpu_tasks=sum(t.kind == "cpu" for t in p.todo),
                               n_gpu_tasks=sum(t.kind == "gpu" for t in p.todo))
            if sched is None:
                sched = make_scheduler(ray, cfg, cache, sizes, compiler_factory=compiler_factory, on_event=event)
                timeline["actors_requested"] = time.time()
            else:
                sched.ensure_workers(sizes)   # the early pool was sized for the sure part only
            for t in p.todo:
                sched.add(t)
            sched.run()
            results.update(sched.results)
            counters = sched.counters
    finally:
        if sched is not None:
            timeline["scheduler_done"] = time.time()
            sched.shutdown()
        if started:
            stop_ray(ray)
            timeline["ray_shutdown"] = time.time()
        if prep is not None:
            prep.join(timeout=120)   # one compile, normally long done; never leave it half-way
    rows = []
    for s in sigs:
        r = results[s.key].to_dict()
        r["description"] = describe(s)
        r["device"] = s.device
        rows.append(r)
    rows += class_rows
    from aoti_farm.progress import attach_speed

    attach_speed(rows, cache, cfg.inductor_options)   # each kernel's measured speed-up
    progress.finish(rows)
    from aoti_farm.progress import startup_line

    line = startup_line(timeline)
    if line:
        progress._log(line)
    if counters_out is not None and counters is not None:
        from dataclasses import asdict

        counters_out.update(asdict(counters))
    if report:
        from dataclasses import asdict

        timeline["end"] = time.time()
        write_report(report, rows, {"cache_dir": str(cache.root), "models": list(models),
                                    "pool": asdict(counters) if counters else None, "timeline": timeline})
    return 1 if any(r["status"] == "failed" for r in rows) else 0


# --- serve ----------------------------------------------------------------------------------


def serve(cfg: FarmConfig, *, stop: threading.Event | None = None, install_signals: bool = False,
          stream: TextIO | None = None, compiler_factory: Callable | None = None,
          on_event: Callable | None = None, metrics_port: int | None = None) -> int:
    """Drain the miss queues until ``stop`` is set (or SIGTERM/SIGINT); returns 0.
    ``metrics_port``: expose the pool's counters there (see aoti_farm.workers.metrics)."""
    from aoti_farm import missq
    from aoti_farm.progress import Progress
    from aoti_farm.workers import metrics as farm_metrics
    from aoti_farm.workers.pool import Task, pool_sizes, route

    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    stop = stop or threading.Event()
    cache = _open_cache(cfg)
    cache.ensure()
    progress = Progress(0, stream, tty=False)
    ray, started = start_ray(cfg)
    if install_signals and threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda *_: stop.set())
    try:
        res = ray.cluster_resources()
        big = 1 << 30
        sizes = pool_sizes(res, cpu_workers=cfg.cpu_workers, gpu_workers=cfg.gpu_workers,
                           gpus_per_worker=cfg.gpus_per_worker, n_cpu_tasks=big,
                           n_gpu_tasks=big if res.get("GPU") else 0)

        def event(kind: str, data: dict) -> None:
            progress.event(kind, data)
            if on_event:
                on_event(kind, data)

        sched = make_scheduler(ray, cfg, cache, sizes, compiler_factory=compiler_factory, on_event=event)
        progress._log(f"serving {cache.root} with {sizes['cpu']} CPU and {sizes['gpu']} GPU workers")
        exporter = _serve_metrics(sched, metrics_port, progress) if metrics_port is not None else None
        bad = BadItems(progress._log)
        try:
            while not stop.is_set():
                for kind in ("cpu", "gpu"):
                    for fp_id in sched.fp_ids(kind):
                        _enqueue_pending(cache, fp_id, kind, sched, bad, missq, Task, route)
                for key, r in list(sched.results.items()):
                    if r.fp_id:
                        try:
                            missq.done(cache, r.fp_id, key)
                        except (OSError, FarmError) as e:
                            bad.see(f"{r.fp_id}/queue", key, e)
                    del sched.results[key]
                if sched.done() and all(w.state == "ready" for w in sched.workers):
                    farm_metrics.observe_scheduler(sched)   # Ray's metrics (step() does it too)
                    stop.wait(cfg.poll_interval)
                else:
                    sched.step(cfg.poll_interval)
        finally:
            sched.shutdown()
            progress._log(f"stopped: compiled {sched.counters.compiled}, cached {sched.counters.cached}, "
                          f"failed {sched.counters.failed}, bad queue items skipped {bad.count}")
            if exporter is not None:
                progress._log("counters " + json.dumps(asdict(sched.counters)))
                exporter.close()
    finally:
        if started:
            stop_ray(ray)
    return 0


def _serve_metrics(sched, port: int, progress):
    """`serve --metrics-port`: the pool's counters on a port; Ray's own metrics (compile
    seconds by device, queue depth, retries...) are at the Ray node's metrics port."""
    from aoti_farm.workers import metrics as farm_metrics

    try:
        ex = farm_metrics.serve_pool_metrics(lambda: sched, port)
    except OSError as e:
        raise UserError(f"--metrics-port {port}: {e}; pass another port (0: any free one)") from None
    rp = farm_metrics.ray_metrics_port()
    progress._log(f"metrics on port {ex.port}" + (f"; Ray's metrics (aoti_farm_compile_seconds...) on port {rp}"
                                                   if rp else ""))
    return ex


class BadItems:
    """Bad queue items (and unsafe queue directories) that ``serve`` skipped: each is
    counted and logged once per process; ``cache verify --repair`` removes them."""

    def __init__(self, log: Callable[[str], None]):
        self._log, self._seen, self.count = log, set(), 0

    def see(self, where: str, name: str, err: Exception) -> None:
        if (where, name) not in self._seen:
            self._seen.add((where, name))
            self.count += 1
            self._log(f"skipping bad queue item {where}/{name[:16]}: {err}")


def _enqueue_pending(cache, fp_id, kind, sched, bad, missq, Task, route) -> None:
    """Add the queue's new signatures to ``sched``.  Every check of an item is inside the
    per-item try: one bad item (or an unsafe queue) is counted and skipped, never fatal."""
    try:
        listing = missq.scan(cache, fp_id)
    except (OSError, FarmError) as e:
        bad.see(fp_id, "queue", e)
        return
    for name in listing.junk:
        bad.see(f"{fp_id}/queue", name, FarmError("not a queue item name"))
    for key in sorted(listing.keys, key=lambda k: (listing.keys[k], k)):
        if key in sched.tasks:
            continue
        try:
            if cache.has_entry(fp_id, key) or cache.failure(fp_id, key) is not None:
                missq.done(cache, fp_id, key)
                continue
            sig = missq.read(cache, fp_id, key)
            if route(sig) != kind:
                continue
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 -- a bad item: counted, skipped, left for `cache verify --repair`
            bad.see(f"{fp_id}/queue", key, e)
            continue
        sched.add(Task(sig, kind, fp_id))


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `aoti-farm warm` / `aoti-farm serve`")
