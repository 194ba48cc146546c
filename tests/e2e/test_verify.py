"""Verification under the conditions of serving, with real AOTInductor compiles: CPU kernels
at several intra-op thread counts, adversarial inputs (special values, indices eager
rejects), ops AOTInductor cannot run alone, and the reduction corpus that any change of
Inductor's CPU threading (a patch, an option) must pass at 1 to N threads."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler, load_runner
from aoti_farm.compile.tolerance import compare, length_tolerance
from aoti_farm.errors import CompileRefused
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish
from aoti_farm.compile.runner import flat_tensors


@contextlib.contextmanager
def _threads(n):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _reduction_sig():
    """A parallel reduction over (2, 3) of a U-Net-sized activation.  (The U-Net block's
    own var_mean accumulates in float32 where eager's accumulates in float64, and is
    refused on the precision case: test_a_variance_less_accurate_than_eager_is_refused.)"""
    x = torch.empty(2, 32, 64, 64)
    return S.from_call(torch.ops.aten.sum.dim_IntList, (x, [2, 3]), {"keepdim": True})


def _build_unverified(sig, workdir, monkeypatch, threads=1):
    """A kernel built as a Ray actor with one CPU builds it (1 intra-op thread), without
    verification (what it would refuse is what the caller checks)."""
    with monkeypatch.context() as m, _threads(threads):
        m.setattr(AOTICompiler, "verify", lambda self, sig, path: {})
        AOTICompiler(measure_speed=False).compile(sig, str(workdir))
    return os.path.join(str(workdir), "kernel.so")


@contextlib.contextmanager
def _parallel_like_64_threads():
    """Fault injection: Inductor's parallel-depth decision made as for 64 threads without
    dynamic threads, as aoti-farm's removed ``parallel_like_eager`` patch did.  Built at 1
    thread, its var_mean over (2, 3) is wrong at 2 (the variance about 1/4095 of eager's)."""
    from torch._inductor import config as iconfig
    from torch._inductor.codegen import cpp as cpp_codegen

    orig = cpp_codegen.CppKernel.decide_parallel_depth

    def decide(self, *args, **kwargs):
        if len(args) == 2 and not kwargs:
            with iconfig.patch({"cpp.dynamic_threads": False}):
                return orig(self, args[0], 64)
        return orig(self, *args, **kwargs)

    cpp_codegen.CppKernel.decide_parallel_depth = decide
    try:
        yield
    finally:
        cpp_codegen.CppKernel.decide_parallel_depth = orig


def test_a_reduction_is_published_right_at_every_thread_count(tmp_path):
    """A parallel reduction kernel, built with the defaults at 1 thread (a Ray actor's
    count): published with verified_threads [1, 2, cores], and equal to eager at 1 and 2
    threads on fresh inputs."""
    cache, fp, sig = Cache(tmp_path / "c"), fingerprint("cpu"), _reduction_sig()
    with _threads(1):
        out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
        assert torch.get_num_threads() == 1   # verification restored the builder's count
    assert out.status == "compiled", (out.error, out.evidence)
    entry = cache.open_entry(fp, sig.key)
    cores = len(os.sched_getaffinity(0))
    assert entry.manifest["verified_threads"] == sorted({1, 2, cores}) == entry.verified_threads
    runner = load_runner(entry.kernel_path, "cpu")
    x = torch.randn(2, 32, 64, 64) * 3 + 1
    for n in (1, 2):
        with _threads(n):
            expected = torch.ops.aten.sum.dim_IntList(x, [2, 3], keepdim=True)
            got = runner.run([x])
        assert compare(expected, got) is None, n
    # a manifest from before verified_threads: verified at 1 thread only
    old = type(entry)(entry.fp_id, entry.key, entry.path, {k: v for k, v in entry.manifest.items()
                                                           if k != "verified_threads"})
    assert old.verified_threads == [1]


def test_a_kernel_wrong_at_two_threads_is_refused_naming_the_count(tmp_path, monkeypatch):
    x = torch.empty(2, 32, 64, 64)
    sig = S.from_call(torch.ops.aten.var_mean.correction, (x, [2, 3]), {"correction": 1, "keepdim": True})
    with _parallel_like_64_threads():
        path = _build_unverified(sig, tmp_path, monkeypatch)
    with pytest.raises(CompileRefused) as ei:
        AOTICompiler(measure_speed=False).verify(sig, path)
    ev = ei.value.evidence
    assert ei.value.reason == "kernel disagrees with eager at 2 intra-op threads", ei.value.reason
    assert ev["threads"] == 2 and ev["problem"] == "values" and ev["output"] == 0   # the variance
    # at 1 thread alone its values pass, as they did before; what refuses it then is its
    # float32 accumulation (eager's is float64), on the precision case
    monkeypatch.setattr("aoti_farm.compile.verify.verify_thread_counts", lambda device: [1])
    with pytest.raises(CompileRefused) as again:
        AOTICompiler(measure_speed=False).verify(sig, path)
    assert again.value.evidence["problem"] == "precision", again.value.evidence


def test_float_floor_division_is_refused_on_adversarial_inputs(tmp_path):
    """floor(a / b) is not eager's floor_divide: 1.0 // 0.1 (9.0 in eager), inf // 1 (nan)."""
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    a, b = torch.empty(16, 16), torch.empty(16, 16)
    sig = S.from_call(torch.ops.aten.floor_divide.default, (a, b), {})
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "failed"
    assert out.error == "kernel disagrees with eager on adversarial inputs: finite special values", out.error
    assert out.evidence["problem"] == "values"
    assert cache.failure(fp.id, sig.key)["reason"] == out.error


def test_an_infinity_among_finite_values_is_checked(tmp_path):
    """Bilinear upsampling blends neighbours; Inductor's kernel turns an infinity next to a
    finite value into NaN where eager keeps inf.  A tensor made only of special values
    never shows it: the "isolated infinities" case does.  Under the contract it is an edge
    note (non-finite inputs), not a refusal: served under contract="finite" only."""
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    x = torch.empty(2, 8, 8, 8)
    sig = S.from_call(torch.ops.aten.upsample_bilinear2d.default, (x, [16, 16], False), {})
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    notes = cache.open_entry(fp, sig.key).manifest["verification"]["edge_notes"]
    assert {"class": "non-finite inputs", "case": "isolated infinities"}.items() <= \
        next(n for n in notes if n["case"] == "isolated infinities").items(), notes


def test_negative_index_where_eager_raises_is_refused(tmp_path, monkeypatch):
    # verification itself, of a kernel without index guards (tests/e2e/test_index_guards.py
    # serves index_select behind them) and without the scan that refuses such a kernel
    # before its build (tests/e2e/test_abortscan.py)
    monkeypatch.setattr("aoti_farm.compile.adversarial.index_guards", lambda *a, **k: None)
    monkeypatch.setenv("AOTI_FARM_DEV", "abort_scan=0")
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    w, idx = torch.empty(10, 4), torch.empty(3, dtype=torch.int64)
    sig = S.from_call(torch.ops.aten.index_select.default, (w, 0, idx), {})
    sig = S.Signature(sig.op, sig.args, {"index": {"range": [0, 9]}})
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "failed"
    assert out.error == "kernel does not raise where eager raises: negative index (index=-1)", out.error
    assert out.evidence["eager_error"].startswith("IndexError")


def test_an_op_that_needs_the_proxy_executor_is_recorded_once(tmp_path):
    """_logcumsumexp has no C shim: its kernel calls AOTInductor's proxy executor, which a
    kernel.so alone cannot run.  A deterministic refusal, recorded; never a retry."""
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    sig = S.from_call(torch.ops.aten._logcumsumexp.default, (torch.empty(8, 16), 1), {})
    comp = AOTICompiler(measure_speed=False)
    out = compile_and_publish(cache, comp, fp, sig, owner="t")
    assert out.status == "failed" and out.error.startswith("unsupported: the kernel needs AOTInductor's proxy"), out.error
    rec = cache.failure(fp.id, sig.key)
    assert rec is not None and rec["attempts"] == 1

    class Never:
        name = "never"

        def options(self):
            return {}

        def compile(self, sig, workdir):
            raise AssertionError("compiled again")

    assert compile_and_publish(cache, Never(), fp, sig, owner="t").status == "failed"


def test_a_proxy_executor_op_seen_once_costs_no_compile_again(tmp_path, monkeypatch):
    """The first signature of an op whose kernel needs the proxy executor is compiled and
    refused from its generated source; the host remembers the op, and its next signature
    (another shape) is refused before Inductor runs: no wrapper is built."""
    from aoti_farm.build import splitbuild
    from aoti_farm.compile.checks import known_proxy_op

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))   # a fresh private memo
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    comp = AOTICompiler(measure_speed=False)
    first = S.from_call(torch.ops.aten._logcumsumexp.default, (torch.empty(8, 16), 1), {})
    assert not known_proxy_op(first.op, "cpu")
    out = compile_and_publish(cache, comp, fp, first, owner="t")
    assert out.status == "failed" and out.error.startswith("unsupported: the kernel needs AOTInductor's proxy")
    assert known_proxy_op(first.op, "cpu") and not known_proxy_op(first.op, "cuda")
    built = splitbuild.stats()
    second = S.from_call(torch.ops.aten._logcumsumexp.default, (torch.empty(4, 32), 0), {})
    out = compile_and_publish(cache, comp, fp, second, owner="t")
    assert out.status == "failed" and out.error.startswith("unsupported: the kernel needs AOTInductor's proxy")
    assert out.evidence.get("before_compile") is True, out.evidence
    assert splitbuild.stats() == built   # nothing was built


# --- the reduction corpus ---------------------------------------------------------------------

def _corpus():
    x4 = torch.empty(2, 32, 64, 64)
    rows = torch.empty(64, 4096)
    cols = torch.empty(4096, 64)
    c32 = torch.empty(32)
    a = torch.ops.aten
    return {
        "sum": (a.sum.dim_IntList, (x4, [2, 3], True), {}),
        "sum_all": (a.sum.default, (torch.empty(1 << 18),), {}),
        "mean": (a.mean.dim, (x4, [2, 3], True), {}),
        "var_mean": (a.var_mean.correction, (x4, [2, 3]), {"correction": 1, "keepdim": True}),
        "var": (a.var.correction, (rows, [1]), {"correction": 1}),
        "std": (a.std.correction, (cols, [0]), {"correction": 1}),
        "amax": (a.amax.default, (rows, [1]), {}),
        "argmax": (a.argmax.default, (rows, 1), {}),
        "logsumexp": (a.logsumexp.default, (rows, [1]), {}),
        "cumsum": (a.cumsum.default, (rows, 1), {}),
        "softmax": (a._softmax.default, (rows, 1, False), {}),
        "log_softmax": (a._log_softmax.default, (rows, -1, False), {}),
        "layer_norm": (a.native_layer_norm.default, (rows, [4096], torch.empty(4096), torch.empty(4096), 1e-5), {}),
        "group_norm": (a.native_group_norm.default, (x4, c32, c32, 2, 32, 4096, 8, 1e-5), {}),
        "batch_norm": (a._native_batch_norm_legit_no_training.default,
                       (x4, c32, c32, torch.zeros(32), torch.ones(32), 0.1, 1e-5), {}),
    }


@pytest.mark.slow
def test_reduction_corpus_matches_eager_at_one_to_n_threads(tmp_path, monkeypatch):
    """Every reduction, scan and norm of the corpus, built with the defaults at 1 thread,
    equals eager at 1, 2 and 4 intra-op threads (kernel and eager at the same count) on
    fresh inputs.  Any patch of Inductor's CPU threading must pass this (the removed
    parallel_like_eager did not: var_mean at 2 threads)."""
    wrong = {}
    for name, (op, args, kwargs) in _corpus().items():
        sig = S.from_call(op, args, kwargs)
        path = _build_unverified(sig, tmp_path / name, monkeypatch)
        runner = load_runner(path, "cpu")
        fargs, fkwargs = S.materialize(sig, seed=7)
        for n in (1, 2, 4):
            with _threads(n), torch.no_grad():
                expected = op(*fargs, **fkwargs)
                got = runner.run(flat_tensors(sig, fargs, fkwargs))
            bad = compare(expected, got, length_tolerance(sig, fargs, fkwargs, expected))
            if bad is not None:
                wrong.setdefault(name, {})[n] = bad
    assert not wrong, {name: {n: (bad["problem"], bad.get("output")) for n, bad in per.items()}
                       for name, per in wrong.items()}


def test_a_channels_last_size1_result_has_eagers_memory_format(tmp_path):
    """sigmoid of a channels-last ``[N, C, 1, 1]`` (what adaptive_avg_pool2d returns for a
    channels-last input): eager's result has strides ``(C, 1, 1, 1)`` (contiguous), the
    op's meta function keeps the input's ``(C, 1, C, C)`` (channels-last), and a later
    ``interpolate`` follows whichever it gets.  The kernel is published with eager's
    strides, and a kernel that kept the meta's would be refused (tests/unit/test_layout_format.py)."""
    c = 16
    x = torch.empty_strided((4, c, 1, 1), (c, 1, c, c)).normal_()
    sig = S.from_call(torch.ops.aten.sigmoid.default, (x,), {})
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    got, = load_runner(cache.open_entry(fp, sig.key).kernel_path, "cpu").run([x])
    want = torch.sigmoid(x)
    assert got.stride() == want.stride() == (c, 1, 1, 1)
    assert compare(want, [got]) is None
    up = torch.nn.functional.interpolate(got, size=(2, 2))
    assert up.stride() == torch.nn.functional.interpolate(want, size=(2, 2)).stride()


def test_a_variance_less_accurate_than_eager_is_built_again_in_float64(tmp_path):
    """var of rows ``3e4 + N(0, 1)``: eager's CPU kernel accumulates in float64 (error ~1e-8),
    the generated one in float32 (~1e-4, past the float32 tolerance of the true 0.99): a
    result no user of eager would get, refused on the precision case.  The compiler then
    builds it computing in float64 (inputs cast up in the graph, the result cast back to
    float32), which verification accepts: published with ``computed_in: float64``, and
    served it is as accurate as eager on the ill-conditioned rows."""
    import tempfile

    from aoti_farm.compile.compiler import load_runner

    sig = S.from_call(torch.ops.aten.var.correction, (torch.empty(8, 4096), [1]), {"correction": 1})
    comp = AOTICompiler(measure_speed=False)
    with pytest.raises(CompileRefused) as narrow:          # the build in float32 alone
        comp._compile(sig, tempfile.mkdtemp(dir=tmp_path))
    ev = narrow.value.evidence
    assert ev.get("problem") == "precision" and ev["case"] == "large offset", ev
    assert ev["kernel_error"] > ev["eager_error"] + 1e-4
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    out = compile_and_publish(cache, comp, fp, sig, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    entry = cache.open_entry(fp, sig.key)
    v = entry.manifest["verification"]
    assert v["computed_in"] == "float64" and v["narrow_refusal"].startswith("kernel less accurate than eager")
    x = 3e4 + torch.randn(8, 4096, generator=torch.Generator().manual_seed(5))
    truth = torch.var(x.double(), dim=1, correction=1)
    got = load_runner(entry.kernel_path, "cpu").run([x])[0]
    want = torch.ops.aten.var.correction(x, [1], correction=1)
    assert got.dtype == torch.float32 and got.shape == want.shape and got.stride() == want.stride()
    assert (got.double() - truth).abs().max() <= (want.double() - truth).abs().max() + 1e-6


def test_a_kernel_laid_out_unlike_eager_is_built_again_in_eager_strides(tmp_path):
    """GPT-2's ``cat([float32[0], k], dim=-2)`` with ``k`` transposed (strides (1024, 32,
    128, 1)): eager returns a fresh contiguous tensor, Inductor's kernel the input's layout,
    so the first build is refused on its strides (a layout no user of eager gets).  The
    compiler then builds it with the output forced into eager's strides, which verification
    accepts: published with ``layout: eager's strides``, and the kernel returns eager's
    strides and values."""
    import tempfile

    k = torch.randn(2, 8, 4, 32).permute(0, 2, 1, 3)
    sig = S.from_call(torch.ops.aten.cat.default, ([torch.empty(0), k], -2), {})
    comp = AOTICompiler(measure_speed=False)
    with pytest.raises(CompileRefused) as first:          # the build as Inductor lays it out
        comp._compile(sig, tempfile.mkdtemp(dir=tmp_path))
    assert first.value.evidence.get("problem") == "strides", first.value.evidence
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    out = compile_and_publish(cache, comp, fp, sig, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    entry = cache.open_entry(fp, sig.key)
    v = entry.manifest["verification"]
    assert v["layout"] == "eager's strides" and v["layout_refusal"].startswith("kernel disagrees with eager")
    x = torch.randn(2, 8, 4, 32).permute(0, 2, 1, 3)
    e = torch.empty(0)
    got = load_runner(entry.kernel_path, "cpu").run([e, x])[0]
    want = torch.cat([e, x], dim=-2)
    assert got.stride() == want.stride() == (1024, 256, 32, 1)
    assert torch.equal(got, want)


def test_the_third_pass_ill_conditioned_cases_are_served_right_or_declined(tmp_path):
    """The third pass's finite inputs that told kernels from eager (issue 48), at either
    contract level (precision is no edge note): ``trace`` of a diagonal of shuffled
    ``x, -x`` pairs around 1e4 (eager's CPU trace adds in float64: exactly 0; a float32
    kernel's sum was off by up to 0.5), and ``mean.dim`` of zero-mean rows around 1e4.
    Verification's sorted and diagonal cancellation cases refuse the float32 trace, which
    is built again in float64; the mean kernel (eager's adds in float32 too) is served and
    within the stated tolerance (a mean's bound: eps * mean|x|) of eager on those rows."""
    from aoti_farm.compile.tolerance import length_tolerance, precision

    comp, cache, fp = AOTICompiler(measure_speed=False), Cache(tmp_path / "c"), fingerprint("cpu")
    g = torch.Generator().manual_seed(0)
    tr = S.from_call(torch.ops.aten.trace.default, (torch.empty(64, 64),), {})
    out = compile_and_publish(cache, comp, fp, tr, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    entry = cache.open_entry(fp, tr.key)
    assert entry.manifest["verification"].get("computed_in") == "float64"
    run = load_runner(entry.kernel_path, "cpu")
    for _ in range(6):
        x = torch.randn(64, 64, generator=g)
        d = 1e4 + torch.rand(32, generator=g)
        x.diagonal().copy_(torch.cat([d, -d])[torch.randperm(64, generator=g)])
        want, got = torch.trace(x), run.run([x])[0]
        assert precision(want, [got], torch.trace(x.double())) is None, (float(want), float(got))
        assert compare(want, [got]) is None
    mn = S.from_call(torch.ops.aten.mean.dim, (torch.empty(8, 4096), [1]), {})
    out = compile_and_publish(cache, comp, fp, mn, owner="t")
    assert out.status == "compiled", (out.error, out.evidence)
    run = load_runner(cache.open_entry(fp, mn.key).kernel_path, "cpu")
    for _ in range(6):
        r = torch.randn(8, 2048, generator=g)
        x = torch.cat([1e4 + r, -(1e4 + r)], 1)[:, torch.randperm(4096, generator=g)]
        want, got = torch.ops.aten.mean.dim(x, [1]), run.run([x])[0]
        assert precision(want, [got], torch.ops.aten.mean.dim(x.double(), [1])) is None
        assert compare(want, [got], length_tolerance(mn, (x, [1]), {}, want)) is None, (want - got).abs().max()
