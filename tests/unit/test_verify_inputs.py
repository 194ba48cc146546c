"""Unit tests of what verification feeds and compares (no compile): example inputs of
tensor lists with per-item hints, the adversarial cases, compare() on special values, and
the classification of a compile's failures."""

from __future__ import annotations

import torch

from aoti_farm import signature as S


def _cat_sig():
    a, b = torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64)
    sig = S.from_call(torch.ops.aten.cat.default, ([a, b], -1), {})
    hints = {"tensors": {"items": [{"range": [3, 9]}, None]}}
    return S.Signature(sig.op, sig.args, S.check_hints(hints, sig.info(), "hints"))


def test_materialize_takes_the_range_of_a_tensor_list_item():
    """A tensor-list item's hint is {"range": [lo, hi]}: the range, not the dict, bounds its
    values (a dict there raised KeyError: 0 and failed every decode-step cat)."""
    args, _ = S.materialize(_cat_sig(), seed=3)
    first, second = args[0]
    assert first.dtype == torch.int64 and tuple(first.shape) == (2, 5)
    assert int(first.min()) >= 3 and int(first.max()) <= 9
    assert int(second.min()) >= 0 and int(second.max()) <= 15


def test_compare_checks_nan_places_infinities_and_signed_zeros():
    from aoti_farm.compile.tolerance import compare

    inf, nan = float("inf"), float("nan")
    e = torch.tensor([1.0, -0.0, inf, -inf, nan, 0.0])
    assert compare(e, [e.clone()]) is None
    # a number where eager has NaN (and the reverse)
    g = e.clone(); g[4] = 1.0
    assert compare(e, [g])["problem"] == "a number where eager has NaN"
    g = e.clone(); g[0] = nan
    assert compare(e, [g])["problem"] == "NaN where eager has a number"
    # infinities: the sign, and finite against infinite
    g = e.clone(); g[2] = -inf
    assert compare(e, [g])["problem"] == "values"
    g = e.clone(); g[3] = -3.4e38
    assert compare(e, [g])["problem"] == "values"
    # zeros: -0.0 where eager has 0.0 and the reverse
    g = e.clone(); g[1] = 0.0
    bad = compare(e, [g])
    assert bad["problem"] == "sign of zero" and bad["flat_index"] == 1
    g = e.clone(); g[5] = -0.0
    assert compare(e, [g])["flat_index"] == 5
    # float64 and a tuple of outputs alike
    assert compare((e.double(), e), [e.double(), g])["output"] == 1


# --- adversarial inputs ---------------------------------------------------------------------


def _cases(op, args, kwargs=None, hints=None):
    from aoti_farm.compile import adversarial as A

    sig = S.from_call(op, args, kwargs or {})
    if hints:
        sig = S.Signature(sig.op, sig.args, hints)
    a, kw = S.materialize(sig, seed=5)
    return sig, a, kw, {name: (ca, ckw) for name, ca, ckw in A.cases(sig, a, kw)}


def test_adversarial_floats_meet_in_every_pair_of_special_values():
    """Two float inputs of 10x10 elements meet in every pair of each case's values: 1.0 //
    0.1 among the finite ones; -inf // -1, remainder(5.0, inf) and remainder(-0.0, inf)
    among the non-finite ones; strides and the inputs given are kept."""
    from aoti_farm.compile.adversarial import FINITE, NONFINITE

    x, y = torch.empty(10, 10), torch.empty(10, 10).t()
    sig, a, kw, cases = _cases(torch.ops.aten.floor_divide.default, (x, y))
    before = a[0].clone()
    assert list(cases) == ["finite special values", "infinities and NaN", "magnitudes", "isolated infinities",
                           "isolated NaN", "large offset", "cancellation", "sorted cancellation",
                           "diagonal cancellation"]

    def pairs(case):
        ca, _ = cases[case]
        assert ca[0].stride() == a[0].stride() and ca[1].stride() == a[1].stride() == (1, 10)
        flat0, flat1 = ca[0].as_strided((100,), (1,)), ca[1].as_strided((100,), (1,))
        return {(str(float(p)), str(float(q))) for p, q in zip(flat0, flat1)}

    def f32(v):
        return str(float(torch.tensor(v)))

    finite, nonfinite = pairs("finite special values"), pairs("infinities and NaN")
    assert len(finite) == len(FINITE) ** 2 and len(nonfinite) == len(NONFINITE) ** 2
    assert (f32(1.0), f32(0.1)) in finite and not any("inf" in p or "nan" in p for pr in finite for p in pr)
    for p, q in ((float("-inf"), -1.0), (5.0, float("inf")), (-0.0, float("inf"))):
        assert (f32(p), f32(q)) in nonfinite
    assert torch.equal(a[0], before)   # the random inputs are untouched
    mag, _ = cases["magnitudes"]
    fi = torch.finfo(torch.float32)
    assert float(mag[0].max()) == fi.max / 4 and float(mag[0].abs().min()) == fi.tiny
    # a few infinities among the random values, each next to finite neighbours; NaNs in pairs
    iso, _ = cases["isolated infinities"]
    flat = iso[0].as_strided((100,), (1,))
    inf = torch.isinf(flat)
    assert 0 < int(inf.sum()) < 40 and bool(torch.isfinite(flat[~inf]).all())
    assert bool(torch.isfinite(flat[4])) and bool(torch.isinf(flat[3])) and bool(torch.isfinite(flat[2]))
    nan, _ = cases["isolated NaN"]
    flat = nan[0].as_strided((100,), (1,))
    assert bool(torch.isnan(flat[2]) & torch.isnan(flat[3])) and int(torch.isnan(flat).sum()) < 40


def test_adversarial_integers_get_extremes_without_zero_divisors():
    x, y = torch.empty(6, dtype=torch.int32), torch.empty(6, dtype=torch.int32)
    _, _, _, cases = _cases(torch.ops.aten.floor_divide.default, (x, y))
    ca, _ = cases["finite special values"]
    ii = torch.iinfo(torch.int32)
    assert {ii.min, ii.max, 0, -1} <= set(ca[0].tolist())
    assert 0 not in ca[1].tolist() and min(ca[1].tolist()) > 0   # no SIGFPE in the verifying process


def test_adversarial_indices_at_the_bound_negative_and_out_of_range():
    """index_select(W[10, 4], 0, idx): a case per bound, each changing one thing; the other
    cases keep the indices valid (a negative index must not hide the special values)."""
    W, idx = torch.empty(10, 4), torch.empty(3, dtype=torch.int64)
    sig, a, kw, cases = _cases(torch.ops.aten.index_select.default, (W, 0, idx),
                               hints={"index": {"range": [0, 9]}})
    assert set(cases) == {"finite special values", "infinities and NaN", "magnitudes", "isolated infinities",
                          "isolated NaN", "large offset", "cancellation", "sorted cancellation",
                          "index at the bound (index=9)",
                          "negative index (index=-1)", "index out of range (index=10)"}
    for name, (ca, _) in cases.items():
        got = ca[2].tolist()
        if name.startswith("negative"):
            assert got[0] == -1 and all(0 <= v < 10 for v in got[1:])
        elif name.startswith("index out"):
            assert got[0] == 10 and all(0 <= v < 10 for v in got[1:])
        else:
            assert all(0 <= v < 10 for v in got), (name, got)
    bound = cases["index at the bound (index=9)"][0][2].tolist()
    assert bound[0] == 9 and bound.count(9) == 1
    # eager's verdicts: the bound is valid, -1 and 10 raise
    op = torch.ops.aten.index_select.default
    op(*cases["index at the bound (index=9)"][0])
    for name in ("negative index (index=-1)", "index out of range (index=10)"):
        try:
            op(*cases[name][0])
        except (IndexError, RuntimeError):
            continue
        raise AssertionError(f"eager accepted {name}")


def test_adversarial_index_bounds_of_embedding_gather_and_nll_loss():
    from aoti_farm.compile.adversarial import index_bound

    W, x = torch.empty(7, 3), torch.empty(4, 5)
    assert index_bound("aten::embedding", "indices", None, {"weight": W}) == 7
    assert index_bound("aten::gather", "index", None, {"self": x, "dim": -1}) == 5
    assert index_bound("aten::nll_loss_forward", "target", None, {"self": x}) == 5
    assert index_bound("aten::index.Tensor", "indices", 1, {"self": x}) == 5
    assert index_bound("aten::add.Tensor", "index", None, {"self": x}) is None


# --- failures of our own code -----------------------------------------------------------------


def _raise(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("no exception")


def test_own_code_error_tells_our_bugs_from_torch_and_the_host():
    from aoti_farm.compile.faults import own_code_error
    from aoti_farm.errors import CompileRefused
    from aoti_farm.signature import decode_value

    bug = own_code_error(_raise(lambda: decode_value(("no-such-tag", 1))))
    assert bug["bug"] is True and bug["exception"] == "KeyError: 'no-such-tag'"
    assert bug["where"].startswith("aoti_farm/signature/examples.py:") and bug["where"].endswith("in decode_value")
    assert "Traceback" in bug["traceback"] and "decode_value" in bug["traceback"]
    # raised inside torch (whoever called it), a deliberate refusal, the host: not ours
    assert own_code_error(_raise(lambda: torch.ops.aten.add.Tensor(torch.ones(2), torch.ones(3)))) is None
    assert own_code_error(_raise(lambda: torch.ones(2).view(3))) is None
    assert own_code_error(CompileRefused("ineligible: x")) is None
    assert own_code_error(_raise(lambda: open("/nonexistent/x"))) is None


class _BuggyCompiler:
    """A compiler whose compile hits a bug of ours (a KeyError in aoti-farm's code) or an
    error of torch's."""
    name = "buggy"

    def __init__(self, torch_error=False):
        self.torch_error = torch_error
        self.calls = 0

    def options(self):
        return {}

    def compile(self, sig, workdir):
        from aoti_farm.signature import decode_value

        self.calls += 1
        if self.torch_error:
            torch.ones(2).view(3)
        decode_value(("no-such-tag", 1))


def test_a_bug_of_ours_is_recorded_once_with_its_traceback(tmp_path):
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import COUNTERS, compile_and_publish
    from aoti_farm.report.progress import bug_lines

    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    sig = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(3, 5), torch.empty(3, 5)), {})
    before = COUNTERS.snapshot()["own_bugs"]
    comp = _BuggyCompiler()
    out = compile_and_publish(cache, comp, fp, sig, owner="t")
    assert out.status == "failed" and out.error.startswith("bug in aoti-farm: KeyError: 'no-such-tag' at ")
    assert out.evidence["bug"] is True and "decode_value" in out.evidence["traceback"]
    rec = cache.failure(fp.id, sig.key)
    assert rec["reason"] == out.error and "Traceback" in rec["evidence"]["traceback"]
    assert COUNTERS.snapshot()["own_bugs"] == before + 1
    # final: a second call reads the record and compiles nothing
    assert compile_and_publish(cache, comp, fp, sig, owner="t").status == "failed" and comp.calls == 1
    # the warm summary names it
    row = {**out.to_dict(), "op": sig.op, "description": S.describe(sig)}
    lines = bug_lines([row, {"status": "failed", "key": "k" * 64, "op": "x", "evidence": {}}])
    assert lines[0].startswith("BUGS in aoti-farm: 1 signature(s)") and len(lines) == 2
    assert "KeyError: 'no-such-tag' at aoti_farm/signature/examples.py:" in lines[1]
    # torch's error is not ours: it propagates (the farm's infrastructure path), no record
    other = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(2, 5), torch.empty(2, 5)), {})
    try:
        compile_and_publish(cache, _BuggyCompiler(torch_error=True), fp, other, owner="t")
    except RuntimeError:
        pass
    else:
        raise AssertionError("torch's error was swallowed")
    assert cache.failure(fp.id, other.key) is None


def test_cache_ls_failed_lists_only_failures(tmp_path, capsys):
    from aoti_farm.cache.store import Cache
    from aoti_farm.cli import main
    from aoti_farm.fingerprint import fingerprint

    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    good = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(3, 5), torch.empty(3, 5)), {})
    bad = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(2, 5), torch.empty(2, 5)), {})
    so = tmp_path / "kernel.so"
    so.write_bytes(b"not a kernel; ls reads manifests only")
    cache.publish(fp, good, {"kernel.so": str(so)}, {"compile_seconds": 1.0})
    cache.record_failure(fp, bad, "compile error: boom")
    capsys.readouterr()
    assert main(["cache", "ls", "--failed", "--cache-dir", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert bad.key[:16] in out and "boom" in out and good.key[:16] not in out
    assert main(["cache", "ls", "--cache-dir", str(cache.root)]) == 0
    assert good.key[:16] in capsys.readouterr().out


# --- tolerances that follow eager's flags -------------------------------------------------------


def _as_cuda(sig):
    def dev(a):
        if a[0] == "T":
            return (*a[:4], "cuda:0")
        if a[0] == "TL":
            return ("TL", tuple(dev(t) for t in a[1]))
        return a
    return S.Signature(sig.op, tuple(dev(a) for a in sig.args), sig.hints)


def _tf32(t):
    """t's values rounded to TF32 (10 explicit mantissa bits), as cuBLAS/cuDNN round operands."""
    return (t.view(torch.int32) & ~((1 << 13) - 1)).view(torch.float32)


def test_tf32_tolerance_follows_eager_flags():
    """A correct float32 matmul/convolution whose operands eager rounded to TF32 (flags on)
    is within flag_tolerance of the exact result, and outside the fixed tolerance; with the
    flags off, or on CPU, no extra tolerance."""
    from aoti_farm.compile.tolerance import compare, flag_tolerance

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 512, generator=g), torch.randn(512, 64, generator=g)
    sig = _as_cuda(S.from_call(torch.ops.aten.mm.default, (a, b), {}))
    exact = (a.double() @ b.double()).float()
    eager = (_tf32(a).double() @ _tf32(b).double()).float()
    on = {"matmul_allow_tf32": True, "cudnn_allow_tf32": True}
    off = {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}
    assert compare(eager, [exact]) is not None
    extra = flag_tolerance(sig, (a, b), {}, on)
    assert compare(eager, [exact], extra) is None
    assert compare(eager, [exact + 1.0], extra) is not None   # a wrong kernel still is
    assert flag_tolerance(sig, (a, b), {}, off) == (0.0, 0.0)
    cpu = S.from_call(torch.ops.aten.mm.default, (a, b), {})
    assert flag_tolerance(cpu, (a, b), {}, on) == (0.0, 0.0)
    # a 3x3 convolution over 32 channels: cudnn_allow_tf32
    x, w = torch.randn(2, 32, 16, 16, generator=g), torch.randn(64, 32, 3, 3, generator=g)
    conv = _as_cuda(S.from_call(torch.ops.aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                                     [0, 0], 1), {}))
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1).float()
    eager = torch.nn.functional.conv2d(_tf32(x).double(), _tf32(w).double(), padding=1).float()
    assert compare(eager, [exact]) is not None
    assert compare(eager, [exact], flag_tolerance(conv, args, {}, on)) is None
    assert flag_tolerance(conv, args, {}, {"matmul_allow_tf32": True, "cudnn_allow_tf32": False}) == (0.0, 0.0)


def test_entry_verified_threads_reads_old_and_new_manifests():
    """The runtime reads Entry.verified_threads: the manifest's sorted list, [1] for a CPU
    manifest written before the field, None for CUDA."""
    from pathlib import Path

    from aoti_farm.cache.manifest import Entry

    cpu = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(3, 5), torch.empty(3, 5)), {})
    cuda = _as_cuda(cpu)

    def entry(sig, **m):
        return Entry("fp", sig.key, Path("/nonexistent"), {"signature": sig.to_obj(), **m})

    assert entry(cpu, verified_threads=[16, 1, 2]).verified_threads == [1, 2, 16]
    assert entry(cpu).verified_threads == [1]
    assert entry(cpu, verified_threads="junk").verified_threads == [1]
    assert entry(cuda).verified_threads is None


def test_cuda_index_ops_are_refused_before_compiling_unless_eager_asserts_on_every_bad_index():
    """On CUDA eager rejects a bad index through a device-side assert, which leaves the
    process's CUDA context unusable: a compile actor that ran such a case would fail every
    later CUDA compile (recorded as refusals in the shared cache).  So no out-of-bound case
    is built for a CUDA index, and the kernel is refused up front, naming the argument --
    except an exact kernel of an op whose eager kernel asserts on every index outside
    ``[0, bound)`` (``index_select``, ``embedding``, ``gather``): its negative indices are
    mapped to the bound in the graph and its generated code is read for the asserts
    (tests/e2e/test_cuda_index.py on a GPU); a shape class of it is still refused."""
    from aoti_farm.compile import adversarial

    W, idx = torch.empty(10, 4), torch.empty(3, dtype=torch.int64)
    cpu = S.from_call(torch.ops.aten.index_select.default, (W, 0, idx), {})
    cuda = _as_cuda(cpu)
    args, kwargs = (W, 0, torch.tensor([1, 2, 3])), {}
    assert adversarial.unverifiable(cpu, args, kwargs) is None
    assert adversarial.unverifiable(cuda, args, kwargs) is None
    assert adversarial.cuda_index_bounds(cuda, args, kwargs) == [(1, 10)]
    assert adversarial.cuda_index_bounds(cpu, args, kwargs) is None
    why = adversarial.unverifiable(cuda, args, kwargs, exact=False)
    assert why is not None and "'index'" in why and "device-side assert" in why
    # an index op whose eager kernel does not assert the same way: refused up front
    src = torch.empty(3, 4)
    scatter = _as_cuda(S.from_call(torch.ops.aten.scatter.src, (W, 0, torch.empty(3, 4, dtype=torch.int64), src), {}))
    sargs = (W, 0, torch.zeros(3, 4, dtype=torch.int64), src)
    assert adversarial.cuda_index_bounds(scatter, sargs, {}) is None
    why = adversarial.unverifiable(scatter, sargs, {})
    assert why is not None and "'index'" in why
    # a CUDA op without an index argument is verified as usual
    x = torch.empty(4, 4)
    add = _as_cuda(S.from_call(torch.ops.aten.add.Tensor, (x, x), {}))
    assert adversarial.unverifiable(add, (x, x), {}) is None


def test_no_out_of_bound_index_case_for_a_cuda_tensor(monkeypatch):
    from aoti_farm.compile import adversarial

    W, idx = torch.empty(10, 4), torch.empty(3, dtype=torch.int64)
    sig = S.from_call(torch.ops.aten.index_select.default, (W, 0, idx), {})
    sig = S.Signature(sig.op, sig.args, {"index": {"range": [0, 9]}})
    args, kwargs = S.materialize(sig, seed=0)
    names = [c[0] for c in adversarial.cases(sig, args, kwargs)]
    assert any(n.startswith("negative index") for n in names)
    # the same tensors seen as CUDA ones: only the in-bound cases remain
    monkeypatch.setattr(adversarial, "_on_cpu", lambda t: False)
    names = [c[0] for c in adversarial.cases(sig, args, kwargs)]
    assert not any(n.startswith(("negative index", "index out of range", "index at the bound")) for n in names)
