"""Drills of hostile inputs: huge integers, the op-name gadget, the oversized
signature (the memory budget).

* An integer outside int64 anywhere in a trace (a scalar, a size, a stride, a list item,
  a range, a count) is one line and exit 2 in ``trace validate|show|key|merge`` and
  ``warm``; in the msgpack form of manifests and queue items it is a ValueError.
* An op name resolves only to a real OpOverload of that exact name: ``aten::add.__class__``
  and friends are unknown ops (ValueError), and a manifest naming one is a bad entry that
  ``cache ls`` / ``cache verify`` report and ``verify --repair`` removes.
* A signature whose compile would exceed the memory budget is refused before anything is
  allocated: ``trace validate`` and ``compile-one`` exit 2 naming the entry and the fix,
  ``warm`` reports it failed with the reason (without starting Ray for it), and
  ``compile_and_publish`` (the path of the Ray actors and the hook's worker) refuses it
  without a lease, a compile or a failure record.  The end-to-end check runs the hook's
  real compile worker with a small budget.

No test here compiles anything unless the behaviour it checks is broken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import torch

from aoti_farm import budget
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.cli import main
from aoti_farm.config import FarmConfig, resolve
from aoti_farm.errors import Ineligible, UserError
from aoti_farm.fingerprint import fingerprint

from e2e.test_drills_util import snapshot

HOST_24G_BUDGET = int((24 << 30) * budget.DEFAULT_FRACTION)   # the default on a 24 GiB host


def _t(name, sizes, strides=None, dtype="float32", **kw):
    if strides is None:
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.insert(0, acc)
            acc *= max(s, 1)
    return {"name": name, "kind": "tensor", "dtype": dtype, "sizes": sizes, "strides": strides, "device": "cpu", **kw}


def _trace(*entries) -> dict:
    return {"format": "aoti-farm-trace", "version": 1,
            "entries": [{"op": op, "args": args, **extra} for op, args, extra in entries]}


def _add(alpha_arg):
    return ("aten::add.Tensor", [_t("self", [4]), _t("other", [4]), alpha_arg], {})


def _run(capsys, argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line(rc, err, names):
    assert rc == 2, f"exit {rc}: {err!r}"
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("aoti-farm: error: "), err
    assert names in err, err


# --- huge integers --------------------------------------------------------------------------

HUGE = {
    "alpha 2**64": _trace(_add({"name": "alpha", "kind": "int", "value": 2**64})),
    "alpha 2**63": _trace(_add({"name": "alpha", "kind": "int", "value": 2**63})),
    "alpha -2**63-1": _trace(_add({"name": "alpha", "kind": "int", "value": -2**63 - 1})),
    "float alpha 10**400": _trace(_add({"name": "alpha", "kind": "float", "value": 10**400})),
    "size 2**64": _trace(("aten::relu", [_t("self", [2**64, 0], [1, 1])], {})),
    "stride 2**64": _trace(("aten::relu", [_t("self", [1], [2**64])], {})),
    "int_list 2**64": _trace(("aten::sum.dim_IntList", [_t("self", [4]), {"name": "dim", "kind": "int_list",
                                                                           "value": [2**64]}], {})),
    "range 2**70": _trace(("aten::embedding", [_t("weight", [10, 4]),
                                               _t("indices", [3], dtype="int64", range=[0, 2**70])], {})),
    "hint range 2**64": _trace(("aten::embedding", [_t("weight", [10, 4]), _t("indices", [3], dtype="int64")],
                                {"hints": {"indices": {"range": [0, 2**64]}}})),
    "count 2**64": _trace(("aten::relu", [_t("self", [4])], {"count": 2**64})),
    "order 2**64": _trace(("aten::relu", [_t("self", [4])], {"order": 2**64})),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("limits")
    cache = Cache(base / "cache", signing_key=None)
    cache.ensure(fingerprint("cpu"))
    return {"base": base, "cache": cache.root, "before": snapshot(cache.root)}


@pytest.mark.parametrize("case", sorted(HUGE))
def test_huge_integers_exit_2(world, capsys, case):
    p = world["base"] / f"huge-{case.replace(' ', '_').replace('*', '')}.json"
    p.write_text(json.dumps(HUGE[case]))
    out = world["base"] / "merged.json"
    for argv in (["trace", "validate", p], ["trace", "show", p], ["key", "--trace", p, "--index", 0,
                                                                 "--cache-dir", world["cache"]],
                 ["trace", "merge", out, p],
                 ["warm", "--model", p, "--cache-dir", world["cache"], "--cpu-workers", 1]):
        rc, _, err = _run(capsys, argv)
        _one_line(rc, err, str(p))
    assert not out.exists()
    assert snapshot(world["cache"]) == world["before"]


def test_huge_integers_in_msgpack_forms_are_value_errors():
    """Manifests and queue items carry Signature.to_obj() as msgpack (which holds up to
    uint64): every out-of-int64 integer is a ValueError, never an OverflowError."""
    good = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(4), torch.empty(4)), {"alpha": 2})
    obj = msgpack.unpackb(msgpack.packb(good.to_obj()))
    assert S.parse_signature(obj).key == good.key

    def mutate(fn):
        o = msgpack.unpackb(msgpack.packb(good.to_obj()))
        fn(o)
        try:
            return msgpack.unpackb(msgpack.packb(o))   # what a reader decodes
        except OverflowError:   # beyond msgpack (< -2**63): only the JSON form can hold it
            return o

    for fn in (lambda o: o["args"][2].__setitem__("value", 2**63),
               lambda o: o["args"][2].__setitem__("value", 2**64 - 1),
               lambda o: o["args"][2].__setitem__("value", -2**63 - 1),
               lambda o: o["args"][0].__setitem__("sizes", [2**64 - 1]),
               lambda o: o["args"][0].__setitem__("strides", [2**63]),
               lambda o: o["args"][0].__setitem__("range", [0, 2**63]),
               lambda o: o.__setitem__("hints", {"self": {"range": [-2**63 - 1, 0]}}),
               lambda o: o.__setitem__("hints", {"self": {"items": [{"range": [0, 2**64 - 1]}]}}),
               lambda o: o.__setitem__("hints", {"self": {"range": "x"}}),
               lambda o: o.__setitem__("hints", {"nope": {"range": [0, 1]}}),
               lambda o: o.__setitem__("hints", []),
               lambda o: o["args"][0].__setitem__("device", "cuda:99999999999999999999")):
        with pytest.raises(ValueError):
            S.parse_signature(mutate(fn))


def test_calls_with_integers_outside_int64_are_never_served():
    """torch's Scalar holds uint64, so such a call reaches the dispatcher; it is left to
    eager (Ineligible) rather than recorded into a trace no reader accepts."""
    x = torch.ones(3)
    info = S.op_info(torch.ops.aten.add.Tensor)
    assert S.encode_call(info, (x, x), {"alpha": 2**63 - 1})[2] == ("i", 2**63 - 1)
    for v in (2**63, 2**64 - 1):
        with pytest.raises(Ineligible, match="int64"):
            S.encode_call(info, (x, x), {"alpha": v})


# --- the op-name gadget ---------------------------------------------------------------------

GADGETS = ["aten::add.__class__", "aten::__dict__", "aten::add.__init__", "aten::add.__doc__",
           "aten::add._schema", "aten::add.overloads", "aten::add._overloadpacket", "aten::relu.op",
           "aten::add.Tensor.__class__", "__builtins__::x", "aten::__class__.x", "aten::add.name",
           "aten::", "::add", "aten::add.", "aten::add.Tensor\x00", "a" * 300 + "::x"]


@pytest.mark.parametrize("name", GADGETS)
def test_op_names_resolve_only_to_real_overloads(name):
    with pytest.raises(ValueError):
        S.resolve_op(name)
    with pytest.raises(ValueError, match="op"):
        S.parse_signature({"op": name, "args": []})


def test_real_ops_still_resolve():
    """Names of every kind the dispatcher has, dunder ops (``aten::__and__``) included."""
    for name in ("aten::add.Tensor", "aten::relu", "aten::relu.default", "aten::__and__.Tensor",
                 "aten::_softmax", "prims::add"):
        op = S.resolve_op(name)
        assert isinstance(op, torch._ops.OpOverload)
        assert S.op_name(op) == name.removesuffix(".default")
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    assert len(names) > 1000
    for n in names:
        assert S.op_name(S.resolve_op(n)) == n.removesuffix(".default")


def test_op_gadget_in_a_manifest(tmp_path, capsys):
    """A manifest naming ``aten::add.__class__``: ``cache ls`` lists it as a bad
    signature, ``verify`` reports it (exit 1), ``verify --repair`` removes it; no
    traceback anywhere.  The entry's kernel is a dummy file: nothing here loads it."""
    cache = Cache(tmp_path / "c", signing_key=None)
    fp = fingerprint("cpu")
    sig = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(4), torch.empty(4)), {})
    dummy = tmp_path / "kernel.so"
    dummy.write_bytes(b"not a kernel")
    d = cache.publish(fp, sig, {"kernel.so": str(dummy)}, {"compile_seconds": 0.0})
    m = msgpack.unpackb((d / "manifest.msgpack").read_bytes())
    m["signature"]["op"] = "aten::add.__class__"
    (d / "manifest.msgpack").write_bytes(msgpack.packb(m, use_bin_type=True))
    rc, out, err = _run(capsys, ["cache", "ls", "--cache-dir", cache.root])
    assert rc == 0 and "Traceback" not in err, err
    assert "unknown op" in out, out
    rc, out, err = _run(capsys, ["cache", "verify", "--cache-dir", cache.root])
    assert rc == 1 and "Traceback" not in err and "corrupt" in out, (out, err)
    rc, out, err = _run(capsys, ["cache", "verify", "--repair", "--cache-dir", cache.root])
    assert rc == 0 and "Traceback" not in err, (out, err)
    assert not d.exists()


# --- the memory budget ----------------------------------------------------------------------

def _relu(n: int) -> S.Signature:
    return S.parse_signature({"op": "aten::relu", "args": [_t("self", [n])]})


def test_issue_examples_are_refused_under_a_24g_hosts_default():
    """relu float32[2**29] (validated, then OOM'd compile-one at 24.3 GB) and relu[2**27]
    (compiled by the hook's worker at 8.5 GB) are both over a 24 GiB host's default."""
    for n, inputs_alone in ((2**29, True), (2**27, False)):
        reason, ev = budget.refusal(_relu(n), HOST_24G_BUDGET)
        assert ev["refused"] == "memory_budget" and ev["budget_bytes"] == HOST_24G_BUDGET
        assert ("inputs alone" in reason) == inputs_alone, reason
        assert "raise the budget" in reason and "drop the entry" in reason
    # the lower bound used by planning sees only the first
    assert budget.refusal(_relu(2**29), HOST_24G_BUDGET, outputs=False) is not None
    assert budget.refusal(_relu(2**27), HOST_24G_BUDGET, outputs=False) is None
    # ordinary signatures fit easily
    assert budget.refusal(_relu(2**20), HOST_24G_BUDGET) is None


def test_estimate_counts_broadcast_outputs():
    """add [4096,1] + [1,4096]: 8 Ki input elements, 16 Mi output elements (meta run)."""
    sig = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(4096, 1), torch.empty(1, 4096)), {})
    est = budget.estimate(sig)
    assert est.outputs_known and est.input_elements == 8192 and est.output_elements == 4096 * 4096
    assert est.bytes == budget.INPUT_BYTES_PER_ELEMENT * 8192 + budget.OUTPUT_BYTES_PER_ELEMENT * 4096 * 4096
    assert budget.refusal(sig, 512 << 20) is not None and budget.refusal(sig, 2 << 30) is None


def test_default_budget_is_a_quarter_of_memtotal(monkeypatch):
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert budget.host_memory() == total
    assert budget.default_budget() == int(total * budget.DEFAULT_FRACTION)
    monkeypatch.delenv(budget.ENV, raising=False)
    assert budget.current() == (budget.default_budget(), "a quarter of this host's memory")
    # the environment is the command layer's (config.memory_budget), never read here
    monkeypatch.setenv(budget.ENV, "512M")
    assert budget.current() == (budget.default_budget(), "a quarter of this host's memory")
    assert budget.current(1 << 30) == (1 << 30, "configured")
    from aoti_farm import config

    assert config.memory_budget() == 512 << 20 and config.memory_budget("1G") == 1 << 30


def test_budget_config(tmp_path):
    assert resolve(FarmConfig, env={}).memory_budget is None
    assert resolve(FarmConfig, env={"AOTI_FARM_MEMORY_BUDGET": "6G"}).memory_budget == 6 << 30
    toml = tmp_path / "f.toml"
    toml.write_text('[farm]\nmemory_budget = "1.5G"\n')
    assert resolve(FarmConfig, env={}, config_path=str(toml)).memory_budget == 3 << 29
    toml.write_text("[farm]\nmemory_budget = 1000000\n")
    assert resolve(FarmConfig, env={}, config_path=str(toml)).memory_budget == 1000000
    assert resolve(FarmConfig, env={"AOTI_FARM_MEMORY_BUDGET": "6G"}, cli={"memory_budget": "1M"},
                   config_path=str(toml)).memory_budget == 1 << 20
    for bad in ("lots", "0", "-1G", "1e999", "inf", ""):
        if bad == "":
            continue   # empty environment values are unset
        with pytest.raises(UserError, match="memory_budget"):
            resolve(FarmConfig, env={"AOTI_FARM_MEMORY_BUDGET": bad})


def test_trace_validate_refuses_over_budget(world, capsys, monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    p = world["base"] / "big.json"
    p.write_text(json.dumps(_trace(("aten::relu", [_t("self", [8])], {}),
                                   ("aten::relu", [_t("self", [2**27])], {}))))
    rc, _, err = _run(capsys, ["trace", "validate", p, "--memory-budget", "6G"])
    _one_line(rc, err, str(p))
    assert "entries[1]" in err and "float32[134217728]" in err and "memory budget" in err, err
    assert "raise the budget" in err and "drop the entry" in err, err
    monkeypatch.setenv(budget.ENV, "6G")
    rc, _, err = _run(capsys, ["trace", "validate", p])
    _one_line(rc, err, "entries[1]")
    rc, out, err = _run(capsys, ["trace", "validate", p, "--memory-budget", "16G", "--json"])
    assert rc == 0 and json.loads(out)["memory_budget"] == 16 << 30, err
    # show / key / merge do not compile: the budget is not theirs to enforce
    rc, _, err = _run(capsys, ["trace", "show", p])
    assert rc == 0, err
    rc, _, err = _run(capsys, ["trace", "validate", p, "--memory-budget", "lots"])
    _one_line(rc, err, "--memory-budget")


def test_compile_one_refuses_before_touching_the_cache(world, capsys):
    p = world["base"] / "big1.json"
    p.write_text(json.dumps(_trace(("aten::relu", [_t("self", [2**27])], {}))))
    root = world["base"] / "never-created"
    rc, _, err = _run(capsys, ["compile-one", "--trace", p, "--index", 0, "--cache-dir", root,
                               "--memory-budget", "6G"])
    _one_line(rc, err, f"{p} entry 0")
    assert "memory budget" in err and not root.exists(), err


def test_warm_reports_refusal_without_starting_ray(world, capsys):
    p = world["base"] / "big29.json"
    p.write_text(json.dumps(_trace(("aten::relu", [_t("self", [2**29])], {}))))
    report = world["base"] / "report.json"
    rc, out, err = _run(capsys, ["warm", "--model", p, "--cache-dir", world["cache"], "--report", report,
                                 "--memory-budget", "6G"])
    assert rc == 1, err
    doc = json.loads(report.read_text())
    (row,) = doc["signatures"]
    assert row["status"] == "failed" and row["evidence"]["refused"] == "memory_budget", row
    assert "memory budget" in row["error"] and "memory budget" in err
    assert "ray_started" not in doc["timeline"], doc["timeline"]
    assert snapshot(world["cache"]) == world["before"]   # no failure record: the budget is the host's


def test_plan_splits_refused_from_work(tmp_path):
    from aoti_farm.workers.warm import plan, surely_work

    c = Cache(tmp_path / "c", signing_key=None)
    small, big = _relu(64), _relu(2**29)
    p = plan([small, big], c, None, 6 << 30)
    assert [t.sig.key for t in p.todo] == [small.key]
    (r,) = p.done
    assert r.key == big.key and r.status == "failed" and r.evidence["refused"] == "memory_budget"
    assert surely_work([small, big], c, 6 << 30) == {"cpu": 1, "gpu": 0}


def test_compile_and_publish_refuses_before_lease_and_compile(tmp_path):
    """The shared compile path (Ray actors, the hook's worker, compile-one): refused
    with no lease left, no entry and no failure record.  With the real compiler: were the
    budget not checked, this would compile (a small kernel) and the test would fail."""
    from aoti_farm.compile import job
    from aoti_farm.compile.compiler import AOTICompiler

    c = Cache(tmp_path / "c", signing_key=None)
    fp = fingerprint("cpu")
    sig = _relu(1 << 16)                 # ~5 MB estimated
    n0 = budget.COUNTERS.get("refused")
    out = job.compile_and_publish(c, AOTICompiler(), fp, sig, owner="t", memory_budget=1 << 20)
    assert out.status == job.FAILED and out.evidence["refused"] == "memory_budget", out
    assert "memory budget" in out.error and budget.COUNTERS.get("refused") == n0 + 1
    assert not c.has_entry(fp.id, sig.key) and c.failure(fp.id, sig.key) is None
    leases_dir = c.ns(fp.id) / "leases"
    assert not leases_dir.exists() or not any(leases_dir.iterdir())


def test_hook_worker_refuses_over_budget_end_to_end(tmp_path):
    """The hook's real background compile worker, given ``--memory-budget 1M`` (as the hook
    starts it, from its resolved AOTI_FARM_MEMORY_BUDGET), drains a queued relu[2**16] without
    compiling: a failed outcome naming the budget, the item done, nothing published."""
    from aoti_farm.cache import queue as missq

    c = Cache(tmp_path / "c", signing_key=None)
    fp = fingerprint("cpu")
    c.ensure(fp)
    sig = _relu(1 << 16)
    assert missq.enqueue(c, fp.id, sig)
    env = {k: v for k, v in os.environ.items() if k != budget.ENV}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "aoti_farm.runtime.compile_worker", "--cache-dir", str(c.root),
                        "--fp-id", fp.id, "--idle", "1", "--memory-budget", "1M"],
                       capture_output=True, text=True, env=env, timeout=300)
    events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"event"')]
    outcomes = [e for e in events if e["event"] == "outcome"]
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(outcomes) == 1 and outcomes[0]["status"] == "failed", events
    assert "memory budget" in outcomes[0]["error"] and outcomes[0]["evidence"]["refused"] == "memory_budget"
    assert not any(e["event"] == "compile" for e in events), events
    assert missq.pending(c, fp.id) == [] and not c.has_entry(fp.id, sig.key)
    assert c.failure(fp.id, sig.key) is None
    print(f"hook worker refused relu[2**16] under a 1M budget; worker ran {time.monotonic() - t0:.1f}s")


def test_merged_counts_stay_int64(world, capsys):
    """Counts add up in a merge (and when a trace repeats a signature); the result is
    capped at int64 so the merged trace still validates."""
    big = 2**63 - 10
    a, b = world["base"] / "cnt-a.json", world["base"] / "cnt-b.json"
    for p in (a, b):
        p.write_text(json.dumps(_trace(("aten::relu", [_t("self", [4])], {"count": big}),
                                       ("aten::relu", [_t("self", [4])], {"count": big}))))
    out = world["base"] / "cnt-merged.json"
    rc, _, err = _run(capsys, ["trace", "merge", out, a, b])
    assert rc == 0, err
    rc, _, err = _run(capsys, ["trace", "validate", out])
    assert rc == 0, err
    assert json.loads(out.read_text())["entries"][0]["count"] == 2**63 - 1
