"""End-to-end tests of `aoti-farm warm` / `serve`: real Ray, real AOTInductor compiles.

Distinct signatures compiled for real: add (S1), mul (S2), relu (S4); BAD is rejected by
eager before any compile.  One module-wide cache is warmed by two *concurrent* CLI runs
(which must not compile anything twice); the other tests work on copies of it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from aoti_farm.cache import queue as missq
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.tolerance import compare
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.compiler import load_runner
from aoti_farm.config import FarmConfig
from aoti_farm.fingerprint import fingerprint

from _runtime_helpers import wait_until
from conftest import sig_add_alpha, sig_mul

pytestmark = pytest.mark.slow

S1, S2 = sig_add_alpha(), sig_mul()
S4 = S.from_call(torch.ops.aten.relu.default, (torch.empty(6, 5),), {})
BAD = S.from_call(torch.ops.aten.mm.default, (torch.empty(3, 4), torch.empty(4, 5)), {})
# same op, inner dimensions that do not match: eager rejects it, so it can never compile
_bad = BAD.to_obj()
_bad["args"][1]["sizes"], _bad["args"][1]["strides"] = [7, 5], [5, 1]
BAD = S.parse_signature(_bad)

ENV = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1",
       "PYTHONWARNINGS": "ignore"}


def write_trace(path, sigs):
    entries = [{"order": i, "count": 2, "op": s.op, "args": s.to_obj()["args"]} for i, s in enumerate(sigs)]
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": entries}))
    return str(path)


def cli(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "aoti_farm", *args], env=env or ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def report(path):
    return {r["key"]: r for r in json.loads(open(path).read())["signatures"]}


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    d = tmp_path_factory.mktemp("farm")
    a = write_trace(d / "a.json", [S1, S2])
    b = write_trace(d / "b.json", [S2, S1])          # duplicates across models
    c = write_trace(d / "c.json", [BAD])
    cache = d / "cache"
    common = ["--cache-dir", str(cache), "--cpu-workers", "1", "--lease-ttl", "8"]
    ray_tmp = tempfile.mkdtemp(prefix="afr", dir="/tmp")   # short: Ray's socket paths live under it
    env = {**ENV, "RAY_TMPDIR": ray_tmp}
    p1 = cli("warm", "--model", a, "--model", b, "--report", str(d / "r1.json"), *common, env=env)
    p2 = cli("warm", "--model", a, "--model", c, "--report", str(d / "r2.json"), *common, env=env)
    out1, out2 = p1.communicate(timeout=900), p2.communicate(timeout=900)
    yield {"dir": d, "a": a, "b": b, "c": c, "cache": Cache(cache), "rc": (p1.returncode, p2.returncode),
           "out": (out1, out2), "reports": (report(d / "r1.json"), report(d / "r2.json")), "ray_tmp": ray_tmp}
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(f"{pid}: {cmd[:160]}")
    return out


def test_concurrent_cold_runs_compile_each_signature_once(warmed):
    r1, r2 = warmed["reports"]
    assert warmed["rc"] == (0, 1), warmed["out"]
    assert set(r1) == {S1.key, S2.key} and set(r2) == {S1.key, S2.key, BAD.key}
    for sig in (S1, S2):
        statuses = [r1[sig.key]["status"], r2[sig.key]["status"]]
        assert statuses.count("compiled") == 1 and set(statuses) <= {"compiled", "cached"}, statuses
    fp = fingerprint("cpu")
    assert warmed["cache"].list_keys(fp.id) == {S1.key, S2.key}
    # each run stopped the Ray it started: no process of either embedded cluster is left
    assert wait_until(lambda: not _processes_mentioning(warmed["ray_tmp"]), 30, 0.5), \
        _processes_mentioning(warmed["ray_tmp"])


def test_kernels_load_and_match_eager(warmed):
    fp = fingerprint("cpu")
    for sig in (S1, S2):
        entry = warmed["cache"].open_entry(fp, sig.key)
        runner = load_runner(entry.kernel_path, "cpu")
        args, kwargs = S.materialize(sig, seed=7)
        expected = S.resolve_op(sig.op)(*args, **kwargs)
        assert compare(expected, runner.run(flat_tensors(sig, args, kwargs))) is None


def test_failing_signature_exit_1_with_record(warmed):
    r2 = warmed["reports"][1]
    bad = r2[BAD.key]
    assert bad["status"] == "failed" and "eager rejects" in bad["error"]
    assert bad["op"].startswith("aten::mm")
    assert {"key", "op", "status", "seconds", "worker", "attempts", "error"} <= set(bad)
    rec = warmed["cache"].failure(fingerprint("cpu").id, BAD.key)
    assert rec and "eager rejects" in rec["reason"]
    assert "failed signatures:" in warmed["out"][1][1]


_NO_RAY = ("import sys\nfrom aoti_farm.cli import main\nrc = main(sys.argv[1:])\n"
           "print('RAY_IMPORTED' if 'ray' in sys.modules else 'NO_RAY')\nsys.exit(rc)\n")


@pytest.mark.parametrize("extra,rc", [((), 0), (("--model", "c"), 1)])
def test_second_run_all_cached_does_not_import_ray(warmed, extra, rc):
    extra = tuple(warmed["c"] if x == "c" else x for x in extra)
    p = subprocess.run([sys.executable, "-c", _NO_RAY, "warm", "--model", warmed["a"], "--model", warmed["b"],
                        *extra, "--cache-dir", str(warmed["cache"].root)], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == rc, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "NO_RAY"


def _copy(warmed, tmp_path, drop=()):
    dst = tmp_path / "cache"
    shutil.copytree(warmed["cache"].root, dst, symlinks=True)
    c = Cache(dst)
    for sig in drop:
        assert c.remove(fingerprint("cpu").id, sig.key)
    return c


def test_killed_actor_mid_compile_is_retried(warmed, tmp_path, monkeypatch):
    from aoti_farm.workers.warm import warm

    cache = _copy(warmed, tmp_path)
    trace = write_trace(tmp_path / "t.json", [S1, S4])
    killed = []

    def on_event(kind, data):
        if kind == "dispatch" and not killed:
            killed.append(data["worker"]["pid"])
            os.kill(data["worker"]["pid"], signal.SIGKILL)

    counters = {}
    cfg = FarmConfig(cache_dir=str(cache.root), cpu_workers=1, retries=2)
    rc = warm(cfg, [trace], report=str(tmp_path / "r.json"), on_event=on_event, counters_out=counters)
    r = report(tmp_path / "r.json")
    assert rc == 0 and killed
    assert r[S4.key]["status"] == "compiled" and r[S4.key]["attempts"] == 2
    assert r[S1.key]["status"] == "cached" and r[S1.key]["attempts"] == 0
    assert counters["actor_losses"] == 1 and counters["retried"] == 1
    fp = fingerprint("cpu")
    runner = load_runner(cache.open_entry(fp, S4.key).kernel_path, "cpu")
    args, kwargs = S.materialize(S4, seed=3)
    assert compare(torch.relu(args[0]), runner.run(flat_tensors(S4, args, kwargs))) is None


def test_cluster_node_removed_mid_run(warmed, tmp_path):
    """Two worker nodes on this machine share the cache; one is removed mid-run."""
    import ray
    from ray.cluster_utils import Cluster

    from aoti_farm.workers.warm import warm

    cache = _copy(warmed, tmp_path, drop=(S1, S2))
    trace = write_trace(tmp_path / "t.json", [S1, S2])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    removed = []

    def on_event(kind, data):
        if kind == "dispatch" and not removed:
            node = next(n for n in nodes if n.node_id == data["worker"]["node_id"])
            removed.append(node)
            cluster.remove_node(node)

    counters = {}
    try:
        cluster.wait_for_nodes()
        cfg = FarmConfig(cache_dir=str(cache.root), address=cluster.address, cpu_workers=2, retries=2)
        rc = warm(cfg, [trace], report=str(tmp_path / "r.json"), on_event=on_event, counters_out=counters)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    r = report(tmp_path / "r.json")
    assert rc == 0 and removed
    assert [r[s.key]["status"] for s in (S1, S2)] == ["compiled", "compiled"]
    assert counters["retried"] >= 1 and counters["compiled"] == 2
    assert cache.list_keys(fingerprint("cpu").id) >= {S1.key, S2.key}


def test_serve_drains_queue_and_stops_on_sigterm(warmed, tmp_path):
    cache = _copy(warmed, tmp_path, drop=(S2,))
    fp = fingerprint("cpu")
    assert missq.enqueue(cache, fp.id, S2) and missq.enqueue(cache, fp.id, S1)
    p = cli("serve", "--cache-dir", str(cache.root), "--cpu-workers", "1", "--poll-interval", "0.5")
    try:
        deadline = time.monotonic() + 600
        while missq.pending(cache, fp.id) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert p.poll() is None, p.communicate()
        assert missq.pending(cache, fp.id) == []
        assert cache.has_entry(fp.id, S2.key)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "stopped: compiled 1" in err
    from aoti_farm.cache.leases import list_leases

    assert list_leases(cache, fp.id) == []


def test_bad_input_exit_2_one_line_nothing_written(tmp_path):
    from aoti_farm.cli import main

    cache = tmp_path / "cache"
    p = subprocess.run([sys.executable, "-m", "aoti_farm", "warm", "--model", str(tmp_path / "missing.json"),
                        "--cache-dir", str(cache)], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "missing.json" in p.stderr and "Traceback" not in p.stderr
    assert not cache.exists()
    trace = write_trace(tmp_path / "t.json", [S1])
    assert main(["warm", "--model", trace, "--cache-dir", str(cache), "--report", str(tmp_path / "no/r.json")]) == 2
    assert main(["warm", "--model", trace, "--cache-dir", str(cache), "--retries", "-1"]) == 2
    assert not cache.exists()
