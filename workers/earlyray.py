"""`warm` on a many-core host: start the embedded Ray before the driver imports torch.

Reading a trace means building each signature's key, which needs torch (the op's
schema); ``warm`` then started Ray.  On the 16-core GPU host the driver's ``import
torch`` took 3.5-4.4 s (run 12, 2026-11-27), and Ray's prestarted workers, whose own
imports set when compiling can start, began only after it, about 10 s in.

Where the job surely has work, this module lets Ray start first.  The test runs without
torch: the traces' JSON is counted, and the cache's entries are counted by a scan of its
directories.  ``ray.init`` then runs in the main thread: started from another thread
that then ends, Ray lost its GCS (tried on the 2-core VM, Ray 2.60.0).  The traces are
loaded in a thread meanwhile: the keys, then the cache and :func:`~aoti_farm.workers.warm.surely_work`, then the plan.  That
thread imports torch while ``ray.init`` mostly waits for its processes.  On a fresh host
the ISA probe is forked first, before any thread exists
(:mod:`aoti_farm.isafork`; its child imports torch itself).  The host preparation
(:mod:`aoti_farm.hostprep`) also starts at once.

When is work "sure"?  When the traces hold more distinct entries than the cache holds
keys and failure records, over every fingerprint namespace.  Entries that differ as JSON
but share a key can only make this count too high.  That costs no correctness: such a
warm starts a Ray it may not need and stops it when the plan leaves nothing to do.  The
embedded Ray is sized from the count, which bounds the real number of signatures from
above, as :func:`~aoti_farm.workers.placement.embedded_cpus` needs.

It applies only to an embedded Ray with the real compiler and ``--dynamic off``, on a
host of at least :data:`~aoti_farm.workers.warm.PREP_MIN_CORES` cores (on 2 cores
start-up is CPU-bound and keeps its order).  Anything unexpected in the count (an
unreadable or malformed trace, an odd cache) means no early start, and the normal path
reports the problem.  ``AOTI_FARM_DEV=early_ray=0`` turns it off.
"""

from __future__ import annotations

import glob
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

from aoti_farm.config import FarmConfig

DEV = "early_ray"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place
#: The most bytes of one trace read here (``aoti_farm.trace.MAX_BYTES``; a larger trace
#: is refused by the loader anyway).
MAX_TRACE_BYTES = 256 << 20
_FP_NAME = re.compile(r"^[0-9a-f]{24}$")
_KEY_NAME = re.compile(r"^[0-9a-f]{64}")


def enabled() -> bool:
    return _dev(DEV) != "0"


@dataclass(frozen=True)
class Steps:
    """What ``warm`` does, handed in by it (:func:`aoti_farm.workers.warm.early_steps`;
    this module must not import ``warm``, which imports it)."""
    min_cores: int                # warm.PREP_MIN_CORES
    load_signatures: Callable     # (models) -> sigs
    open_cache: Callable          # (cfg, signing_key) -> cache
    surely_work: Callable         # (sigs, cache, memory_budget) -> {"cpu", "gpu"}
    isa_then_plan: Callable       # (cfg, sigs, cache, sure, timeline, compiler_factory, forked) -> plan
    start_host_prep: Callable     # (cfg, n_cpu, timeline, compiler_factory, predict=) -> thread | None
    ray_args: Callable            # (cfg, n_cpu, n_gpu, compiler_factory) -> start_ray's keywords


def count_entries(models: list[str]) -> dict[str, int] | None:
    """Distinct trace entries per pool kind (``{"cpu", "gpu"}``), without torch: an entry
    with a CUDA tensor argument is a GPU one.  None where a trace cannot be read this way."""
    seen: dict[str, str] = {}
    try:
        for path in models:
            with open(path, "rb") as f:
                raw = f.read(MAX_TRACE_BYTES + 1)
            if len(raw) > MAX_TRACE_BYTES:
                return None
            doc = json.loads(raw.decode("utf-8"))
            for e in doc["entries"]:
                ident = json.dumps([e["op"], e["args"]], sort_keys=True)
                seen.setdefault(ident, "gpu" if _on_cuda(e["args"]) else "cpu")
    except (OSError, ValueError, TypeError, KeyError, RecursionError, AttributeError):
        return None
    out = {"cpu": 0, "gpu": 0}
    for kind in seen.values():
        out[kind] += 1
    return out


def _on_cuda(args) -> bool:
    for a in args:
        if isinstance(a, dict):
            items = a.get("items") if a.get("kind") == "tensor_list" else [a]
            for t in items if isinstance(items, list) else []:
                if isinstance(t, dict) and str(t.get("device", "")).startswith("cuda"):
                    return True
    return False


def known_keys(cache_dir: str, enough: int | None = None) -> int:
    """How many entries and failure records the cache holds, over every namespace (a
    scan of names only; 0 for a missing cache).  ``enough``: stop counting there (a
    large shared cache need not be scanned to the end to know it holds that many)."""
    n = 0
    try:
        with os.scandir(cache_dir) as top:
            spaces = [d.path for d in top if _FP_NAME.match(d.name) and d.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    for ns in spaces:
        for sub in ("entries", "failed"):
            try:
                with os.scandir(os.path.join(ns, sub)) as shards:
                    paths = [s.path for s in shards if s.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for sh in paths:
                if enough is not None and n >= enough:
                    return n
                try:
                    with os.scandir(sh) as it:
                        n += sum(1 for e in it if _KEY_NAME.match(e.name))
                except OSError:
                    continue
    return n


def fresh_host() -> bool:
    """No ISA memo at all in this host's memo directory (whatever torch build)."""
    from aoti_farm.fsutil import memo_dir

    return not glob.glob(os.path.join(glob.escape(memo_dir()), "isa-*.json"))


class Early:
    """A warm whose Ray starts before its traces are loaded: the ISA probe (forked on a
    fresh host) and the host preparation are running; :meth:`start_ray` imports Ray, then
    starts a loader thread that reads the traces, opens the cache and plans, and starts
    Ray in this (the main) thread meanwhile; :meth:`loaded` and :meth:`planned` wait for
    the loader."""

    def __init__(self, cfg: FarmConfig, models: list[str], counts: dict, signing_key: bytes | None,
                 compiler_factory: Callable | None, timeline: dict, steps: Steps):
        self.cfg, self.counts, self.timeline, self.steps = cfg, counts, timeline, steps
        self.compiler_factory = compiler_factory
        self.forked = None
        if fresh_host():
            from aoti_farm import isafork

            self.forked = isafork.start(pycache=timeline.get("pycache"))   # no thread yet, no torch
        # the host's per-host products for the compiles to come (a CPU job of >= 2)
        self.prep = steps.start_host_prep(cfg, counts["cpu"], timeline, compiler_factory,
                                          predict=self.forked is not None)
        self._loaded = threading.Event()
        self._planned = threading.Event()
        self.box: dict = {}
        self._thread = threading.Thread(target=self._load_and_plan, args=(models, signing_key),
                                        name="aoti-farm-load", daemon=True)
        timeline["early_ray"] = {"entries": counts}

    def _load_and_plan(self, models: list[str], signing_key: bytes | None) -> None:
        st = self.steps
        try:
            try:
                sigs = st.load_signatures(models)
                cache = st.open_cache(self.cfg, signing_key)
                self.box.update(sigs=sigs, cache=cache, sure=st.surely_work(sigs, cache, self.cfg.memory_budget))
                self.timeline["loaded"] = time.time()
            finally:
                self._loaded.set()
            self.box["plan"] = st.isa_then_plan(self.cfg, self.box["sigs"], cache, self.box["sure"], self.timeline,
                                                self.compiler_factory, self.forked)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread
            self.box["error"] = e
        finally:
            self._loaded.set()
            self._planned.set()

    def start_ray(self):
        """(ray, started): the embedded Ray, sized from the count of entries."""
        from aoti_farm.workers.raysetup import start_ray

        try:
            import ray  # noqa: F401 -- before the loader imports torch: both would hold the interpreter lock
        finally:
            self._thread.start()   # reads the traces (importing torch) while ray.init waits for Ray's processes
        self.timeline["ray_imported"] = time.time()
        ray, started = start_ray(self.cfg, **self.steps.ray_args(self.cfg, self.counts["cpu"], self.counts["gpu"],
                                                                 self.compiler_factory))
        self.timeline["ray_started"] = time.time()
        return ray, started

    def loaded(self):
        """(sigs, cache, sure) once the loader has them; its error is raised here."""
        self._loaded.wait()
        if "sure" not in self.box:
            self._planned.wait()
            raise self.box.get("error") or RuntimeError("aoti-farm: the trace loader stopped")
        return self.box["sigs"], self.box["cache"], self.box["sure"]

    def planned(self):
        self._planned.wait()
        if "error" in self.box:
            raise self.box["error"]
        return self.box["plan"]

    def wait(self) -> None:
        """Wait for the loader thread (on the way out after an error)."""
        if self._thread.ident is not None:   # started (start_ray always starts it)
            self._planned.wait()


def begin(cfg: FarmConfig, models: list[str], signing_key: bytes | None, compiler_factory: Callable | None,
          timeline: dict, steps: Steps) -> Early | None:
    """Start the early path where it applies (see the module doc), else None."""
    if (not enabled() or cfg.address or compiler_factory is not None or getattr(cfg, "dynamic", "off") != "off"
            or (os.cpu_count() or 1) < steps.min_cores):
        return None
    counts = count_entries(models)
    total = sum(counts.values()) if counts else 0
    if not total or total <= known_keys(str(cfg.cache_dir), enough=total):
        return None
    return Early(cfg, models, counts, signing_key, compiler_factory, timeline, steps)

