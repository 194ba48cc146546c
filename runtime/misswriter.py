"""The serving hook's miss writer: a background thread that writes misses to the shared
miss queue, never the caller's.

A miss is reported once per signature and process (:meth:`MissWriter.report`) into an
in-process queue (bounded: beyond :data:`PENDING_LIMIT` it is dropped and counted, and
reported again on a later miss).  The thread writes it with ``missq.enqueue`` (which
dedups across processes), remembers it as *outstanding* until it is published or
recorded as failing (:meth:`prune`), and hands it to ``on_queued`` (the hook starts its
compile worker there).  The same thread runs other background jobs in order
(:meth:`submit`: kernel loads, a worker start), so a flush sees everything before it.

The shared queue is bounded per serving process: at most ``queue_cap`` signatures
written by one process, and ``queue_cap_per_op`` per op (settings of ``[hook]`` /
``install()``, defaults :data:`QUEUE_CAP`, :data:`QUEUE_CAP_PER_OP`); a miss beyond either is not
written and is counted (``queue_overflow``), so a caller choosing shapes cannot flood the
queue that ``serve`` and the workers compile.  A miss that a shape class covers is queued
as a request to widen that class (:mod:`aoti_farm.compile.widen`), once per class and process
(``queue_widened_dedup`` counts the rest): one compile serves every shape of the class.

It also keeps the miss -> hit timing: when a signature first missed here, and the
histogram of first miss -> first hit (``runtime/metrics.py``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable

from aoti_farm.cache import queue as missq
from aoti_farm.cache.store import Cache
from aoti_farm.metrics.counters import Counters
from .metrics import LatencyHistogram

log = logging.getLogger("aoti_farm.hook")

#: In-process queue of signatures waiting to be written to the miss queue.
PENDING_LIMIT = 4096
#: Most shards watched one by one for misses this process waits for (more: the poll).
WATCH_SHARDS = 32
#: For how long after this process last queued a miss its shards are watched so.
WATCH_QUEUED_SECONDS = 300.0
#: Most signatures one serving process writes to the shared miss queue (beyond: counted
#: as ``queue_overflow``, not written): the default of the setting ``queue_cap``
#: (``aoti_farm/config.py``, ``HookConfig``).
QUEUE_CAP = 1024
#: Most of them for one op: the default of ``queue_cap_per_op``.
QUEUE_CAP_PER_OP = 128


class _Flush:
    def __init__(self, ev: threading.Event):
        self.ev = ev


class MissWriter:
    """``report(call)`` from the request path; everything else from background threads."""

    def __init__(self, cache: Cache, fps: dict, enabled: bool, on_queued: Callable, *,
                 cap: int = QUEUE_CAP, cap_per_op: int = QUEUE_CAP_PER_OP):
        self.cache, self.fps = cache, fps
        self.cap, self.cap_per_op = cap, cap_per_op   # resolved settings queue_cap, queue_cap_per_op
        self.enabled = enabled                  # on_miss != "ignore"
        self._on_queued = on_queued             # (call) -> None, in the writer thread
        self.widen_of: Callable = lambda call: None   # (call) -> a widened class to queue or None (aoti_farm/compile/widen.py)
        self._pending: queue.Queue = queue.Queue(maxsize=PENDING_LIMIT)
        self._lock = threading.Lock()
        self._reported: set[str] = set()        # keys handed to the writer
        self.outstanding: dict[str, str] = {}   # queued misses not yet published/failed -> device
        self._last_queued = 0.0                 # monotonic time of the last queued miss
        self._first_miss: dict[str, float] = {}  # key -> monotonic time of its first miss here
        self._hist = LatencyHistogram()
        self._pending_done_s = 0.0              # closed first-miss -> first-hit windows
        self.wake = threading.Event()           # a miss was queued: the poller looks now
        self._written = 0                       # queue items this process wrote (cap)
        self._written_op: dict[str, int] = {}   # per op (cap_per_op)
        self._widened: set[str] = set()         # shape classes this process asked to widen
        self.counters = Counters("queued", "queue_dedup", "queue_dropped", "queue_errors", "queue_overflow",
                                 "queue_widened_dedup")
        self._thread = threading.Thread(target=self._loop, name="aoti-farm-missq", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the request path ------------------------------------------------------------------------
    def report(self, call, again: bool = False) -> None:
        """A miss of ``call``: queued once per signature (``again``: once more)."""
        with self._lock:
            if call.key in self._reported and not again:
                return
            self._reported.add(call.key)
            if not again:
                self._first_miss.setdefault(call.key, time.monotonic())
        if not self.enabled:
            return
        try:
            self._pending.put_nowait(call)
        except queue.Full:
            self.counters.inc("queue_dropped")
            with self._lock:
                self._reported.discard(call.key)

    def first_hit(self, key: str) -> None:
        """The first hit of a signature that missed here: closes its miss -> hit window."""
        with self._lock:
            t0 = self._first_miss.pop(key, None)   # once per signature, not per call
            if t0 is not None:
                dt = time.monotonic() - t0
                self._hist.observe(dt)
                self._pending_done_s += dt

    def submit(self, job: Callable[[], None]) -> bool:
        """Run ``job`` in the writer thread; False when the queue is full."""
        try:
            self._pending.put_nowait(job)
            return True
        except queue.Full:
            return False

    # -- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            if isinstance(item, _Flush):
                item.ev.set()
            elif callable(item):
                try:
                    item()
                except Exception as e:  # noqa: BLE001 -- never kills the thread
                    log.debug("background job failed: %s", e)
            else:
                self._write(item)

    def _write(self, call) -> None:
        fp = self.fps[call.device]
        op = call.sig.op
        try:
            widen = self.widen_of(call)
        except Exception:  # noqa: BLE001 -- the exact signature then
            widen = None
        wid = None
        if widen is not None:
            import json

            wid = json.dumps(widen, sort_keys=True, default=str)
            if wid in self._widened:   # this class is asked for already: its kernel covers this call
                self.counters.inc("queue_widened_dedup")
                return
        if self._written >= self.cap or self._written_op.get(op, 0) >= self.cap_per_op:
            self.counters.inc("queue_overflow")   # stays reported: not retried in this process
            return
        try:
            if not self.cache.root.is_dir():
                raise FileNotFoundError(f"cache {self.cache.root} is gone")
            added = missq.enqueue(self.cache, fp.id, call.sig, widen=widen)
        except Exception as e:  # noqa: BLE001 -- read-only, full or vanished cache
            log.debug("cannot queue %s: %s", call.key[:12], e)
            self.counters.inc("queue_errors")
            with self._lock:
                self._reported.discard(call.key)   # try again on a later miss
            return
        self.counters.inc("queued" if added else "queue_dedup")
        if added:
            self._written += 1
            self._written_op[op] = self._written_op.get(op, 0) + 1
        if wid is not None:
            self._widened.add(wid)
        with self._lock:
            self.outstanding[call.key] = call.device
            self._last_queued = time.monotonic()
        self.wake.set()
        self._on_queued(call)

    # -- the poller's side -----------------------------------------------------------------------
    def waiting_shards(self) -> dict[str, set[str]] | None:
        """Per device, the shards of the misses this process queued and still waits for;
        None when there are none, too many to watch one by one, or they were queued long
        ago (then the regular poll looks)."""
        with self._lock:
            if not self.outstanding or time.monotonic() - self._last_queued > WATCH_QUEUED_SECONDS:
                return None
            out: dict[str, set[str]] = {}
            for k, d in self.outstanding.items():
                out.setdefault(d, set()).add(k[:2])
        return None if sum(map(len, out.values())) > WATCH_SHARDS else out

    def prune(self, indexes: dict) -> set[str]:
        """Forget queued misses that are published or recorded as failing; returns the
        devices of those still outstanding."""
        with self._lock:
            for k, d in list(self.outstanding.items()):
                idx = indexes.get(d)
                if idx is None or k in idx.keys or k in idx.failed:
                    del self.outstanding[k]
            return set(self.outstanding.values())

    def stats(self) -> dict:
        s = self.counters.snapshot()
        with self._lock:
            s["queued_waiting"] = len(self.outstanding)   # queued here, not yet published or failed
            s["miss_to_hit_seconds"] = self._hist.snapshot()
            now = time.monotonic()
            s["eager_while_pending_seconds"] = self._pending_done_s + sum(
                now - t for k, t in self._first_miss.items() if k in self.outstanding)
        return s

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every reported miss has been written to the miss queue."""
        done = threading.Event()
        self._pending.put(_Flush(done))
        done.wait(timeout)

    def close(self) -> None:
        self._pending.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=30)
