"""The serving hook (runtime/hook.py) and its dispatch layer, end to end with real kernels.

Compiled signatures (shared session cache via ``kernels``): add with alpha (broadcast),
div trunc on a transposed input, int32 sum with dtype=int64, where with a bool condition;
the two-process test compiles cat in its own fresh cache through the hook's own
background worker.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_runtime.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from aoti_farm.cache import queue as missq
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.errors import UserError
from aoti_farm.runtime import Settings, install, launch

from _counters import assert_delta
from _runtime_helpers import run_threads, same, wait_until
from conftest import sig_add_alpha
from unit.test_launch import _ns   # argv parsed by a launcher's arguments

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/: _runtime_helpers.py


# --- the differential cases ------------------------------------------------------------------

def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def case_add_alpha():          # broadcasting + an int Scalar argument
    g = _g()
    return torch.ops.aten.add.Tensor, (torch.randn(8, 16, generator=g), torch.randn(16, generator=g)), {"alpha": 2}


def case_div_trunc():          # a str argument + non-contiguous strides
    g = _g(1)
    a = torch.randn(8, 32, generator=g)[:, ::2]          # strides (32, 2)
    b = torch.rand(8, 16, generator=g) + 0.5
    return torch.ops.aten.div.Tensor_mode, (a, b), {"rounding_mode": "trunc"}


def case_sum_dtype():          # an int tensor + a dtype argument
    x = torch.randint(-100, 100, (8, 16), generator=_g(2), dtype=torch.int32)
    return torch.ops.aten.sum.dim_IntList, (x, [1]), {"dtype": torch.int64}


def case_where_bool():         # a bool tensor
    g = _g(3)
    return torch.ops.aten.where.self, (torch.rand(8, 16, generator=g) > 0.5, torch.randn(8, 16, generator=g),
                                       torch.randn(8, 16, generator=g)), {}


CASES = {"add_alpha_broadcast": case_add_alpha, "div_trunc_noncontiguous": case_div_trunc,
         "sum_int_dtype": case_sum_dtype, "where_bool": case_where_bool}


def _public(op, args, kwargs):
    """The same call as a user writes it (through torch's Python API)."""
    if op is torch.ops.aten.add.Tensor:
        return torch.add(*args, **kwargs)
    if op is torch.ops.aten.div.Tensor_mode:
        return torch.div(*args, **kwargs)
    if op is torch.ops.aten.sum.dim_IntList:
        return torch.sum(args[0], dim=args[1], dtype=kwargs["dtype"])
    return torch.where(*args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hit_equals_eager_exactly(kernels, name):
    op, args, kwargs = CASES[name]()
    sig = S.from_call(op, args, kwargs)
    out = kernels.ensure(sig)
    assert out.status in ("compiled", "cached"), f"{name}: {out.status}: {out.error} {out.evidence}"
    expected = _public(op, args, kwargs)                 # eager, before any hook
    hook = install(cache_dir=str(kernels.cache.root), on_miss="ignore", route="all")
    try:
        got = [_public(op, args, kwargs) for _ in range(3)]
        st = hook.stats()
    finally:
        hook.uninstall()
    for g in got:
        assert same(g, expected), (name, g.dtype, g.stride(), expected.stride())
    assert st["per_op"][sig.op]["hits"] == 3 and st["kernels_loaded"] == 1, st["per_op"]
    print(f"{name}: 3/3 hits, equal to eager (dtype {expected.dtype}, strides {expected.stride()})")


@pytest.mark.parametrize("name", sorted(CASES))
def test_miss_equals_eager_exactly(tmp_path, name):
    op, args, kwargs = CASES[name]()
    expected = _public(op, args, kwargs)
    # route="all": misses are seen (and counted) only on routed ops; with on_miss="ignore"
    # the default routes only ops with a servable entry (tests/e2e/test_routing.py)
    with install(cache_dir=str(tmp_path / "empty"), on_miss="ignore", route="all") as hook:
        got = _public(op, args, kwargs)
        st = hook.stats()
    assert same(got, expected)
    assert st["per_op"][S.from_call(op, args, kwargs).op]["misses"] == 1 and st["hits"] == 0


def test_uninstall_restores_eager_and_allclose_works(kernels, tmp_path):
    kernels.ensure(sig_add_alpha())
    x = torch.randn(8, 16, generator=_g())
    hook = install(cache_dir=str(kernels.cache.root), on_miss="ignore", route="all")
    assert torch.allclose(x, x.clone()) and not torch.allclose(x, x + 1)
    torch.add(x, x[0], alpha=2)
    calls = hook.stats()["calls"]
    assert calls > 0
    hook.uninstall()
    hook.uninstall()  # idempotent
    torch.add(x, x[0], alpha=2)
    assert hook.stats()["calls"] == calls
    assert torch.library.get_kernel(torch.ops.aten.add.Tensor, "CPU") is not None


def test_requires_grad_is_eager(kernels):
    kernels.ensure(sig_add_alpha())
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(16)
    with install(cache_dir=str(kernels.cache.root), on_miss="ignore", route="all") as hook:
        y = torch.add(a, b, alpha=2)
        y.sum().backward()
        with torch.no_grad():
            z = torch.add(a, b, alpha=2)
        st = hook.stats()
    assert st["fallbacks"].get("requires_grad", 0) >= 1 and st["per_op"]["aten::add.Tensor"]["hits"] == 1
    assert torch.equal(a.grad, torch.ones(8, 16)) and torch.equal(y.detach(), z)


def test_bad_arguments_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="on_miss"):
        install(cache_dir=str(tmp_path), on_miss="later")
    with pytest.raises(UserError, match="aten::bernoulli"):
        install(cache_dir=str(tmp_path), ops=["aten::bernoulli"])
    with pytest.raises(UserError, match="devices"):
        install(cache_dir=str(tmp_path), devices=("tpu",))


# --- concurrency ----------------------------------------------------------------------------------

def test_eight_threads_counts_add_up(kernels):
    kernels.ensure(sig_add_alpha())
    a, b = torch.randn(8, 16, generator=_g()), torch.randn(16, generator=_g(1))
    c = torch.randn(5, 7, generator=_g(2))
    exp_hit, exp_miss = torch.add(a, b, alpha=2), torch.mul(c, c)
    n, per = 8, 50
    bad = []
    with install(cache_dir=str(kernels.cache.root), ops=["aten::add.Tensor", "aten::mul.Tensor"],
                 on_miss="ignore", route="all") as hook:   # mul's misses are counted too
        def work():
            for _ in range(per):
                if not same(torch.add(a, b, alpha=2), exp_hit) or not same(torch.mul(c, c), exp_miss):
                    bad.append(1)

        before = hook.stats()
        run_threads(n, work)
        st = hook.stats()
    assert not bad
    # exact: every call counted once, whichever path (Python or native) counted it
    assert_delta(before, st, {"calls": 2 * n * per, "hits": n * per, "misses": n * per, "kernels_loaded": 1,
                              "per_op": {"aten::add.Tensor": {"hits": n * per},
                                         "aten::mul.Tensor": {"misses": n * per}}}, ignore=("rescans",))
    assert st["per_op"]["aten::add.Tensor"]["hits"] == n * per
    assert st["per_op"]["aten::mul.Tensor"]["misses"] == n * per
    assert st["hits"] + st["misses"] + st["failed_signatures"] + sum(st["fallbacks"].values()) == st["calls"]
    assert st["kernels_loaded"] == 1
    print(f"8 threads: hits={st['hits']} misses={st['misses']} calls={st['calls']}")


# --- hot reload -----------------------------------------------------------------------------------

def test_hot_reload_new_and_removed_entries(kernels, tmp_path):
    sig = sig_add_alpha()
    kernels.ensure(sig)
    src = kernels.cache.entry_dir(kernels.fp.id, sig.key)
    cache = kernels.copy_to(tmp_path / "c")
    cache.remove(kernels.fp.id, sig.key)
    a, b = torch.randn(8, 16, generator=_g()), torch.randn(16, generator=_g(1))
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=str(cache.root), on_miss="queue", settings=Settings(poll_interval=0.05)) as hook:
        assert same(torch.add(a, b, alpha=2), expected)
        assert hook.stats()["hits"] == 0
        hook.flush()
        assert sig.key in missq.pending(cache, kernels.fp.id)
        # publish (as a farm would: build aside, rename into place)
        stage = cache.tmp_dir() / "stage-test"
        shutil.copytree(src, stage)
        os.rename(stage, cache.entry_dir(kernels.fp.id, sig.key))
        assert wait_until(lambda: same(torch.add(a, b, alpha=2), expected) and hook.stats()["hits"] > 0)
        st = hook.stats()
        assert st["served_after_miss"] == 1
        cache.remove(kernels.fp.id, sig.key)
        assert wait_until(lambda: hook.stats()["kernels_dropped"] == 1)
        hits = hook.stats()["hits"]
        assert same(torch.add(a, b, alpha=2), expected)
        st = hook.stats()
    assert st["hits"] == hits and st["rescans"] >= 3
    print(f"hot reload: served after publish, dropped after removal; stats rescans={st['rescans']}")


def test_queued_miss_is_watched_until_published(kernels, tmp_path):
    """on_miss="queue" (someone else compiles: `aoti-farm serve`, another process's
    worker): the hook watches the shards of the keys it queued, so a publish becomes a hit
    without waiting for the regular poll (here 10 minutes, so only the watch can see it),
    and stops watching a key once it is published."""
    kernels.ensure(sig_add_alpha())
    root = tmp_path / "cache"
    a, b = torch.randn(8, 16), torch.randn(16)
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=str(root), ops=["aten::add.Tensor"], on_miss="queue",
                 settings=Settings(poll_interval=600)) as hook:
        assert same(torch.add(a, b, alpha=2), expected)
        hook.flush()
        st = hook.stats()
        assert st["misses"] == 1 and st["queued"] == 1 and st["workers_started"] == 0, st
        assert st["queued_waiting"] == 1
        kernels.copy_to(root)                              # published elsewhere
        assert wait_until(lambda: (torch.add(a, b, alpha=2), hook.stats()["hits"] > 0)[1], timeout=120)
        assert wait_until(lambda: hook.stats()["queued_waiting"] == 0, timeout=60)   # no longer watched
        st = hook.stats()
    assert st["served_after_miss"] == 1, st


# --- miss -> background compile, two processes ------------------------------------------------------

def test_two_processes_miss_queue_once_compile_once_then_hit(tmp_path):
    """Each process misses cat, returns eager at once (the kernel is not published when the
    call returns), the signature is queued once and compiled once fleet-wide by the hooks'
    own background workers, and the same call becomes a hit in both without a restart."""
    cache = tmp_path / "cache"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_runtime_helpers.py"), str(cache), str(barrier),
                               str(i), str(tmp_path / f"worker-{i}.log")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}) for i in range(2)]
    outs = []
    for p in procs:
        so, se = p.communicate(timeout=900)
        assert p.returncode == 0, se[-3000:]
        outs.append(json.loads(so.strip().splitlines()[-1]))
    for o in outs:
        assert o["first_miss"] and not o["published_when_first_returned"], o
        assert o["all_equal"] and o["stats"]["hits"] >= 1 and o["stats"]["served_after_miss"] == 1, o
    assert sum(o["stats"]["queued"] for o in outs) == 1
    assert sum(o["stats"]["queue_dedup"] for o in outs) == 1
    # while their compile workers ran, the serving threads kept the program's thread count
    for o in outs:
        th, yc = o["threads"], o["stats"]["thread_room"]
        assert th["seen"] == [th["before"]] and th["after"] == th["before"] and yc["lowered"] == 0, o

    def logs():
        lines = []
        for i in range(2):
            p = tmp_path / f"worker-{i}.log"
            if p.exists():
                lines += [json.loads(x) for x in p.read_text().splitlines() if x.startswith("{")]
        return lines

    # each worker ended: idle, or with the serving process that started it
    started = sum(1 for x in logs() if x["event"] == "start")
    assert wait_until(lambda: sum(1 for x in logs() if x["event"] in ("idle-exit", "terminated")) == started, 300, 0.5)
    compiled = [x for x in logs() if x["event"] == "outcome" and x["status"] == "compiled"]
    assert len(compiled) == 1, logs()
    c = Cache(cache, signing_key=None)
    fp_id = c.fingerprint_ids()[0]
    assert len(c.list_keys(fp_id)) == 1 and missq.pending(c, fp_id) == []
    print(f"two processes: queued=1 dedup=1 compiled=1 (workers started {started}); "
          f"both served the kernel after missing it")


# --- aoti-farm run ------------------------------------------------------------------------------------

def test_run_command_hooks_an_unmodified_program(kernels, tmp_path, monkeypatch):
    kernels.ensure(sig_add_alpha())
    script = tmp_path / "serve.py"
    script.write_text("import torch\na, b = torch.randn(8, 16), torch.randn(16)\n"
                      "for _ in range(5):\n    torch.add(a, b, alpha=2)\nprint('served')\n")
    stats = tmp_path / "stats"
    stats.mkdir()
    monkeypatch.setenv("AOTI_FARM_HOOK_STATS", str(stats))
    ns = _ns(launch.add_run_args, ["--cache-dir", str(kernels.cache.root), "--on-miss", "ignore", "--",
                                   sys.executable, str(script)])
    assert launch.run_command(ns) == 0
    [f] = list(stats.iterdir())
    st = json.loads(f.read_text())
    assert st["per_op"]["aten::add.Tensor"]["hits"] == 5
    ns = _ns(launch.add_run_args, ["--", sys.executable, "-c", "import sys; sys.exit(3)"])
    assert launch.run_command(ns) == 3
    with pytest.raises(UserError, match="no program"):
        launch.run_command(_ns(launch.add_run_args, []))
    with pytest.raises(UserError, match="not found"):
        launch.run_command(_ns(launch.add_run_args, ["--", str(tmp_path / "nope")]))
