"""Shape classes and shape-general kernels.

One real class compile for the module (``warmed``: ``aoti-farm warm --dynamic auto`` of a
trace with silu at three lengths) and one exact compile (precedence); the rest is pure.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_shapes.py.
"""

from __future__ import annotations

import json
import os
import shutil

import msgpack
import pytest
import torch

from aoti_farm.dynamic import dyncompile, shapes as SH
from aoti_farm import signature as S
from aoti_farm.cache.store import BadEntry, Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish


from unit.test_shapes import T, add   # the encoded-signature builders the unit tier uses


# --- fallback (export only, no Inductor) ------------------------------------------------------------


def test_a_class_that_cannot_be_exported_dynamically_falls_back_to_exact(tmp_path):
    from aoti_farm.compile import dynwarm
    from aoti_farm.workers.classtasks import ClassWork
    from aoti_farm.workers.scheduler import Result

    # _unsafe_view to [-1, 64] needs s0 * 16 % 64 == 0: export refuses symbolic s0
    sigs = [S.Signature("aten::_unsafe_view", (T((n, 16)), ("il", (-1, 64)))) for n in (4, 8, 12)]
    cls = SH.classes(sigs)[0][0]
    cache = Cache(tmp_path / "c")
    comp = AOTICompiler()
    fp = fingerprint("cpu", comp.options())
    out = dynwarm.compile_class(cache, cls, comp, fp, None, owner="pytest")     # what the pool's actor runs
    assert out["status"] == "failed" and "export with symbolic sizes failed" in out["error"]
    assert not cache.has_entry(fp.id, cls.key)

    # the driver: the class is one pool task; refused, its members become exact tasks on the same pool
    class Cfg:
        inductor_options, memory_budget = {}, None

    class Sched:
        added = []
        add = added.append

    from aoti_farm.workers.warm import plan

    work = ClassWork(Cfg, cache, open(os.devnull, "w"), plan)
    assert work.split(sigs) == []                                   # members leave the exact plan
    work.start(Sched, None)
    assert [(t.key, t.method) for t in Sched.added] == [(cls.key, "compile_class")]
    assert work.event("done", {"result": Result(cls.key, cls.op, out["status"], error=out["error"])})
    assert [(t.key, t.method) for t in Sched.added[1:]] == [(s.key, "compile") for s in sigs]   # compiled exactly
    assert [s.key for s in work.fallback] == [s.key for s in sigs]
    rows = work.rows()
    assert rows[0]["status"] == "fallback" and "export" in rows[0]["error"]


# --- one real class compile, shared ---------------------------------------------------------------


LENGTHS = (8, 24, 40)


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """``aoti-farm warm --dynamic auto`` of a trace with silu at three lengths."""
    import aoti_farm
    from aoti_farm.cli import main

    d = tmp_path_factory.mktemp("shapes")
    trace = d / "trace.json"
    with aoti_farm.record(str(trace)):
        for n in LENGTHS:
            torch.nn.functional.silu(torch.randn(n, 64))
    report = d / "report.json"
    rc = main(["warm", "--model", str(trace), "--dynamic", "auto", "--cache-dir", str(d / "cache"),
               "--cpu-workers", "1", "--report", str(report)])
    assert rc == 0
    cache = Cache(d / "cache")
    fp = fingerprint("cpu")
    return cache, fp, json.loads(report.read_text())


def _class_key(cache, fp):
    keys = cache.list_keys(fp.id)
    for k in keys:
        if "shape_class" in cache.read_manifest(cache.entry_dir(fp.id, k)):
            return k
    raise AssertionError("no shape-general entry")


def test_warm_dynamic_auto_publishes_one_class_kernel_for_three_lengths(warmed):
    cache, fp, report = warmed
    assert len(cache.list_keys(fp.id)) == 1                       # one kernel, not three
    k = _class_key(cache, fp)
    m = cache.open_entry(fp, k).manifest
    assert SH.parse_class(m["shape_class"]).ranges == (("s0", 8, 40),)
    assert m["verification"]["samples"] >= 5
    assert {8, 40} <= {s["at"]["s0"] for s in m["speed_samples"]}
    row = next(r for r in report["signatures"] if r.get("kind") == "shape_class")
    assert row["status"] == "compiled" and row["ranges"] == {"s0": [8, 40]}
    # compiled on the farm's Ray pool: one task dispatched to a compile actor, not in this process
    assert report["pool"]["dispatched"] == 1 and report["pool"]["compiled"] == 1
    assert row["worker"] and row["worker"].rsplit(":", 1)[1] != str(os.getpid())
    assert m["worker"] == row["worker"]


def test_warming_again_finds_the_class_cached_without_starting_the_pool(warmed, tmp_path):
    from aoti_farm.cli import main

    cache, fp, first = warmed
    report = tmp_path / "again.json"
    rc = main(["warm", "--model", first["models"][0], "--dynamic", "auto", "--cache-dir", str(cache.root),
               "--cpu-workers", "1", "--report", str(report)])
    doc = json.loads(report.read_text())
    assert rc == 0 and doc["pool"] is None                        # nothing to compile: no Ray
    assert [(r["kind"], r["status"]) for r in doc["signatures"]] == [("shape_class", "cached")]
    assert doc["signatures"][0]["ranges"] == {"s0": [8, 40]}


def test_unseen_length_inside_the_range_is_a_hit_equal_to_eager(warmed, tmp_path):
    from aoti_farm.runtime import install

    cache, fp, _ = warmed
    xs = {n: torch.randn(n, 64) for n in (17, 8, 40, 41, 7)}
    xs["t"] = torch.randn(64, 17).t()                               # another layout class: a miss
    want = {n: torch.ops.aten.silu.default(x) for n, x in xs.items()}
    with install(cache.root, ops=["aten::silu"], on_miss="ignore", route="all", serve="always") as h:
        got = {n: torch.ops.aten.silu.default(x) for n, x in xs.items()}
        st = h.stats()
    for n in xs:
        assert torch.equal(got[n], want[n]) or torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-5), n
    assert st["hits"] == 3 and st["misses"] == 3                    # 17, 8, 40 hit; 41, 7, transposed miss
    assert st["shape_classes"]["matched"] == 3


def test_exact_kernel_wins_over_the_class(warmed, tmp_path):
    from aoti_farm.runtime import install

    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    sig16 = S.from_call(torch.ops.aten.silu.default, (torch.empty(16, 64),), {})
    assert compile_and_publish(c2, AOTICompiler(), fp, sig16, owner="pytest").status == "compiled"
    with install(c2.root, ops=["aten::silu"], on_miss="ignore", route="all", serve="always") as h:
        torch.ops.aten.silu.default(torch.randn(16, 64))   # exact entry
        torch.ops.aten.silu.default(torch.randn(17, 64))   # class entry
        st = h.stats()
    assert st["hits"] == 2 and st["shape_classes"]["matched"] == 1


def test_tampered_class_manifest_is_refused(warmed, tmp_path):
    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    k = _class_key(c2, fp)
    p = c2.entry_dir(fp.id, k) / "manifest.msgpack"
    m = msgpack.unpackb(p.read_bytes(), raw=False)
    m["shape_class"]["ranges"][0][2] = 4096                        # a wider range than verified
    os.chmod(p, 0o644)
    p.write_bytes(msgpack.packb(m, use_bin_type=True))
    with pytest.raises(BadEntry) as e:
        c2.open_entry(fp, k)
    assert e.value.kind == "corrupt"


class _WrongAt(AOTICompiler):
    """Test double of the build step only: reuses a verified kernel's bytes, and its runner
    returns a wrong value at one shape (the verification is the real one)."""

    def __init__(self, kernel, bad_len):
        super().__init__(measure_speed=False)
        self.kernel, self.bad_len = kernel, bad_len

    def compile(self, cls, workdir):
        path = os.path.join(workdir, "kernel.so")
        shutil.copyfile(self.kernel, path)
        self.verify_class(cls, path)
        raise AssertionError("verification passed a wrong kernel")

    def load(self, kernel_path, device):
        real, bad_len = super().load(kernel_path, device), self.bad_len

        class Wrong:
            def run(self, tensors):
                out = real.run(tensors)
                if tensors[0].shape[0] == bad_len:
                    out[0].view(-1)[3] += 1.0
                return out
        return Wrong()


def test_a_kernel_wrong_at_one_sampled_shape_is_refused(warmed, tmp_path):
    cache, fp, _ = warmed
    entry = cache.open_entry(fp, _class_key(cache, fp))
    cls = SH.parse_class(entry.manifest["shape_class"])
    cls = SH.ShapeClass(cls.op, cls.group, cls.dims, cls.ranges, cls.example,
                        tuple(cls.point({"s0": n}) for n in LENGTHS))
    odd = next(p["s0"] for p in SH.sample_points(cls) if p["s0"] % 2 and p["s0"] not in (8, 40))
    c2 = Cache(tmp_path / "c")
    # the right kernel passes every sample; wrong at an odd interior size: refused
    AOTICompiler(measure_speed=False).verify_class(cls, entry.kernel_path)
    out = compile_and_publish(c2, _WrongAt(entry.kernel_path, odd), fp, cls, owner="pytest")
    assert out.status == "failed" and f"'s0': {odd}" in out.error
    assert out.evidence["problem"] == "values"
    assert not c2.has_entry(fp.id, cls.key)
    assert dyncompile.hinted_keys(c2, fp.id, cls.group_key) == []


def test_under_the_speed_gate_a_class_serves_only_inside_its_serve_range(warmed, tmp_path):
    from aoti_farm.runtime import install

    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    k = _class_key(c2, fp)
    p = c2.entry_dir(fp.id, k) / "manifest.msgpack"
    m = msgpack.unpackb(p.read_bytes(), raw=False)
    assert m["speed"]["serve_range"] is None or set(m["speed"]["serve_range"]) == {"s0"}
    m["speed"]["serve_range"] = {"s0": [8, 20]}        # as if it lost to eager above 20
    os.chmod(p, 0o644)
    p.write_bytes(msgpack.packb(m, use_bin_type=True))
    with install(c2.root, ops=["aten::silu"], on_miss="queue", route="all", serve="faster") as h:
        # covered by the class outside its serve_range: a hit the gate declines (gated), not
        # a miss, and not queued (an exact kernel there would lose the same way)
        torch.ops.aten.silu.default(torch.randn(30, 64))
        torch.ops.aten.silu.default(torch.randn(17, 64))   # inside: the class (hit, gated or pending the gate)
        h.flush()
        st = h.stats()
    assert st["misses"] == 0 and st["queued"] == 0, json.dumps(st, default=str)
    assert st["shape_classes"]["matched"] == 1 and st["shape_classes"]["gated"] == 1
    assert st["hits"] + st["gated"] + st.get("gate_pending", 0) == 2, json.dumps(st, default=str)
    assert st["summary"]["not_served"]["missed"] == 0
    with install(c2.root, ops=["aten::silu"], on_miss="ignore", route="all", serve="always") as h:
        torch.ops.aten.silu.default(torch.randn(30, 64))   # serve="always": the whole verified range
        assert h.stats()["hits"] == 1


def test_cache_ls_shows_ranges_and_export_upstream_skips_class_entries(warmed, tmp_path, capsys):
    from aoti_farm.cli import main
    from aoti_farm.interop.upstream import export_upstream

    cache, fp, _ = warmed
    assert main(["cache", "ls", "--cache-dir", str(cache.root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows = rows if isinstance(rows, list) else rows.get("rows", rows.get("entries"))
    assert [r["ranges"] for r in rows if "ranges" in r] == [{"s0": [8, 40]}]
    rep = export_upstream(cache, tmp_path / "up")
    assert rep["exported"] == []
    assert [s["key"] for s in rep["skipped"]] == [_class_key(cache, fp)]
    assert "shape-general" in rep["skipped"][0]["reason"]


# --- the miss policy: widen the range (aoti_farm/compile/widen.py) -------------------------------------------


def test_a_miss_near_the_range_queues_a_widened_class_that_then_serves_it(warmed, tmp_path):
    from aoti_farm.compile import widen
    from aoti_farm.cache import queue as missq
    from aoti_farm.runtime import Settings, install

    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    x60, x200 = torch.randn(60, 64), torch.randn(200, 64)
    with install(c2.root, ops=["aten::silu"], on_miss="queue", serve="always") as h:   # widen="auto": the default
        torch.ops.aten.silu.default(x60)      # outside 8..40, within twice it: asks for s0 = 8..64
        torch.ops.aten.silu.default(x200)     # far outside: its exact signature
        h.flush()
        st = h.stats()
    assert st["misses"] == 2 and st["shape_classes"]["widen_requests"] == 1
    s60 = S.from_call(torch.ops.aten.silu.default, (x60,), {})
    s200 = S.from_call(torch.ops.aten.silu.default, (x200,), {})
    sig, w = missq.read_item(c2, fp.id, s60.key)
    assert sig == s60 and SH.parse_class(w).ranges == (("s0", 8, 64),)
    assert missq.read_item(c2, fp.id, s200.key) == (s200, None)

    # what the drainers run (the hook's compile worker, serve's actors): a real class compile
    out = widen.compile_queued(c2, AOTICompiler(), fp, sig, w, owner="pytest")
    wkey = SH.parse_class(w).key
    assert out.status == "compiled" and out.evidence["widened"] == {
        "key": wkey, "ranges": {"s0": [8, 64]}, "status": "compiled",
        **({"outside_serve_range": True} if "outside_serve_range" in out.evidence["widened"] else {})}
    assert c2.has_entry(fp.id, wkey) and wkey in dyncompile.hinted_keys(c2, fp.id, SH.parse_class(w).group_key)
    x50 = torch.randn(50, 64)                 # never compiled exactly, inside the widened range only
    want = torch.ops.aten.silu.default(x50)
    with install(c2.root, ops=["aten::silu"], on_miss="ignore", route="all", serve="always") as h:
        got = torch.ops.aten.silu.default(x50)
        st = h.stats()
    assert st["hits"] == 1 and st["shape_classes"]["matched"] == 1
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)

    with install(c2.root, ops=["aten::silu"], on_miss="queue", serve="always",
                 settings=Settings(widen="off")) as h:
        torch.ops.aten.silu.default(torch.randn(100, 64))    # outside 8..64, within twice it; policy off
        h.flush()
        assert h.stats()["shape_classes"]["widen_requests"] == 0
    s100 = S.from_call(torch.ops.aten.silu.default, (torch.empty(100, 64),), {})
    assert missq.read_item(c2, fp.id, s100.key) == (s100, None)


def test_a_refused_widened_class_falls_back_to_the_exact_signature(warmed, tmp_path):
    from aoti_farm.compile import widen

    cache, fp, _ = warmed
    cls = SH.parse_class(cache.open_entry(fp, _class_key(cache, fp)).manifest["shape_class"])
    sig = S.from_call(torch.ops.aten.silu.default, (torch.empty(700, 64),), {})
    w = widen.request("always", [cls], sig)
    assert w.ranges == (("s0", 8, 1024),)
    c2 = Cache(tmp_path / "c")
    # a budget nothing fits: the class is refused (its widest shape), then the exact signature is tried
    out = widen.compile_queued(c2, AOTICompiler(), fp, sig, w.to_obj(), owner="pytest",
                               memory_budget=1)
    assert out.status == "failed" and out.key == sig.key
    assert out.evidence["widen_refused"]["key"] == w.key and "budget" in out.evidence["widen_refused"]["error"]
    assert out.evidence.get("refused") == "memory_budget" or "budget" in (out.error or "")
    assert w.key in widen._REFUSED and not c2.has_entry(fp.id, w.key)


def test_serve_drains_a_widen_request_on_its_ray_pool(warmed, tmp_path):
    import threading

    from aoti_farm.compile import widen
    from aoti_farm.cache import queue as missq
    from aoti_farm.config import FarmConfig, resolve
    from aoti_farm.workers.serve import serve

    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    cls = SH.parse_class(cache.open_entry(fp, _class_key(cache, fp)).manifest["shape_class"])
    sig = S.from_call(torch.ops.aten.silu.default, (torch.empty(90, 64),), {})
    w = widen.request("always", [cls], sig)                       # s0 = 8..128
    assert missq.enqueue(c2, fp.id, sig, widen=w.to_obj())
    events, stop = [], threading.Event()
    cfg = resolve(FarmConfig, cli={"cache_dir": str(c2.root), "cpu_workers": 1, "poll_interval": 0.2}, env={})
    th = threading.Thread(target=serve, args=(cfg,), kwargs={"stop": stop, "stream": open(os.devnull, "w"),
                                                             "on_event": lambda k, d: events.append((k, d))})
    th.start()
    try:
        t0 = __import__("time").monotonic()
        while missq.pending(c2, fp.id) and __import__("time").monotonic() - t0 < 300:
            __import__("time").sleep(0.2)
    finally:
        stop.set()
        th.join(120)
    assert missq.pending(c2, fp.id) == []                          # the queue item is retired
    assert c2.has_entry(fp.id, w.key)                             # the widened class, compiled by an actor
    done = [d["result"] for k, d in events if k == "done"]
    assert [(r.key, r.status) for r in done] == [(sig.key, "compiled")]
    m = c2.open_entry(fp, w.key).manifest
    assert m["worker"].rsplit(":", 1)[1] != str(os.getpid())


def test_explain_names_class_covered_signatures_and_gated_ones(warmed, tmp_path):
    """On a --dynamic auto cache, explain says "covered by class ..." for a length the
    class covers (not "not published; nearest entry ... differs"), and "gated" where the
    class covers it outside the range where it beat eager."""
    from aoti_farm.report.explain import Explainer

    cache, fp, _ = warmed
    c2 = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c2.root, dirs_exist_ok=True)
    k = _class_key(c2, fp)
    p = c2.entry_dir(fp.id, k) / "manifest.msgpack"
    m = msgpack.unpackb(p.read_bytes(), raw=False)
    m["speed"]["serve_range"] = {"s0": [8, 20]}
    os.chmod(p, 0o644)
    p.write_bytes(msgpack.packb(m, use_bin_type=True))

    def sig_of(n):
        from aoti_farm.signature import Signature, encode_call, op_info

        op = torch.ops.aten.silu.default
        return Signature("aten::silu", encode_call(op_info(op), (torch.randn(n, 64),), {}))

    ex = Explainer(c2, {"cpu": fp}, serve="faster")
    inside, outside, beyond = ex.explain(sig_of(17)), ex.explain(sig_of(30)), ex.explain(sig_of(41))
    assert (inside.outcome, inside.category) == ("hit", "class"), inside
    assert inside.reason.startswith(f"covered by class {k[:16]}") and "s0=17" in inside.reason, inside.reason
    assert (outside.outcome, outside.category) == ("gated", "class"), outside
    assert "did not beat eager" in outside.reason and "nothing is queued" in outside.reason
    assert beyond.outcome == "missing" and beyond.category != "other", beyond
    always = Explainer(c2, {"cpu": fp}, serve="always").explain(sig_of(30))
    assert always.outcome == "hit" and always.category == "class"


# --- strided layout classes: a KV cache's decode steps (issue 34 item 6) ----------------------------


def _kv_new():
    """One key of q/k/v split from a fused [2, 1, 384] projection, as GPT-2's attention
    makes it: [2, 4, 1, 32] with strides (384, 32, 128, 1), not dense."""
    qkv = torch.randn(2, 1, 384)
    return qkv.split(128, dim=2)[1].view(2, 1, 4, 32).transpose(1, 2)


def test_kv_cache_append_class_compiles_and_serves_unseen_decode_steps(tmp_path):
    """The decode step's KV-cache ``cat([past [2,4,n,32], new (strided)], dim=2)``, recorded
    at n = 8, 10, 12 and warmed with ``--dynamic auto``, becomes one class kernel (symbolic
    n, constant strides for the strided key); unseen steps n = 9 and 11 are served by it,
    equal to eager in values, sizes and strides."""
    import aoti_farm
    from aoti_farm.cli import main
    from aoti_farm.runtime import install

    new = _kv_new()
    assert new.stride() == (384, 32, 128, 1) and not new.is_contiguous()
    trace = tmp_path / "kv.json"
    with aoti_farm.record(str(trace)):
        for n in (8, 10, 12):
            torch.cat([torch.randn(2, 4, n, 32), new], dim=2)
    rc = main(["warm", "--model", str(trace), "--dynamic", "auto", "--cache-dir", str(tmp_path / "cache"),
               "--cpu-workers", "1"])
    assert rc == 0
    cache, fp = Cache(tmp_path / "cache"), fingerprint("cpu")
    k = _class_key(cache, fp)
    cls = SH.parse_class(cache.open_entry(fp, k).manifest["shape_class"])
    assert cls.ranges == (("s0", 8, 12),) and cls.group[0][1][1][4] == SH.STRIDED
    with install(cache.root, ops=["aten::cat"], on_miss="ignore", route="all", serve="always") as h:
        for n in (9, 11):
            past = torch.randn(2, 4, n, 32)
            out = torch.cat([past, new], dim=2)
            with h._routes.bypassed():
                ref = torch.cat([past, new], dim=2)
            assert torch.equal(out, ref) and out.stride() == ref.stride() and out.shape == (2, 4, n + 1, 32)
        st = h.stats()
    assert st["hits"] == 2 and st["misses"] == 0, st
    assert st["shape_classes"]["matched"] == 2
