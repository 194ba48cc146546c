"""The native hit path (runtime/fastpath.cpp, runtime/native.py), end to end with real
kernels from the session cache (add with alpha; where with a bool condition).

What it must never do is serve a kernel to a call whose signature differs: its key is
checked here against strides, shapes, scalar values, wrapped numbers, conj views and
requires_grad, and the remembered decisions against a changing cache.
"""

from __future__ import annotations


import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.speedgate import hitpath
from aoti_farm.runtime import Settings, install, native

from _runtime_helpers import run_threads, same, wait_until
from conftest import sig_add_alpha

pytestmark = pytest.mark.skipif(native.disabled(), reason="AOTI_FARM_NATIVE=0")


def _add_inputs(seed=0, shape=(8, 16)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape[-1:], generator=g)


@pytest.fixture
def add_cache(kernels, tmp_path):
    out = kernels.ensure(sig_add_alpha())
    assert out.status in ("compiled", "cached"), out
    return kernels.copy_to(tmp_path / "cache")


def test_native_serves_hits_without_asking_python_again(add_cache):
    a, b = _add_inputs()
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=str(add_cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="require")) as hook:
        got = [torch.add(a, b, alpha=2) for _ in range(50)]
        a2, b2 = _add_inputs(seed=7)                      # same metadata, other values
        got2 = torch.add(a2, b2, alpha=2)
        st = hook.stats()
    assert all(same(g, expected) for g in got)
    assert same(got2, torch.add(a2, b2, alpha=2))
    assert st["native"]["active"] and st["native"]["slow_calls"] == 1, st["native"]
    assert st["hits"] == 51 and st["kernels_loaded"] == 1 and st["per_op"]["aten::add.Tensor"]["hits"] == 51


def test_native_key_separates_what_the_signature_separates(add_cache):
    """Only the exact compiled metadata is served; every variant gets eager's result."""
    a, b = _add_inputs()
    variants = {
        "transposed strides": (torch.randn(16, 8).t(), b, 2),
        "other shape": (torch.randn(4, 16), b, 2),
        "other alpha": (a, b, 3),
        "float alpha": (a, b, 2.0),
        "float64": (a.double(), b.double(), 2),
        "offset view, same strides": (torch.randn(9, 16)[1:], b, 2),
    }
    with install(cache_dir=str(add_cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="require")) as hook:
        expected = torch.add(a.clone(), b.clone(), alpha=2)            # a hit
        results = {k: torch.add(x, y, alpha=al) for k, (x, y, al) in variants.items()}
        wrapped = a + 1.5                                  # add.Tensor with a wrapped number
        c = torch.randn(8, 16, dtype=torch.complex64)
        conj = torch.add(c.conj(), c, alpha=2)             # a conj view (resolved before CPU): a miss
        g = a.clone().requires_grad_()
        graded = torch.add(g, b, alpha=2)
        st = hook.stats()
    assert same(expected, torch.add(a, b, alpha=2))
    for k, (x, y, al) in variants.items():
        assert same(results[k], torch.add(x, y, alpha=al)), k
    assert same(wrapped, a + 1.5)
    assert torch.equal(conj, torch.add(c.conj().resolve_conj(), c, alpha=2))
    assert graded.requires_grad and same(graded.detach(), torch.add(a, b, alpha=2))
    # the offset view has the compiled sizes and strides: served (its signature is the same)
    assert st["hits"] == 2, st
    assert st["misses"] == len(variants) - 1 + 1, st
    fb = st["fallbacks"]
    assert fb.get("wrapped Python number") == 1, fb
    assert sum(v for k, v in fb.items() if "requires_grad" in k) >= 1, fb


def test_remembered_miss_becomes_a_hit_when_published(kernels, tmp_path):
    """A miss is replayed from C++ without Python; a new entry makes it a hit."""
    kernels.ensure(sig_add_alpha())
    root = tmp_path / "cache"
    a, b = _add_inputs()
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=str(root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(poll_interval=0.05, native="require")) as hook:   # routed before its first entry
        for _ in range(5):
            assert same(torch.add(a, b, alpha=2), expected)
        st = hook.stats()
        assert st["misses"] == 5 and st["native"]["slow_calls"] == 1, st
        kernels.copy_to(root)                              # publish (as a warm job would)
        wait_until(lambda: (torch.add(a, b, alpha=2), hook.stats()["hits"] > 0)[1], timeout=60)
        out = torch.add(a, b, alpha=2)
        st = hook.stats()
    assert same(out, expected)
    assert st["served_after_miss"] == 1 and st["kernels_loaded"] == 1, st


@pytest.mark.parametrize("mode", ["require", "off"])
def test_kernel_that_raises_is_dropped_and_eager_serves(kernels, tmp_path, mode):
    """A published kernel that raises when run (here: a 3-input kernel published under a
    2-input signature, bypassing the farm's verification) costs a counter, never an
    exception, and is not run again."""
    where = S.from_call(torch.ops.aten.where.self, (torch.rand(8, 16) > 0.5, torch.randn(8, 16),
                                                    torch.randn(8, 16)), {})
    out = kernels.ensure(where)
    assert out.status in ("compiled", "cached"), out
    cache = Cache(tmp_path / "cache")
    wrong = kernels.cache.open_entry(kernels.fp, where.key)
    cache.publish(kernels.fp, sig_add_alpha(), {"kernel.so": wrong.kernel_path}, {"note": "wrong kernel"})
    a, b = _add_inputs()
    n = torch.get_num_threads()
    torch.set_num_threads(1)   # the verified thread count: served without the hook's own check
    try:
        with install(cache_dir=str(cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                     settings=Settings(native=mode)) as hook:
            got = [torch.add(a, b, alpha=2) for _ in range(3)]
            st = hook.stats()
    finally:
        torch.set_num_threads(n)
    assert all(same(g, torch.add(a, b, alpha=2)) for g in got)
    assert st["kernel_errors"] == 1 and st["hits"] == 0, st
    assert st["native"]["active"] == (mode == "require")


def test_threads_share_the_native_path(add_cache):
    a, b = _add_inputs()
    expected = torch.add(a, b, alpha=2)
    x = torch.randn(5, 16)
    bad: list = []

    def work():
        for i in range(300):
            if not same(torch.add(a, b, alpha=2), expected):
                bad.append("hit")
            if not torch.equal(torch.add(x, b, alpha=2), x + 2 * b):
                bad.append("miss")

    with install(cache_dir=str(add_cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="require")) as hook:
        run_threads(4, work)
        st = hook.stats()
    assert not bad
    assert st["hits"] == 1200 and st["misses"] >= 1200, st
    assert st["native"]["callback_errors"] == 0


@pytest.fixture(scope="module")
def big_add(kernels):
    """An add large enough (256 x 1024) that calls from several threads overlap."""
    sig = sig_add_alpha((256, 1024))
    out = kernels.ensure(sig)
    assert out.status in ("compiled", "cached"), out
    return kernels


def _overlapping_calls(fn, n_threads=4, calls=150):
    """Run ``fn`` from ``n_threads`` threads that start together."""
    import threading

    gate = threading.Barrier(n_threads)

    def work():
        gate.wait()
        for _ in range(calls):
            fn()

    run_threads(n_threads, work)


@pytest.mark.parametrize("mode", ["require", "off"])
def test_threads_run_a_kernel_at_once_each_with_its_own_container(big_add, tmp_path, mode):
    """The hit path has no cross-call wait: natively, each call runs a single-threaded
    container of its own (checked out of the kernel's pool), so several threads run one
    kernel at once; on the Python path (CPU: torch's runner with a model per core) too.
    The results stay eager's and nothing is counted as an error."""
    cache = big_add.copy_to(tmp_path / "cache")
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, generator=g)
    expected = torch.add(a, b, alpha=2)
    bad: list = []

    def call():
        if not same(torch.add(a, b, alpha=2), expected):
            bad.append(1)

    with install(cache_dir=str(cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 serve="always", settings=Settings(native=mode)) as hook:
        _overlapping_calls(call)
        st = hook.stats()
        n = hook._routes.nreg.stats() if mode == "require" else None
    assert not bad
    assert st["hits"] == 600 and st["kernel_errors"] == 0, st
    if n is not None:
        assert n["callback_errors"] == 0, n
        # more than one container: calls did overlap, and none shared a container
        assert 2 <= n["containers"] <= 4, n


def test_pooled_runner_from_several_threads(big_add):
    """The Python path's wait-free runner (used for CUDA kernels; runs CPU kernels too):
    thread-safe, one container per concurrent call, eager's results."""
    from aoti_farm.compile.runner import flat_tensors
    from aoti_farm.compile.runner import PooledRunner

    sig = sig_add_alpha((256, 1024))
    r = PooledRunner(big_add.cache.open_entry(big_add.fp, sig.key).kernel_path, "cpu")
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, generator=g)
    expected = torch.add(a, b, alpha=2)
    ins = flat_tensors(sig, (a, b), {"alpha": 2})
    bad: list = []

    def call():
        out = r.run(ins)
        if len(out) != 1 or not same(out[0], expected):
            bad.append(1)

    _overlapping_calls(call)
    assert not bad
    assert 2 <= r.containers <= 4, r.containers


def test_ineligible_calls_are_remembered_natively(tmp_path):
    """A call aoti-farm can never serve (here a 0-dim CPU double tensor in a tensor slot,
    which signature encoding refuses) is decided once by Python and then replayed from C++
    (an ineligibility follows from the call's metadata, all of it in the native key); each
    call is still counted under its reason, and the results are eager's."""
    a = torch.randn(8, 16)
    two = torch.tensor(2.0, dtype=torch.float64)
    expected = torch.add(a, two)
    with install(cache_dir=str(tmp_path / "empty"), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="require")) as hook:   # routed without an entry
        got = [torch.add(a, two) for _ in range(20)]
        st = hook.stats()
    assert all(same(g, expected) for g in got)
    assert st["native"]["slow_calls"] == 1, st["native"]
    fb = {k: v for k, v in st["fallbacks"].items() if "0-dim" in k}
    assert list(fb.values()) == [20], st["fallbacks"]
    assert st["misses"] == 0 and st["calls"] == 20, st


def test_remembered_calls_are_bounded(tmp_path):
    """Dynamic shapes: an op that has remembered its limit of calls forgets them all and
    learns again (memory stays bounded); results stay eager's."""
    b = torch.randn(1)
    with install(cache_dir=str(tmp_path / "empty"), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="require")) as hook:   # routed without an entry
        for n in range(1, 16384 + 50):
            x = torch.ones(1, n)
            if n % 4096 == 0:
                assert torch.equal(torch.add(x, b, alpha=2), torch.full((1, n), 1.0) + 2 * b)
            else:
                torch.add(x, b, alpha=2)
        st = hook.stats()["native"]
    assert st["forgotten_full"] == 1 and 0 < st["remembered"] < 100, st


@pytest.mark.slow
def test_hook_builds_the_native_path_in_the_background_and_switches(add_cache, tmp_path, monkeypatch):
    """With nothing built, the hook serves from Python at once, builds the extension in a
    niced child process (a real compile, about 30 s) and then serves natively."""
    monkeypatch.setenv("AOTI_FARM_NATIVE_DIR", str(tmp_path / "native"))
    monkeypatch.setattr(hitpath, "_loaded", None)           # this process must load the new build
    a, b = _add_inputs()
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=str(add_cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(poll_interval=0.2)) as hook:
        assert same(torch.add(a, b, alpha=2), expected)
        st = hook.stats()
        assert not st["native"]["active"] and st["hits"] == 1, st
        wait_until(lambda: hook.stats()["native"]["active"], timeout=600, step=0.5)
        got = [torch.add(a, b, alpha=2) for _ in range(10)]
        st = hook.stats()
    assert all(same(g, expected) for g in got)
    assert st["hits"] == 11 and st["native"]["slow_calls"] == 1, st
    assert native.library_path().exists() and str(native.library_path()).startswith(str(tmp_path))


def test_native_off_and_env_switch(add_cache, monkeypatch):
    a, b = _add_inputs()
    expected = torch.add(a, b, alpha=2)
    monkeypatch.setenv("AOTI_FARM_NATIVE", "0")
    with install(cache_dir=str(add_cache.root), ops=["aten::add.Tensor"], on_miss="ignore", route="all") as hook:
        assert same(torch.add(a, b, alpha=2), expected)
        st = hook.stats()
    assert st["hits"] == 1 and not st["native"]["active"], st


def test_status_and_build_cli():
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "aoti_farm.runtime.native", "status"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["built"] is True
    r = subprocess.run([sys.executable, "-m", "aoti_farm.runtime.native", "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
