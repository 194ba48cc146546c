"""`aoti-farm explain`: one signature per outcome, each named field by field.

Real entries come from the session cache (``kernels``: add(8,16)+(16,) alpha=2 and
mul(8,16)); the failure record is written by a real ``compile_and_publish`` that eager
rejects (no compile).  The gated entry is a real entry whose manifest carries the speed
gate's ``speed`` record; the foreign entry is published through ``Cache.publish`` under a
fingerprint with another ``cpu_isa`` (never loaded: explain reads manifests only).

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_explain.py.
"""

from __future__ import annotations

import json
import logging

import msgpack
import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.cli import main
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.report.explain import NOT_TIMED_HERE
from aoti_farm.fingerprint import Fingerprint, fingerprint
from aoti_farm.compile.job import compile_and_publish
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul

ADD = sig_add_alpha()                                                          # (8,16) + (16,), alpha=2
MUL = sig_mul()                                                                # (8,16) * (8,16)
SHAPE = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(4, 16), torch.empty(16)), {"alpha": 2})
SCALAR = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(8, 16), torch.empty(16)), {"alpha": 3})
FOREIGN = S.from_call(torch.ops.aten.relu.default, (torch.empty(6, 5),), {})
NO_OP = S.from_call(torch.ops.aten.tanh.default, (torch.empty(3, 3),), {})
CUDA = S.parse_signature({"op": "aten::relu", "args": [
    {"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [4], "strides": [1], "device": "cuda:0"}]})
WRAPPED = S.Signature("aten::add.Tensor", (("T", "float64", (), (), "cpu"), ("T", "float32", (4,), (1,), "cpu"),
                                           ("i", 1)))
_bad = S.from_call(torch.ops.aten.mm.default, (torch.empty(3, 4), torch.empty(4, 5)), {}).to_obj()
_bad["args"][1]["sizes"], _bad["args"][1]["strides"] = [7, 5], [5, 1]
BAD = S.parse_signature(_bad)       # eager rejects it: a real failure record, no compile
FAST = {"kernel_us": 2.0, "eager_us": 4.0, "ratio": 0.5, "rounds": 7, "threads": 2, "device": "cpu"}
SPEED = {"kernel_us": 5.25, "eager_us": 4.0, "ratio": 1.3125, "rounds": 7, "threads": 2, "device": "cpu"}


def foreign_fp(fp: Fingerprint) -> Fingerprint:
    isa = dict(fp.fields)["cpu_isa"]
    other = "avx2" if isa != "avx2" else "avx512"
    return Fingerprint(tuple((k, other if k == "cpu_isa" else v) for k, v in fp.fields))


@pytest.fixture(scope="module")
def cache(kernels, tmp_path_factory):
    for s in (ADD, MUL):
        assert kernels.ensure(s).status in ("compiled", "cached")
    c = kernels.copy_to(tmp_path_factory.mktemp("explain") / "cache")
    fp = fingerprint("cpu")
    for s in (SHAPE, SCALAR, FOREIGN, BAD, NO_OP):   # whatever other tests put in the session cache
        c.remove(fp.id, s.key)
    out = compile_and_publish(c, AOTICompiler(), fp, BAD, owner="pytest")
    assert out.status == "failed"
    # the speed gate's records (as the compile path writes them): add fast, mul slow
    for s, speed in ((ADD, FAST), (MUL, SPEED)):
        mpath = c.entry_dir(fp.id, s.key) / "manifest.msgpack"
        m = msgpack.unpackb(mpath.read_bytes(), raw=False)
        m["speed"] = speed
        mpath.write_bytes(msgpack.packb(m, use_bin_type=True))
    # an entry of FOREIGN under another CPU ISA only
    kernel = str(c.entry_dir(fp.id, ADD.key) / "kernel.so")
    c.publish(foreign_fp(fp), FOREIGN, {"kernel.so": kernel}, {"compile_seconds": 0.0})
    return c


TRACE = [ADD, MUL, BAD, CUDA, WRAPPED, SHAPE, SCALAR, FOREIGN, NO_OP]


def write(tmp_path, sigs, name="t.json"):
    p = tmp_path / name
    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(sigs)]), str(p))
    return str(p)


@pytest.fixture(autouse=True)
def _default_policy(monkeypatch):
    monkeypatch.delenv("AOTI_FARM_SERVE", raising=False)


def run_json(capsys, *argv):
    capsys.readouterr()
    assert main(["explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_signature_per_outcome_named_field_by_field(cache, tmp_path, capsys):
    t = write(tmp_path, TRACE)
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(cache.root))
    rows = {r["key"]: r for r in doc["signatures"]}
    cuda = "ineligible" if not torch.cuda.is_available() else "missing"
    assert [rows[s.key]["outcome"] for s in TRACE] == [
        "hit", "gated", "failed", cuda, "ineligible", "missing", "missing", "missing", "missing"]

    assert "kernel 2.00 us vs eager 4.00 us (ratio 0.500)" in rows[ADD.key]["details"][0]
    gated = rows[MUL.key]
    assert "kernel 5.25 us vs eager 4.00 us (ratio 1.312) > 0.95" in gated["reason"]
    assert gated["data"]["speed"] == SPEED

    failed = rows[BAD.key]
    assert failed["reason"].startswith("compile failed (") and len(failed["reason"]) > len("compile failed (x): ") + 5
    from aoti_farm.cache.failures import REFUSAL_CLASSES

    assert failed["category"] in REFUSAL_CLASSES, failed   # the named class of the failure
    assert failed["data"]["failure"]["reason"] == cache.failure(fingerprint("cpu").id, BAD.key)["reason"]

    if not torch.cuda.is_available():
        assert "torch sees no CUDA device" in rows[CUDA.key]["reason"]
    assert "0-dim CPU double/long/bool tensor" in rows[WRAPPED.key]["reason"]

    shape = rows[SHAPE.key]
    assert shape["category"] == "shape" and shape["data"]["nearest"] == ADD.key
    assert shape["details"] == ["self.sizes [4,16] vs [8,16]"]

    scalar = rows[SCALAR.key]
    assert scalar["category"] == "argument" and scalar["data"]["nearest"] == ADD.key
    assert scalar["details"] == ["alpha 3 vs 2"]

    foreign = rows[FOREIGN.key]
    fp = fingerprint("cpu")
    assert foreign["category"] == "fingerprint" and foreign["data"]["foreign_fp"] == foreign_fp(fp).id
    isa = dict(fp.fields)["cpu_isa"]
    other = dict(foreign_fp(fp).fields)["cpu_isa"]
    shown = isa if " " not in isa else json.dumps(isa)
    assert foreign["details"] == [f"cpu_isa {shown} vs {other}"]

    assert rows[NO_OP.key]["category"] == "op" and "no entry of aten::tanh" in rows[NO_OP.key]["reason"]


def test_text_output_and_index(cache, tmp_path, capsys):
    t = write(tmp_path, TRACE)
    capsys.readouterr()
    assert main(["explain", "--trace", t, "--index", "6", "--cache-dir", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert "[6] missing" in out and "alpha 3 vs 2" in out and "[5]" not in out
    assert main(["explain", "--trace", t, "--index", "99", "--cache-dir", str(cache.root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--index 99" in err and "9 entries" in err


def test_host_without_namespace_names_fingerprint_fields(cache, tmp_path, capsys):
    """Only a foreign namespace: the note and every signature name the differing fields."""
    only = Cache(tmp_path / "only-foreign", signing_key=None)
    fp = fingerprint("cpu")
    kernel = str(cache.entry_dir(fp.id, ADD.key) / "kernel.so")
    only.publish(foreign_fp(fp), ADD, {"kernel.so": kernel}, {})
    doc = run_json(capsys, "--trace", write(tmp_path, [ADD, SHAPE]), "--cache-dir", str(only.root))
    isa, other = dict(fp.fields)["cpu_isa"], dict(foreign_fp(fp).fields)["cpu_isa"]
    shown = isa if " " not in isa else json.dumps(isa)
    assert len(doc["notes"]) == 1 and f"cpu_isa {shown} vs {other}" in doc["notes"][0]
    assert fp.id in doc["notes"][0] and foreign_fp(fp).id in doc["notes"][0]
    a, b = doc["signatures"]
    assert a["outcome"] == b["outcome"] == "missing"
    assert a["details"] == b["details"] == [f"cpu_isa {shown} vs {other}"]
    assert "another fingerprint" in a["reason"] and "no namespace" in b["reason"]


def test_hook_counts_miss_reasons_and_explains_first_miss(cache, tmp_path, caplog):
    from aoti_farm.runtime import Settings, install

    c2 = Cache(tmp_path / "c2")
    import shutil

    shutil.copytree(cache.root, c2.root, symlinks=True)
    a, b = torch.randn(4, 16), torch.randn(16)
    x = torch.randn(8, 16, dtype=torch.float64)[0, 0]   # 0-dim double: ineligible
    caplog.set_level(logging.WARNING, logger="aoti_farm.explain")
    # route="all": add's only entry may lose here, and the default route would then leave add
    # unrouted (its new signatures are not queued)
    hook = install(cache_dir=str(c2.root), ops=["aten::add.Tensor"], on_miss="queue", route="all",
                   settings=Settings(poll_interval=0.2, explain_misses=True))
    try:
        for _ in range(3):
            torch.add(a, b, alpha=2)        # SHAPE: missing, nearest ADD
        torch.add(x, b)
        hook.flush()
        s = hook.stats()
    finally:
        hook.uninstall()
    # (torch itself may call add on other tensors meanwhile: those are counted too)
    assert s["miss_reasons"]["missing"] == s["misses"] >= 3
    assert s["miss_reasons"]["ineligible"] == sum(s["fallbacks"].values()) >= 1
    assert s["miss_explained"].get("shape", 0) >= 1
    msgs = [r.getMessage() for r in caplog.records if r.name == "aoti_farm.explain"]
    mine = [m for m in msgs if "float32[4, 16], float32[16], alpha=2" in m]
    assert len(mine) == 1    # three misses, the first explained and mine[0].endswith("self.sizes [4,16] vs [8,16]; queued for compile (the miss queue holds it)")


def test_hook_explains_nothing_by_default(cache, tmp_path, monkeypatch):
    from aoti_farm.runtime import Settings, install

    monkeypatch.delenv("AOTI_FARM_EXPLAIN_MISSES", raising=False)
    import shutil

    c3 = tmp_path / "c3"
    shutil.copytree(cache.root, c3, symlinks=True)
    hook = install(cache_dir=str(c3), ops=["aten::add.Tensor"], on_miss="queue", route="all",
                   settings=Settings(poll_interval=0.2))
    try:
        torch.add(torch.randn(4, 16), torch.randn(16), alpha=2)
        hook.flush()
        s = hook.stats()
    finally:
        hook.uninstall()
    assert s["misses"] == 1 and s["miss_explained"] == {}


def test_serve_always_and_entry_without_speed(cache, tmp_path, capsys):
    """Under serve=always the slow kernel is a hit; an entry without a speed record is gated
    under the default policy (the hook does not serve it)."""
    t = write(tmp_path, [MUL, ADD])
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(cache.root), "--serve", "always")
    assert [r["outcome"] for r in doc["signatures"]] == ["hit", "hit"]
    c2 = Cache(tmp_path / "nospeed")
    import shutil

    shutil.copytree(cache.root, c2.root, symlinks=True)
    mpath = c2.entry_dir(fingerprint("cpu").id, ADD.key) / "manifest.msgpack"
    m = msgpack.unpackb(mpath.read_bytes(), raw=False)
    del m["speed"]
    mpath.write_bytes(msgpack.packb(m, use_bin_type=True))
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(c2.root))
    mul, add = doc["signatures"]
    assert mul["outcome"] == add["outcome"] == "gated"
    assert add["category"] == "no speed record" and "no speed record" in add["reason"]


def test_the_policy_is_resolved_like_the_hooks(cache, tmp_path, capsys):
    """`explain` resolves ``serve`` as install() does: the TOML file's [hook] serve counts,
    and --serve wins over it."""
    t = write(tmp_path, [MUL])
    toml = tmp_path / "f.toml"
    toml.write_text('[hook]\nserve = "always"\n')
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(cache.root), "--config", str(toml))
    assert [r["outcome"] for r in doc["signatures"]] == ["hit"]
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(cache.root), "--config", str(toml), "--serve", "faster")
    assert [r["outcome"] for r in doc["signatures"]] == ["gated"]


def test_gated_here_from_this_hosts_kept_decisions(cache, tmp_path, capsys, monkeypatch):
    """A hit on the compile host that this host's gate declined is "gated here" with its
    on-host ratio; one that won here stays a hit and says so.  The decisions are the ones a
    real hook's on-host trial kept (aoti_farm/speedgate/hostgate.py), then ones written as it would."""
    from aoti_farm.speedgate import hostgate
    from aoti_farm.runtime import install

    monkeypatch.setattr(hostgate, "overloaded", lambda: False)   # kept whatever the shared host's load
    c2 = Cache(tmp_path / "here")
    import shutil

    shutil.copytree(cache.root, c2.root, symlinks=True)
    fp = fingerprint("cpu")
    t = write(tmp_path, [ADD, MUL])
    # nothing decided here yet: a hit by the compile host's record, which says it is a guess
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(c2.root))
    assert doc["signatures"][0]["outcome"] == "hit"
    assert NOT_TIMED_HERE in doc["signatures"][0]["details"]
    # a real hook decides ADD on this host at install (runtime/pretrial.py) and keeps it
    hook = install(cache_dir=str(c2.root), on_miss="ignore", ops=["aten::add.Tensor"])
    try:
        decided = hook.gate.decision(ADD.key)
    finally:
        hook.uninstall()
    assert decided is not None
    kept = hostgate.load(fp.id, c2.root)
    assert kept[ADD.key]["ok"] is decided and kept[ADD.key]["threads"] == torch.get_num_threads()
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(c2.root))
    add, mul = doc["signatures"]
    assert mul["outcome"] == "gated"          # slower on the compile host: not "gated here"
    assert add["outcome"] == ("hit" if decided else "gated here")
    # this host's kept decision against the compile host's record, both ways
    # (a loss here; a win smaller than a served call's cost in a model; a win; a win kept as
    # served under a lower floor, judged by the floor in force: gated)
    for kept, ok, ratio, k_us, e_us in ((False, False, 1.31, 1.31, 1.0), (False, False, 0.85, 3.0, 5.0),
                                         (True, True, 0.62, 12.4, 20.0), (True, False, 0.65, 3.0, 5.0)):
        assert hostgate.save(fp.id, c2.root, {ADD.key: hostgate.record(
            kept, {"ratio": ratio, "threads": 2, "kernel_us": k_us, "eager_us": e_us})})
        doc = run_json(capsys, "--trace", t, "--cache-dir", str(c2.root))
        add = doc["signatures"][0]
        if ok:
            assert add["outcome"] == "hit" and any("faster here too (0.62 of eager on this host, 2 threads"
                                                   in d for d in add["details"])
            assert NOT_TIMED_HERE not in add["details"]
        else:
            assert add["outcome"] == "gated here"
            assert add["reason"].startswith(f"gated here ({ratio} of eager on this host, 2 threads")
            # a kernel is called slower only when it is slower here
            assert ("slower than eager on this host" in add["reason"]) == (ratio > 1)
            if ratio < 1:
                assert "faster than eager on this host by 2.0 µs a call (3.0 against 5.0 µs)" in add["reason"]
            assert doc["counts"]["gated here"] == 1 and doc["counts"]["hit"] == 0
    # under serve=always the hook serves it whatever this host found
    doc = run_json(capsys, "--trace", t, "--cache-dir", str(c2.root), "--serve", "always")
    assert doc["signatures"][0]["outcome"] == "hit"
