"""The farm's metrics, two ways:

* through **Ray's own metrics** (``ray.util.metrics``), exported by every Ray node's
  metrics agent with the rest of Ray's (``ray_`` prefix, at the node's metrics export
  port, which Ray's Prometheus service discovery file lists):

  - ``aoti_farm_compile_seconds{device,status}`` (histogram): one compile call in an
    actor (:func:`record_compile`, called by ``CompileActor.compile``);
  - ``aoti_farm_farm_queue_depth``, ``aoti_farm_farm_in_flight`` (gauges) and
    ``aoti_farm_farm_{dispatched,compiled,cached,failed,retries,timeouts,leases_waited,
    actor_losses,leases_broken}`` (counters) from the scheduler's own counters
    (:func:`observe_scheduler`, called once per ``Scheduler.step``: deltas, no new state in
    the scheduler);

* for **`aoti-farm serve --metrics-port P`**: a ``prometheus_client`` endpoint in the serve
  process whose :class:`PoolCollector` reads the scheduler's ``stats()`` at scrape
  time (``aoti_farm_pool_*``), so the numbers equal what ``serve`` prints at exit.

Nothing here raises into the scheduler or the actor: without Ray (unit tests with a test
double) or with a Ray whose metrics fail, recording is skipped.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("aoti_farm.farm_metrics")

#: Seconds between two mirrors of the scheduler's counters into Ray's.
OBSERVE_INTERVAL = 1.0
COMPILE_BUCKETS = [0.5, 1, 2, 3, 5, 8, 13, 20, 30, 60, 120, 300, 600]
#: scheduler counter (POOL_COUNTERS) -> (Ray counter name, help)
_COUNTERS = {
    "dispatched": ("dispatched", "compile calls sent to actors"),
    "compiled": ("compiled", "signatures compiled, verified and published"),
    "cached": ("cached", "signatures found published when an actor took them"),
    "failed": ("failed", "signatures that failed for good (failure record or retries spent)"),
    "retried": ("retries", "compile calls retried after an infrastructure failure"),
    "timeouts": ("timeouts", "compile calls past the per-signature timeout"),
    "busy_parks": ("leases_waited", "signatures parked while another farm held their lease "
                                    "(in-flight deduplication)"),
    "actor_losses": ("actor_losses", "actors lost mid-call"),
    "leases_broken": ("leases_broken", "leases of killed actors broken"),
}

_lock = threading.Lock()
_metrics: dict | None = None
_disabled = False


def _ray_metrics() -> dict | None:
    """The Ray metric objects, created once per process (None without a Ray worker)."""
    global _metrics, _disabled
    if _metrics is not None or _disabled:
        return _metrics
    with _lock:
        if _metrics is not None or _disabled:
            return _metrics
        try:
            ray = sys.modules.get("ray")   # never imported here: a forked compiler (workers/forkserver.py) has none
            if ray is None or not ray.is_initialized():
                return None
            from ray.util.metrics import Counter, Gauge, Histogram

            m = {"compile_seconds": Histogram("aoti_farm_compile_seconds", description="seconds of one compile "
                                              "call in a compile actor (lease, export, Inductor, verify, publish)",
                                              boundaries=COMPILE_BUCKETS, tag_keys=("device", "status")),
                 "queue_depth": Gauge("aoti_farm_farm_queue_depth", description="signatures waiting for an "
                                      "actor (ready + parked)"),
                 "in_flight": Gauge("aoti_farm_farm_in_flight", description="compile calls submitted, not done")}
            for field, (name, doc) in _COUNTERS.items():
                m[field] = Counter(f"aoti_farm_farm_{name}", description=doc)
            m["_last"] = {}
            _metrics = m
        except Exception as e:  # noqa: BLE001 -- metrics never break the farm
            log.debug("Ray metrics unavailable: %s", e)
            _disabled = True
    return _metrics


def record_compile(device: str, out: dict) -> None:
    """One compile call's seconds, by device (cpu / cuda:N) and status; in the actor."""
    m = _ray_metrics()
    if m is None:
        return
    try:
        m["compile_seconds"].observe(float(out.get("seconds") or 0.0),
                                     tags={"device": str(device), "status": str(out.get("status"))})
    except Exception as e:  # noqa: BLE001
        log.debug("record_compile: %s", e)


def observe_scheduler(sched, final: bool = False) -> None:
    """Mirror a scheduler's counters into Ray's metrics (deltas since the last call; at
    most once per ``OBSERVE_INTERVAL`` seconds unless ``final``; O(workers))."""
    m = _ray_metrics()
    if m is None:
        return
    try:
        now = time.monotonic()
        last = m["_last"].setdefault(id(sched), {})
        if not final and now - last.get("_t", -1e9) < OBSERVE_INTERVAL:
            return
        last["_t"] = now
        c = sched.stats()
        for field in _COUNTERS:
            d = c.get(field, 0) - last.get(field, 0)
            if d > 0:
                m[field].inc(d)
            last[field] = c.get(field, 0)
        m["queue_depth"].set(len(sched.ready) + len(sched.parked))
        m["in_flight"].set(sum(len(w.queue) for w in sched.workers))
    except Exception as e:  # noqa: BLE001
        log.debug("observe_scheduler: %s", e)


def ray_metrics_port() -> int | None:
    """The port where this Ray node's metrics agent serves Prometheus text (None if unknown).

    Ray internal: ``ray._private.worker._global_node.metrics_export_port`` (checked against
    Ray 2.60.0), because Ray has no public API for its own metrics port; it only names the
    port in the log line of ``serve --metrics-port`` and can go with a public API (or the
    log line).  Any failure reads as unknown."""
    try:
        import ray

        node = ray._private.worker._global_node
        return int(node.metrics_export_port) if node is not None else None
    except Exception:  # noqa: BLE001
        return None


# --- `aoti-farm serve --metrics-port` ---------------------------------------------------------


class PoolCollector:
    """``aoti_farm_pool_*`` from a scheduler's stats(), read at scrape time."""

    def __init__(self, get_sched, get_pending=None):
        self.get_sched, self.get_pending = get_sched, get_pending

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sched = self.get_sched()
        if sched is None:
            return
        c = sched.stats()
        for field, v in c.items():
            if field == "peak_in_flight":
                g = GaugeMetricFamily("aoti_farm_pool_peak_in_flight", "most compile calls in flight at once")
                g.add_metric([], v)
                yield g
                continue
            doc = _COUNTERS.get(field, (field, field.replace("_", " ")))[1]
            m = CounterMetricFamily(f"aoti_farm_pool_{field}", doc)
            m.add_metric([], v)
            yield m
        g = GaugeMetricFamily("aoti_farm_pool_queue_depth", "signatures waiting for an actor", labels=["kind"])
        depth: dict[str, int] = {"cpu": 0, "gpu": 0}
        for t in list(sched.ready) + list(sched.parked):
            depth[t.kind] = depth.get(t.kind, 0) + 1
        for kind, n in sorted(depth.items()):
            g.add_metric([kind], n)
        yield g
        g = GaugeMetricFamily("aoti_farm_pool_workers", "compile actors by state", labels=["kind", "state"])
        seen: dict[tuple, int] = {}
        for w in list(sched.workers):
            seen[(w.kind, w.state)] = seen.get((w.kind, w.state), 0) + 1
        for (kind, state), n in sorted(seen.items()):
            g.add_metric([kind, state], n)
        yield g
        if self.get_pending is not None:
            g = GaugeMetricFamily("aoti_farm_pool_miss_queue", "signatures in the cache's miss queues")
            g.add_metric([], self.get_pending())
            yield g


def serve_pool_metrics(get_sched, endpoint, get_pending=None):
    """Start the serve process's endpoint (an :class:`aoti_farm.metrics.exposition.Endpoint`);
    returns the Exporter (``.port``, ``.close()``)."""
    from prometheus_client import CollectorRegistry

    from aoti_farm.metrics.exposition import serve_http

    reg = CollectorRegistry(auto_describe=False)
    reg.register(PoolCollector(get_sched, get_pending))
    return serve_http(reg, endpoint.port, addr=endpoint.addr, span=endpoint.span, sd_dir=endpoint.sd_dir,
                      labels={"role": "farm"})
