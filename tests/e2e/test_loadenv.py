"""The libstdc++ trap of the GPU machine (aoti_farm.startup.loadenv), exercised on CPU.

``AOTI_FARM_PRELOAD_LIBSTDCXX=1`` declares a host that needs the preload.  A process
started without it must then never dlopen a kernel itself: the compiler verifies in a
child that has the preload, and the hook intercepts nothing (eager, at eager's cost).

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_loadenv.py.
"""

from __future__ import annotations

import pytest
import torch

from aoti_farm.startup import loadenv
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.runtime import install

from conftest import sig_add_alpha

pytestmark = pytest.mark.skipif(loadenv.system_libstdcxx() is None, reason="no system libstdc++ to preload")


def test_probe_loads_a_real_kernel_in_a_child(kernels):
    sig = sig_add_alpha()
    kernels.ensure(sig)
    res = loadenv.probe(kernels.cache.open_entry(kernels.fp, sig.key).kernel_path)
    assert res["plain_rc"] == 0 and res["needs_preload"] is False


def test_unsafe_host_verifies_in_a_preloaded_child_and_hook_stays_eager(kernels, monkeypatch):
    sig = sig_add_alpha()
    kernels.ensure(sig)
    path = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    monkeypatch.setenv("AOTI_FARM_PRELOAD_LIBSTDCXX", "1")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    res = AOTICompiler().verify(sig, path)
    assert res.get("in_child") is True and res["ok"] is True
    a, b = torch.randn(8, 16), torch.randn(16)
    expected = torch.add(a, b, alpha=2)
    with install(cache_dir=kernels.cache.root, ops=["aten::add.Tensor"], on_miss="ignore", route="all") as hook:
        got = torch.add(a, b, alpha=2)
        st = hook.stats()
    assert torch.equal(got, expected)
    # it cannot serve, so it intercepts nothing (costs nothing): no call is even counted
    assert st["serving"] is False and st["calls"] == 0 and st["kernels_loaded"] == 0, st
