"""The serving hook: serve cached AOTInductor kernels for eager aten calls, never block.

``install(...) -> Hook`` registers a kernel on the served ops (``runtime/routes.py``:
native C++ kernels, or Python ones from ``runtime/dispatch.py``).  Per call (``_decide``,
the same code for both paths):

1. ``encode_call`` normalises the call (``Ineligible`` -> eager, counted by reason; so is
   a tensor input that requires grad while grad mode is on).
2. ``(op, encoding)`` -> a memoised :class:`Call` holding the signature key.
3. Key published under the device's fingerprint (``runtime/index.py``; else a shape class
   in range, ``runtime/shapeserve.py``) -> **hit**: the kernel is verified and loaded on
   first use (``runtime/kernels.py``) and, under ``serve="faster"``, served only where
   the speed gate agrees (``runtime/gate.py``); no lock is held while it runs.  A refused
   entry is counted, dropped from the index, queued again, and the call returns eager's
   result.
4. Otherwise **miss**: eager's result at once; the miss writer's thread
   (``runtime/misswriter.py``) writes the signature to the shared miss queue and, with
   ``on_miss="compile"``, the hook's low-priority compile worker drains it
   (``runtime/supervisor.py``).  ``on_miss="queue"`` only queues (for ``aoti-farm
   serve``), ``"ignore"`` does neither.

Hot reload: the poller (``runtime/poller.py``) refreshes the index every
``poll_interval`` seconds, at once when this hook's worker reports an outcome.

**What is routed.**  A routed op enters the hook on every call (about 0.4 µs on a 2-core
VM even when the call then runs eager), so only ops that can be served are routed where
that is known.  ``route="paying"`` (the default with ``on_miss`` "compile" or "queue")
registers every requested op except those whose entries here all lose to eager on this
host (below); ``route="all"`` registers every requested op (a miss must be seen to be
queued).  With ``on_miss="ignore"``
a call can only be served or run eager, so the default there is
``route="servable-at-install"``: only ops with at least one servable entry when
``install()`` runs (published, not refused or failing here, and under ``serve="faster"``
faster than eager on the compile host) are registered, and the registration never changes
afterwards; every other op costs exactly eager.  Under ``serve="faster"`` ``install()``
first takes this host's kept decisions (``aoti_farm/speedgate/hostgate.py``: measured by an earlier
process at the same thread count), then times the routed ops' other kernels on this host
(``runtime/pretrial.py``, within ``install_trial`` seconds) and unroutes the ops none of
whose kernels won here, so an op whose calls would all run eager is not routed either.  New signatures of a routed op are still
picked up by the poller; an op whose first servable entry lands later is served from the
next ``install()``.  ``route="servable"`` (opt-in) recomputes the set after each poll and
re-registers the dispatcher when it changes (an op that lost its last servable entry stays
routed for ``routes.DROP_AFTER_S``); it is opt-in because torch does not promise that
replacing a kernel registration is safe while another thread is inside it.  A process
that cannot load kernels at all (the libstdc++ trap, ``aoti_farm/startup/loadenv.py``) registers
nothing.

Nothing the cache, the queue or a kernel does raises into the caller: every such error is
counted and the call returns eager's result.  Counters: :meth:`Hook.stats`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Iterable

import torch

from aoti_farm.compile import adversarial
from aoti_farm.speedgate import hostgate
from aoti_farm.security import private
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import Ineligible, UserError
from aoti_farm.fingerprint import Fingerprint, fingerprint
from . import dispatch
from . import gate as gate_mod
from . import metrics as metrics_mod
from . import settings as settings_mod
from . import pretrial, trial
from .calls import Call, CallMemo
from .hookstats import merged_stats
from .index import Index, losing_ops, servable_ops
from .kernels import KernelTable
from .misswriter import MissWriter
from .poller import Poller
from .room import ThreadRoom
from .routes import Routes, cannot_load_reason, native_code
from .settings import Settings
from .shapeserve import ShapeIndex
from .supervisor import WorkerSupervisor

log = logging.getLogger("aoti_farm.hook")

#: Seconds a compile worker waits for new queue items before it exits.
WORKER_IDLE_SECONDS = 60.0


class Hook:
    """An installed serving hook.  Use :func:`install`; every setting here is resolved
    (see ``runtime/settings.py``)."""

    def __init__(self, settings: settings_mod.HookSettings):
        c = settings.config
        ops, devices, on_miss, poll_interval = c.ops, tuple(c.devices), c.on_miss, c.poll_interval
        native, route = settings.native, settings.route
        self.on_miss = on_miss
        self.settings = settings   # as resolved (runtime/settings.py)
        self.inductor_options = dict(c.inductor_options or {})
        self.cache = Cache(c.cache_dir, signing_key=settings.signing_key, allow_insecure=c.allow_insecure)
        # the compile worker's log: mkstemp in a 0700 dir unless a developer names one
        self.worker_log = settings.worker_log or private.new_log_or_devnull("aoti-farm-worker")
        worker_idle = WORKER_IDLE_SECONDS if settings.worker_idle is None else settings.worker_idle
        try:   # serve a kernel only where it is faster than eager (runtime/gate.py)
            self.gate = gate_mod.Gate(c.serve)
        except ValueError as e:
            raise UserError(f"{e}; use serve='faster' (default) or 'always'") from None
        self.counters = Counters("calls", "hits", "misses", "failed_signatures", "served_after_miss", "gated",
                                 "gate_pending", "poll_errors", "rescans", fallbacks={}, per_op={},
                                 miss_explained={})
        self._ineligible_ids: dict[str, int] = {}   # fallback reason -> the native path's id
        self._room = ThreadRoom()   # running compiles, reported; no thread count is ever changed

        served = [d for d in devices if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]
        self.fps: dict[str, Fingerprint] = {d: fingerprint(d, self.inductor_options) for d in served}
        self._calls = CallMemo(self.fps)
        # this host's kept on-host decisions (aoti_farm/speedgate/hostgate.py), at the program's thread
        # count: routing below follows them, with no trial
        threads = torch.get_num_threads()
        self.remembered = {d: self.gate.preload(fp.id, self.cache.root, threads) for d, fp in self.fps.items()}
        self._threads = threads
        # ops whose every call ran eager in the last process here (hostgate.load_ops)
        self._eager_ops: set[str] = set()
        if self.gate.active:
            for fp in self.fps.values():
                self._eager_ops |= hostgate.load_ops(fp.id, self.cache.root, threads)
        if on_miss != "ignore":  # a fresh cache: create it so misses can be queued
            for fp in self.fps.values():
                try:
                    self.cache.ensure(fp)
                except Exception as e:  # noqa: BLE001 -- read-only or full: misses are not queued
                    log.warning("cache %s: %s", self.cache.root, e)
        self.route = route
        self._route_by_entries = route != "all"     # servable ops only
        self._reroute = route == "servable"         # ... re-registered when that set changes
        self._index = {d: Index(self.cache, fp, with_meta=self._route_by_entries) for d, fp in self.fps.items()}
        wake = threading.Event()
        explain = (metrics_mod.MissExplainer(self.cache, self.fps, self.counters)
                   if c.explain_misses else None)
        self._writer = MissWriter(self.cache, self.fps, on_miss != "ignore",
                                  lambda call: self._queued(call, explain), cap=c.queue_cap,
                                  cap_per_op=c.queue_cap_per_op)
        self._writer.wake = wake
        self._kernels = KernelTable(self.cache, self.fps, self._index, self._writer.report, self._writer.submit,
                                    contract=c.contract)
        self._workers = WorkerSupervisor(self.cache, self.fps, self.inductor_options, self.worker_log, worker_idle,
                                         self._room, wake, c.memory_budget, settings.key_file)
        self._shapes = ShapeIndex(self.cache, self.fps, Call, gated=self.gate.active,   # runtime/shapeserve.py
                                  widen=c.widen)
        self._writer.widen_of = self._shapes.widen_request   # a miss outside every range (aoti_farm/compile/widen.py)
        for d in self._index:
            self._refresh(d)
        self.install_trial: dict | None = None   # install()'s own trials (runtime/pretrial.py)
        self._routes = Routes(ops, served, self._handle, self._native_decide, self._kernels.native_failed,
                              native, self._room, self._attached, self.worker_log)
        # a process that can never load a kernel safely (the libstdc++ trap, see loadenv)
        # intercepts nothing, so the hook costs nothing (misses are not counted either)
        self._not_serving = None if native == "require" else cannot_load_reason()
        if self._not_serving:
            log.warning("aoti-farm hook serves nothing: %s", self._not_serving)
            self._routes.serve_nothing(self._not_serving)
        else:
            self._routes.start(self._servable_ops())
            if self._route_by_entries and self.gate.active and c.install_trial > 0 and self._routes.routed:
                # time the routed ops' kernels here first; unroute ops none of which won
                before = set(self._routes.routed)
                self.install_trial = pretrial.run(self, c.install_trial)
                self.gate.persist()
                self._routes.route(self._servable_ops(), at_once=True)
                self.install_trial["unrouted"] = sorted(before - set(self._routes.routed or ()))
        self._workers.watch_build(self._routes.build)
        self.install_seconds = self._routes.reg.install_seconds
        self._poller = Poller(float(poll_interval), self._index, self._writer, self._workers, self._room,
                              self._poll_step, wake)
        self._metrics = None
        if not self._not_serving:
            self._poller.start()
            self._writer.start()
            # the compile worker starts at the first miss, not here: its start-up (an
            # interpreter importing torch, seconds of a core) ran beside the program's first
            # requests in every served process, including those that never miss
        if settings.metrics is not None:
            self._metrics = metrics_mod.start_for_hook(self, settings.metrics)

    # -- routing ---------------------------------------------------------------------------------
    def _servable_ops(self) -> list[str] | None:
        """The ops to route: None (every requested op) unless ``on_miss="ignore"``, then
        the ops with at least one entry this hook could serve (see the module docstring)."""
        if not self._route_by_entries:
            return None
        if self.route == "paying":   # every requested op but those that cannot pay here
            eager = self._eager_ops - servable_ops(self._index, self._kernels.bad, self.gate) if self._eager_ops else set()
            return sorted(self._routes.requested() - losing_ops(self._index, self._kernels.bad, self.gate) - eager)
        ops = servable_ops(self._index, self._kernels.bad, self.gate)
        return sorted(ops & self._routes.requested())

    def _attached(self, nreg) -> None:
        """The native registration changed: native kernel ids of the old one are void."""
        if self._kernels.native is not None or nreg is not None:
            self._kernels.clear()
        self._kernels.native = nreg

    # -- the per-call path -----------------------------------------------------------------------
    def _fallback(self, info, reason: str) -> None:
        c = self.counters
        c.inc("calls")
        c.inc("fallbacks", reason)
        c.inc("per_op", info.name, "fallbacks")

    def _decide(self, info: S.OpInfo, args: tuple, kwargs: dict) -> tuple:
        """What to do with one call: ``("run", call, handle)`` with a loaded kernel (the
        caller runs it and counts the hit), ``("gated", call, settled)`` for a hit the speed
        gate runs eager (counted here), or ``("miss"|"failed", call)`` /
        ``("fallback", None[, reason])`` for eager (counted here; a miss is reported)."""
        try:
            if dispatch.requires_grad_input(args, kwargs):
                self._fallback(info, "requires_grad")
                return ("fallback", None)
            enc = S.encode_call(info, args, kwargs)
        except Ineligible as e:
            self._fallback(info, str(e))
            return ("fallback", None, str(e))   # the reason: the native path remembers it
        except Exception as e:  # noqa: BLE001 -- an odd argument is never the caller's problem
            self._fallback(info, f"unencodable: {type(e).__name__}")
            return ("fallback", None)
        call = self._calls.get(info, enc)
        if call is None:
            self._fallback(info, "device not served")
            return ("fallback", None)
        keys, bad = self._index[call.device].keys, self._kernels.bad
        exact = call
        if call.key not in keys or call.key in bad:   # exact first, then a shape class in range
            call = self._shapes.call_for(exact, keys, bad) or exact
            if call is exact and self._shapes.declined(exact.key):
                # a class covers it where it lost to eager: gated, not a miss (not queued)
                self.counters.inc("calls")
                self.counters.inc("gated")
                return ("gated", exact, True)
        if call.key in keys and call.key not in bad:
            handle = self._kernels.current(call.key)
            if handle is None:
                if call.missed:
                    # published while this process served it eagerly: verify and load it
                    # off the request path; eager serves until it is ready
                    self._kernels.load_soon(call)
                    return self._missed_call(info, call)
                handle = self._kernels.load(call)
            if handle is not None:
                # served only under what it was verified under (runtime/kernels.py)
                why = self._kernels.unservable(call, self._routes.bypassed)
                if why is not None:
                    self._fallback(info, why)
                    return ("fallback", None, why)   # the native key holds these values
            if handle is not None and self.gate.active:
                ok = self.gate.decision(call.key)
                if ok is None:   # timed in the gate's thread; eager meanwhile
                    trial.request(self.gate, self.cache, self.fps[call.device], call, handle, self._routes.bypassed)
                if not ok:   # a hit that runs eager
                    self.counters.inc("calls")
                    self.counters.inc("gate_pending" if ok is None else "gated")
                    return ("gated", call, ok is not None)
            if handle is not None:
                if call.missed:
                    call.missed = False
                    self.counters.inc("served_after_miss")
                    self._writer.first_hit(call.key)
                return ("run", call, handle)
        return self._missed_call(info, exact)

    def _missed_call(self, info: S.OpInfo, call: Call) -> tuple:
        c = self.counters
        c.inc("calls")
        if call.key in self._index[call.device].failed:
            c.inc("failed_signatures")
            c.inc("per_op", info.name, "fallbacks")
            return ("failed", call)
        c.inc("misses")
        c.inc("per_op", info.name, "misses")
        call.missed = True
        self._writer.report(call)
        return ("miss", call)

    def _handle(self, info: S.OpInfo, device: str, orig, keyset, args: tuple, kwargs: dict):
        """The pure-Python kernel (when the native hit path is not in use)."""
        self._room.follow()
        d = self._decide(info, args, kwargs)
        if d[0] == "run" and not isinstance(d[2], tuple):   # (a native kernel: this registration is going)
            call, runner = d[1], d[2]
            inputs = call.gather(args, kwargs)
            guards = self._kernels.guards.get(call.key)
            if guards and adversarial.violates(guards, inputs):
                # an index the kernel was not verified at: eager's own call (its error)
                self._fallback(info, "index guard: an index out of range")
                return dispatch.call_original(info, orig, keyset, args, kwargs)
            try:
                out = runner.run(inputs)
            except Exception as e:  # noqa: BLE001
                # eager's own error on these inputs is the caller's (it propagates, the
                # kernel stays); an error eager does not raise drops the kernel
                try:
                    res = dispatch.call_original(info, orig, keyset, args, kwargs)
                except Exception:
                    self._kernels.counters.inc("user_errors")
                    self.counters.inc("calls")
                    raise
                self._kernels.failed(call.key, e)
                self._missed_call(info, call)
                return res
            else:
                c = self.counters
                c.inc("calls")
                c.inc("hits")
                c.inc("per_op", info.name, "hits")
                return out[0] if info.n_returns == 1 else tuple(out)
        return dispatch.call_original(info, orig, keyset, args, kwargs)

    def _native_decide(self, nreg, info: S.OpInfo, device: str, args: tuple, kwargs: dict) -> int:
        """Native registration ``nreg``'s question about a call it has not seen (see
        runtime.native): one of its own kernel ids, or an eager code."""
        d = self._decide(info, args, kwargs)
        if d[0] == "run":
            h = d[2]   # (registration, id); another registration's id is not this one's
            return h[1] if isinstance(h, tuple) and h[0] is nreg else nreg.mod.EAGER_ONCE
        return native_code(nreg.mod, d, self._ineligible_ids)

    # -- background ------------------------------------------------------------------------------
    def _queued(self, call: Call, explain) -> None:
        """A miss was written to the queue (the miss writer's thread)."""
        if self.on_miss == "compile":
            self._workers.ensure(call.device)
        if explain is not None:
            with self._routes.bypassed():   # its own calls never enter this hook (re-entrancy guard)
                explain(call)

    def _refresh(self, device: str) -> None:
        added, removed, n = self._index[device].refresh()
        self.counters.inc("rescans", n=n)
        self._kernels.removed(removed)
        if n:
            self._shapes.changed()
            if self._kernels.native is not None:
                # the index changed: calls remembered as eager are decided again
                self._kernels.native.forget_eager()
            self._kernels.retry_replaced(device)

    def _poll_step(self) -> None:
        try:
            self._routes.switch_if_built()
        except Exception as e:  # noqa: BLE001
            log.warning("switching to the native hit path failed: %s", e)
            self._routes.mode = "off"
        for d in list(self._index):
            try:
                self._refresh(d)
            except Exception as e:  # noqa: BLE001
                log.debug("poll failed: %s", e)
                self.counters.inc("poll_errors")
        if self._reroute:
            try:
                self._routes.route(self._servable_ops())
            except Exception as e:  # noqa: BLE001 -- routing stays as it was
                log.warning("re-routing failed: %s", e)
        if self._writer.outstanding:
            devices = self._writer.prune(self._index)
            if self.on_miss == "compile":
                # a worker that went idle just as this process queued a miss has exited
                for d in devices:
                    try:
                        self._workers.ensure(d)
                    except Exception as e:  # noqa: BLE001
                        log.debug("worker check failed: %s", e)

    # -- public ----------------------------------------------------------------------------------
    @property
    def worker(self):
        """The compile worker process last started (None if never)."""
        return self._workers.last

    @property
    def ops(self) -> list[str]:
        """The ops routed through the hook now."""
        return list(self._routes.reg.ops)

    def stats(self) -> dict:
        """Every counter (see ``runtime/hookstats.py``)."""
        return merged_stats(self)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every reported miss has been written to the miss queue."""
        self._writer.flush(timeout)

    def uninstall(self, stop_worker: bool = False) -> None:
        """Restore eager kernels, write pending misses, stop the threads (idempotent).

        The compile worker keeps running until idle unless ``stop_worker``."""
        if self._poller.stopping.is_set():
            return
        # stats() after uninstall (the stats written at exit) describe the hook as it served
        self.served_as = {"routed_ops": len(self.ops), "native_active": self._routes.nreg is not None}
        self._keep_op_outcomes()
        self._routes.uninstall()
        self._poller.stop()
        self._writer.close()
        self._room.close()
        self.gate.close()
        if self._metrics is not None:
            self._metrics.close()
        self._kernels.clear()
        if stop_worker:
            self._workers.stop()

    def _keep_op_outcomes(self) -> None:
        """Keep in this host's memo which routed ops ran every call eager (route="paying"
        leaves them unrouted next time, see ``aoti_farm/speedgate/hostgate.py``).  Never raises."""
        if self.route != "paying" or not self.gate.active or self._not_serving or len(self.fps) != 1:
            return
        try:
            recs = hostgate.op_records(self.stats()["per_op"], self._threads)
            (fp,) = self.fps.values()
            hostgate.save(fp.id, self.cache.root, {}, ops=recs)
        except Exception as e:  # noqa: BLE001 -- a memo is an optimisation
            log.debug("keeping op outcomes: %s", e)

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()


@settings_mod.refusing_unknown_names
def install(cache_dir: str | os.PathLike | None = None, ops: Iterable | None = None,
            devices: Iterable[str] | None = None, on_miss: str | None = None, *, serve: str | None = None,
            route: str | None = None, contract: str | None = None, signing_key_file: str | None = None,
            config: str | None = None, settings: Settings | None = None) -> Hook:
    """Install the serving hook; see the module docstring.  ``uninstall()`` or use as a
    context manager.  The common settings are keywords; every setting (these too) is a
    field of :class:`Settings` (``install(settings=Settings(native="off", ...))``); a
    keyword and ``settings`` giving one setting different values is an error.  Settings
    left None are resolved as ``aoti-farm run`` resolves them: environment, then the TOML
    file (``config``, else ``$AOTI_FARM_CONFIG``), then the defaults
    (``runtime/settings.py``, ``docs/settings.md``, ``docs/hook.md``); bad arguments,
    and names install() does not take (a retired setting, a ``Settings`` field given as a
    keyword), raise :class:`UserError` naming the argument."""
    s = settings_mod.merge(settings, cache_dir=cache_dir, ops=ops, devices=devices, on_miss=on_miss, serve=serve,
                           route=route, contract=contract, signing_key_file=signing_key_file, config=config)
    return Hook(settings_mod.resolve(s))
