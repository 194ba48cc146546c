"""The Ray compile actor: a long-lived process that keeps torch and Inductor warm.

Contract (what the scheduler in :mod:`aoti_farm.workers.scheduler` relies on):

* ``CompileActor(cache_root, device, inductor_options, lease_ttl, signing_key_file,
  compiler_factory, warmup_level, memory_budget)`` (resolved values, no environment)
  builds nothing expensive; ``warmup()`` imports torch and Inductor,
  computes this worker's fingerprint (so a CUDA fingerprint is computed *on the GPU
  node*, never on the driver) and returns :meth:`info`.  A worker is used only after its
  ``warmup()`` returned.
* ``compile(sig_obj, attempts)`` runs :func:`aoti_farm.compile.job.compile_and_publish` for one
  signature (``Signature.to_obj()`` form) and returns ``Outcome.to_dict()`` plus
  ``info()`` under ``"actor"``.  It never raises: an unexpected exception comes back as
  status ``"error"`` (an infrastructure failure the scheduler may retry); a deterministic
  compile failure is status ``"failed"`` with a failure record in the cache.
* The actor never forks: ``TORCHINDUCTOR_COMPILE_THREADS=1`` is set (by the runtime_env
  and again here) so Inductor compiles in-process.

This module does not import Ray at import time; the driver wraps the class with
``ray.remote`` and the resource requests of :func:`aoti_farm.workers.placement.actor_options`.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable

from aoti_farm.report.progress import process_start_time
from . import metrics as farm_metrics


def _host_steps() -> dict:
    """Per-host steps this process ran or waited for (ISA probe and checks, the split
    build's common object): the evidence that they run once per host, not per actor."""
    out: dict = {}
    try:
        from aoti_farm import fingerprint
        from aoti_farm.build import splitbuild

        out.update(fingerprint.host_steps())
        sb = splitbuild.stats()
        out.update({k: sb[k] for k in ("common_built", "common_reused", "common_waited", "common_busy") if k in sb})
    except Exception:  # noqa: BLE001 -- a failed import is warm-up's error, not info()'s
        pass
    return out


def _ray_context():
    """Ray's runtime context in a Ray worker; None elsewhere (asking for it outside Ray
    would start a Ray)."""
    try:
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return None
        return ray.get_runtime_context()
    except Exception:  # noqa: BLE001 -- outside Ray (unit use): no ids
        return None


class CompileActor:
    def __init__(self, cache_root: str, device: str = "cpu", inductor_options: dict | None = None,
                 lease_ttl: float = 30.0, signing_key_file: str | None = None,
                 compiler_factory: Callable | None = None, warmup_level: str = "light",
                 memory_budget: int | None = None):
        self.created_at = time.time()
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning)
        from aoti_farm.startup import notices

        notices.drop(notices.TORCH_NOTICES)   # before warmup() imports torch
        self.cache_root = cache_root
        self.device = "cuda:0" if device.startswith("cuda") or device == "gpu" else "cpu"
        self.inductor_options = dict(inductor_options or {})
        self.lease_ttl = lease_ttl
        self.memory_budget = memory_budget   # bytes per compile; None: the host default (budget.current)
        self.signing_key_file = signing_key_file   # read here (_setup): a key is never an actor's argument
        self.compiler_factory = compiler_factory
        self.warmup_level = warmup_level
        self._cache = self._compiler = self._fp = None
        self._owner = None
        self.warmup_seconds: float | None = None
        self.warmup_span: tuple[float, float] | None = None   # wall-clock (start, end)
        self.warmup_phases: dict = {}

    # -- lazily built state (so a failing import is an error of warmup(), not of __init__)
    def _setup(self) -> None:
        if self._fp is not None:
            return
        from aoti_farm.cache.store import Cache
        from aoti_farm.compile.compiler import AOTICompiler
        from aoti_farm.fingerprint import fingerprint
        from aoti_farm.cache.leases import new_owner

        from aoti_farm.config import load_signing_key

        key = load_signing_key(path=self.signing_key_file) if self.signing_key_file else None
        self._cache = Cache(self.cache_root, signing_key=key)
        factory = self.compiler_factory or AOTICompiler
        self._compiler = factory(self.inductor_options)
        self._fp = fingerprint(self.device, self._compiler.options())
        self._owner = new_owner(f"ray-{self._actor_id()[:12]}")

    #: (actor id, node id) of the Ray actor this forked copy serves (workers/forkserver.py):
    #: such a copy is no Ray worker and never imports Ray.
    forked_ids: tuple | None = None

    def _actor_id(self) -> str:
        if self.forked_ids is not None:
            return self.forked_ids[0]
        ctx = _ray_context()
        return (ctx.get_actor_id() or "") if ctx is not None else ""

    def _node_id(self) -> str:
        if self.forked_ids is not None:
            return self.forked_ids[1]
        ctx = _ray_context()
        return (ctx.get_node_id() or "") if ctx is not None else ""

    def info(self) -> dict:
        """Where this worker runs and what it compiles for (pid, node, lease owner, fingerprint).
        A forked actor's (see :meth:`_attach_fork`) is its compiling copy's, ``pid`` included."""
        if self._copy is not None:
            try:
                return self._as_proxy(self._copy.call("info"))
            except Exception as e:  # noqa: BLE001 -- the copy is gone: this process compiles from now on
                self._drop_fork(e)
        self._setup()
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": self._node_id(),
                "actor_id": self._actor_id(), "owner": self._owner, "device": self.device,
                "fp_id": self._fp.id, "fingerprint": self._fp.as_dict(),
                "warmup_seconds": self.warmup_seconds, "created_at": self.created_at,
                "warmup_span": self.warmup_span, "warmup_phases": self.warmup_phases,
                "verifier_started": self.verifier_started,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),   # "": an embedded Ray hid the GPUs
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),   # aoti_farm/startup/ompwait.py
                "host_steps": _host_steps(), "fork": self.fork}

    # -- a compiling copy forked from the host's fork server (workers/forkserver.py)
    _copy = None
    #: How this actor compiles: None (in its own process), {"pid", "server_pid", "span",
    #: "imports", "threads_seen"} (in a forked copy; "lost" added if the copy died and this
    #: process compiles since), or {"error"} (the fork failed; in its own process).
    fork: dict | None = None

    def _attach_fork(self) -> bool:
        """Have the host's fork server (workers/forkserver.py; an embedded Ray's CPU-only warm
        on a many-core host starts one) fork this actor's compiling copy, which has torch
        (and Inductor, where the server could import it single-threaded) imported already;
        this process then never imports torch.  False (this process compiles) where there
        is no server, for a GPU or test-double actor, or where the fork fails."""
        if self.device != "cpu" or self.compiler_factory is not None:
            return False
        from . import forkclient

        path = forkclient.inherited_socket()
        if not path:
            return False
        s = time.time()
        kw = {"cache_root": self.cache_root, "device": self.device, "inductor_options": self.inductor_options,
              "lease_ttl": self.lease_ttl, "signing_key_file": self.signing_key_file, "warmup_level": self.warmup_level,
              "memory_budget": self.memory_budget}
        try:
            self._copy = forkclient.attach(path, kw, (self._actor_id(), self._node_id()))
        except Exception as e:  # noqa: BLE001 -- compile here instead
            self.fork = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
            return False
        self.fork = {"pid": self._copy.pid, "server_pid": self._copy.server_pid, "span": [s, time.time()],
                     **self._copy.server}
        return True

    def _drop_fork(self, e: BaseException) -> None:
        if self._copy is not None:
            self._copy.close()
        self._copy = None
        self.fork = {**(self.fork or {}), "lost": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}

    def _as_proxy(self, info: dict) -> dict:
        """The copy's ``info()`` with this actor's own start-up and fork."""
        return {**(info or {}), "created_at": self.created_at, "warmup_seconds": self.warmup_seconds,
                "warmup_span": self.warmup_span, "warmup_phases": self.warmup_phases,
                "verifier_started": (info or {}).get("verifier_started"), "fork": self.fork,
                "proxy_pid": os.getpid(), "proxy_imported_torch": "torch" in sys.modules}

    def _forward(self, method: str, sig_obj: dict, attempts: int) -> dict | None:
        """``method`` run by the forked copy; None where the copy is gone (the caller
        then compiles here)."""
        try:
            out = self._copy.call(method, sig_obj, attempts)
        except Exception as e:  # noqa: BLE001 -- the copy died (or its call broke): this process compiles
            self._drop_fork(e)
            return None
        out["actor"] = self._as_proxy(out.get("actor") or {})
        farm_metrics.record_compile(self.device, out)
        return out

    def warmup(self) -> dict:
        """Pay the per-process start-up cost once; returns :meth:`info`.

        Phases, each a wall-clock ``[start, end]`` in ``info()["warmup_phases"]`` (the warm
        report's timeline): ``boot`` (process start to this actor's construction: Ray's
        worker start and its imports), ``import`` (torch, Inductor and its compile path),
        ``setup`` (cache, compiler, fingerprint: the host's ISA memo, waiting only while
        another process probes a fresh host), ``isa`` (Inductor's ISA answers replayed
        from that memo, :func:`aoti_farm.fingerprint.seed_inductor_vec_isa`), ``export``
        (one trivial ``torch.export``).  Imports come first so that they overlap a
        probe another process may be running; nothing here takes a lock it does not need."""
        t0, w0 = time.perf_counter(), time.time()
        phases: dict = {}
        start = process_start_time()
        if start is not None:
            phases["boot"] = [start, self.created_at]
        light = self.warmup_level in ("light", "compile") and self.compiler_factory is None
        pre = sys.modules.get("aoti_farm.workers.actor_preload")   # Ray's worker imported it (raysetup)
        if pre is not None and getattr(pre, "SPAN", None):
            phases["preload"] = list(pre.SPAN)
        if self._attach_fork():
            try:
                info = self._copy.call("warmup")
            except Exception as e:  # noqa: BLE001 -- the copy failed: warm up here instead
                self._drop_fork(e)
            else:
                phases.update({k: v for k, v in (info.get("warmup_phases") or {}).items() if k not in phases})
                phases["fork"] = self.fork["span"]
                self.warmup_seconds = time.perf_counter() - t0
                self.warmup_span = (w0, time.time())
                self.warmup_phases = phases
                return self._as_proxy(info)
        if light:
            s = time.time()
            import torch
            import torch._inductor  # noqa: F401 -- the import is the warm-up
            from torch._inductor import codecache  # noqa: F401

            from aoti_farm.compile.compiler import import_compile_path

            import_compile_path()
            phases["import"] = [s, time.time()]
        s = time.time()
        self._setup()
        phases["setup"] = [s, time.time()]
        if light:
            from aoti_farm import signature as S

            dev = "cuda" if self.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
            sig = S.from_call(torch.ops.aten.relu.default, (torch.empty(4, device=dev),), {})
            if dev == "cpu":
                from aoti_farm.fingerprint import seed_inductor_vec_isa

                s = time.time()
                seed_inductor_vec_isa()
                phases["isa"] = [s, time.time()]
            s = time.time()
            if self.warmup_level == "compile":
                with tempfile.TemporaryDirectory(prefix="aoti-farm-warmup-") as d:
                    self._compiler.compile(sig, d)
                phases["compile"] = [s, time.time()]
            else:
                from aoti_farm.compile.graph import OpModule
                from aoti_farm.compile.runner import flat_tensors

                args, kwargs = S.materialize(sig, seed=0)
                with torch.no_grad():
                    torch.export.export(OpModule(sig, args, kwargs), tuple(flat_tensors(sig, args, kwargs)),
                                        strict=False)
                phases["export"] = [s, time.time()]
        if light and self.device == "cpu":
            self._verifier_when_needed()
        self.warmup_seconds = time.perf_counter() - t0
        self.warmup_span = (w0, time.time())
        self.warmup_phases = phases
        return self.info()

    #: How long, after its warm-up, an actor watches for the host's loader memo (below).
    LOADER_WATCH_S = 120.0

    def _verifier_when_needed(self) -> None:
        """Start this process's verification child (:mod:`aoti_farm.compile.verifyserver`) as soon
        as it is known to be needed, not when the first kernel is waiting for it.

        Needed where kernels cannot be loaded here (:func:`aoti_farm.startup.loadenv.load_safe`).
        On a fresh host nobody knows yet: the answer comes from the loader probe of the
        first kernel built here (the driver's host preparation, or a first compile), written
        to the host's memo.  So while no memo exists, a daemon thread looks for it every
        0.2 s (for at most :attr:`LOADER_WATCH_S`) and starts the child the moment it says
        so; the child's torch import then overlaps this actor's first compile instead of
        following it.  Starts nothing where kernels load in-process.

        (Starting the child before the memo exists was tried, 0ad8a99: such a child ran
        without the preload the memo then asked for, and kernels crashed it on the
        16-core host; removed, and :mod:`aoti_farm.compile.verifyserver` now replaces a child
        that lacks a preload the memo asks for.  Now, on hosts of
        :attr:`EARLY_VERIFIER_MIN_CORES` cores, the child starts at warm-up *with* the
        only preload the memo can ask for: :meth:`_early_preload`.)"""
        from aoti_farm.startup import loadenv
        from aoti_farm.compile import verifyserver

        if not loadenv.load_safe():
            verifyserver.prestart()
            self.verifier_started = "at warm-up"
            return
        if not loadenv.needs_probe():
            return   # known: this process loads kernels itself
        early = self._early_preload()
        if early:
            verifyserver.prestart(preload=early)
            self.verifier_started = "at warm-up, with the candidate preload"

        def watch() -> None:
            end = time.monotonic() + self.LOADER_WATCH_S
            while time.monotonic() < end:
                if not loadenv.needs_probe():
                    if not loadenv.load_safe():
                        verifyserver.prestart()   # keeps the early child if it has the wanted preload
                        if not early:
                            self.verifier_started = "when the loader memo appeared"
                    elif early:
                        verifyserver.stop()   # kernels load in this process: the child is not needed
                        self.verifier_started = "at warm-up, stopped: kernels load in-process"
                    return
                time.sleep(0.2)

        threading.Thread(target=watch, name="aoti-farm-loader-watch", daemon=True).start()

    verifier_started: str | None = None

    #: From this many cores an actor on a fresh host starts its verification child at
    #: warm-up with the candidate preload (below); on fewer, start-up is CPU-bound and a
    #: child that may turn out unneeded would only take the CPU from the imports.
    EARLY_VERIFIER_MIN_CORES = 4

    def _early_preload(self) -> str | None:
        """The preload to start this actor's verification child with before the loader
        memo exists (a fresh host), or None to wait for the memo.

        The only preload the loader probe can ask for is the system libstdc++
        (:func:`aoti_farm.startup.loadenv.system_libstdcxx`), so a child started with it now is
        exactly the child the memo would start if it says the host needs it; if the memo
        says kernels load in-process, the child is stopped unused, and a child whose
        preload the memo does not want is never used (:mod:`aoti_farm.compile.verifyserver`
        replaces it).  On the 16-core GPU host each actor's first verification waited
        3.5 s (p90) for a child started when the memo appeared."""
        from aoti_farm.startup import loadenv

        if (os.cpu_count() or 1) < self.EARLY_VERIFIER_MIN_CORES or loadenv.preloaded():
            return None   # few cores; or this process has the preload: it loads kernels itself
        return loadenv.system_libstdcxx()

    def pid(self) -> int:
        return os.getpid()

    def compile(self, sig_obj: dict, attempts: int = 1) -> dict:
        """Lease, compile, verify, publish one signature; never raises (see module doc)."""
        from aoti_farm.compile.job import compile_and_publish
        from aoti_farm.signature import parse_signature

        if self._copy is not None:
            out = self._forward("compile", sig_obj, attempts)
            if out is not None:
                return out
        t0, w0 = time.perf_counter(), time.time()
        try:
            self._setup()
            sig = parse_signature(sig_obj)
            out = compile_and_publish(self._cache, self._compiler, self._fp, sig, owner=self._owner,
                                      attempts=attempts, lease_ttl=self.lease_ttl,
                                      memory_budget=self.memory_budget).to_dict()
        except Exception as e:  # noqa: BLE001 -- reported to the scheduler as an infrastructure failure
            msg = " ".join(str(e).split())[:300] or type(e).__name__
            out = {"key": (sig_obj or {}).get("key", ""), "status": "error", "seconds": time.perf_counter() - t0,
                   "worker": f"{socket.gethostname()}:{os.getpid()}", "error": f"{type(e).__name__}: {msg}",
                   "evidence": {}, "phases": {}}
        out["span"] = (w0, time.time())   # wall clock, for the warm report's timeline
        out["actor"] = self.info()
        farm_metrics.record_compile(self.device, out)
        return out

    def compile_class(self, class_obj: dict, attempts: int = 1) -> dict:
        """A shape class's kernel, as :meth:`compile` (see aoti_farm/workers/classtasks.py)."""
        if self._copy is not None:
            out = self._forward("compile_class", class_obj, attempts)
            if out is not None:
                return out
        from .classtasks import compile_in_actor

        return compile_in_actor(self, class_obj, attempts)
