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

from aoti_farm.cache import leases
from aoti_farm.cache.store import MANIFEST, Cache
from aoti_farm.fingerprint import fingerprint
from aoti_farm import signature as S
from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul
from e2e.test_drills_util import EXE, REPO, cmdline, descendants, env, kill_tree, wait_for

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


def _report(path: Path) -> dict:
    """The warm report written by ``--report`` (aoti_farm.report.progress.write_report); {} if none."""
    try:
        rep = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    assert rep.get("format") == "aoti-farm-warm-report", rep
    return rep


def _statuses(rep: dict) -> dict[str, list[str]]:
    """key -> statuses it got in this report (a key compiled twice shows up twice)."""
    out: dict[str, list[str]] = {}
    for r in rep.get("signatures", []):
        out.setdefault(r["key"], []).append(r["status"])
    return out


def _attempts(rep: dict) -> list[int]:
    return [int(r["attempts"]) for r in rep.get("signatures", []) if r["status"] == "compiled"]


def _actor_pids(root_pid: int) -> list[int]:
    return [p for p in descendants(root_pid) if "CompileActor" in cmdline(p)]


# --- drill 1: a worker killed mid-compile ---------------------------------------------------

def run_worker_crash(tmp: Path, sigs) -> dict:
    """One round of drill 1; returns its figures (also used by scripts/drill_worker_crash.sh)."""
    root = tmp / "cache"
    trace = _trace(tmp / "t.json", sigs)
    fp = fingerprint("cpu").id
    report = tmp / "report.json"
    p = subprocess.Popen([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                          "--retries", "2", "--report", str(report)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(),
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
    rep = _report(report)
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
    # long enough that the rerun (Ray start + actor warm-up, ~10 s here) usually meets the
    # lease still live and has to park on it; short enough to keep the drill quick
    ttl = 15
    root = tmp_path / "cache"
    sigs = [sig_add_alpha(), sig_mul()]
    trace = _trace(tmp_path / "t.json", sigs)
    fp = fingerprint("cpu").id
    e = env()
    report = tmp_path / "rerun.json"
    p = subprocess.Popen([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                          "--lease-ttl", str(ttl)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
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
    # when each orphaned lease expires (its holder is dead: no more heartbeats)
    expires = {k: time.time() - i["age"] + float(i.get("ttl", ttl))
               for k in stale if (i := leases.holder_info(Cache(root, signing_key=None), fp, k))}
    before = len(_manifests(root))
    t0 = time.time()
    r = subprocess.run([EXE, "warm", "--model", str(trace), "--cache-dir", str(root), "--cpu-workers", "1",
                        "--report", str(report)], capture_output=True, text=True, env=e, timeout=900)
    t1 = time.time()
    assert r.returncode == 0, r.stderr[-3000:]
    man = {m["key"]: m for m in _manifests(root)}
    assert sorted(man) == sorted(s.key for s in sigs)
    # the lease-blocked signature: its rerun compile started after the stale lease expired
    rep = _report(report)
    parks = rep["pool"]["busy_parks"]
    delays = []
    for k, exp in expires.items():
        assert k in man and man[k]["created"] >= t0
        start = man[k]["created"] - float(man[k].get("compile_seconds") or 0)
        # never compiled while the orphaned lease was live (the dead holder might still be)...
        assert start >= exp - 0.5, (start, exp)
        # ...and held up by it no longer than its expiry plus one re-check (ttl/4) and slack
        assert parks == 0 or start <= exp + ttl / 4 + 10, (start - exp, parks)
        delays.append(round(max(0.0, start - max(t0, exp)), 1) if parks else 0.0)
    st = _statuses(rep)
    assert sum(s.count("compiled") for s in st.values()) == len(sigs) - before
    assert _verify_clean(root) and _leftovers(root)["leases"] == []
    print(f"drill 2: killed_processes={len(tree)} survivors={len(survivors)} stale_leases={len(stale)} "
          f"done_before_kill={before} rerun_exit=0 rerun_compiles={len(sigs) - before} "
          f"lease_ttl={ttl}s busy_parks={parks} lease_delay_after_expiry_s={delays} rerun_wall_s={t1 - t0:.1f}")


# --- drill 4: concurrency --------------------------------------------------------------------

SERVE = r"""
import json, sys, time, torch
from aoti_farm.runtime import Settings, install
root, rounds, wlog = sys.argv[1], int(sys.argv[2]), sys.argv[3]
g = torch.Generator().manual_seed(1)
a, b, c = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(8, 16, generator=g)
# expected values from eager before the hook; only add/sub are served and results are
# checked in Python, so the hook sees exactly the two signatures of the drill
want = [torch.add(a, b, alpha=2).flatten().tolist(), torch.sub(a, c).flatten().tolist()]
hook = install(cache_dir=root, ops=["aten::add.Tensor", "aten::sub.Tensor"], on_miss="compile",
               settings=Settings(poll_interval=0.2, worker_log=wlog, worker_idle=3))
ok = True
for i in range(rounds):
    for got, w in zip((torch.add(a, b, alpha=2), torch.sub(a, c)), want):
        ok &= all(abs(x - y) <= 1e-5 for x, y in zip(got.flatten().tolist(), w))
    time.sleep(0.5)
st = hook.stats()
hook.uninstall()
w = hook.worker
if w is not None:  # let its background compile worker finish (it exits when idle)
    w.wait(timeout=600)
print(json.dumps({"ok": ok, "stats": st}))
"""


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _ray_head(tmp: Path, port: int, e: dict) -> subprocess.Popen:
    """One shared Ray head (2 CPUs) for the four warms, in its own session and temp dir so
    it is stopped by killing its process tree, never by `ray stop` (which stops every Ray
    on the host, including other tests'), and so embedded ray.init() elsewhere can't find it."""
    import tempfile

    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    tdir = tempfile.mkdtemp(prefix="rd4-", dir="/tmp")  # short: Ray's unix sockets live under it
    log = open(tmp / "ray-head.log", "w")
    h = subprocess.Popen([ray, "start", "--head", "--block", "--num-cpus", "2", "--port", str(port),
                          "--disable-usage-stats", "--include-dashboard=false", "--temp-dir", tdir],
                         stdout=log, stderr=subprocess.STDOUT, text=True, env=e, start_new_session=True)
    log.close()
    up = wait_for(lambda: h.poll() is not None or "Ray runtime started" in (tmp / "ray-head.log").read_text(),
                  180, 0.2)
    if h.poll() is not None or not up:
        kill_tree(h.pid)
        pytest.fail("ray start --head failed: " + (tmp / "ray-head.log").read_text()[-2000:])
    return h


def _hook_worker_compiles(log: Path) -> int:
    """Compiles done by a serving process's background compile worker (its JSON log lines)."""
    n = 0
    if log.exists():
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                o = json.loads(line)
                n += o.get("event") == "outcome" and o.get("status") == "compiled"
    return n


def test_four_warms_two_servers_one_cache(tmp_path):
    root = tmp_path / "cache"
    add, mul, sub = sig_add_alpha(), sig_mul(), sig_sub()
    traces = [_trace(tmp_path / f"t{i}.json", s) for i, s in
              enumerate([[add, mul], [mul, add], [add, sub], [sub, mul]])]
    port = _free_port()
    # Ray >= 2.5x enables token auth for `ray start` clusters, and drivers only send the
    # token with RAY_AUTH_MODE=token; a throwaway single-host test cluster opts out
    e = env(RAY_AUTH_MODE="disabled")
    head = _ray_head(tmp_path, port, e)
    wlogs = [tmp_path / f"serve{i}-worker.log" for i in range(2)]
    reps = [tmp_path / f"warm{i}.json" for i in range(4)]
    try:
        addr = f"127.0.0.1:{port}"
        warms = [subprocess.Popen([EXE, "warm", "--model", str(t), "--cache-dir", str(root), "--address", addr,
                                   "--cpu-workers", "1", "--report", str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=e) for t, r in zip(traces, reps)]
        servers = [subprocess.Popen([sys.executable, "-c", SERVE, str(root), "40", str(w)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=e, cwd=str(REPO)) for w in wlogs]
        wres = [(w.communicate(timeout=900), w.returncode) for w in warms]
        sres = [(s.communicate(timeout=900), s.returncode) for s in servers]
    finally:
        kill_tree(head.pid)
        head.wait(timeout=60)
    for (out, err), rc in wres:
        assert rc == 0, err[-3000:]
    for (out, err), rc in sres:
        assert rc == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["ok"]
    reports = [_report(r) for r in reps]
    compiled_by_warm: dict[str, int] = {}
    for rep in reports:
        assert len(rep["signatures"]) == 2 and all(r["status"] in ("compiled", "cached") for r in rep["signatures"])
        for k, v in _statuses(rep).items():
            compiled_by_warm[k] = compiled_by_warm.get(k, 0) + v.count("compiled")
    man = _manifests(root)
    keys = sorted(m["key"] for m in man)
    assert keys == sorted({add.key, mul.key, sub.key})             # no lost entry
    assert all(n <= 1 for n in compiled_by_warm.values()), compiled_by_warm  # nothing compiled twice by warms
    served_compiles = sum(_hook_worker_compiles(w) for w in wlogs)
    total = sum(compiled_by_warm.values()) + served_compiles
    assert total == 3, (compiled_by_warm, served_compiles)         # nothing compiled twice, all told
    hits = [json.loads(out.strip().splitlines()[-1])["stats"]["hits"] for (out, _), _ in sres]
    assert _verify_clean(root)
    print(f"drill 4: warms=4 servers=2 signatures=3 compiles_total={total} (warm={sum(compiled_by_warm.values())} "
          f"serving={served_compiles}) entries={len(man)} serving_hits={hits} duplicates=0 lost=0 verify=clean")
