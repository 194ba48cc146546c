"""Metrics in the Prometheus format: a serving process's (in an application's registry, and
on a port, several processes per host) and `aoti-farm serve`'s equal their counters.

Kernels come from the session cache (``kernels``); the miss -> hit case publishes an
entry into the hook's cache while it serves (a copy of a real entry, renamed into place
as a publish does).  `serve` runs real Ray and a real actor on a signature that eager
rejects (no compile).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aoti_farm.cache import queue as missq
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import fingerprint

from _runtime_helpers import wait_until
from conftest import sig_add_alpha, sig_mul

HERE = os.path.dirname(os.path.abspath(__file__))
ADD, MUL = sig_add_alpha(), sig_mul()


def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} of an exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def v(sm: dict, name: str, **labels) -> float:
    return sm.get((name, frozenset(labels.items())), 0.0)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def check_equal(sm: dict, s: dict) -> None:
    """Every exported hook counter equals ``stats()``."""
    p = "aoti_farm_hook_"
    assert v(sm, p + "calls_total") == s["calls"]
    assert v(sm, p + "hits_total") == s["hits"]
    assert v(sm, p + "misses_total", reason="missing") == s["misses"]
    assert v(sm, p + "misses_total", reason="failed") == s["failed_signatures"]
    assert v(sm, p + "gated_total") == s["gated"]
    for reason, n in s["fallbacks"].items():
        assert v(sm, p + "fallbacks_total", reason=reason) == n
    assert sum(val for (name, _), val in sm.items() if name == p + "fallbacks_total") == sum(s["fallbacks"].values())
    for k in ("kernels_loaded", "load_errors", "kernel_errors", "queued", "served_after_miss"):
        assert v(sm, p + k + "_total") == s[k], k
    for kind, n in s["integrity_failures_by_kind"].items():
        assert v(sm, p + "integrity_failures_total", kind=kind) == n
    for op, oc in s["per_op"].items():
        for outcome, k in (("hit", "hits"), ("miss", "misses"), ("fallback", "fallbacks")):
            assert v(sm, p + "op_calls_total", op=op, outcome=outcome) == oc[k]
    h = s["miss_to_hit_seconds"]
    assert v(sm, p + "miss_to_hit_seconds_count") == h["count"]
    assert v(sm, p + "miss_to_hit_seconds_sum") == pytest.approx(h["sum"])
    for le, c in h["buckets"]:
        assert v(sm, p + "miss_to_hit_seconds_bucket", le="+Inf" if le == float("inf") else repr(float(le))) == c
    assert v(sm, p + "eager_while_pending_seconds") == pytest.approx(s["eager_while_pending_seconds"])


@pytest.fixture(scope="module")
def cache(kernels, tmp_path_factory):
    for s in (ADD, MUL):
        assert kernels.ensure(s).status in ("compiled", "cached")
    c = kernels.copy_to(tmp_path_factory.mktemp("metrics") / "cache")
    return c


def test_registry_scrape_equals_stats_with_miss_to_hit(cache, kernels, tmp_path):
    from aoti_farm.runtime import Settings, install
    from aoti_farm.runtime.metrics import register

    c = Cache(tmp_path / "c")
    shutil.copytree(cache.root, c.root, symlinks=True)
    fp = fingerprint("cpu")
    c.remove(fp.id, MUL.key)
    reg = CollectorRegistry()
    hook = install(cache_dir=str(c.root), ops=["aten::add.Tensor", "aten::mul.Tensor"], on_miss="ignore",
                   serve="always", route="all",
                   settings=Settings(poll_interval=0.1))   # mul is missed before it is published
    try:
        register(hook, reg)
        a, b = torch.randn(8, 16), torch.randn(16)
        x, y = torch.randn(8, 16), torch.randn(8, 16)
        for _ in range(3):
            torch.add(a, b, alpha=2)                                 # hits
        torch.add(torch.randn(4, 16), b, alpha=2)                   # a miss
        torch.add(torch.randn(8, 16, dtype=torch.float64)[0, 0], b)  # ineligible: a fallback
        torch.mul(x, y)                                              # a miss, published below
        time.sleep(0.3)
        # publish MUL as a publish does: whole directory renamed into place
        src = kernels.cache.entry_dir(fp.id, MUL.key)
        stage = c.root / "tmp" / "stage-test"
        shutil.copytree(src, stage)
        dst = c.entry_dir(fp.id, MUL.key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(stage, dst)
        wait_until(lambda: (torch.mul(x, y), hook.stats()["served_after_miss"] >= 1)[1], 120, 0.05)
        text = generate_latest(reg).decode()
        s = hook.stats()
    finally:
        hook.uninstall()
    sm = samples(text)
    assert s["hits"] >= 4 and s["misses"] >= 2 and s["served_after_miss"] == 1
    assert s["miss_to_hit_seconds"]["count"] == 1 and s["miss_to_hit_seconds"]["sum"] >= 0.3
    assert s["eager_while_pending_seconds"] == pytest.approx(s["miss_to_hit_seconds"]["sum"])
    check_equal(sm, s)
    assert v(sm, "aoti_farm_hook_miss_to_hit_seconds_count") == 1


def _free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def test_several_serving_processes_each_on_its_own_port(cache, tmp_path):
    base = _free_port()
    sd = tmp_path / "sd"
    env = {**os.environ, "AOTI_FARM_METRICS_PORT": str(base), "AOTI_FARM_METRICS_SD_DIR": str(sd),
           "AOTI_FARM_METRICS_ADDR": "127.0.0.1", "PYTHONWARNINGS": "ignore"}
    env.pop("AOTI_FARM_SERVE", None)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_metrics_helpers.py"), str(cache.root), str(n),
                               str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (1, 2)]
    try:
        first = [json.loads(p.stdout.readline()) for p in procs]
        ports = [f["port"] for f in first]
        assert len(set(ports)) == 2 and all(base <= q < base + 64 for q in ports), (ports, procs[0].stderr.read())
        files = sorted(os.listdir(sd))
        assert files == sorted(f"aoti-farm-{f['pid']}.json" for f in first)
        targets = {json.load(open(sd / f))[0]["targets"][0].rsplit(":", 1)[1] for f in files}
        assert targets == {str(q) for q in ports}
        texts = [scrape(q) for q in ports]
        go.touch()
        stats = [json.loads(p.stdout.readline())["stats"] for p in procs]
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for text, s, n in zip(texts, stats, (1, 2)):
        assert s["hits"] == n and s["misses"] == n + 1
        check_equal(samples(text), s)
    assert os.listdir(sd) == []          # each process removed its target file


def test_metrics_port_setting_bad_value(cache):
    from aoti_farm.errors import UserError
    from aoti_farm.runtime import Settings, install

    with pytest.raises(UserError, match="metrics_port"):
        install(cache_dir=str(cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                settings=Settings(metrics_port="http"))


_bad = S.from_call(torch.ops.aten.mm.default, (torch.empty(3, 4), torch.empty(4, 5)), {}).to_obj()
_bad["args"][1]["sizes"], _bad["args"][1]["strides"] = [7, 5], [5, 1]
BAD = S.parse_signature(_bad)        # eager rejects it in the actor: a real failure, no compile


@pytest.mark.slow
def test_serve_metrics_equal_its_counters_and_ray_metrics(tmp_path):
    c = Cache(tmp_path / "cache")
    fp = fingerprint("cpu")
    c.ensure(fp)
    assert missq.enqueue(c, fp.id, BAD)
    env = {**os.environ, "PYTHONWARNINGS": "ignore",
           "AOTI_FARM_METRICS_ADDR": "127.0.0.1"}
    p = subprocess.Popen([sys.executable, "-m", "aoti_farm", "serve", "--cache-dir", str(c.root), "--cpu-workers", "1",
                          "--poll-interval", "0.5", "--metrics-port", "0"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    t = threading.Thread(target=lambda: lines.extend(iter(p.stderr.readline, "")), daemon=True)
    t.start()
    try:
        line = wait_until(lambda: next((x for x in lines if "metrics on port" in x), None), 300, 0.1)
        assert line, lines
        port = int(line.split("metrics on port ")[1].split(";")[0])
        ray_port = int(line.rsplit("on port ", 1)[1])
        assert wait_until(lambda: not missq.pending(c, fp.id) and c.failure(fp.id, BAD.key) is not None, 300, 0.2)
        # Ray's own metrics: the actor's compile seconds by device, the scheduler's counters
        ray_text = wait_until(lambda: (lambda x: x if "ray_aoti_farm_farm_failed" in x
                                       and "ray_aoti_farm_compile_seconds_count" in x else None)(scrape(ray_port)),
                              120, 1.0)
        assert ray_text, "Ray's metrics agent never showed aoti_farm metrics"
        sm = samples(scrape(port))
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=120)
        t.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, lines
    counters = json.loads(next(x for x in lines if "counters {" in x).split("counters ", 1)[1])
    assert counters["failed"] == 1 and counters["dispatched"] == 1
    for k, val in counters.items():
        name = f"aoti_farm_pool_{k}" if k == "peak_in_flight" else f"aoti_farm_pool_{k}_total"
        assert v(sm, name) == val, k
    rs = samples(ray_text)
    failed = [val for (name, labels), val in rs.items() if name.startswith("ray_aoti_farm_farm_failed")]
    comp = [(dict(labels), val) for (name, labels), val in rs.items() if name == "ray_aoti_farm_compile_seconds_count"]
    assert failed and max(failed) == 1
    assert any(lab.get("device") == "cpu" and lab.get("status") == "failed" and val == 1 for lab, val in comp)
