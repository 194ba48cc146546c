"""aoti-farm as upstream's AOTI-eager compile backend.

``torch._inductor.aoti_eager.register_aoti_compile_backend(device, compile_fn, load_fn)``
lets a process replace how upstream's C++ ``AOTIPythonKernelHolder`` (registered with
``torch.library.Library(ns, "IMPL")._impl_with_aoti_compile(op, "CPU")``) finds and builds
kernels:

* ``load_fn(ns, op, device)`` is called once when a holder is registered; we return every
  verified entry of the shared cache for that op and device, in upstream's metadata form
  (torch dtype objects, device_index -1 on CPU, the absolute path of the entry's
  ``kernel.so``).  Each entry is fully checked with ``Cache.open_entry`` (manifest, key,
  fingerprint, sha256, HMAC, ownership) and handed over as the path of its sealed private
  copy (the verified bytes), never the shared file.
* ``compile_fn(ns, op, device, dynamic, f, args, kwargs, ...)`` is called synchronously on a
  miss.  We rebuild the Signature from the OpOverload and the arguments and go through
  ``aoti_farm.compile.job.compile_and_publish``: it returns a cached entry, compiles under the
  fleet-wide lease, or reports that another worker holds the lease, in which case we
  wait for that worker's result.  A signature is thus compiled once fleet-wide.  On
  failure we return "" (upstream's holder then raises "Failed to produce kernel library").

Never imports Ray.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch

from aoti_farm import config
from aoti_farm.compile import job
from aoti_farm.cache import leases
from aoti_farm import signature as S
from aoti_farm.interop import upstream as U
from aoti_farm.cache.store import BadEntry, Cache, load_signing_key
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import FarmError, Ineligible, UserError
from aoti_farm.fingerprint import Fingerprint, fingerprint

log = logging.getLogger("aoti_farm.upstream")

#: The backend's counters: load_fn calls (one per holder registration), entries handed to
#: upstream by load_fn, entries that failed verification (not handed over), compile_fn
#: calls (upstream misses), compiled here, already published when asked, waited for
#: another worker's compile, returned "" (ineligible, refused, timed out).
COUNTERS = ("loads", "loaded_kernels", "bad_entries", "compile_requests", "compiled", "cached", "waited", "failed")


class UpstreamBackend:
    """The registered backend; ``stats()``, ``disable()``."""

    def __init__(self, cache: Cache, *, devices: tuple[str, ...], inductor_options: dict | None,
                 compile: bool, wait_s: float, compiler: Any = None, memory_budget: int | None = None):
        from aoti_farm.compile.compiler import AOTICompiler

        self.cache = cache
        self.devices = devices
        self.compiler = compiler or AOTICompiler(inductor_options)
        self.memory_budget = memory_budget   # bytes per compile; None: budget.py's default
        self.compile = compile
        self.wait_s = wait_s
        self.owner = leases.new_owner("upstream-backend")
        self.counters = Counters(*COUNTERS)
        self._lock = threading.Lock()
        self._fps: dict[str, Fingerprint | None] = {}
        self._ops: dict[str, dict[str, str]] = {}   # fp id -> key -> op name (manifest index)
        self._registered: list[str] = []
        self._copies: list = []                      # private copies handed to upstream's holders

    # -- helpers ---------------------------------------------------------------------------
    def _fp(self, device: str) -> Fingerprint | None:
        if device not in self._fps:
            if device == "cuda" and not torch.cuda.is_available():
                self._fps[device] = None
            else:
                self._fps[device] = fingerprint("cpu" if device == "cpu" else "cuda:0", self.compiler.options())
        return self._fps[device]

    def _op_index(self, fp_id: str) -> dict[str, str]:
        """key -> op for the namespace's entries; manifests of new keys are read once."""
        idx = self._ops.setdefault(fp_id, {})
        for key in self.cache.list_keys(fp_id) - idx.keys():
            try:
                m = self.cache.read_manifest(self.cache.entry_dir(fp_id, key))
                idx[key] = str(m["signature"]["op"])
            except (BadEntry, FarmError, KeyError, TypeError):
                continue
        return idx

    def stats(self) -> dict:
        return self.counters.snapshot()

    def _count(self, name: str, n: int = 1) -> None:
        self.counters.inc(name, n=n)

    # -- upstream's hooks ----------------------------------------------------------------------
    def load(self, ns: str, op_name_with_overload: str, device_type: str) -> list[dict]:
        self._count("loads")
        try:
            fp = self._fp(device_type)
            if fp is None:
                return []
            op = S.op_name(S.resolve_op(f"{ns}::{op_name_with_overload.removesuffix('.default')}"))
            out = []
            for key, name in sorted(self._op_index(fp.id).items()):
                if name != op:
                    continue
                try:
                    entry = self.cache.open_entry(fp, key, private=True, guards=False)
                    item = {"meta_info": U.meta_info(entry.signature, as_objects=True),
                            "kernel_path": self._keep(entry)}
                except BadEntry as e:
                    self._count("bad_entries")
                    log.warning("aoti-farm: not serving %s: %s", key[:12], e)
                    continue
                except Ineligible:
                    continue  # a kernel upstream's holder cannot match (e.g. an int-list argument)
                self.cache.touch_used(entry)
                out.append(item)
            self._count("loaded_kernels", len(out))
            return out
        except Exception:  # never raise into the C++ holder
            log.exception("aoti-farm: load of %s::%s for %s failed", ns, op_name_with_overload, device_type)
            return []

    def compile_fn(self, ns: str, op_name_with_overload: str, device_type: str, dynamic: bool, f: Any,
                   args: tuple, kwargs: dict, **_options: Any) -> str:
        self._count("compile_requests")
        try:
            return self._compile(ns, op_name_with_overload, device_type, dynamic, f, args, kwargs)
        except Exception:  # never raise into the C++ holder
            log.exception("aoti-farm: compile of %s::%s failed", ns, op_name_with_overload)
            self._count("failed")
            return ""

    def _compile(self, ns: str, op_name_with_overload: str, device_type: str, dynamic: bool, f: Any,
                 args: tuple, kwargs: dict) -> str:
        if dynamic:
            log.warning("aoti-farm: %s::%s asked for a dynamic-shape kernel; only static shapes are served",
                        ns, op_name_with_overload)
            self._count("failed")
            return ""
        op = f if isinstance(f, torch._ops.OpOverload) else \
            S.resolve_op(f"{ns}::{op_name_with_overload.removesuffix('.default')}")
        try:
            sig = S.from_call(op, tuple(args), dict(kwargs))
        except Ineligible as e:
            log.warning("aoti-farm: %s::%s call is not served: %s", ns, op_name_with_overload, e)
            self._count("failed")
            return ""
        fp = self._fp(sig.device)
        if fp is None or sig.device != device_type:
            log.warning("aoti-farm: %s on %s cannot be served here", S.describe(sig), device_type)
            self._count("failed")
            return ""
        deadline = time.monotonic() + self.wait_s
        delay, waited = 0.05, False
        while True:
            if self.compile:
                out = job.compile_and_publish(self.cache, self.compiler, fp, sig, owner=self.owner,
                                              memory_budget=self.memory_budget)
                status = out.status
            else:
                status = job.CACHED if self.cache.has_entry(fp.id, sig.key) else job.BUSY
                out = None
            if status in (job.COMPILED, job.CACHED):
                try:
                    entry = self.cache.open_entry(fp, sig.key, private=True, guards=False)
                except BadEntry as e:   # e.g. a kernel served only behind index guards
                    log.warning("aoti-farm: not serving %s: %s", S.describe(sig), e)
                    self._count("bad_entries")
                    return ""
                self._count("compiled" if status == job.COMPILED else ("waited" if waited else "cached"))
                self.cache.touch_used(entry)
                return self._keep(entry)
            if status == job.FAILED:
                log.warning("aoti-farm: %s is not compiled: %s", S.describe(sig), out.error if out else "")
                self._count("failed")
                return ""
            # BUSY: another worker holds the lease; wait for its result
            if time.monotonic() > deadline:
                log.warning("aoti-farm: gave up waiting %.0f s for %s", self.wait_s, S.describe(sig))
                self._count("failed")
                return ""
            waited = True
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _keep(self, entry) -> str:
        """The path upstream's holder will load: the entry's sealed private copy (exactly the
        verified bytes), kept open until this backend is disabled, since the holder loads
        it after we return."""
        with self._lock:
            self._copies.append(entry.kernel)
        return entry.load_path

    # -- lifecycle ------------------------------------------------------------------------------
    def disable(self) -> None:
        """Unregister this backend (holders registered meanwhile keep their kernels)."""
        from torch._inductor import aoti_eager

        # torch 2.13.0 has register_aoti_compile_backend but no unregister: remove our entry
        # from its private table (only if it is still ours); goes when torch has one
        backends = getattr(aoti_eager, "_aoti_compile_backends", {})
        for d in self._registered:
            b = backends.get(d)
            if b is not None and getattr(b.load_fn, "__self__", None) is self:
                del backends[d]
        self._registered = []
        with self._lock:   # libraries already loaded keep their mappings
            copies, self._copies = self._copies, []
        for c in copies:
            c.close()


def enable_upstream_backend(cache_dir: str | os.PathLike | None = None, *, devices: tuple[str, ...] = ("cpu", "cuda"),
                            inductor_options: dict | None = None, compile: bool = True, wait_s: float = 600.0,
                            signing_key: bytes | str | None = None, allow_insecure: bool = False) -> UpstreamBackend:
    """Register aoti-farm as the compile backend of upstream's AOTI-eager holders.

    Call it before ``Library(...)._impl_with_aoti_compile(...)``: a holder loads its
    kernels once, when it is registered.  ``compile=False`` serves published kernels and
    waits for other workers' compiles but never compiles here.  ``signing_key``: the
    key, or None for the configured one (``AOTI_FARM_SIGNING_KEY_FILE``, read here: this
    is a serving process's entry point, like ``install``), none when none is configured."""
    try:
        from torch._inductor import aoti_eager
    except ImportError as e:
        raise UserError(f"torch {torch.__version__} has no torch._inductor.aoti_eager ({e}); "
                        "upgrade torch or use aoti_farm.runtime.install instead") from None
    if not hasattr(aoti_eager, "register_aoti_compile_backend"):
        raise UserError(f"torch {torch.__version__} lacks torch._inductor.aoti_eager.register_aoti_compile_backend; "
                        "upgrade torch or use aoti_farm.runtime.install instead")
    for d in devices:
        if d not in U.DEVICES:
            raise UserError(f"enable_upstream_backend(devices=...): {d!r} is not 'cpu' or 'cuda'")
    # a serving process's entry point: unset settings resolved like install()'s (config.py)
    cache = Cache(config.cache_dir(cache_dir), signing_key=load_signing_key(signing_key),
                  allow_insecure=allow_insecure)
    cache.check_version()
    backend = UpstreamBackend(cache, devices=tuple(devices), inductor_options=inductor_options,
                              compile=compile, wait_s=wait_s, memory_budget=config.memory_budget())
    for d in devices:
        aoti_eager.register_aoti_compile_backend(d, backend.compile_fn, backend.load)
        backend._registered.append(d)
    return backend


__all__ = ["enable_upstream_backend", "UpstreamBackend", "COUNTERS"]
