"""Drills 1, 2 and 4 (P1, P6, P7): a worker killed mid-compile, a driver killed mid-run,
and four warm processes plus two serving processes on one cache.

Real Ray, real compiles, real directories.  Each drill counts compiles from what is left
behind (manifests, the warm report) and prints its figures; `pytest -s` shows them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import torch

from aoti_farm import leases
from aoti_farm.cache import MANIFEST, Cache
from aoti_farm.cli import main
from aoti_farm.fingerprint import fingerprint
from aoti_farm import signature as S
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul
from test_drills_util import EXE, REPO, cmdline, descendants, env, kill_tree, wait_for

pytest.importorskip("aoti_farm.farm", reason="farm.py not written yet")
pytestmark = pytest.mark.slow


def sig_sub(shape=(8, 16)):
    a, b = torch.empty(shape), torch.empty(shape)
    return S.from_call(torch.ops.aten.sub.Tensor, (a, b), {})


def _trace(path: Path, sigs) -> Path:
    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(sigs)]), path)
    return path


def _manifests(root: Path) -> list[dict]:
    out = []
    for p in root.glob("*/entries/*/*/" + MANIFEST):
        out.append(msgpack.unpackb(p.read_bytes(), raw=False))
    return out


def _verify_clean(root: Path) -> bool:
    p = subprocess.run([EXE, "cache", "verify", "--cache-dir", str(root), "--json"], capture_output=True,
                       text=True, env=env())
    obj = json.loads(p.stdout)
    return p.returncode == 0 and not obj["bad"]


def _leftovers(root: Path) -> dict:
    fp = fingerprint("cpu").id
    tmp = sorted(os.listdir(root / "tmp")) if (root / "tmp").exists() else []
    ls = leases.list_leases(Cache(root, signing_key=None), fp)
    return {"tmp": tmp, "leases": ls}


def _report(stdout: str) -> dict:
    """The warm report: the last JSON document on stdout (``--json``)."""
    text = stdout.strip()
    start = text.rfind("\n{")
    return json.loads(text if start < 0 else text[start + 1:]) if text.startswith("{") or start >= 0 else {}


def _statuses(rep: dict) -> dict[str, list[str]]:
    """key -> statuses it got in this report (a key compiled twice shows up twice)."""
    out: dict[str, list[str]] = {}
    for r in rep.get("results", rep.get("signatures", [])):
        out.setdefault(r["key"], []).append(r["status"])
    return out


def _attempts(rep: dict) -> list[int]:
    return [int(r.get("attempts", 1)) for r in rep.get("results", rep.get("signatures", []))]


def _actor_pids(root_pid: int) -> list[int]:
    return [p for p in descendants(root_pid) if "CompileActor" in cmdline(p)]


# --- drill 1: a worker killed mid-compile ---------------------------------------------------

def run_worker_crash(tmp: Path, sigs) -> dict:
    """One round of drill 1; returns its figures (also used by scripts/drill_worker_crash.sh)."""
    root = tmp / "cache"
    trace = _trace(tmp / "t.json", sigs)
    fp = fingerprint("cpu").id
    p = subprocess.Popen([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                         start_new_session=True)
    killed = []
    try:
        # mid-compile: a lease is held (a compile started) and nothing is published yet
        def compiling():
            held = leases.list_leases(Cache(root, signing_key=None), fp) if (root / fp).exists() else []
            pids = _actor_pids(p.pid)
            return (held and pids and not _manifests(root)) and pids

        pids = wait_for(compiling, 300, 0.05)
        assert pids, "no compile actor was seen compiling"
        time.sleep(1.0)  # let the compile get going (Inductor is mid-codegen now)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        out, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    rep = _report(out)
    st = _statuses(rep)
    man = _manifests(root)
    left = _leftovers(root)
    return {"exit": p.returncode, "stderr": err[-3000:], "killed": len(killed), "report": rep,
            "statuses": st, "attempts": _attempts(rep), "entries": len(man),
            "keys": sorted(m["key"] for m in man), "compiled": sum(s.count("compiled") for s in st.values()),
            "verify_clean": _verify_clean(root), "tmp": left["tmp"], "leases": left["leases"]}


def test_worker_killed_mid_compile(tmp_path):
    sigs = [sig_add_alpha(), sig_mul()]
    f = run_worker_crash(tmp_path, sigs)
    assert f["exit"] == 0, f["stderr"]
    assert f["killed"] >= 1
    assert f["keys"] == sorted(s.key for s in sigs)                 # nothing lost
    assert f["compiled"] == len(sigs), f["statuses"]                # nothing compiled twice
    assert all(len(v) == 1 for v in f["statuses"].values()), f["statuses"]
    assert f["attempts"] and max(f["attempts"]) <= 3, f["attempts"]  # 1 + --retries (2)
    assert f["verify_clean"] and f["tmp"] == [] and f["leases"] == []
    print(f"drill 1: killed_workers={f['killed']} exit={f['exit']} attempts={f['attempts']} "
          f"compiles={f['compiled']} entries={f['entries']} partial_entries=0 tmp_orphans={len(f['tmp'])} "
          f"stale_leases={len(f['leases'])}")


# --- drill 2: the driver killed mid-run ------------------------------------------------------

def test_driver_killed_then_rerun(tmp_path):
    ttl = 5
    root = tmp_path / "cache"
    sigs = [sig_add_alpha(), sig_mul()]
    trace = _trace(tmp_path / "t.json", sigs)
    fp = fingerprint("cpu").id
    e = env(AOTI_FARM_LEASE_TTL=ttl)
    p = subprocess.Popen([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         start_new_session=True)
    try:
        held = wait_for(lambda: (root / fp / "leases").exists() and leases.list_leases(
            Cache(root, signing_key=None), fp), 300, 0.05)
        assert held, "the warm never took a lease"
        time.sleep(1.0)
        tree = [p.pid] + descendants(p.pid)
        kill_tree(p.pid)           # the driver and its local Ray (gcs, raylet, workers)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    survivors = [q for q in tree if os.path.exists(f"/proc/{q}") and cmdline(q)]
    stale = leases.list_leases(Cache(root, signing_key=None), fp)
    before = len(_manifests(root))
    t0 = time.time()
    r = subprocess.run([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                        "--json"], capture_output=True, text=True, env=e, timeout=900)
    t1 = time.time()
    assert r.returncode == 0, r.stderr[-3000:]
    man = {m["key"]: m for m in _manifests(root)}
    assert sorted(man) == sorted(s.key for s in sigs)
    # the lease-blocked signature: its rerun compile started after the stale lease expired
    delays = []
    for k in stale:
        if k in man and man[k]["created"] >= t0:
            start = man[k]["created"] - float(man[k].get("compile_seconds") or 0)
            delays.append(round(start - t0, 1))
    st = _statuses(_report(r.stdout))
    assert sum(s.count("compiled") for s in st.values()) == len(sigs) - before
    assert _verify_clean(root) and _leftovers(root)["leases"] == []
    print(f"drill 2: killed_processes={len(tree)} survivors={len(survivors)} stale_leases={len(stale)} "
          f"done_before_kill={before} rerun_exit=0 rerun_compiles={len(sigs) - before} "
          f"lease_ttl={ttl}s lease_delay_s={delays} rerun_wall_s={t1 - t0:.1f}")


# --- drill 4: concurrency --------------------------------------------------------------------

SERVE = r"""
import json, sys, time, torch
from aoti_farm.runtime import install
root, rounds = sys.argv[1], int(sys.argv[2])
hook = install(cache_dir=root, on_miss="compile", poll_interval=0.2)
g = torch.Generator().manual_seed(1)
a, b, c = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(8, 16, generator=g)
ok = True
for i in range(rounds):
    for got, want in ((torch.add(a, b, alpha=2), a + 2 * b), (torch.sub(a, c), a - c)):
        ok &= bool(torch.allclose(got, want, atol=1e-6))
    time.sleep(0.5)
st = hook.stats()
hook.uninstall()
print(json.dumps({"ok": ok, "stats": st}, default=lambda o: getattr(o, "__dict__", str(o))))
"""


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_four_warms_two_servers_one_cache(tmp_path):
    root = tmp_path / "cache"
    add, mul, sub = sig_add_alpha(), sig_mul(), sig_sub()
    traces = [_trace(tmp_path / f"t{i}.json", s) for i, s in
              enumerate([[add, mul], [mul, add], [add, sub], [sub, mul]])]
    port = _free_port()
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    e = env()
    h = subprocess.run([ray, "start", "--head", "--num-cpus", "2", "--port", str(port), "--disable-usage-stats",
                        "--include-dashboard=false"], capture_output=True, text=True, env=e, timeout=180)
    assert h.returncode == 0, h.stderr[-2000:]
    try:
        addr = f"127.0.0.1:{port}"
        warms = [subprocess.Popen([EXE, "warm", "--model", str(t), "--cache-dir", str(root), "--address", addr,
                                   "--cpu-workers", "1", "--json"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=e) for t in traces]
        servers = [subprocess.Popen([sys.executable, "-c", SERVE, str(root), "40"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=e, cwd=str(REPO)) for _ in range(2)]
        wres = [(w.communicate(timeout=900), w.returncode) for w in warms]
        sres = [(s.communicate(timeout=900), s.returncode) for s in servers]
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=e, timeout=120)
    for (out, err), rc in wres:
        assert rc == 0, err[-3000:]
    for (out, err), rc in sres:
        assert rc == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    reports = [_report(out) for (out, _), _ in wres]
    compiled_by_warm: dict[str, int] = {}
    for rep in reports:
        for k, v in _statuses(rep).items():
            compiled_by_warm[k] = compiled_by_warm.get(k, 0) + v.count("compiled")
    man = _manifests(root)
    keys = sorted(m["key"] for m in man)
    assert keys == sorted({add.key, mul.key, sub.key})             # no lost entry
    assert all(n <= 1 for n in compiled_by_warm.values()), compiled_by_warm  # nothing compiled twice by warms
    served_compiles = sum(_serving_compiles(json.loads(out.strip().splitlines()[-1])["stats"])
                          for (out, _), _ in sres)
    total = sum(compiled_by_warm.values()) + served_compiles
    assert total == 3, (compiled_by_warm, served_compiles)
    assert _verify_clean(root)
    print(f"drill 4: warms=4 servers=2 signatures=3 compiles_total={total} (warm={sum(compiled_by_warm.values())} "
          f"serving={served_compiles}) entries={len(man)} duplicates=0 lost=0 verify=clean")


def _serving_compiles(stats) -> int:
    from test_drills_runtime import _flat

    f = _flat(stats)
    return int(f.get("compiled", 0))
