"""Scheduler unit tests: real Ray, a test-double compiler (tests/doubles.py).

Routing, resource requests, timeouts, retries, backpressure and lease waits, without
Inductor.  One embedded Ray for the module, with a declared (fake) GPU so CUDA routing is
exercised on a CPU-only host.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_scheduler.py.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import ray

from aoti_farm.cache import leases
from aoti_farm.cache.store import Cache
from aoti_farm.config import FarmConfig
from aoti_farm.fingerprint import fingerprint

import doubles
from doubles import ScriptedCompiler
from _counters import assert_delta
from unit.test_scheduler import cpu_sig, cuda_sig   # the unit tier's signature builders

# tests/ is not on the actors' path: the double travels by value, not by module name
ray.cloudpickle.register_pickle_by_value(doubles)


# --- on Ray ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def write_trace(path, sigs):
    entries = [{"order": i, "count": 1, "op": s.op, "args": s.to_obj()["args"]} for i, s in enumerate(sigs)]
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": entries}))
    return str(path)


class Run:
    def __init__(self, tmp_path, script: dict, sigs, **cfg):
        self.script = tmp_path / "script.json"
        self.script.write_text(json.dumps(script))
        self.trace = write_trace(tmp_path / "trace.json", sigs)
        self.cache_dir = cfg.pop("cache_dir", None) or tmp_path / "cache"
        cfg.setdefault("retries", 1)
        cfg.setdefault("lease_ttl", 2.0)
        self.cfg = FarmConfig(cache_dir=str(self.cache_dir), **cfg)
        self.events = []
        self.counters = {}

    def warm(self, on_event=None):
        from aoti_farm.workers.warm import warm

        def ev(kind, data):
            self.events.append((kind, data))
            if on_event:
                on_event(kind, data)

        self.rc = warm(self.cfg, [self.trace], report=str(self.script.parent / "report.json"),
                       compiler_factory=functools.partial(ScriptedCompiler, script=str(self.script)),
                       on_event=ev, counters_out=self.counters)
        self.report = {r["key"]: r for r in json.loads((self.script.parent / "report.json").read_text())["signatures"]}
        return self.rc

    def log(self) -> list[tuple[str, str]]:
        p = str(self.script) + ".log"
        if not os.path.exists(p):
            return []
        return [tuple(line.split()[:2]) for line in open(p)]

    def starts(self, key) -> int:
        return sum(1 for what, k in self.log() if what == "start" and k == key)


def test_routing_cpu_and_cuda_on_ray(ray_local, tmp_path):
    sigs = [cpu_sig(2), cpu_sig(3), cuda_sig(4)]
    # 1 CPU actor + 1 GPU actor (which also takes a CPU) fit the 2 CPUs
    r = Run(tmp_path, {}, sigs, cpu_workers=1, gpu_workers=1, gpus_per_worker=0.5)
    assert r.warm() == 0
    where = {d["key"]: d["worker"]["device"] for k, d in r.events if k == "dispatch"}
    assert where == {sigs[0].key: "cpu", sigs[1].key: "cpu", sigs[2].key: "cuda:0"}
    assert {v["status"] for v in r.report.values()} == {"compiled"}
    # the CUDA fingerprint came from the GPU actor, not the driver
    assert r.report[sigs[2].key]["fp_id"] == fingerprint("cuda:0").id != fingerprint("cpu").id


def test_refusal_is_final_crash_is_retried(ray_local, tmp_path):
    good, refused, crashing = cpu_sig(5), cpu_sig(6), cpu_sig(7)
    r = Run(tmp_path, {refused.key: "refuse", crashing.key: "crash"}, [good, refused, crashing],
            cpu_workers=2, retries=1)
    assert r.warm() == 1
    assert r.report[good.key]["status"] == "compiled"
    assert r.report[refused.key]["status"] == "failed" and "scripted refusal" in r.report[refused.key]["error"]
    assert r.starts(refused.key) == 1                     # never retried
    assert r.report[crashing.key]["status"] == "failed" and "scripted crash" in r.report[crashing.key]["error"]
    assert r.starts(crashing.key) == 2                    # 1 + retries
    cache, fp = Cache(r.cache_dir), fingerprint("cpu")
    assert cache.failure(fp.id, refused.key)["reason"] == "scripted refusal"
    assert cache.failure(fp.id, crashing.key) is None     # infrastructure failures leave no record
    # a second run does not start Ray work for the recorded failure and still says 1
    (tmp_path / "again").mkdir()
    r2 = Run(tmp_path / "again", {}, [refused], cache_dir=str(r.cache_dir))
    assert r2.warm() == 1 and "recorded failure" in r2.report[refused.key]["error"]
    assert r2.starts(refused.key) == 0


def test_timeout_kills_actor_and_retries(ray_local, tmp_path):
    hung, other = cpu_sig(8), cpu_sig(9)
    r = Run(tmp_path, {hung.key: "hang-once"}, [hung, other], cpu_workers=1, timeout=5.0, retries=1)
    assert r.warm() == 0
    assert r.counters["timeouts"] == 1 and r.counters["actor_losses"] == 1
    assert r.report[hung.key]["status"] == "compiled" and r.report[hung.key]["attempts"] == 2
    assert r.starts(hung.key) == 2
    assert r.report[other.key]["status"] == "compiled"
    # the killed actor's lease was broken rather than waited out
    assert r.counters["leases_broken"] == 1


def test_backpressure_bounds_in_flight(ray_local, tmp_path):
    sigs = [cpu_sig(10 + i) for i in range(5)]
    r = Run(tmp_path, {s.key: "sleep:0.2" for s in sigs}, sigs, cpu_workers=2, max_in_flight=1)
    assert r.warm() == 0
    # every pool counter exactly: 5 dispatched and compiled, 2 actors, nothing retried
    assert_delta({}, r.counters, {"dispatched": 5, "compiled": 5, "actors_started": 2, "peak_in_flight": 1})
    running, peak = 0, 0
    for what, _ in r.log():
        running += 1 if what == "start" else -1
        peak = max(peak, running)
    assert peak == 1 and len(r.log()) == 10


def test_busy_lease_waits_instead_of_compiling_twice(ray_local, tmp_path):
    """Another farm holds the lease and publishes while we wait: we compile nothing."""
    sig = cpu_sig(20)
    r = Run(tmp_path, {}, [sig], cpu_workers=1, lease_ttl=60.0)
    cache, fp = Cache(r.cache_dir), fingerprint("cpu")
    cache.ensure(fp)
    other = leases.try_acquire(cache, fp.id, sig.key, "other-farm", ttl=60.0)

    def on_event(kind, data):
        if kind == "busy":  # the other farm finishes: publish, release
            work = tmp_path / "k.so"
            work.write_bytes(b"x")
            cache.publish(fp, sig, {"kernel.so": str(work)}, {"compiler": "other"})
            other.release()

    assert r.warm(on_event) == 0
    assert r.report[sig.key]["status"] == "cached"
    assert r.starts(sig.key) == 0 and r.counters["busy_parks"] == 1


def test_stale_lease_is_taken_over(ray_local, tmp_path):
    """A lease left by a dead farm (no heartbeat) is stale after its TTL, then taken over."""
    sig = cpu_sig(21)
    r = Run(tmp_path, {}, [sig], cpu_workers=1, lease_ttl=1.0)
    cache, fp = Cache(r.cache_dir), fingerprint("cpu")
    cache.ensure(fp)
    p = leases.lease_path(cache, fp.id, sig.key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"owner": "dead-farm", "ttl": 1.0}))
    assert r.warm() == 0
    assert r.report[sig.key]["status"] == "compiled" and r.starts(sig.key) == 1
