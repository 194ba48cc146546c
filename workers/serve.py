"""`aoti-farm serve`: keep compiling what serving processes missed.

Polls the miss queue (:mod:`aoti_farm.cache.queue`) of every fingerprint namespace its workers
compile for and drains it with the same pool as ``warm``, until SIGTERM/SIGINT; then it
abandons in-flight work (kills the actors, breaks their leases), shuts Ray down and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Callable, TextIO

from aoti_farm.config import FarmConfig
from aoti_farm.errors import FarmError, UserError
from .raysetup import make_scheduler, start_ray, stop_ray
from .warm import open_farm_cache


def serve(cfg: FarmConfig, *, stop: threading.Event | None = None, install_signals: bool = False,
          stream: TextIO | None = None, compiler_factory: Callable | None = None,
          on_event: Callable | None = None, metrics=None, signing_key: bytes | None = None) -> int:
    """Drain the miss queues until ``stop`` is set (or SIGTERM/SIGINT); returns 0.
    ``metrics``: an :class:`aoti_farm.metrics.exposition.Endpoint` to expose the pool's counters on
    (see aoti_farm.workers.metrics), None for none;
    ``signing_key``: the resolved key's bytes (None: no signing)."""
    from aoti_farm.cache import queue as missq
    from aoti_farm.report.progress import Progress
    from . import metrics as farm_metrics
    from .placement import pool_sizes, route
    from .scheduler import Task

    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    from aoti_farm.startup import notices

    notices.drop(notices.TORCH_NOTICES)   # `aoti-farm serve` is the farm's own process
    stop = stop or threading.Event()
    cache = open_farm_cache(cfg, signing_key)
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
        exporter = _serve_metrics(sched, metrics, progress) if metrics is not None else None
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
            c = sched.stats()
            progress._log(f"stopped: compiled {c['compiled']}, cached {c['cached']}, "
                          f"failed {c['failed']}, bad queue items skipped {bad.count}")
            if exporter is not None:
                progress._log("counters " + json.dumps(c))
                exporter.close()
    finally:
        if started:
            stop_ray(ray)
    return 0


def _serve_metrics(sched, endpoint, progress):
    """`serve --metrics-port`: the pool's counters on a port; Ray's own metrics (compile
    seconds by device, queue depth, retries...) are at the Ray node's metrics port."""
    from . import metrics as farm_metrics

    try:
        ex = farm_metrics.serve_pool_metrics(lambda: sched, endpoint)
    except OSError as e:
        raise UserError(f"--metrics-port {endpoint.port}: {e}; pass another port (0: any free one)") from None
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
            sig, wid = missq.read_item(cache, fp_id, key)   # wid: a widened class asked for (aoti_farm/compile/widen.py)
            if route(sig) != kind:
                continue
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 -- a bad item: counted, skipped, left for `cache verify --repair`
            bad.see(f"{fp_id}/queue", key, e)
            continue
        from .classtasks import queued_task

        sched.add(queued_task(sig, wid, kind, fp_id))   # the exact Task, or a widened class's (classtasks.py)
