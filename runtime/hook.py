"""The serving hook: serve cached AOTInductor kernels for eager aten calls, never block.

``install(...) -> Hook`` registers a Python kernel on every served op (see
:mod:`aoti_farm.runtime.dispatch`).  Per call:

1. ``encode_call`` normalises the call (``Ineligible`` -> eager, counted by reason; so is
   a tensor input that requires grad while grad mode is on).
2. ``(op, encoding)`` -> a memoised :class:`_Call` holding the signature key.
3. Key published under the device's fingerprint -> **hit**: the kernel is loaded on first
   use (``Cache.open_entry`` walks to the entry without following links, checks owners and
   modes, reads the manifest bounded, verifies fingerprint, HMAC and sha256 into a sealed
   private copy, and ``load_runner`` dlopens that copy, never the shared file) and run; no lock is held while it runs.  A ``BadEntry`` is
   counted (``foreign`` or ``integrity_failures``), dropped from the index, queued again,
   and the call returns eager's result.
4. Otherwise **miss**: eager's result is returned at once; a background thread writes the
   signature to the shared miss queue (``missq.enqueue`` dedups across processes) and,
   with ``on_miss="compile"``, starts a low-priority compile worker process
   (``python -m aoti_farm.runtime.compile_worker``, niced 19, spawned not forked) that
   drains the queue and exits when idle.  ``on_miss="queue"`` only queues (for
   ``aoti-farm serve``), ``"ignore"`` does neither.

Hot reload: a daemon thread stats the 256 shard directories of ``<fp>/entries/`` and
``<fp>/failed/`` every ``poll_interval`` seconds and rescans only shards whose
``(mtime_ns, nlink)`` changed; new entries become hits, removed ones stop being served.

Nothing the cache, the queue or a kernel does raises into the caller: every such error is
counted and the call returns eager's result.  Counters: :class:`HookStats`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

from aoti_farm import missq
from aoti_farm import signature as S
from aoti_farm.cache import BadEntry, Cache
from aoti_farm import loadenv
from aoti_farm.compiler import flat_tensors, load_runner
from aoti_farm.errors import Ineligible, UserError
from aoti_farm.fingerprint import Fingerprint, fingerprint
from aoti_farm.runtime import dispatch
from aoti_farm.runtime import metrics as metrics_mod
from aoti_farm.runtime import native as native_mod
from aoti_farm.runtime.compile_worker import BUSY_EVENTS, read_events
from aoti_farm.runtime.room import ThreadRoom, lowest_priority
from aoti_farm.runtime import gate as gate_mod
from aoti_farm.runtime.shapeserve import ShapeIndex

log = logging.getLogger("aoti_farm.hook")

#: Most distinct (op, encoding) pairs memoised; beyond, keys are computed per call.
MEMO_LIMIT = 65536
#: In-process queue of signatures waiting to be written to the miss queue.
PENDING_LIMIT = 4096
#: Seconds a compile worker waits for new queue items before it exits.
WORKER_IDLE_SECONDS = 60.0
#: Seconds between looks at the compile worker's log while it runs.
WATCH_INTERVAL = 0.05
#: Most shards watched one by one for misses this process waits for (more: the poll).
WATCH_SHARDS = 32
#: For how long after this process last queued a miss its shards are watched so.
WATCH_QUEUED_SECONDS = 300.0


@dataclass
class OpCounts:
    hits: int = 0
    misses: int = 0
    fallbacks: int = 0


@dataclass
class HookStats:
    """Named counters of one hook.  ``stats()`` returns them as a dict."""

    calls: int = 0                    # calls that reached the hook (not re-entrant ones)
    hits: int = 0                     # served by a cached kernel
    misses: int = 0                   # eligible, not (yet) in the cache: eager
    failed_signatures: int = 0        # calls whose signature has a failure record: eager
    fallbacks: dict = field(default_factory=dict)   # ineligible calls by reason: eager
    queued: int = 0                   # signatures this process added to the miss queue
    queue_dedup: int = 0              # signatures already in the miss queue
    queue_dropped: int = 0            # dropped: the in-process pending queue was full
    queue_errors: int = 0             # the miss queue could not be written (cache RO/full/gone)
    served_after_miss: int = 0        # signatures missed earlier in this process, now hits
    kernels_loaded: int = 0           # kernels verified and loaded
    kernels_dropped: int = 0          # loaded kernels dropped because their entry went away
    load_errors: int = 0              # load_runner failed on a verified entry
    load_unsafe: int = 0              # not loaded: the host needs the libstdc++ preload (loadenv)
    kernel_errors: int = 0            # a loaded kernel raised while running: eager
    integrity_failures: int = 0       # entries refused by verification (not foreign)
    integrity_failures_by_kind: dict = field(default_factory=dict)
    foreign: int = 0                  # entries built under another fingerprint
    rescans: int = 0                  # shard directories rescanned by the poller
    poll_errors: int = 0
    workers_started: int = 0          # background compile worker processes started
    worker_errors: int = 0            # a compile worker could not be started
    gated: int = 0                    # cache hits the speed gate ran eager (runtime/gate.py)
    gate_pending: int = 0             # cache hits run eager while this host timed the kernel
    per_op: dict = field(default_factory=dict)      # op -> OpCounts
    miss_explained: dict = field(default_factory=dict)  # first misses by explain's category (explain_misses)


@dataclass
class _Call:
    """What the hook knows about one (op, encoding)."""

    sig: S.Signature
    key: str
    device: str
    missed: bool = False
    gather: Any = None                # (args, kwargs) -> runner inputs, built once per signature


def _gatherer(sig: S.Signature):
    """A function building the runner's inputs for calls of ``sig`` (the same list as
    ``compiler.flat_tensors``), specialised once: the hit path then skips the schema walk."""
    pos = S.tensor_positions(sig)
    info = sig.info()
    if all(j is None and not info.kwarg_only[i] for i, j in pos):
        idx = [i for i, _ in pos]
        if idx == list(range(len(idx))):
            n = len(idx)
            return lambda args, kwargs: list(args[:n])
        return lambda args, kwargs: [args[i] for i in idx]
    return lambda args, kwargs: flat_tensors(sig, args, kwargs)


class _Index:
    """Published and failed keys of one fingerprint namespace, kept fresh by shard stats."""

    def __init__(self, cache: Cache, fp: Fingerprint):
        self.cache, self.fp = cache, fp
        self.keys: set[str] = set()
        self.failed: set[str] = set()
        self._stats: dict[tuple[str, str], tuple[int, int]] = {}
        self._shard: dict[tuple[str, str], set[str]] = {}

    def _dir(self, which: str) -> str:
        return str(self.cache.root / self.fp.id / which)

    def refresh(self) -> tuple[set[str], set[str], int]:
        """Rescan changed shards; returns (added keys, removed keys, shards rescanned)."""
        added: set[str] = set()
        removed: set[str] = set()
        n = 0
        for which, target in (("entries", self.keys), ("failed", self.failed)):
            base = self._dir(which)
            try:
                shards = {e.name: e.path for e in os.scandir(base) if len(e.name) == 2}
            except (FileNotFoundError, NotADirectoryError):
                shards = {}
            for sk in [k for k in self._stats if k[0] == which and k[1] not in shards]:
                gone = self._shard.pop(sk, set())
                self._stats.pop(sk, None)
                target.difference_update(gone)
                if which == "entries":
                    removed |= gone
            for name, path in shards.items():
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                sig = (st.st_mtime_ns, st.st_nlink)
                sk = (which, name)
                if self._stats.get(sk) == sig:
                    continue
                try:
                    names = os.listdir(path)
                except OSError:
                    continue
                self._stats[sk] = sig
                n += 1
                if which == "entries":
                    now = {x for x in names if len(x) == 64}
                else:
                    now = {x[:-8] for x in names if x.endswith(".msgpack") and len(x) == 72}
                before = self._shard.get(sk, set())
                self._shard[sk] = now
                target.difference_update(before - now)
                target.update(now)
                if which == "entries":
                    added |= now - before
                    removed |= before - now
        return added, removed, n

    def shards_changed(self, names: Iterable[str]) -> bool:
        """Whether any of these shards (``key[:2]``) changed since the last refresh: a few
        stats, for watching the keys this process is waiting for."""
        for which in ("entries", "failed"):
            base = self._dir(which)
            for name in names:
                try:
                    st = os.stat(os.path.join(base, name))
                except OSError:
                    continue   # not there (yet): nothing published in it
                if self._stats.get((which, name)) != (st.st_mtime_ns, st.st_nlink):
                    return True
        return False


class Hook:
    """An installed serving hook.  Use :func:`install`."""

    def __init__(self, cache_dir=None, ops=None, devices=("cpu", "cuda"), on_miss="compile",
                 poll_interval=1.0, signing_key=None, allow_insecure=False, inductor_options=None,
                 worker_log: str | None = None, worker_idle: float = WORKER_IDLE_SECONDS,
                 native: str = "auto", yield_core: bool = True, metrics_port: int | None = None,
                 explain_misses: bool | None = None, serve: str | None = None):
        if native not in ("auto", "off", "require"):
            raise UserError(f"native: {native!r} is not one of auto, off, require")
        if native_mod.disabled():
            native = "off"
        if on_miss not in ("compile", "queue", "ignore"):
            raise UserError(f"on_miss: {on_miss!r} is not one of compile, queue, ignore")
        if not poll_interval or poll_interval <= 0:
            raise UserError(f"poll_interval: {poll_interval!r} must be a positive number of seconds")
        self.on_miss = on_miss
        self.poll_interval = float(poll_interval)
        self.inductor_options = dict(inductor_options or {})
        key = signing_key.encode() if isinstance(signing_key, str) else signing_key
        self.cache = (Cache(cache_dir, allow_insecure=allow_insecure) if key is None
                      else Cache(cache_dir, signing_key=key, allow_insecure=allow_insecure))
        self.worker_log = worker_log or os.path.join(tempfile.gettempdir(), f"aoti-farm-worker-{os.getpid()}.log")
        self.worker_idle = worker_idle
        self.c = HookStats()
        self._lock = threading.Lock()             # counters, memo, loads bookkeeping
        self._load_locks: dict[str, threading.Lock] = {}
        self._memo: dict[tuple, _Call] = {}
        self._runners: dict[str, Any] = {}
        self._bad: dict[str, tuple] = {}          # key -> (device, entry dir stat) when refused
        self._reported: set[str] = set()          # keys handed to the miss writer
        self._loading: set[str] = set()           # keys queued for the background loader
        self._outstanding: dict[str, str] = {}    # queued misses not yet published/failed -> device
        self._loads_in_background = True
        self._pending: queue.Queue = queue.Queue(maxsize=PENDING_LIMIT)
        self._stop = threading.Event()
        self._wake = threading.Event()            # a miss was queued or a worker started: look now
        self._worker: subprocess.Popen | None = None   # the last one started
        self._workers: dict[str, subprocess.Popen] = {}  # per device
        self._worker_lock = threading.Lock()
        self._worker_retry_at = 0.0
        self._nreg: native_mod.NativeRegistration | None = None
        self._native_mode = native
        self._native_build: subprocess.Popen | None = None
        self._native_error: str | None = None
        self._native_final: dict | None = None    # the native counters at uninstall
        self._room = ThreadRoom(bool(yield_core))   # fewer intra-op threads while compiling
        try:   # serve a kernel only where it is faster than eager (runtime/gate.py)
            self._gate = gate_mod.Gate(serve or gate_mod.policy_from_env())
        except ValueError as e:
            raise UserError(f"{e}; use serve='faster' (default) or 'always'") from None
        self._wstate: dict[int, str] = {}         # worker pid -> its last event
        self._last_queued = 0.0                   # monotonic time of the last queued miss
        self._log_pos, self._log_partial = max(self._log_size(), 0), b""
        # observability (runtime/metrics.py): first-miss times, miss->hit latency, explain
        self._miss_t: dict[str, float] = {}       # key -> monotonic time of its first miss here
        self._miss_hist = metrics_mod.LatencyHistogram()
        self._pending_done_s = 0.0                # closed first-miss -> first-hit windows
        self._explain = metrics_mod.explain_enabled(explain_misses)
        self._explainer = None
        self._metrics = None

        served = [d for d in devices if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]
        bad = [d for d in devices if d not in ("cpu", "cuda")]
        if bad:
            raise UserError(f"devices: {bad[0]!r} is not 'cpu' or 'cuda'")
        self.fps: dict[str, Fingerprint] = {d: fingerprint(d, self.inductor_options) for d in served}
        if on_miss != "ignore":  # a fresh cache: create it so misses can be queued
            for fp in self.fps.values():
                try:
                    self.cache.ensure(fp)
                except Exception as e:  # noqa: BLE001 -- read-only or full: misses are not queued
                    log.warning("cache %s: %s", self.cache.root, e)
        self._index = {d: _Index(self.cache, fp) for d, fp in self.fps.items()}
        self._shapes = ShapeIndex(self.cache, self.fps, _Call, gated=self._gate.active)   # runtime/shapeserve.py
        for d in self._index:
            self._refresh(d)
        self._ops_arg, self._served = ops, served
        self._reg: Any = None
        self._not_serving: str | None = None
        self._ineligible_ids: dict[str, int] = {}   # fallback reason -> the native path's id
        try:
            if native == "require":
                self._require_native()
            elif not loadenv.load_safe():
                # No kernel can ever be loaded into this process (the libstdc++ trap, see
                # loadenv): intercept nothing, so the hook costs nothing.  Misses are not
                # counted or queued either (that would need every call intercepted).
                self._not_serving = self._native_error = (
                    "this process cannot load AOTI kernels safely: start it with "
                    f"LD_PRELOAD={loadenv.system_libstdcxx()} (aoti-farm run does)")
                log.warning("aoti-farm hook serves nothing: %s", self._not_serving)
                for d in served:  # bad `ops` are still an error
                    dispatch.resolve_ops(ops, d)
                self._reg = _NoRegistration()
            elif native == "auto" and not self._try_native():
                if native_mod.error() and native_mod.error().startswith("not built"):
                    self._native_build = native_mod.build_in_background(self.worker_log)
            if self._reg is None:
                self._reg = dispatch.Registration(ops, self._handle, served)
        except ValueError as e:
            raise UserError(f"ops: {e}") from None
        self.install_seconds = self._reg.install_seconds
        self._threads = [] if self._not_serving else [
            threading.Thread(target=self._poll_loop, name="aoti-farm-poll", daemon=True),
            threading.Thread(target=self._writer_loop, name="aoti-farm-missq", daemon=True)]
        for t in self._threads:
            t.start()
        if on_miss == "compile" and "cpu" in self.fps and not self._not_serving:
            # a warm worker (torch imported, idle at the lowest priority) compiles the first
            # miss without the interpreter start-up; it exits after ``worker_idle`` seconds
            self._pending.put(_Start("cpu"))
        port = metrics_mod.port_setting(metrics_port)
        if port is not None:
            self._metrics = metrics_mod.start_for_hook(self, port)

    # -- the native hit path ------------------------------------------------------------------
    def _try_native(self) -> bool:
        """Register the native kernels if the extension is built and loads; never raises
        for a missing or broken extension (the reason is in ``stats()["native"]``)."""
        mod = native_mod.load()
        if mod is None:
            self._native_error = native_mod.error()
            return False
        try:
            nreg = native_mod.NativeRegistration(mod, self._ops_arg, self._native_decide, self._native_error_cb,
                                                 self._served)
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001
            self._native_error = f"registration failed: {type(e).__name__}: {e}"
            return False
        self._nreg = nreg
        self._reg = nreg
        self._native_error = None
        try:
            self._room.attach_native(mod)
        except Exception as e:  # noqa: BLE001 -- serving goes on without the thread limit
            log.warning("native thread limit: %s", e)
        return True

    def _require_native(self) -> None:
        try:
            native_mod.build()
        except Exception as e:  # noqa: BLE001
            raise UserError(f"native=require: {e}; use native='auto' to serve from Python meanwhile") from None
        if not self._try_native():
            raise UserError(f"native=require: {self._native_error}; use native='auto' to serve from Python")

    def _switch_to_native(self) -> None:
        """Called by the poller once a background build has finished: swap the Python
        kernels for native ones (calls in between get eager's result)."""
        if self._native_build is not None and self._native_build.poll() is None:
            return
        self._native_build = None
        if not native_mod.library_path().exists():
            self._native_mode = "off"  # the build failed; its log is the worker log
            self._native_error = "background build failed (see the worker log)"
            return
        old = self._reg
        old.uninstall()
        with self._lock:
            self._runners.clear()  # Python runners; native ones are loaded on demand
        try:
            ok = self._try_native()
        except Exception as e:  # noqa: BLE001 -- never leave the ops unserved
            self._native_error = f"registration failed: {type(e).__name__}: {e}"
            ok = False
        if not ok:
            self._reg = dispatch.Registration(self._ops_arg, self._handle, self._served)
        self._native_mode = "active" if self._nreg is not None else "off"

    # -- the per-call path ---------------------------------------------------------------------
    def _count_op(self, name: str, what: str) -> None:
        oc = self.c.per_op.get(name)
        if oc is None:
            oc = self.c.per_op[name] = OpCounts()
        setattr(oc, what, getattr(oc, what) + 1)

    def _fallback(self, info, reason: str) -> None:
        with self._lock:
            self.c.calls += 1
            self.c.fallbacks[reason] = self.c.fallbacks.get(reason, 0) + 1
            self._count_op(info.name, "fallbacks")

    def _decide(self, info: S.OpInfo, args: tuple, kwargs: dict) -> tuple:
        """What to do with one call: ``("run", call, handle)`` with a loaded kernel (the
        caller runs it and counts the hit), ``("gated", call, settled)`` for a hit the speed
        gate runs eager (counted here), or ``("miss"|"failed", call)`` /
        ``("fallback", None)`` for eager (counted here; a miss is reported)."""
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
        call = self._memo.get((info.name, enc))
        if call is None:
            call = self._new_call(info, enc)
        if call is None:
            self._fallback(info, "device not served")
            return ("fallback", None)
        index = self._index[call.device]
        exact = call
        if call.key not in index.keys or call.key in self._bad:   # exact first, then a shape class in range
            call = self._shapes.call_for(exact, index.keys, self._bad) or exact
        if call.key in index.keys and call.key not in self._bad:
            handle = self._runners.get(call.key)
            if handle is None or isinstance(handle, int) != (self._nreg is not None):
                if call.missed and self._loads_in_background:
                    # published while this process served it eagerly: verify and load it
                    # off the request path; eager serves until it is ready
                    self._load_soon(call)
                    return self._missed_call(info, call)
                handle = self._load(call)
            if handle is not None and self._gate.active:
                ok = self._gate.decision(call.key)
                if ok is None:   # timed in the gate's thread; eager meanwhile
                    self._gate_request(call, handle)
                if not ok:   # a hit that runs eager
                    with self._lock:
                        self.c.calls += 1
                        if ok is None:
                            self.c.gate_pending += 1
                        else:
                            self.c.gated += 1
                    return ("gated", call, ok is not None)
            if handle is not None:
                if call.missed:
                    with self._lock:
                        call.missed = False
                        self.c.served_after_miss += 1
                        t0 = self._miss_t.pop(call.key, None)   # once per signature, not per call
                        if t0 is not None:
                            dt = time.monotonic() - t0
                            self._miss_hist.observe(dt)
                            self._pending_done_s += dt
                return ("run", call, handle)
        return self._missed_call(info, exact)

    def _missed_call(self, info: S.OpInfo, call: _Call) -> tuple:
        with self._lock:
            self.c.calls += 1
            if call.key in self._index[call.device].failed:
                self.c.failed_signatures += 1
                self._count_op(info.name, "fallbacks")
                report = False
                what = "failed"
            else:
                self.c.misses += 1
                self._count_op(info.name, "misses")
                call.missed = True
                report = call.key not in self._reported
                if report:
                    self._reported.add(call.key)
                    self._miss_t.setdefault(call.key, time.monotonic())
                what = "miss"
        if report:
            self._report(call)
        return (what, call)

    def _handle(self, info: S.OpInfo, device: str, orig, keyset, args: tuple, kwargs: dict):
        """The pure-Python kernel (when the native hit path is not in use)."""
        self._room.follow()
        d = self._decide(info, args, kwargs)
        if d[0] == "run":
            call, runner = d[1], d[2]
            try:
                out = runner.run(call.gather(args, kwargs))
            except Exception as e:  # noqa: BLE001
                self._kernel_failed(call.key, e)
                self._missed_call(info, call)
            else:
                with self._lock:
                    self.c.calls += 1
                    self.c.hits += 1
                    self._count_op(info.name, "hits")
                return out[0] if info.n_returns == 1 else tuple(out)
        return dispatch.call_original(info, orig, keyset, args, kwargs)

    def _native_decide(self, info: S.OpInfo, device: str, args: tuple, kwargs: dict) -> int:
        """The native path's question about a call it has not seen (see runtime.native)."""
        mod = self._nreg.mod
        d = self._decide(info, args, kwargs)
        if d[0] == "run":
            return d[2]
        if d[0] == "gated" and d[2] and hasattr(mod, "EAGER_GATED"):
            return mod.EAGER_GATED   # remembered: later calls run eager without asking
        if d[0] == "fallback" and len(d) > 2 and hasattr(mod, "EAGER_INELIGIBLE_BASE"):
            # Ineligible follows from the call's metadata, which the native key holds in
            # full: remembered, later calls run eager without asking (counted per reason)
            rid = self._ineligible_ids.get(d[2])
            if rid is None and len(self._ineligible_ids) < mod.INELIGIBLE_REASONS:
                rid = self._ineligible_ids.setdefault(d[2], len(self._ineligible_ids))
            if rid is not None:
                return mod.EAGER_INELIGIBLE_BASE - rid
        return mod.EAGER_MISS if d[0] == "miss" else mod.EAGER_FAILED if d[0] == "failed" else mod.EAGER_ONCE

    def _gate_request(self, call: _Call, handle) -> None:
        """Have the speed gate time this kernel against eager in its own thread: the
        manifest's compile-time speed, then both on fresh inputs of the signature, with
        this hook bypassed in that thread (runtime/gate.py)."""
        opened: list = []

        def speed():
            e = self.cache.open_entry(self.fps[call.device], call.key, private=isinstance(handle, int))
            sp = e.manifest.get("speed")
            r = gate_mod.compile_ratio(sp)
            if isinstance(handle, int) and r is not None and r <= self._gate.ratio:
                opened.append(e)   # its private copy is loaded for the trial
            else:
                e.close()
            return sp

        def trial():
            try:
                runner = handle
                if isinstance(handle, int):   # a native kernel: time a Python runner of the same bytes
                    runner = load_runner(opened[0].load_path, "cuda:0" if call.device == "cuda" else "cpu")
            finally:
                for e in opened:
                    e.close()
            args, kwargs = S.materialize(call.sig, seed=0)
            tensors = flat_tensors(call.sig, args, kwargs)
            op = S.resolve_op(call.sig.op)
            return (lambda: runner.run(tensors)), (lambda: op(*args, **kwargs)), call.device, self._bypassed()

        self._gate.request(call.key, speed, trial)

    @contextlib.contextmanager
    def _bypassed(self):
        """This thread's calls of served ops go straight to eager (no hit, miss or count)."""
        nreg, reg = self._nreg, self._reg
        if nreg is not None:
            prev = nreg.mod.set_inside(True)
            try:
                yield
            finally:
                nreg.mod.set_inside(prev)
        else:
            tls = reg._tls
            prev = getattr(tls, "active", False)
            tls.active = True
            try:
                yield
            finally:
                tls.active = prev

    def _native_error_cb(self, kernel_id: int, message: str) -> None:
        with self._lock:
            key = next((k for k, h in self._runners.items() if h == kernel_id and isinstance(h, int)), None)
        if key is not None:
            self._kernel_failed(key, RuntimeError(message))
        elif self._nreg is not None:
            self._nreg.unload(kernel_id)

    def _kernel_failed(self, key: str, e: BaseException) -> None:
        log.warning("kernel %s raised %s; dropped, serving eager until its entry changes",
                    key[:12], (str(e).splitlines() or [type(e).__name__])[0][:200])
        call_device = next((d for d, idx in self._index.items() if key in idx.keys), None)
        with self._lock:
            self.c.kernel_errors += 1
            # never retry a kernel that failed: eager until the entry is replaced
            handle = self._runners.pop(key, None)
            self._bad[key] = (call_device, self._entry_stat(call_device, key) if call_device else None)
        self._release(handle)

    def _release(self, handle) -> None:
        if isinstance(handle, int) and self._nreg is not None:
            try:
                self._nreg.unload(handle)
            except Exception:  # noqa: BLE001
                pass

    def _new_call(self, info: S.OpInfo, enc: tuple) -> _Call | None:
        sig = S.Signature(info.name, enc)
        device = sig.device
        if device not in self._index:
            return None
        call = _Call(sig, sig.key, device, gather=_gatherer(sig))
        if len(self._memo) < MEMO_LIMIT:
            self._memo[(info.name, enc)] = call
        return call

    def _report(self, call: _Call) -> None:
        if self.on_miss == "ignore":
            return
        try:
            self._pending.put_nowait(call)
        except queue.Full:
            with self._lock:
                self.c.queue_dropped += 1
                self._reported.discard(call.key)

    def _load(self, call: _Call):
        """Verify and load the kernel of ``call`` (once; concurrent callers wait)."""
        with self._lock:
            lk = self._load_locks.setdefault(call.key, threading.Lock())
        with lk:
            nreg = self._nreg
            runner = self._runners.get(call.key)
            if runner is not None and isinstance(runner, int) == (nreg is not None):
                return runner
            if call.key in self._bad:
                return None   # refused while this thread waited: not verified again
            fp = self.fps[call.device]
            if not loadenv.load_safe():
                # This host needs libstdc++ preloaded to load AOTI libraries and this
                # process was started without it: loading would crash the caller.
                with self._lock:
                    self.c.load_unsafe += 1
                return None
            try:
                # verified bytes in a sealed private copy: the library loaded is exactly
                # what was hashed, whatever happens to the shared file meanwhile
                entry = self.cache.open_entry(fp, call.key, private=True)
            except BadEntry as e:
                self._refused(call, e)
                return None
            except Exception as e:  # noqa: BLE001 -- a vanished or odd cache is a miss
                log.warning("cannot open entry %s: %s", call.key[:12], e)
                with self._lock:
                    self.c.load_errors += 1
                return None
            device = "cuda:0" if call.device == "cuda" else "cpu"
            try:
                runner = nreg.load(entry.load_path, device) if nreg is not None else load_runner(entry.load_path, device)
            except Exception as e:  # noqa: BLE001
                log.warning("cannot load kernel %s: %s", call.key[:12], e)
                with self._lock:
                    self.c.load_errors += 1
                    self._bad[call.key] = (call.device, self._entry_stat(call.device, call.key))
                return None
            finally:
                entry.close()
            self.cache.touch_used(entry)
            with self._lock:
                old = self._runners.get(call.key)
                self._runners[call.key] = runner
                self.c.kernels_loaded += 1
            if old is not None:
                self._release(old)
            return runner

    def _load_soon(self, call: _Call) -> None:
        with self._lock:
            if call.key in self._loading:
                return
            self._loading.add(call.key)
        try:
            self._pending.put_nowait(_Load(call))
        except queue.Full:
            with self._lock:
                self._loading.discard(call.key)

    def _background_load(self, call: _Call) -> None:
        try:
            self._load(call)
        finally:
            with self._lock:
                self._loading.discard(call.key)
            if self._nreg is not None:
                self._nreg.forget_eager()   # the remembered miss is decided again: a hit

    def _entry_stat(self, device: str, key: str):
        try:
            st = os.stat(self.cache.entry_dir(self.fps[device].id, key))
            return (st.st_ino, st.st_mtime_ns)
        except OSError:
            return None

    def _refused(self, call: _Call, e: BadEntry) -> None:
        log.warning("refusing cache entry %s: %s", call.key[:12], e)
        st = self._entry_stat(call.device, call.key)
        with self._lock:
            if e.kind == "foreign":
                self.c.foreign += 1
            elif st is not None:  # the entry is there but bad (not merely removed meanwhile)
                self.c.integrity_failures += 1
                by = self.c.integrity_failures_by_kind
                by[e.kind] = by.get(e.kind, 0) + 1
            self._bad[call.key] = (call.device, st)
            self._index[call.device].keys.discard(call.key)
            self._reported.add(call.key)
        # queued again: a good kernel replaces it (after `cache verify --repair`)
        self._report(call)

    # -- background threads ----------------------------------------------------------------------
    def _refresh(self, device: str) -> None:
        idx = self._index[device]
        added, removed, n = idx.refresh()
        dropped = []
        with self._lock:
            self.c.rescans += n
            for k in removed:
                h = self._runners.pop(k, None)
                if h is not None:
                    self.c.kernels_dropped += 1
                    dropped.append(h)
        for h in dropped:
            self._release(h)
        if n:
            self._shapes.changed()
        if n and self._nreg is not None:
            # the index changed: calls remembered as eager are decided again
            self._nreg.forget_eager()
        if n:  # a refused entry that was replaced (new directory) is tried again
            for k, (dev, st) in list(self._bad.items()):
                if dev == device and self._entry_stat(dev, k) != st:
                    self._bad.pop(k, None)

    def _wait_poll(self) -> bool:
        """Sleep until the next poll; False when stopping.  While this hook's compile
        worker (or native build) runs, its log is followed every 50 ms: an outcome there
        rescans the index at once instead of up to ``poll_interval`` later, and the
        worker's busy/idle events set the thread limit (see :mod:`.room`)."""
        deadline = time.monotonic() + self.poll_interval
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if not self._watching():
                # the last lines of a worker that just exited (its last outcome)
                if self._log_size() not in (-1, self._log_pos) and self._watch():
                    return True
                self._room.set_compiles(0)
                waiting = self._waiting_shards()
                if waiting is None:
                    self._wake.wait(left)
                    self._wake.clear()
                    if self._stop.is_set():
                        return False
                    continue
                # misses this process queued for someone else's compile (on_miss="queue",
                # another process's worker, `aoti-farm serve`): watch their shards
                if self._stop.wait(min(left, WATCH_INTERVAL)):
                    return False
                if any(self._index[d].shards_changed(names) for d, names in waiting.items() if d in self._index):
                    return True
                continue
            if self._stop.wait(min(left, WATCH_INTERVAL)):
                return False
            if self._watch():
                return True

    def _waiting_shards(self) -> dict[str, set[str]] | None:
        """Per device, the shards of the misses this process queued and still waits for;
        None when there are none, too many to watch one by one, or they were queued long
        ago (then the regular poll looks)."""
        with self._lock:
            if not self._outstanding or time.monotonic() - self._last_queued > WATCH_QUEUED_SECONDS:
                return None
            out: dict[str, set[str]] = {}
            for k, d in self._outstanding.items():
                out.setdefault(d, set()).add(k[:2])
        return None if sum(map(len, out.values())) > WATCH_SHARDS else out

    def _watching(self) -> bool:
        nb = self._native_build
        return (nb is not None and nb.poll() is None) or any(w.poll() is None for w in list(self._workers.values()))

    def _watch(self) -> bool:
        """Read the worker log's new events; set the thread limit from what runs now.
        True when a compile ended (the index may have changed)."""
        events, self._log_pos, self._log_partial = read_events(self.worker_log, self._log_pos, self._log_partial)
        ended = False
        for ev in events:
            pid, what = ev.get("pid"), ev.get("event")
            if isinstance(pid, int) and isinstance(what, str):
                self._wstate[pid] = what
            ended = ended or what in ("outcome", "error", "bad-item", "idle-exit")
        self._room.set_compiles(self._compiles_now())
        return ended

    def _compiles_now(self) -> int:
        n = sum(1 for w in list(self._workers.values())
                if w.poll() is None and self._wstate.get(w.pid, "start") in BUSY_EVENTS)
        nb = self._native_build
        return n + (nb is not None and nb.poll() is None)

    def _log_size(self) -> int:
        try:
            return os.stat(self.worker_log).st_size
        except OSError:
            return -1

    def _poll_loop(self) -> None:
        while self._wait_poll():
            if self._nreg is None and self._native_mode == "auto" and self._native_build is not None:
                try:
                    self._switch_to_native()
                except Exception as e:  # noqa: BLE001
                    log.warning("switching to the native hit path failed: %s", e)
                    self._native_mode = "off"
            for d in list(self._index):
                try:
                    self._refresh(d)
                except Exception as e:  # noqa: BLE001
                    log.debug("poll failed: %s", e)
                    with self._lock:
                        self.c.poll_errors += 1
            if self._outstanding:
                self._prune_outstanding()
                if self.on_miss == "compile" and self._outstanding:
                    try:
                        self._check_workers()
                    except Exception as e:  # noqa: BLE001
                        log.debug("worker check failed: %s", e)

    def _writer_loop(self) -> None:
        while True:
            call = self._pending.get()
            if call is None:
                return
            if isinstance(call, _Flush):
                call.ev.set()
                continue
            if isinstance(call, _Start):
                self._ensure_worker(call.device)
                continue
            if isinstance(call, _Load):
                try:
                    self._background_load(call.call)
                except Exception as e:  # noqa: BLE001 -- counted by _load; never kills the thread
                    log.debug("background load failed: %s", e)
                continue
            self._write_miss(call)

    def _write_miss(self, call: _Call) -> None:
        fp = self.fps[call.device]
        try:
            if not self.cache.root.is_dir():
                raise FileNotFoundError(f"cache {self.cache.root} is gone")
            added = missq.enqueue(self.cache, fp.id, call.sig)
        except Exception as e:  # noqa: BLE001 -- read-only, full or vanished cache
            log.debug("cannot queue %s: %s", call.key[:12], e)
            with self._lock:
                self.c.queue_errors += 1
                self._reported.discard(call.key)   # try again on a later miss
            return
        with self._lock:
            if added:
                self.c.queued += 1
            else:
                self.c.queue_dedup += 1
            self._outstanding[call.key] = call.device
            self._last_queued = time.monotonic()
        self._wake.set()
        if self.on_miss == "compile":
            self._ensure_worker(call.device)
        if self._explain:
            metrics_mod.explain_first_miss(self, call)

    def _check_workers(self) -> None:
        """A worker that went idle just as this process queued a miss has exited: start
        another while any miss this process queued is neither published nor failed."""
        with self._lock:
            devices = set(self._outstanding.values())
        for d in devices:
            self._ensure_worker(d)

    def _prune_outstanding(self) -> None:
        """Forget queued misses that are published or recorded as failing."""
        with self._lock:
            for k, d in list(self._outstanding.items()):
                idx = self._index.get(d)
                if idx is None or k in idx.keys or k in idx.failed:
                    del self._outstanding[k]

    def _ensure_worker(self, device: str) -> None:
        with self._worker_lock:
            w = self._workers.get(device)
            if w is not None and w.poll() is None:
                return
            if time.monotonic() < self._worker_retry_at:
                return  # the last start failed: not more often than every 10 s
            self._start_worker(device)

    def _start_worker(self, device: str) -> None:
        fp = self.fps[device]
        cmd = [sys.executable, "-m", "aoti_farm.runtime.compile_worker", "--cache-dir", str(self.cache.root),
               "--device", device, "--fp-id", fp.id, "--idle", str(self.worker_idle),
               "--inductor-options", json.dumps(self.inductor_options)]
        if self.cache.allow_insecure:
            cmd.append("--allow-insecure")
        env = {k: v for k, v in os.environ.items() if k not in ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD",
                                                                 "AOTI_FARM_RECORD_DIR")}
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        env["OMP_NUM_THREADS"] = "1"
        env = loadenv.child_env(env)
        env.pop("AOTI_FARM_SIGNING_KEY_FILE", None)
        env.pop("AOTI_FARM_SIGNING_KEY", None)
        if self.cache.signing_key:
            env["AOTI_FARM_SIGNING_KEY"] = os.fsdecode(self.cache.signing_key)   # read back with os.fsencode
        try:
            logf = open(self.worker_log, "ab")
            try:
                self._worker = self._workers[device] = subprocess.Popen(
                    cmd, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, preexec_fn=lowest_priority)
            finally:
                logf.close()
            self._room.set_compiles(self._compiles_now())   # warming up from now
            self._wake.set()
        except Exception as e:  # noqa: BLE001
            log.warning("cannot start the compile worker: %s", e)
            self._worker_retry_at = time.monotonic() + 10.0
            with self._lock:
                self.c.worker_errors += 1
            return
        with self._lock:
            self.c.workers_started += 1

    # -- public ------------------------------------------------------------------------------------
    @property
    def worker(self) -> subprocess.Popen | None:
        """The compile worker process last started (None if never)."""
        return self._worker

    @property
    def ops(self) -> list[str]:
        return list(self._reg.ops)

    def stats(self) -> dict:
        """The counters of :class:`HookStats`, with the native path's folded in, plus
        ``native``: whether it serves and its own counters (``slow_calls`` asked Python,
        ``remembered`` decisions, ``callback_errors``)."""
        with self._lock:
            s = dataclasses.asdict(self.c)
            s["queued_waiting"] = len(self._outstanding)   # queued here, not yet published or failed
            s["miss_to_hit_seconds"] = self._miss_hist.snapshot()
            now = time.monotonic()
            s["eager_while_pending_seconds"] = self._pending_done_s + sum(
                now - t for k, t in self._miss_t.items() if k in self._outstanding)
        nreg = self._nreg
        n = nreg.stats() if nreg is not None else self._native_final
        s["yield_core"] = self._room.stats()
        g = self._gate.stats()
        s["serve"] = g["policy"]
        s["gate_trials"], s["gated_signatures"], s["gate_errors"] = g["gate_trials"], g["gated_signatures"], g["gate_errors"]
        s["serving"] = self._not_serving is None   # False: nothing intercepted (see __init__)
        s["shape_classes"] = self._shapes.stats()
        if n is None:
            s["native"] = {"active": False, "reason": self._native_error or
                           ("off" if self._native_mode == "off" else "building")}
            return metrics_mod.with_miss_reasons(s, self._metrics)
        s["hits"] += n["hits"]
        s["misses"] += n["misses"]
        s["failed_signatures"] += n["failed_signatures"]
        s["calls"] += n["hits"] + n["misses"] + n["failed_signatures"] + n.get("gated", 0)
        s["gated"] += n.get("gated", 0)
        for reason, k in (("wrapped Python number", "wrapped_numbers"), ("requires_grad", "requires_grad"),
                          ("conjugate or negative view", "conj_neg_views")):
            if n[k]:
                s["fallbacks"][reason] = s["fallbacks"].get(reason, 0) + n[k]
                s["calls"] += n[k]
        reasons = {i: r for r, i in self._ineligible_ids.items()}
        for rid, k in n.get("ineligible", {}).items():   # remembered natively, counted there
            reason = reasons.get(rid, "ineligible")
            s["fallbacks"][reason] = s["fallbacks"].get(reason, 0) + k
            s["calls"] += k
        for name, (h, m, f) in n["per_slot"].items():
            oc = s["per_op"].setdefault(name, {"hits": 0, "misses": 0, "fallbacks": 0})
            oc["hits"] += h
            oc["misses"] += m
            oc["fallbacks"] += f
        s["native"] = {"active": nreg is not None, **{k: n[k] for k in ("slow_calls", "remembered", "forgotten_full",
                                                           "unkeyable", "callback_errors", "kernels")}}
        return metrics_mod.with_miss_reasons(s, self._metrics)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every reported miss has been written to the miss queue."""
        done = threading.Event()
        self._pending.put(_Flush(done))
        done.wait(timeout)

    def uninstall(self, stop_worker: bool = False) -> None:
        """Restore eager kernels, write pending misses, stop the threads (idempotent).

        The compile worker keeps running until idle unless ``stop_worker``."""
        if self._stop.is_set():
            return
        self._reg.uninstall()
        self._stop.set()
        self._wake.set()
        if self._native_build is not None and self._native_build.poll() is None:
            pass  # the build goes on: the next process uses it
        self._pending.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self._room.close()
        self._gate.close()
        if self._metrics is not None:
            self._metrics.close()
        self._runners.clear()
        if self._nreg is not None:
            self._native_final = self._nreg.stats()
        self._nreg = None
        for w in list(self._workers.values()) if stop_worker else ():
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    w.kill()

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()


class _NoRegistration:
    """What a hook that cannot serve registers: nothing."""

    ops: list = []
    install_seconds = 0.0

    def uninstall(self) -> None:
        pass


class _Flush:
    def __init__(self, ev: threading.Event):
        self.ev = ev


class _Start:
    def __init__(self, device: str):
        self.device = device


class _Load:
    def __init__(self, call: _Call):
        self.call = call


def install(cache_dir: str | os.PathLike | None = None, ops: Iterable | None = None,
            devices: Iterable[str] = ("cpu", "cuda"), on_miss: str = "compile", poll_interval: float = 1.0,
            signing_key: bytes | str | None = None, allow_insecure: bool = False,
            inductor_options: dict | None = None, **kw) -> Hook:
    """Install the serving hook; see the module docstring.  ``uninstall()`` or use as a
    context manager.  Bad arguments raise :class:`UserError`."""
    return Hook(cache_dir, ops, tuple(devices), on_miss, poll_interval, signing_key, allow_insecure,
                inductor_options, **kw)
