"""The Ray actor pool and the scheduler that feeds it.

Routing, pool sizes and the actors' resource requests are :mod:`aoti_farm.workers.placement`.

:class:`Scheduler` contract:

* ``add(task)`` queues a signature; ``step(max_wait)`` dispatches and collects results
  and returns after at most ``max_wait`` seconds; ``done()`` is true when every added
  task has a final result; ``results`` maps key -> :class:`Result`.
* Bounded in-flight: at most ``max_in_flight`` compile calls are submitted at once
  (``ray.wait`` on them is the backpressure), at most ``depth`` per actor.
* One worker per signature: a key is in at most one actor's queue at a time (and the
  lease in :mod:`aoti_farm.compile.job` keeps it so fleet-wide).
* Per-signature timeout, measured from the moment the call reaches the head of its
  actor's queue: the actor is killed (``ray.kill``; Ray restarts it, ``max_restarts``),
  its leases are broken, and the signature is retried as an infrastructure failure.
* Infrastructure failures (the actor died, its node was lost, an unexpected exception)
  are retried up to ``retries`` times; a deterministic failure (status ``failed`` from
  :func:`aoti_farm.compile.job.compile_and_publish`, which wrote a failure record) is final.
* ``busy`` (another farm holds the lease): the task is parked and the cache re-checked
  every ``lease_ttl/4`` s; it is dispatched again only when the lease is gone or stale,
  so nothing is compiled twice.  It gives up after waiting ``timeout`` seconds.
* A worker is used after its ``warmup()`` returns.  A worker whose warm-up fails is
  replaced by a fresh actor (at most ``max_replacements`` times in all).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from aoti_farm.cache import leases
from aoti_farm.cache.store import Cache
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import FarmError
from aoti_farm.signature import Signature
from . import metrics as farm_metrics

log = logging.getLogger("aoti_farm.pool")

@dataclass
class Task:
    sig: Signature
    kind: str
    fp_id: str | None = None        # None for CUDA until a GPU actor reports its fingerprint
    attempts: int = 0               # calls that reached an actor
    infra_failures: int = 0
    busy_since: float | None = None
    not_before: float = 0.0
    last_error: str | None = None
    method: str = "compile"         # the actor's method: "compile_class" for a shape class (workers/classtasks.py)

    @property
    def key(self) -> str:
        return self.sig.key


@dataclass
class Result:
    key: str
    op: str
    status: str                     # compiled | cached | failed
    seconds: float = 0.0
    worker: str = ""
    attempts: int = 0
    error: str | None = None
    evidence: dict = field(default_factory=dict)
    fp_id: str | None = None
    span: tuple | None = None       # (start, end) wall clock of the compile call in the actor
    phases: dict = field(default_factory=dict)   # export/inductor/verify seconds
    build: dict = field(default_factory=dict)    # how the wrapper was built (aoti_farm.build.splitbuild)

    def to_dict(self) -> dict:
        return asdict(self)


#: The pool's counters (:class:`aoti_farm.metrics.counters.Counters`); :meth:`Scheduler.stats` adds
#: the gauge ``peak_in_flight`` (a running maximum, kept as a plain attribute: not a count).
POOL_COUNTERS = ("dispatched", "compiled", "cached", "failed", "retried", "timeouts", "actor_losses",
                 "actors_started", "actors_replaced", "busy_parks", "leases_broken")


@dataclass
class Worker:
    handle: Any
    kind: str
    state: str = "starting"         # starting | ready | dead
    info: dict = field(default_factory=dict)
    warm_ref: Any = None
    started: float = 0.0
    queue: deque = field(default_factory=deque)   # (ref, task)
    head_since: float = 0.0


class Scheduler:
    def __init__(self, ray, cache: Cache, make_actor: Callable[[str], Any], sizes: dict[str, int], *,
                 timeout: float, retries: int, lease_ttl: float, max_in_flight: int | None = None,
                 on_event: Callable[[str, dict], None] | None = None, start_timeout: float | None = None):
        self.ray, self.cache, self.make_actor = ray, cache, make_actor
        #: how long a kind may have no ready worker before its tasks fail (pending resources)
        self.start_timeout = start_timeout if start_timeout is not None else max(timeout, 300.0)
        self.timeout, self.retries, self.lease_ttl = timeout, retries, lease_ttl
        n = sum(sizes.values())
        self._max_in_flight_arg = max_in_flight
        self.max_in_flight = max(1, max_in_flight if max_in_flight else 2 * max(1, n))
        self.depth = max(1, min(2, math.ceil(self.max_in_flight / max(1, n))))
        self.on_event = on_event or (lambda kind, data: None)
        self.counters = Counters(*POOL_COUNTERS)
        self.peak_in_flight = 0          # gauge: most compile calls in flight at once
        self.results: dict[str, Result] = {}
        self.ready: deque[Task] = deque()
        self.parked: list[Task] = []
        self.tasks: dict[str, Task] = {}
        self.workers: list[Worker] = []
        self.max_replacements = max(2, n * (retries + 1))
        for kind, k in sizes.items():
            for _ in range(k):
                self._start_worker(kind)

    # -- public --------------------------------------------------------------------------
    def add(self, task: Task) -> bool:
        """Queue ``task``; False if its key is already queued or finished here."""
        if task.key in self.tasks or task.key in self.results:
            return False
        self.tasks[task.key] = task
        if not any(w.kind == task.kind for w in self.workers):
            self._finish(task, "failed", error=f"no {task.kind.upper()} workers in the Ray cluster "
                         f"(resources: {self._resources()}); add {task.kind.upper()} nodes or drop these signatures")
            return True
        self.ready.append(task)
        return True

    def ensure_workers(self, sizes: dict[str, int]) -> None:
        """Start actors until each kind has at least ``sizes[kind]`` (a pool started before
        the whole plan was known); the in-flight bound and depth follow the new size."""
        for kind, k in sizes.items():
            for _ in range(k - sum(w.kind == kind for w in self.workers)):
                self._start_worker(kind)
        n = len(self.workers)
        arg = self._max_in_flight_arg
        self.max_in_flight = max(1, arg if arg else 2 * max(1, n))
        self.depth = max(1, min(2, math.ceil(self.max_in_flight / max(1, n))))
        self.max_replacements = max(self.max_replacements, 2, n * (self.retries + 1))

    def done(self) -> bool:
        return not self.tasks

    def stats(self) -> dict:
        """The pool's counters (``POOL_COUNTERS``) and the gauge ``peak_in_flight``: the
        report's ``pool``, ``serve``'s log line and the metrics read this."""
        return {**self.counters.snapshot(), "peak_in_flight": self.peak_in_flight}

    def in_flight(self) -> int:
        return sum(len(w.queue) for w in self.workers)

    def fp_ids(self, kind: str | None = None) -> set[str]:
        """Fingerprint ids reported by the ready workers (of ``kind``)."""
        return {w.info["fp_id"] for w in self.workers if w.info.get("fp_id") and (kind is None or w.kind == kind)}

    def step(self, max_wait: float = 1.0) -> None:
        now = time.monotonic()
        farm_metrics.observe_scheduler(self)
        self._unpark(now)
        self._dispatch(now)
        self._check_timeouts(time.monotonic())
        self._check_startup(time.monotonic())
        refs = [w.warm_ref for w in self.workers if w.state == "starting" and w.warm_ref is not None]
        refs += [ref for w in self.workers for ref, _ in w.queue]
        if not refs:
            if self.tasks and (self.ready or self.parked):
                time.sleep(min(max_wait, self._next_wake(now)))
            return
        wait = min(max_wait, self._next_wake(now))
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=max(0.0, wait))
        if ready:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self._collect(ref)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Step until every task is final; a kind's actors are killed as soon as no task
        of that kind is left (so CPU actors free the CPUs GPU actors may be waiting for)."""
        while not self.done() and not should_stop():
            self.step()
            self.release_idle_kinds()

    def release_idle_kinds(self) -> None:
        left = {t.kind for t in self.tasks.values()}
        for w in [w for w in self.workers if w.kind not in left and not w.queue]:
            self._kill(w, restart=False)
            self.workers.remove(w)

    def shutdown(self) -> None:
        """Kill every actor and break the leases they held (abandons in-flight work)."""
        farm_metrics.observe_scheduler(self, final=True)
        for w in self.workers:
            if w.state != "dead":
                for _, task in w.queue:
                    self._break_lease(w, task)
                self._kill(w, restart=False)
        self.workers.clear()

    # -- workers -------------------------------------------------------------------------
    def _resources(self) -> dict:
        try:
            return {k: v for k, v in self.ray.cluster_resources().items() if k in ("CPU", "GPU")}
        except Exception:  # noqa: BLE001
            return {}

    def _start_worker(self, kind: str) -> Worker:
        w = Worker(self.make_actor(kind), kind, started=time.monotonic())
        w.warm_ref = w.handle.warmup.remote()
        self.workers.append(w)
        self.counters.inc("actors_started")
        return w

    def _kill(self, w: Worker, restart: bool) -> None:
        try:
            self.ray.kill(w.handle, no_restart=not restart)
        except Exception:  # noqa: BLE001 -- already gone
            pass
        if not restart:
            w.state = "dead"

    def _replace(self, w: Worker, reason: str) -> None:
        self._kill(w, restart=False)
        self.workers.remove(w)
        self.counters.inc("actors_replaced")
        self.on_event("worker_replaced", {"kind": w.kind, "reason": reason, "info": w.info})
        if self.counters.get("actors_replaced") <= self.max_replacements:
            self._start_worker(w.kind)
        if not any(x.kind == w.kind for x in self.workers):
            for t in [t for t in self.ready if t.kind == w.kind] + [t for t in self.parked if t.kind == w.kind]:
                self._finish(t, "failed", error=f"no {w.kind.upper()} worker could be kept alive ({reason})")

    def _lose_worker(self, w: Worker, reason: str, *, timed_out: bool = False) -> None:
        """The actor died or was killed: break its leases, requeue its calls (the head one
        counts an infrastructure failure) and let Ray restart it; warm it up again."""
        self.counters.inc("actor_losses")
        queued = list(w.queue)
        w.queue.clear()
        for i, (_, task) in enumerate(queued):
            self._break_lease(w, task)
            if i == 0:
                self._infra_failure(task, reason)
            else:
                self.ready.appendleft(task)
        if timed_out:
            self._kill(w, restart=True)
        w.state, w.info, w.started = "starting", {}, time.monotonic()
        w.warm_ref = w.handle.warmup.remote()
        self.on_event("worker_lost", {"kind": w.kind, "reason": reason})

    def _break_lease(self, w: Worker, task: Task) -> None:
        """Remove the lease ``w`` held on ``task`` (``w`` is dead, so it cannot heartbeat)."""
        fp_id, owner = w.info.get("fp_id"), w.info.get("owner")
        if not fp_id or not owner:
            return
        info = leases.holder_info(self.cache, fp_id, task.key)
        if info and info.get("owner") == owner:
            try:   # through the leases/ directory's descriptor: never a link
                if leases.remove(self.cache, fp_id, f"{task.key}.lease"):
                    self.counters.inc("leases_broken")
            except (OSError, FarmError) as e:
                log.warning("cannot break the lease of %s: %s", task.key[:12], e)

    def _check_startup(self, now: float) -> None:
        """Workers that cannot start (no resources) for ``timeout`` s while their kind has
        no ready worker: fail that kind's tasks rather than wait forever."""
        for kind in {w.kind for w in self.workers}:
            ws = [w for w in self.workers if w.kind == kind]
            if any(w.state == "ready" for w in ws) or not ws:
                continue
            if all(now - w.started > self.start_timeout for w in ws):
                for t in [t for t in self.ready if t.kind == kind]:
                    self._finish(t, "failed", error=f"no {kind.upper()} worker started within {self.start_timeout:.0f}s "
                                 f"(resources: {self._resources()})")

    # -- tasks ---------------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        pending = deque()
        waiting: dict[str, int] = {}
        for t in self.ready:
            waiting[t.kind] = waiting.get(t.kind, 0) + 1
        while self.ready:
            task = self.ready.popleft()
            if task.key not in self.tasks:
                continue
            if self.in_flight() >= self.max_in_flight:
                pending.append(task)
                continue
            free = [w for w in self.workers if w.kind == task.kind and w.state == "ready" and len(w.queue) < self.depth]
            idle = [w for w in free if not w.queue]
            # Queue behind a running compile only while this kind has more work waiting than
            # workers (it hides the call's round trip); near the end, a task queued there
            # would wait while a worker that is just starting or finishing stays idle.
            if not idle and waiting.get(task.kind, 0) <= sum(w.kind == task.kind and w.state != "dead"
                                                              for w in self.workers):
                free = []
            if not free:
                pending.append(task)
                continue
            w = idle[0] if idle else min(free, key=lambda x: len(x.queue))
            waiting[task.kind] -= 1
            task.attempts += 1
            if not w.queue:
                w.head_since = now
            w.queue.append((getattr(w.handle, task.method).remote(task.sig.to_obj(), task.attempts), task))
            self.counters.inc("dispatched")
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight())
            self.on_event("dispatch", {"key": task.key, "attempt": task.attempts, "worker": dict(w.info)})
        self.ready = pending

    def _collect(self, ref) -> None:
        for w in list(self.workers):
            if w.state == "starting" and w.warm_ref is not None and w.warm_ref == ref:
                try:
                    w.info = self.ray.get(ref)
                    w.state, w.warm_ref = "ready", None
                    self.on_event("worker_ready", {"kind": w.kind, "info": dict(w.info)})
                except Exception as e:  # noqa: BLE001 -- the actor could not start
                    self._replace(w, f"warm-up failed: {_one_line(e)}")
                return
            for i, (r, task) in enumerate(w.queue):
                if r == ref:
                    try:
                        out = self.ray.get(ref)
                    except self.ray.exceptions.RayActorError as e:
                        self._lose_worker(w, f"worker lost: {_one_line(e)}")
                        return
                    except Exception as e:  # noqa: BLE001 -- object lost, node died, task error
                        del w.queue[i]
                        self._infra_failure(task, f"{type(e).__name__}: {_one_line(e)}")
                        return
                    del w.queue[i]
                    if i == 0:
                        w.head_since = time.monotonic()
                    self._outcome(task, out)
                    return

    def _outcome(self, task: Task, out: dict) -> None:
        actor = out.get("actor") or {}
        task.fp_id = actor.get("fp_id") or task.fp_id
        status = out.get("status")
        if status in ("compiled", "cached", "failed"):
            self._finish(task, status, seconds=out.get("seconds", 0.0), worker=out.get("worker", ""),
                         error=out.get("error"), evidence=out.get("evidence") or {},
                         span=tuple(out["span"]) if out.get("span") else None, phases=out.get("phases") or {},
                         build=out.get("build") or {})
        elif status == "busy":
            now = time.monotonic()
            if task.busy_since is None:
                task.busy_since = now
            task.attempts -= 1  # nothing was attempted
            self.counters.inc("busy_parks")
            task.not_before = now + max(0.2, self.lease_ttl / 4)
            self.parked.append(task)
            self.on_event("busy", {"key": task.key})
        else:
            self._infra_failure(task, out.get("error") or f"unexpected status {status!r}")

    def _infra_failure(self, task: Task, reason: str) -> None:
        task.infra_failures += 1
        task.last_error = reason
        if task.infra_failures > self.retries:
            self._finish(task, "failed", error=f"{reason} (gave up after {task.infra_failures} attempts)")
            return
        self.counters.inc("retried")
        self.on_event("retry", {"key": task.key, "reason": reason, "attempt": task.infra_failures})
        self.ready.appendleft(task)

    def _unpark(self, now: float) -> None:
        keep = []
        for task in self.parked:
            if task.key not in self.tasks:
                continue
            if now < task.not_before:
                keep.append(task)
                continue
            fp_id = task.fp_id
            if fp_id and self.cache.has_entry(fp_id, task.key):
                self._finish(task, "cached")
            elif fp_id and self.cache.failure(fp_id, task.key) is not None:
                rec = self.cache.failure(fp_id, task.key) or {}
                self._finish(task, "failed", error=rec.get("reason"), evidence=rec.get("evidence") or {})
            else:
                holder = leases.holder_info(self.cache, fp_id, task.key) if fp_id else None
                if holder and not holder.get("stale"):
                    if now - (task.busy_since or now) > self.timeout:
                        self._finish(task, "failed", error=f"still being compiled by {holder.get('owner')} after "
                                     f"{self.timeout:.0f}s; run again later")
                    else:
                        task.not_before = now + max(0.2, self.lease_ttl / 4)
                        keep.append(task)
                else:
                    self.ready.append(task)
        self.parked = keep

    def _check_timeouts(self, now: float) -> None:
        for w in list(self.workers):
            if w.state == "ready" and w.queue and now - w.head_since > self.timeout:
                self.counters.inc("timeouts")
                self._lose_worker(w, f"timed out after {self.timeout:g}s", timed_out=True)

    def _next_wake(self, now: float) -> float:
        t = [1.0]
        t += [max(0.0, p.not_before - now) for p in self.parked]
        t += [max(0.0, w.head_since + self.timeout - now) + 0.01 for w in self.workers if w.queue]
        return min(t)

    def _finish(self, task: Task, status: str, *, seconds: float = 0.0, worker: str = "", error: str | None = None,
                evidence: dict | None = None, span: tuple | None = None, phases: dict | None = None,
                build: dict | None = None) -> None:
        self.tasks.pop(task.key, None)
        r = Result(task.key, task.sig.op, status, seconds, worker, task.attempts, error, evidence or {}, task.fp_id,
                   span, phases or {}, build or {})
        self.results[task.key] = r
        self.counters.inc(status)
        self.on_event("done", {"result": r})


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
