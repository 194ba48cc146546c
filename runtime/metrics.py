"""The serving hook's metrics in the OpenMetrics / Prometheus format (``prometheus_client``).

Nothing is counted twice and nothing is added to the per-call path: a custom
:class:`HookCollector` reads ``Hook.stats()`` (the counters the hook keeps anyway) when a
scrape comes, and turns them into metric families.  The one histogram, the miss -> hit
latency of a signature, is observed by the hook once per signature, when the first hit
follows its misses (:class:`LatencyHistogram`, a plain bucket array under the hook's
existing lock).

Two ways to expose them:

* ``register(hook, registry)`` adds the collector to a registry the application already
  serves (``prometheus_client.REGISTRY`` or its own);
* ``install(settings=Settings(metrics_port=...))`` / ``AOTI_FARM_METRICS_PORT`` starts a
  small HTTP server in the serving process (:func:`serve_http`).

Several serving processes per host: each process exports its own counters on its own
port.  ``AOTI_FARM_METRICS_PORT=9400`` makes a process take the first free port of
9400..9400+AOTI_FARM_METRICS_PORTS-1 (default 64 ports; 0 takes any free port).  With
``AOTI_FARM_METRICS_SD_DIR=/run/aoti-farm/sd`` each process also writes a Prometheus
``file_sd_configs`` target file ``<dir>/aoti-farm-<pid>.json`` naming its port (removed
when the hook is uninstalled or the process exits), so Prometheus finds whichever ports
the processes took.  (prometheus_client's multiprocess mode cannot carry custom
collectors, which is why every process serves its own.)
"""

from __future__ import annotations

import bisect
import logging

log = logging.getLogger("aoti_farm.metrics")

#: miss -> hit latency buckets, seconds (a compile takes 3-60 s; a queue can wait minutes)
LATENCY_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
PREFIX = "aoti_farm_hook"


class LatencyHistogram:
    """Bucket counts, sum and count; the caller holds its own lock around ``observe``."""

    def __init__(self, buckets=LATENCY_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)   # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def snapshot(self) -> dict:
        """``{"buckets": [[le, cumulative count], ...], "sum": s, "count": n}``."""
        out, acc = [], 0
        for le, c in zip(list(self.buckets) + [float("inf")], self.counts):
            acc += c
            out.append([le, acc])
        return {"buckets": out, "sum": self.sum, "count": self.count}


class HookCollector:
    """Metric families built from one hook's ``stats()`` at scrape time."""

    def __init__(self, hook):
        self.hook = hook

    def describe(self):
        return []   # unchecked collector: the families depend on the counters present

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.hook.stats()

        def counter(name, doc, value, labels=None, label_values=None):
            m = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            if labels:
                for lv, v in label_values:
                    m.add_metric(lv, v)
            else:
                m.add_metric([], value)
            return m

        yield counter("calls", "calls that reached the hook", s["calls"])
        yield counter("hits", "calls served by a cached kernel", s["hits"])
        reasons = s.get("miss_reasons") or {}
        yield counter("misses", "calls that ran eager for want of a served kernel, by reason "
                      "(missing: not published; failed: a failure record)",
                      None, ["reason"], [([k], v) for k, v in sorted(reasons.items()) if k in ("missing", "failed")])
        yield counter("fallbacks", "ineligible calls (never served), by reason", None, ["reason"],
                      [([k], v) for k, v in sorted(s["fallbacks"].items())])
        yield counter("gated", "calls of published kernels the speed gate leaves to eager", s.get("gated", 0))
        yield counter("kernels_loaded", "kernels verified and loaded", s["kernels_loaded"])
        yield counter("kernels_dropped", "loaded kernels dropped because their entry went away", s["kernels_dropped"])
        yield counter("load_errors", "verified kernels that failed to load", s["load_errors"])
        yield counter("kernel_errors", "loaded kernels that raised while running", s["kernel_errors"])
        by_kind = dict(s.get("integrity_failures_by_kind") or {})
        if s.get("foreign"):
            by_kind["foreign"] = by_kind.get("foreign", 0) + s["foreign"]
        yield counter("integrity_failures", "cache entries refused by verification, by kind", None, ["kind"],
                      [([k], v) for k, v in sorted(by_kind.items())])
        for name, doc in (("queued", "signatures this process added to the miss queue"),
                          ("queue_dedup", "signatures already in the miss queue"),
                          ("queue_dropped", "misses dropped: the in-process pending queue was full"),
                          ("queue_errors", "misses the queue could not be written for"),
                          ("queue_overflow", "misses not queued: this process reached queue_cap or queue_cap_per_op"),
                          ("served_after_miss", "signatures missed earlier in this process, now hits"),
                          ("workers_started", "background compile workers started"),
                          ("worker_errors", "compile workers that could not be started")):
            yield counter(name, doc, s.get(name, 0))
        yield counter("miss_explained", "first misses of signatures, by what explain says differs "
                      "(only with AOTI_FARM_EXPLAIN_MISSES=1)", None, ["reason"],
                      [([k], v) for k, v in sorted((s.get("miss_explained") or {}).items())])
        per = CounterMetricFamily(f"{PREFIX}_op_calls", "calls per op and outcome", labels=["op", "outcome"])
        for op, oc in sorted(s["per_op"].items()):
            for outcome, k in (("hit", "hits"), ("miss", "misses"), ("fallback", "fallbacks")):
                per.add_metric([op, outcome], oc[k])
        yield per
        g = GaugeMetricFamily(f"{PREFIX}_queued_waiting", "misses queued here, not yet published or failed")
        g.add_metric([], s.get("queued_waiting", 0))
        yield g
        g = GaugeMetricFamily(f"{PREFIX}_eager_while_pending_seconds",
                              "wall seconds signatures were served by eager between their first miss and "
                              "their first hit, summed (still-waiting queued ones up to now)")
        g.add_metric([], float(s.get("eager_while_pending_seconds", 0.0)))
        yield g
        g = GaugeMetricFamily(f"{PREFIX}_metrics_ports_held_by_others",
                              "ports of the metrics span another user listened on at start (scrapes there "
                              "do not reach aoti-farm)")
        g.add_metric([], (s.get("metrics") or {}).get("ports_held_by_others", 0))
        yield g
        g = GaugeMetricFamily(f"{PREFIX}_native_active", "1 when the native hit path serves")
        g.add_metric([], 1.0 if (s.get("native") or {}).get("active") else 0.0)
        yield g
        h = s.get("miss_to_hit_seconds")
        if h:
            hm = HistogramMetricFamily(f"{PREFIX}_miss_to_hit_seconds",
                                       "seconds from a signature's first miss to its first hit in this process")
            hm.add_metric([], [(_le(le), c) for le, c in h["buckets"]], h["sum"])
            yield hm


def _le(v: float) -> str:
    return "+Inf" if v == float("inf") else repr(float(v))


def register(hook, registry=None):
    """Add ``hook``'s collector to ``registry`` (default: prometheus_client's global
    REGISTRY); returns the collector (``registry.unregister(c)`` removes it)."""
    from prometheus_client import REGISTRY

    c = HookCollector(hook)
    (registry or REGISTRY).register(c)
    return c


from aoti_farm.metrics.exposition import Exporter, serve_http  # noqa: E402 -- shared with `serve`


def start_for_hook(hook, endpoint) -> "Exporter | NotExposed":
    """The hook's own endpoint (``Settings(metrics_port=...)``; ``endpoint`` a
    :class:`aoti_farm.metrics.exposition.Endpoint`); never raises: a port that cannot be had is
    logged and the hook serves without metrics (a :class:`NotExposed`, which still counts
    the ports another user held)."""
    try:
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
        register(hook, reg)
        ex = serve_http(reg, endpoint.port, addr=endpoint.addr, span=endpoint.span, sd_dir=endpoint.sd_dir or "",
                        labels={"role": "serving"})
        log.info("aoti-farm metrics on port %d", ex.port)
        return ex
    except Exception as e:  # noqa: BLE001 -- metrics never stop serving
        log.warning("aoti-farm metrics not exposed: %s", e)
        return NotExposed(getattr(e, "held", ()))


class NotExposed:
    """The hook's endpoint when no port could be had: no port, but the ports another user
    held still count (``stats()["metrics"]``)."""

    port = None
    port_file = None

    def __init__(self, held=()):
        self.held = list(held)

    def close(self) -> None:
        pass


# --- what the hook calls (never raising into a serving process) ---------------------------------


def with_miss_reasons(s: dict, exporter: Exporter | None) -> dict:
    """Adds ``miss_reasons`` (calls that ran eager, by the outcome `aoti-farm explain`
    names) and ``metrics`` (the endpoint's port, the ports of its span another user held
    at start, the private file naming the port) to a ``stats()`` dict."""
    s["miss_reasons"] = {"missing": s["misses"], "failed": s["failed_signatures"],
                         "gated": s.get("gated", 0), "ineligible": sum(s["fallbacks"].values())}
    s["metrics"] = {"port": getattr(exporter, "port", None),
                    "ports_held_by_others": len(getattr(exporter, "held", ())),   # exposition.py: squatted ports
                    "port_file": getattr(exporter, "port_file", None)}
    return s


#: Seconds a hook's explain index is reused before the cache is listed again.
EXPLAIN_INDEX_AGE = 5.0
explain_log = logging.getLogger("aoti_farm.explain")


class MissExplainer:
    """Explains one signature's first miss in this process (called in the miss writer
    thread, never the caller's): logs it and counts it by category in ``counters``
    (``stats()["miss_explained"]``)."""

    def __init__(self, cache, fps: dict, counters):
        self.cache, self.fps, self.counters = cache, fps, counters
        self._explainer = None

    def __call__(self, call) -> None:
        try:
            from aoti_farm.report.explain import Explainer

            if self._explainer is None:
                self._explainer = Explainer(self.cache, self.fps)
            else:
                self._explainer.refresh(EXPLAIN_INDEX_AGE)
            ex = self._explainer.explain(call.sig)
            what = ex.category if ex.outcome == "missing" and ex.category else ex.outcome
            explain_log.warning("first miss of %s: %s%s", ex.description, ex.reason,
                                "".join(f"; {d}" for d in ex.details[:8]))
        except Exception as e:  # noqa: BLE001 -- explaining never breaks serving
            log.debug("explain failed: %s", e)
            what = "unexplained"
        self.counters.inc("miss_explained", what)
