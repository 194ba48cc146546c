"""A CUDA ``conv2d`` reaches ``aten::cudnn_convolution``, an op without a C shim, whose
kernel would need AOTInductor's proxy executor (never served).  The compiler traces it as
``aten::convolution`` where that reaches ``cudnn_convolution`` with the call's own
arguments (its ``benchmark``/``deterministic``/``allow_tf32`` equal what the globals give):
published, ``build.traced_as`` says so, and the kernel returns eager's values and
strides.  A call whose flags differ from the globals is not substituted and stays refused.
Skipped where no GPU is present (CI)."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.failures import PROXY_EXECUTOR_REFUSAL
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler, load_runner
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


def _sig(allow_tf32: bool):
    x, w = torch.empty(2, 3, 64, 64, device="cuda"), torch.empty(32, 3, 3, 3, device="cuda")
    return S.from_call(torch.ops.aten.cudnn_convolution.default,
                       (x, w, [1, 1], [1, 1], [1, 1], 1, False, False, allow_tf32), {})


def test_cudnn_convolution_is_served_as_convolution(tmp_path):
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cudnn.benchmark   # torch's defaults
    sig = _sig(True)
    cache, fp = Cache(tmp_path / "c"), fingerprint("cuda")
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    entry = cache.open_entry(fp, sig.key)
    assert entry.manifest["build"]["traced_as"] == "aten::convolution"
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 3, 64, 64, device="cuda", generator=g)
    w = torch.randn(32, 3, 3, 3, device="cuda", generator=g)
    got = load_runner(entry.kernel_path, "cuda").run([x, w])[0]
    want = torch.ops.aten.cudnn_convolution.default(x, w, [1, 1], [1, 1], [1, 1], 1, False, False, True)
    torch.cuda.synchronize()
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_a_direct_call_with_other_flags_is_not_substituted(tmp_path):
    sig = _sig(False)        # allow_tf32=False while the globals allow TF32: not what convolution passes
    cache, fp = Cache(tmp_path / "c"), fingerprint("cuda")
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "failed" and out.error.startswith(PROXY_EXECUTOR_REFUSAL), (out.status, out.error)
