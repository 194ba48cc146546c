"""The serving hook's loaded kernels: verify, load, drop, and remember the refused ones.

A kernel is loaded on its first hit (or, for a signature this process missed earlier, by
the miss writer's thread: :meth:`KernelTable.load_soon`): ``Cache.open_entry(...,
private=True)`` walks to the entry without following links, checks owners and modes,
reads the manifest bounded, verifies fingerprint, HMAC and sha256 into a sealed private
copy, and the runner is loaded from that copy, never from the shared file (a native
kernel id when the native hit path serves, else a Python runner).  One load per key at a
time; concurrent callers wait for it.

A refused entry (``BadEntry``) is counted (``foreign`` or ``integrity_failures`` by kind),
dropped from the index and reported again (a good kernel may replace it); a runner that
fails to load or raises while running is dropped.  Either is remembered in ``bad`` with
its entry directory's stamp until the entry is replaced.  A runner that raises where eager
raises too (an integer division by zero, an index out of range) met the caller's error, not
a fault of its own: the hook re-raises eager's error and the kernel stays.

**Conditions of serving** (:meth:`KernelTable.unservable`, asked on every hit).  Under
``contract="strict"`` a kernel with an edge note runs eager (``contract: strict (CLASS)``).  A
kernel with index guards serves a call only where every index lies in its guard's range
(the rest runs eager: its error, as always).  A kernel
is served only under what it was verified under: the globals of
``aoti_farm.signature.conditions`` (the manifest's ``conditions``, absent: torch's
defaults), and for a CPU kernel the calling thread's ``torch.get_num_threads()`` among the
manifest's ``verified_threads`` (absent: ``[1]``).  At another thread count the kernel is
checked here first, once per key and thread count, in the calling thread (a CPU kernel
runs at its caller's thread count): its outputs on the signature's example inputs against
eager's, with the compiler's tolerance.  It is served there only if they agree; otherwise
the call runs eager, counted as ``thread_mismatch`` (or ``threads_unverified`` where the
check could not run); ``stats()["thread_checks"]`` counts the checks by outcome.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

import torch

from aoti_farm.startup import loadenv
from aoti_farm import signature as S
from aoti_farm.cache.manifest import edge_notes, index_guards
from aoti_farm.cache.store import BadEntry, Cache
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.compiler import load_runner
from aoti_farm.metrics.counters import Counters
from aoti_farm.compile.tolerance import compare, length_tolerance

log = logging.getLogger("aoti_farm.hook")



def runner_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else "cpu"


class KernelTable:
    """``runners``: key -> loaded runner (or ``(native registration, kernel id)``); ``bad``: key -> (device,
    entry stamp) of refused or failing entries.  ``native`` is the native registration
    while it serves (set by the hook), else None."""

    def __init__(self, cache: Cache, fps: dict, indexes: dict, report: Callable, submit: Callable,
                 contract: str = "finite"):
        self.cache, self.fps, self.indexes = cache, fps, indexes
        #: the verification contract served kernels meet (config.CONTRACTS): under "strict" a
        #: kernel with an edge note (its manifest's verification ``edge_notes``) runs eager
        self.contract = contract
        #: key -> the edge notes of its loaded kernel (classes; empty: none)
        self.notes: dict[str, tuple] = {}
        #: key -> its loaded kernel's index guards (manifest.index_guards; empty: none): a
        #: call with an index outside one runs eager (the native path checks its own copy)
        self.guards: dict[str, list] = {}
        self._report = report          # (call) -> None: a refused entry's signature is queued again
        self._submit = submit          # (fn) -> bool: run fn in the background thread
        self.native = None
        self.runners: dict[str, Any] = {}
        self.bad: dict[str, tuple] = {}
        self._load_locks: dict[str, threading.Lock] = {}
        self._loading: set[str] = set()
        self._lock = threading.Lock()
        #: key -> (conditions tuple, verified thread counts or None (CUDA), signature to
        #: check with, Python runner to check with or None): read from the manifest at load
        self.meta: dict[str, tuple] = {}
        #: (key, thread count) -> None (agrees with eager there) or the reason it is not served
        self.thread_verdicts: dict[tuple, str | None] = {}
        self.counters = Counters("kernels_loaded", "kernels_dropped", "load_errors", "load_unsafe",
                                 "kernel_errors", "user_errors", "integrity_failures", "foreign",
                                 integrity_failures_by_kind={}, thread_checks={})

    def _serves(self, h) -> bool:
        """Whether handle ``h`` belongs to the registration serving now: a Python runner
        while no native one does, else ``(registration, kernel id)`` of that very
        registration (kernel ids mean nothing to another one)."""
        native = self.native
        if native is None:
            return not isinstance(h, tuple)
        return isinstance(h, tuple) and h[0] is native

    def current(self, key: str):
        """The loaded handle of ``key`` for the path that serves now, or None."""
        h = self.runners.get(key)
        return h if h is not None and self._serves(h) else None

    def load(self, call):
        """Verify and load the kernel of ``call`` (once; concurrent callers wait)."""
        with self._lock:
            lk = self._load_locks.setdefault(call.key, threading.Lock())
        with lk:
            nreg = self.native
            runner = self.runners.get(call.key)
            if runner is not None and self._serves(runner):
                return runner
            if call.key in self.bad:
                return None   # refused while this thread waited: not verified again
            if not loadenv.load_safe():
                # This host needs libstdc++ preloaded to load AOTI libraries and this
                # process was started without it: loading would crash the caller.
                self.counters.inc("load_unsafe")
                return None
            try:
                # verified bytes in a sealed private copy: the library loaded is exactly
                # what was hashed, whatever happens to the shared file meanwhile
                entry = self.cache.open_entry(self.fps[call.device], call.key, private=True)
            except BadEntry as e:
                self.refused(call, e)
                return None
            except Exception as e:  # noqa: BLE001 -- a vanished or odd cache is a miss
                log.warning("cannot open entry %s: %s", call.key[:12], e)
                self.counters.inc("load_errors")
                return None
            device = runner_device(call.device)
            try:
                guards = index_guards(entry.manifest)   # checked by open_entry: they read
                runner = ((nreg, nreg.load(entry.load_path, device, guards)) if nreg is not None
                          else load_runner(entry.load_path, device))
                meta = self._meta(entry, call, runner, device)
            except Exception as e:  # noqa: BLE001
                log.warning("cannot load kernel %s: %s", call.key[:12], e)
                self.counters.inc("load_errors")
                with self._lock:
                    self.bad[call.key] = (call.device, self.entry_stamp(call.device, call.key))
                return None
            finally:
                entry.close()
            self.cache.touch_used(entry)
            with self._lock:
                old = self.runners.get(call.key)
                self.runners[call.key] = runner
                self.meta[call.key] = meta
                self.notes[call.key] = edge_notes(entry.manifest)
                self.guards[call.key] = guards
            self.counters.inc("kernels_loaded")
            if old is not None:
                self.release(old)
            return runner

    @staticmethod
    def _meta(entry, call, runner, device: str) -> tuple:
        """What :meth:`unservable` needs of an entry, read while it is open."""
        m = entry.manifest if isinstance(entry.manifest, dict) else {}
        conds = S.conditions.from_dict(m.get("conditions"))
        if call.device != "cpu":
            return conds, None, call.sig, None
        vt = m.get("verified_threads", [1])   # absent (older compilers): verified at 1 thread
        threads = frozenset(x for x in vt if type(x) is int and x > 0) if isinstance(vt, list) else frozenset()
        try:
            sig = S.parse_signature(m["signature"])   # with the recorded index ranges
            if sig.key != call.key:
                sig = call.sig
        except Exception:  # noqa: BLE001
            sig = call.sig
        checker = runner if not isinstance(runner, tuple) else None
        if checker is None and threads != frozenset(range(1, (os.cpu_count() or 1) + 1)):
            try:   # the native path's kernel cannot be run from here: a Python runner to check with
                checker = load_runner(entry.load_path, device)
            except Exception as e:  # noqa: BLE001 -- then unchecked thread counts run eager
                log.debug("no checking runner for %s: %s", call.key[:12], e)
        return conds, threads, sig, checker

    def unservable(self, call, bypassed) -> str | None:
        """None if ``call``'s loaded kernel may serve now; else the counted reason it may
        not (see the module docstring).  ``bypassed()``: a context in which this thread's
        calls of served ops run eager."""
        meta = self.meta.get(call.key)
        if meta is None:
            return None
        if self.contract == "strict":
            notes = self.notes.get(call.key)
            if notes:
                return f"contract: strict ({notes[0]})"
        conds, threads, sig, checker = meta
        try:
            why = S.conditions.mismatch(call.device, conds)
        except Exception as e:  # noqa: BLE001 -- a global torch will not read: never served, never raised
            return f"conditions: unreadable ({type(e).__name__})"
        if why is not None:
            return f"conditions: {why}"
        if threads is None:
            return None
        n = torch.get_num_threads()
        if n in threads:
            return None
        vk = (call.key, n)
        try:
            return self.thread_verdicts[vk]
        except KeyError:
            pass
        verdict = self._check_threads(sig, checker, bypassed)
        with self._lock:
            self.thread_verdicts[vk] = verdict
        return verdict

    def _check_threads(self, sig, checker, bypassed) -> str | None:
        """The kernel against eager at this thread's thread count, on ``sig``'s example inputs."""
        verdict = self._compare_at_threads(sig, checker, bypassed)
        self.counters.inc("thread_checks", verdict or "agree")
        return verdict

    def _compare_at_threads(self, sig, checker, bypassed) -> str | None:
        if checker is None:
            return "threads_unverified"
        try:
            args, kwargs = S.materialize(sig, seed=0)
            op = S.resolve_op(sig.op)
            with torch.no_grad(), bypassed():
                expected = op(*args, **kwargs)
                got = checker.run(flat_tensors(sig, args, kwargs))
            bad = compare(expected, got, length_tolerance(sig, args, kwargs, expected))
        except Exception as e:  # noqa: BLE001 -- nothing here may reach the caller
            log.debug("thread check of %s failed: %s", sig.op, e)
            return "threads_unverified"
        if bad is not None:
            log.warning("kernel for %s disagrees with eager at %d threads: %s; eager at that thread count",
                        sig.op, torch.get_num_threads(), bad)
            return "thread_mismatch"
        return None

    def load_soon(self, call) -> None:
        """Load ``call``'s kernel in the background thread (once at a time per key); the
        native path decides its calls again afterwards."""
        with self._lock:
            if call.key in self._loading:
                return
            self._loading.add(call.key)
        if not self._submit(lambda: self._background_load(call)):
            with self._lock:
                self._loading.discard(call.key)

    def _background_load(self, call) -> None:
        try:
            self.load(call)
        finally:
            with self._lock:
                self._loading.discard(call.key)
            if self.native is not None:
                self.native.forget_eager()   # the remembered miss is decided again: a hit

    def refused(self, call, e: BadEntry) -> None:
        log.warning("refusing cache entry %s: %s", call.key[:12], e)
        st = self.entry_stamp(call.device, call.key)
        if e.kind == "foreign":
            self.counters.inc("foreign")
        elif st is not None:  # the entry is there but bad (not merely removed meanwhile)
            self.counters.inc("integrity_failures")
            self.counters.inc("integrity_failures_by_kind", e.kind)
        with self._lock:
            self.bad[call.key] = (call.device, st)
        self.indexes[call.device].keys.discard(call.key)
        # queued again: a good kernel replaces it (after `cache verify --repair`)
        self._report(call, again=True)

    def failed(self, key: str, e: BaseException) -> None:
        """A loaded kernel raised: dropped, eager until its entry is replaced."""
        log.warning("kernel %s raised %s; dropped, serving eager until its entry changes",
                    key[:12], (str(e).splitlines() or [type(e).__name__])[0][:200])
        device = next((d for d, idx in self.indexes.items() if key in idx.keys), None)
        self.counters.inc("kernel_errors")
        with self._lock:
            handle = self.runners.pop(key, None)
            self.bad[key] = (device, self.entry_stamp(device, key) if device else None)
        self.release(handle)

    def native_failed(self, nreg, kernel_id: int, message: str) -> None:
        """The native path's report of a kernel that raised (the call got eager's result)."""
        with self._lock:
            key = next((k for k, h in self.runners.items() if h == (nreg, kernel_id)), None)
        if key is not None:
            self.failed(key, RuntimeError(message))
        else:
            self.release((nreg, kernel_id))

    def release(self, handle) -> None:
        if isinstance(handle, tuple):
            try:
                handle[0].unload(handle[1])
            except Exception:  # noqa: BLE001
                pass

    def removed(self, keys) -> None:
        """Entries that went away: their kernels are dropped."""
        dropped = []
        with self._lock:
            for k in keys:
                h = self.runners.pop(k, None)
                if h is not None:
                    dropped.append(h)
        for h in dropped:
            self.counters.inc("kernels_dropped")
            self.release(h)

    def retry_replaced(self, device: str) -> None:
        """A refused entry that was replaced (a new directory) is tried again."""
        for k, (dev, st) in list(self.bad.items()):
            if dev == device and self.entry_stamp(dev, k) != st:
                with self._lock:
                    self.bad.pop(k, None)

    def clear(self) -> None:
        """Forget every loaded runner (the registration serving them went away)."""
        with self._lock:
            self.runners.clear()

    def entry_stamp(self, device: str, key: str):
        try:
            st = os.stat(self.cache.entry_dir(self.fps[device].id, key))
            return (st.st_ino, st.st_mtime_ns)
        except OSError:
            return None
