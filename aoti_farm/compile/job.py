"""One unit of farm work: lease, compile, verify, publish (or record the failure).

Shared by the Ray compile actors, the runtime's background compile worker and
``aoti-farm compile-one`` so that every path obeys the same rules; a shape class's kernel
(``warm --dynamic auto``, a widened class) is one such unit too, keyed by its class key.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field

from aoti_farm import budget
from aoti_farm.dynamic import dyncompile
from aoti_farm.cache import leases
from aoti_farm.cache.manifest import GUARDED_FORMAT
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import Compiler
from aoti_farm.compile.faults import own_code_error
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import CompileRefused
from aoti_farm.fingerprint import Fingerprint
from aoti_farm.dynamic.shapes import ShapeClass
from aoti_farm.signature import Signature

#: Compiles of this process that failed on a bug of aoti-farm's own code (own_code_error).
COUNTERS = Counters("own_bugs")


def bug_reason(bug: dict) -> str:
    """The failure record's reason for a bug of ours (a line a user can report)."""
    return f"bug in aoti-farm: {bug['exception']} at {bug['where']}"


def record_bug(cache: Cache, fp: Fingerprint, sig: Signature, bug: dict, attempts: int, seconds: float,
               worker: str) -> "Outcome":
    """A compile that failed on a bug of ours: recorded once as a failure with its
    traceback (``cache ls --failed``, the warm report), counted, and final: it fails the same
    way on every retry, so retrying it as infrastructure only hides it."""
    COUNTERS.inc("own_bugs")
    reason = bug_reason(bug)
    cache.record_failure(fp, sig, reason, evidence=bug, attempts=attempts)
    return Outcome(sig.key, FAILED, seconds, worker, reason, bug)


# statuses
COMPILED, CACHED, FAILED, BUSY = "compiled", "cached", "failed", "busy"


@dataclass
class Outcome:
    key: str
    status: str                       # compiled | cached | failed | busy (leased elsewhere)
    seconds: float = 0.0
    worker: str = ""
    error: str | None = None
    evidence: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    build: dict = field(default_factory=dict)     # how the wrapper was built (aoti_farm.build.splitbuild)

    def to_dict(self) -> dict:
        return asdict(self)


def compile_and_publish(cache: Cache, compiler: Compiler, fp: Fingerprint, sig: Signature | ShapeClass, *,
                        owner: str, attempts: int = 1, lease_ttl: float = leases.DEFAULT_TTL,
                        workroot: str | None = None, on_start=None, memory_budget: int | None = None) -> Outcome:
    """``memory_budget``: bytes (None: a quarter of
    this host's memory).  A signature over it is refused before anything is compiled or
    allocated: a ``failed`` outcome whose evidence says ``refused: memory_budget``, with
    no failure record (the budget is this host's, another may compile it); see
    :mod:`aoti_farm.budget`.  The inputs alone are checked first; the whole estimate
    (a meta run, whose first one imports torch._dynamo) only under the lease, when this
    process is about to compile, so a cached or busy answer never pays for it.

    ``sig`` may be a :class:`~aoti_farm.dynamic.shapes.ShapeClass`: the same lease, compile
    (``compiler.compile(cls, workdir)``) and publish, keyed by the class key, with what is
    a class's own (:mod:`aoti_farm.dynamic.dyncompile`): the budget is checked at its widest
    member (``"widest shape: ..."``), its manifest has ``shape_class`` and
    ``speed_samples``, the serving hook's hint is written, ``evidence`` has ``ranges`` and
    ``serve_range``, and a refusal is a ``failed`` outcome without a failure record (the
    caller compiles the members exactly; they get their own).  Any other exception of a
    class compile is raised to the caller."""
    cls = sig if isinstance(sig, ShapeClass) else None
    key = sig.key
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if cache.has_entry(fp.id, key):
        return _cached(cache, fp, key, cls, worker)
    if cls is None and cache.failure(fp.id, key) is not None:
        rec = cache.failure(fp.id, key) or {}
        return Outcome(key, FAILED, worker=worker, error=rec.get("reason"), evidence=rec.get("evidence") or {})
    sized = sig if cls is None else dyncompile.widest(cls)   # what the memory budget is checked at
    over = _over_budget(sized, memory_budget, cls, outputs=False)
    if over is not None:
        return Outcome(key, FAILED, worker=worker, error=over[0], evidence=over[1])
    cache.ensure(fp)
    lease = leases.try_acquire(cache, fp.id, key, owner, lease_ttl)
    if lease is None:
        return Outcome(key, BUSY, worker=worker)
    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix=f"aoti-farm-{key[:12]}-", dir=workroot)
    try:
        # re-check under the lease: someone may have published while we waited
        if cache.has_entry(fp.id, key):
            return _cached(cache, fp, key, cls, worker)
        over = _over_budget(sized, memory_budget, cls)
        if over is not None:
            return Outcome(key, FAILED, worker=worker, error=over[0], evidence=over[1])
        if on_start is not None:
            on_start()   # the compile begins (the serving hook makes room for it)
        try:
            res = compiler.compile(sig, workdir)
        except CompileRefused as e:
            if cls is None:
                cache.record_failure(fp, sig, e.reason, evidence=e.evidence, attempts=attempts)
            return Outcome(key, FAILED, time.perf_counter() - t0, worker, e.reason,
                           e.evidence if cls is None else (e.evidence or {}))
        except Exception as e:
            bug = own_code_error(e) if cls is None else None
            if bug is None:
                raise   # the host's failure: the farm retries it (a class's: its caller decides)
            return record_bug(cache, fp, sig, bug, attempts, time.perf_counter() - t0, worker)
        extra = {} if cls is None else {"shape_class": cls.to_obj(), "speed_samples": res.speed_samples or []}
        guarded = isinstance(res.verification, dict) and res.verification.get("index_guards")
        cache.publish(fp, sig if cls is None else dyncompile.ClassEntry(cls), res.files, {
            **extra,
            # a reader that knows no index guards refuses this format (manifest.GUARDED_FORMAT)
            **({"format": GUARDED_FORMAT} if guarded else {}),
            "compile_seconds": res.seconds, "phases": res.phases, "verification": res.verification,
            "worker": worker, "compiler": compiler.name, "attempts": attempts,
            "build": getattr(res, "build", None) or {},
            **({"cpu": res.cpu} if getattr(res, "cpu", None) else {}),
            # the speed gate (runtime/gate.py) and how a CPU kernel threads (compiler.thread_mode)
            **({"speed": res.speed} if getattr(res, "speed", None) else {}),
            **({"threads": res.threads} if getattr(res, "threads", None) else {}),
            # the intra-op thread counts a CPU kernel was verified at (Entry.verified_threads)
            **({"verified_threads": sorted(int(t) for t in res.verified_threads)}
               if getattr(res, "verified_threads", None) else {}),
        })
        ev = {}
        notes = (res.verification or {}).get("edge_notes") if isinstance(res.verification, dict) else None
        if notes:   # the classes of its edge notes: warm's summary counts them
            ev["edge_notes"] = sorted({n.get("class", "?") for n in notes if isinstance(n, dict)})
        if cls is not None:
            dyncompile.write_hint(cache, fp, cls)
            ev.update({"ranges": dyncompile.ranges(cls), "serve_range": (res.speed or {}).get("serve_range")})
        return Outcome(key, COMPILED, time.perf_counter() - t0, worker, phases=res.phases,
                       build=getattr(res, "build", None) or {}, evidence=ev)
    finally:
        lease.release()
        shutil.rmtree(workdir, ignore_errors=True)


def _cached(cache: Cache, fp: Fingerprint, key: str, cls: ShapeClass | None, worker: str) -> Outcome:
    """A published entry's outcome; a class's also (re)writes the serving hook's hint and
    reports its ranges and serve range."""
    if cls is None:
        return Outcome(key, CACHED, worker=worker)
    dyncompile.write_hint(cache, fp, cls)
    return Outcome(key, CACHED, worker=worker, evidence={"ranges": dyncompile.ranges(cls),
                                                             "serve_range": dyncompile.serve_range(cache, fp, cls.key)})


def _over_budget(sig: Signature, memory_budget: int | None, cls: ShapeClass | None, outputs: bool = True):
    """(reason, evidence) when ``sig`` is over the memory budget, else None.  An exact
    signature's refusal is counted (``budget.COUNTERS``); a class's names its widest shape
    and is not counted (its members are then checked, and counted, one by one)."""
    over = budget.refusal(sig, memory_budget, outputs=outputs)
    if over is None:
        return None
    if cls is not None:
        return f"widest shape: {over[0]}", over[1]
    budget.COUNTERS.inc("refused")
    return over
