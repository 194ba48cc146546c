"""CUDA end to end.  Skipped, with the reason, where no GPU is present (CI);
the full GPU validation with benchmarks is scripts/gpu/validate.sh on a GPU host.
CUDA routing and resource requests stay covered on CPU in test_scheduler.py."""

from __future__ import annotations

import pytest
import torch

from aoti_farm.startup import loadenv
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish
from aoti_farm.runtime import install

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


def test_cuda_compile_verify_publish_and_serve(tmp_path):
    a, b = torch.randn(64, 128, device="cuda"), torch.randn(128, device="cuda")
    sig = S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 2})
    assert sig.device == "cuda"
    fp = fingerprint("cuda:0")
    assert fp.as_dict()["gpu_cc"] and fp.as_dict()["gpu"] and fp.as_dict()["cuda"]
    cache = Cache(tmp_path / "c", signing_key=None)
    out = compile_and_publish(cache, AOTICompiler(), fp, sig, owner="pytest")
    assert out.status == "compiled", out
    expected = torch.add(a, b, alpha=2)
    c, d = torch.randn(3, 5, device="cuda"), torch.randn(3, 5, device="cuda")
    miss_expected = torch.add(c, d)
    with install(cache_dir=cache.root, ops=["aten::add.Tensor"], on_miss="ignore", route="all") as hook:
        got = torch.add(a, b, alpha=2)
        miss = torch.add(c, d)
        st = hook.stats()
    if loadenv.load_safe():
        assert st["hits"] == 1 and st["misses"] == 1, st
    else:  # the libstdc++ trap without the preload: never loaded here, eager instead
        assert st["hits"] == 0 and st["serving"] is False, st
    torch.testing.assert_close(got, expected)
    assert torch.equal(miss, miss_expected)
