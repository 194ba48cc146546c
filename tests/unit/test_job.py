"""job.compile_and_publish: lease + compile + publish, with the compiler test double
(tests/doubles.py) on a real cache directory.  Real compiles are covered elsewhere
(tests/e2e/test_compiler.py, the drills); here each rule of the job is checked alone."""

from __future__ import annotations

import json
import os

import pytest
import torch

from aoti_farm import budget
from aoti_farm.compile import job
from aoti_farm.cache import leases
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import fingerprint

from doubles import TIMED_SPEED, ScriptedCompiler


@pytest.fixture(scope="module")
def fp():
    return fingerprint("cpu")


class World:
    def __init__(self, tmp_path, fp, script=None):
        (tmp_path / "cache").mkdir()
        self.cache = Cache(tmp_path / "cache", signing_key=None)
        self.fp = fp
        self.script = tmp_path / "script.json"
        self.script.write_text(json.dumps(script or {}))
        self.compiler = ScriptedCompiler(script=str(self.script))
        self.workroot = tmp_path / "work"
        self.workroot.mkdir()

    def run(self, sig, **kw):
        kw.setdefault("owner", "test-job")
        return job.compile_and_publish(self.cache, self.compiler, self.fp, sig, workroot=str(self.workroot), **kw)

    def starts(self, key=None) -> int:
        p = str(self.script) + ".log"
        if not os.path.exists(p):
            return 0
        return sum(1 for line in open(p) if line.startswith("start") and (key is None or key in line))


def sig(n: int = 8) -> S.Signature:
    return S.from_call(torch.ops.aten.add.Tensor, (torch.empty(n, 16), torch.empty(16)), {"alpha": 2})


def test_compiled_then_cached(tmp_path, fp):
    w, s = World(tmp_path, fp), sig()
    out = w.run(s, attempts=2)
    assert out.status == job.COMPILED and out.key == s.key and out.error is None
    entry = w.cache.open_entry(fp, s.key)
    m = entry.manifest
    assert (m["compiler"], m["attempts"], m["worker"]) == (ScriptedCompiler.name, 2, out.worker)
    assert m["verification"] == {"double": True}
    assert "speed" not in m and "threads" not in m          # the result had none
    assert leases.list_leases(w.cache, fp.id) == []            # released
    assert os.listdir(w.workroot) == []                        # work directory removed
    again = w.run(s)
    assert again.status == job.CACHED and w.starts(s.key) == 1


def test_speed_and_threads_reach_the_manifest(tmp_path, fp):
    s = sig()
    w = World(tmp_path, fp, {s.key: "timed"})
    assert w.run(s).status == job.COMPILED
    m = w.cache.open_entry(fp, s.key).manifest
    assert m["speed"] == TIMED_SPEED and m["threads"] == "dynamic"


def test_refusal_is_recorded_and_not_compiled_again(tmp_path, fp):
    s = sig()
    w = World(tmp_path, fp, {s.key: "refuse"})
    out = w.run(s, attempts=3)
    assert out.status == job.FAILED and out.error == "scripted refusal" and out.evidence == {"script": True}
    rec = w.cache.failure(fp.id, s.key)
    assert rec["reason"] == "scripted refusal" and rec["attempts"] == 3
    assert not w.cache.has_entry(fp.id, s.key)
    assert leases.list_leases(w.cache, fp.id) == [] and os.listdir(w.workroot) == []
    again = w.run(s)
    assert again.status == job.FAILED and again.error == "scripted refusal"
    assert w.starts(s.key) == 1                                # the record answered


def test_infrastructure_failure_raises_and_leaves_nothing(tmp_path, fp):
    s = sig()
    w = World(tmp_path, fp, {s.key: "crash"})
    with pytest.raises(RuntimeError, match="scripted crash"):
        w.run(s)
    assert w.cache.failure(fp.id, s.key) is None               # retried by the caller, never recorded
    assert not w.cache.has_entry(fp.id, s.key)
    assert leases.list_leases(w.cache, fp.id) == [] and os.listdir(w.workroot) == []


def test_busy_while_another_holds_the_lease_then_cached(tmp_path, fp):
    w, s = World(tmp_path, fp), sig()
    w.cache.ensure(fp)
    other = leases.try_acquire(w.cache, fp.id, s.key, "other-farm", ttl=60)
    try:
        assert w.run(s).status == job.BUSY and w.starts() == 0
        # the other farm publishes (with its own compiler) and lets go
        work = tmp_path / "k.so"
        work.write_bytes(b"published by the other farm")
        w.cache.publish(fp, s, {"kernel.so": str(work)}, {"compiler": "other"})
        # published: cached at once, even before the other farm lets go of its lease
        out = w.run(s)
    finally:
        other.release()
    assert out.status == job.CACHED and w.starts() == 0
    assert w.cache.open_entry(fp, s.key).manifest["compiler"] == "other"


def test_on_start_runs_once_before_the_compile(tmp_path, fp):
    w, s = World(tmp_path, fp), sig()
    seen = []
    out = w.run(s, on_start=lambda: seen.append(w.starts()))
    assert out.status == job.COMPILED and seen == [0] and w.starts() == 1
    seen.clear()
    assert w.run(s, on_start=lambda: seen.append(1)).status == job.CACHED and seen == []


def test_over_the_memory_budget_fails_without_compile_or_record(tmp_path, fp):
    w, s = World(tmp_path, fp), sig()
    before = budget.COUNTERS.get("refused")
    w.cache.ensure(fp)
    other = leases.try_acquire(w.cache, fp.id, s.key, "other-farm", ttl=60)
    try:
        # its inputs alone need 2304 bytes: refused before the lease is even asked for
        out = w.run(s, memory_budget=1024)
    finally:
        other.release()
    assert out.status == job.FAILED and out.evidence["refused"] == "memory_budget"
    assert "over the memory budget" in out.error
    assert budget.COUNTERS.get("refused") == before + 1
    assert w.starts() == 0 and w.cache.failure(fp.id, s.key) is None     # the budget is the host's
    assert not os.path.exists(w.cache.ns(fp.id) / "leases") or leases.list_leases(w.cache, fp.id) == []
    assert w.run(s).status == job.COMPILED                       # a larger budget compiles it


def test_the_whole_estimate_is_paid_only_under_the_lease(tmp_path, fp):
    """Inputs 2304 bytes fit 5000; inputs and outputs (10,496 bytes) do not.  While another
    process holds the lease the answer is busy, not failed: the estimate that needs a meta
    run is made only by the process about to compile."""
    w, s = World(tmp_path, fp), sig()
    w.cache.ensure(fp)
    other = leases.try_acquire(w.cache, fp.id, s.key, "other-farm", ttl=60)
    try:
        assert w.run(s, memory_budget=5000).status == job.BUSY
    finally:
        other.release()
    out = w.run(s, memory_budget=5000)
    assert out.status == job.FAILED and "output elements" in out.error and w.starts() == 0
    assert leases.list_leases(w.cache, fp.id) == []


def test_outcome_to_dict_is_plain(tmp_path, fp):
    w, s = World(tmp_path, fp), sig()
    d = w.run(s).to_dict()
    assert d["status"] == "compiled" and d["key"] == s.key
    json.dumps(d)


# --- shape classes: the same job, the same Compiler -------------------------------------------------


def a_class():
    """The class of ``add`` on [n, 16] for n = 4, 8, 12 (s0 = 4..12)."""
    from aoti_farm.dynamic import shapes as SH
    from unit.test_shapes import T, add

    return SH.classes([add(T((n, 16)), T((n, 16))) for n in (4, 8, 12)])[0][0]


def test_a_class_task_is_compiled_by_the_actors_compiler_through_the_job(tmp_path, monkeypatch):
    """On the pool, a class task (``CompileActor.compile_class``) is compiled by the actor's
    own ``Compiler`` (here the scheduler's double) through ``job.compile_and_publish``:
    one compile path, not a second one that builds its own compiler."""
    from aoti_farm.dynamic import dyncompile, shapes as SH
    from aoti_farm.workers.classtasks import ClassJob
    from aoti_farm.workers.compile_actor import CompileActor

    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")   # the actor sets it: restored after the test
    script = tmp_path / "script.json"
    script.write_text("{}")
    cls = a_class()
    actor = CompileActor(str(tmp_path / "c"), compiler_factory=lambda o: ScriptedCompiler(o, script=str(script)))
    out = actor.compile_class(ClassJob(cls).to_obj())
    assert out["status"] == "compiled" and out["key"] == cls.key, out
    log = (tmp_path / "script.json.log").read_text().split()
    assert log[:2] == ["start", cls.key]                      # the double received the class itself
    cache, fp = actor._cache, actor._fp
    m = cache.open_entry(fp, cls.key).manifest
    assert m["compiler"] == ScriptedCompiler.name and SH.parse_class(m["shape_class"]) == cls
    assert m["signature"] == cls.example.to_obj() and m["speed_samples"] == []
    assert cls.key in dyncompile.hinted_keys(cache, fp.id, cls.group_key)   # the serving hook's hint
    assert out["evidence"] == {"ranges": {"s0": [4, 12]}, "serve_range": None}
    assert leases.list_leases(cache, fp.id) == []
    again = actor.compile_class(ClassJob(cls).to_obj())
    assert again["status"] == "cached" and again["evidence"]["ranges"] == {"s0": [4, 12]}
    assert (tmp_path / "script.json.log").read_text().split().count("start") == 1


def test_a_refused_class_leaves_no_failure_record(tmp_path, fp):
    """A class the compiler refuses falls back to its members (who get their own records);
    a failure the compiler raises otherwise is the caller's (dynwarm: the fallback), never
    a record of the class key."""
    from aoti_farm.compile import dynwarm

    cls = a_class()
    w = World(tmp_path, fp, {cls.key: "refuse"})
    out = w.run(cls)
    assert out.status == job.FAILED and out.key == cls.key and out.error == "scripted refusal"
    assert w.cache.failure(fp.id, cls.key) is None and not w.cache.has_entry(fp.id, cls.key)
    assert w.run(cls).status == job.FAILED and w.starts(cls.key) == 2          # no record answered
    w.script.write_text(json.dumps({cls.key: "crash"}))
    with pytest.raises(RuntimeError, match="scripted crash"):
        w.run(cls)
    d = dynwarm.compile_class(w.cache, cls, w.compiler, fp, None, owner="test-job")
    assert d["status"] == "failed" and "scripted crash" in d["error"]
    assert w.cache.failure(fp.id, cls.key) is None
    assert leases.list_leases(w.cache, fp.id) == [] and os.listdir(w.workroot) == []


def test_a_class_over_the_memory_budget_at_its_widest_shape_is_not_compiled(tmp_path, fp):
    cls = a_class()
    w = World(tmp_path, fp)
    before = budget.COUNTERS.get("refused")
    # the widest member's inputs (2 x 12 x 16 floats, 1536 bytes) are over 1024; the narrowest's (512) are not
    out = w.run(cls, memory_budget=1024)
    assert out.status == job.FAILED and out.error.startswith("widest shape: ") and w.starts() == 0
    assert budget.COUNTERS.get("refused") == before                 # its members are counted, one by one
    assert w.cache.failure(fp.id, cls.key) is None
