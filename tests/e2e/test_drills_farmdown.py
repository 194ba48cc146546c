"""Drill 7 (P5, P7): the farm is down.  Serving processes keep running on eager with
``on_miss="queue"``; their queue survives a restart; an `aoti-farm serve` started later
drains it and exits cleanly on SIGTERM; a serving process that kept running then hits
(hot reload).  Serving runs in real subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from aoti_farm.cache import queue as missq
from aoti_farm.cache.store import MANIFEST, Cache
from aoti_farm.fingerprint import fingerprint

from conftest import sig_add_alpha
from e2e.test_drills_util import EXE, REPO, env, kill_tree, wait_for

pytestmark = pytest.mark.slow

SERVING = r"""
import json, sys, time, torch
from aoti_farm.runtime import Settings, install
root, mode = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(0)
a, b = torch.randn(8, 16, generator=g), torch.randn(16, generator=g)
want = torch.add(a, b, alpha=2).flatten().tolist()   # eager, before the hook is installed
# only add.Tensor is served, and results are checked in Python (tolist), so the hook sees
# exactly one signature: the one the drill is about
hook = install(cache_dir=root, ops=["aten::add.Tensor"], on_miss="queue", settings=Settings(poll_interval=0.2),
               serve="always")   # the drill is about the queue and hot reload, not the speed gate
calls = wrong = 0
end = time.time() + (300 if mode == "loop" else 0)
while True:
    got = torch.add(a, b, alpha=2)
    calls += 1
    wrong += not all(abs(x - y) <= 1e-5 for x, y in zip(got.flatten().tolist(), want))
    hits = hook.stats()["hits"]
    if mode == "loop" and hits:
        print(json.dumps({"event": "hit", "time": time.time(), "calls": calls, "wrong": wrong}), flush=True)
        break
    if time.time() >= end:
        break
    time.sleep(0.05)
st = hook.stats()
hook.uninstall()
print(json.dumps({"event": "done", "calls": calls, "wrong": wrong, "hits": hits,
                  "stats": st}, default=lambda o: getattr(o, "__dict__", str(o))), flush=True)
"""


def _serving(root, mode, **kw):
    return subprocess.Popen([sys.executable, "-c", SERVING, str(root), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(), cwd=str(REPO), **kw)


def _lines(out):
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_farm_down_queue_survives_then_serve_drains(tmp_path):
    root = tmp_path / "cache"
    sig = sig_add_alpha()
    fp = fingerprint("cpu").id
    cache = Cache(root, signing_key=None)
    # 1. no farm anywhere: two separate serving processes (a restart), both on eager
    runs = []
    for _ in range(2):
        p = _serving(root, "once")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        runs.append(_lines(out)[-1])
        assert missq.pending(cache, fp) == [sig.key]        # queued, and survived the restart
    # no entry anywhere: every call was a miss, served eager and right
    assert all(r["wrong"] == 0 and r["calls"] == r["stats"]["misses"] >= 1 for r in runs), runs
    # 2. a serving process that keeps running, then the farm comes up
    loop = _serving(root, "loop")
    serve = subprocess.Popen([EXE, "serve", "--cache-dir", str(root), "--cpu-workers", "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env(),
                             start_new_session=True)
    try:
        entry = cache.entry_dir(fp, sig.key) / MANIFEST
        assert wait_for(entry.exists, 600, 0.1), "serve never published the queued signature"
        published = os.stat(entry).st_mtime
        out, err = loop.communicate(timeout=300)
        assert loop.returncode == 0, err[-3000:]
        hit = [x for x in _lines(out) if x["event"] == "hit"]
        assert hit and hit[0]["wrong"] == 0, out
        reload_s = hit[0]["time"] - published
        drained = wait_for(lambda: missq.pending(cache, fp) == [], 60, 0.1)
        assert drained, missq.pending(cache, fp)
        serve.send_signal(signal.SIGTERM)
        sout, serr = serve.communicate(timeout=120)
    finally:
        for p in (loop, serve):
            if p.poll() is None:
                kill_tree(p.pid)
    assert serve.returncode == 0, serr[-3000:]
    assert "Traceback" not in serr, serr[-3000:]
    cache.open_entry(fingerprint("cpu"), sig.key)
    print(f"drill 7: eager_runs_while_down={len(runs)} wrong_results=0 queue_survived_restart=1 "
          f"serve_drained=1 serve_sigterm_exit={serve.returncode} hot_reload_s={reload_s:.2f}")
