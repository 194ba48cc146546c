"""The refusal before the C++ build (aoti_farm/build/abortscan.py), against verification itself:
a CPU op whose kernel checks an index that eager rejects, and whose index has no guard
(made so here), is compiled for real twice, with the scan and with ``AOTI_FARM_DEV=abort_scan=0``.
Both refuse it, and neither publishes anything.  With the scan, no wrapper is built.  The
ops with guards (``gather``, ``embedding``, ``index_select``) are built and published."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.build import splitbuild
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.compile.verify import is_verification_refusal
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish

PREDICTED = ("kernel aborts the process where eager raises (its generated code checks an index inside an "
             "OpenMP region; refused before its C++ build): index out of bounds: ")


def _sig(op, rows: int = 2):
    """Signatures of the three index ops a recorded BERT or GPT-2 has, with their indices'
    recorded range (in bounds: eager accepts the example inputs).  ``rows``: the index's
    rows; at 2048 and more the kernel's loop nest holds over 4096 elements, so it keeps its
    OpenMP region (a smaller one is serial, aoti_farm/build/serialsmall.py, and its check raises
    as eager does)."""
    i64 = torch.int64
    if op == "gather":
        sig = S.from_call(torch.ops.aten.gather.default, (torch.empty(rows, 16, dtype=i64), 1,
                                                          torch.empty(rows, 4, dtype=i64)), {})
        return S.Signature(sig.op, sig.args, {"index": {"range": [0, 15]}})
    if op == "embedding":
        sig = S.from_call(torch.ops.aten.embedding.default, (torch.empty(12, 8), torch.empty(rows, 5, dtype=i64)), {})
        return S.Signature(sig.op, sig.args, {"indices": {"range": [0, 11]}})
    sig = S.from_call(torch.ops.aten.index_select.default, (torch.empty(10, 4), 0,
                                                            torch.empty(rows + 1, dtype=i64)), {})
    return S.Signature(sig.op, sig.args, {"index": {"range": [0, 9]}})


def _built_wrappers() -> int:
    st = splitbuild.stats()
    return st["split"] + st["whole"]


@pytest.mark.parametrize("op", ["gather", "embedding", "index_select"])
def test_guarded_index_ops_are_built_and_published(op, tmp_path, monkeypatch):
    """Where every index argument has a guard (adversarial.index_guards), no served call
    meets an index the kernel checks inside its OpenMP region: the scan does not run, the
    kernel is built, verified on in-range indices and published behind its guards
    (tests/e2e/test_index_guards.py serves them)."""
    fp, sig = fingerprint("cpu"), _sig(op)
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    cache = Cache(tmp_path / "scan")
    before = _built_wrappers()
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "compiled", (out.status, out.error)
    assert _built_wrappers() == before + 1
    assert cache.open_entry(fp, sig.key).manifest["verification"]["index_guards"]


@pytest.mark.parametrize("op", ["gather", "index_select"])
def test_refused_before_its_build_as_verification_refuses_it(op, tmp_path, monkeypatch):
    """An index argument without a guard (here: index_guards made to find none, as for an
    op adversarial.index_bound cannot bound), in a kernel large enough to keep its OpenMP
    region."""
    fp, sig = fingerprint("cpu"), _sig(op, rows=2048)
    monkeypatch.setattr("aoti_farm.compile.adversarial.index_guards", lambda *a, **k: None)
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    cache = Cache(tmp_path / "scan")
    before = _built_wrappers()
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "failed" and out.error.startswith(PREDICTED), (out.status, out.error)
    assert out.evidence["before_build"] is True and out.evidence["abort"] in out.error
    assert _built_wrappers() == before                       # no wrapper was built
    assert cache.failure(fp.id, sig.key)["reason"] == out.error
    assert not cache.has_entry(fp.id, sig.key)

    monkeypatch.setenv("AOTI_FARM_DEV", "abort_scan=0")      # built, loaded, verified
    cache = Cache(tmp_path / "full")
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert _built_wrappers() == before + 1
    assert out.status == "failed" and is_verification_refusal(out.error), (out.status, out.error)
    assert out.error.startswith(("kernel aborts the process where eager raises (signal 6): index out of bounds",
                                 "kernel does not raise where eager raises: negative index")), out.error
    assert not cache.has_entry(fp.id, sig.key)


def test_a_small_index_kernel_without_a_guard_raises_as_eager_does(tmp_path, monkeypatch):
    """Under 4096 elements the kernel's loop nest is serial (aoti_farm/build/serialsmall.py): its
    index check sits outside any OpenMP region and raises where eager raises, so even
    without a guard the kernel is verified on the bad-index cases and published, and it
    raises on a negative index as eager does."""
    from aoti_farm.compile.compiler import load_runner

    fp, sig = fingerprint("cpu"), _sig("gather")
    monkeypatch.setattr("aoti_farm.compile.adversarial.index_guards", lambda *a, **k: None)
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    cache = Cache(tmp_path / "small")
    out = compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, sig, owner="t")
    assert out.status == "compiled", (out.status, out.error)
    entry = cache.open_entry(fp, sig.key)
    assert "index_guards" not in entry.manifest["verification"]
    assert entry.manifest["build"]["serial_nests"] >= 1
    x, idx = torch.arange(32).view(2, 16), torch.tensor([[-1, 0, 1, 2], [3, 4, 5, 6]])
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 1, idx)
    with pytest.raises(RuntimeError, match="out of bounds"):
        load_runner(entry.kernel_path, "cpu").run([x, idx])


def test_a_class_where_eager_rejects_an_index_is_refused_before_its_build(tmp_path):
    """A class kernel is never verified in the verification child, so where eager raises
    on an index that no constant index guard sends to eager, its members are compiled
    exactly; that is known before the class's compile, which is not run.  ``gather`` from a
    table as long as its index: ``classes`` never makes such a class (the table's size is
    pinned, tests/unit/test_shapes.py), so this one is made by hand, the bound a symbol.
    (A class whose table is fixed is served behind its guard: tests/e2e/test_index_guards.py.)"""
    from aoti_farm.dynamic import shapes as SH

    i64 = torch.int64
    sigs = []
    for n in (8, 16, 24):
        sig = S.from_call(torch.ops.aten.gather.default, (torch.empty(4, n), 1, torch.empty(4, n, dtype=i64)), {})
        sigs.append(S.Signature(sig.op, sig.args, {"index": {"range": [0, n - 1]}}))
    assert all(len(c.members) == 1 for c in SH.classes(sigs)[0])
    cls = SH._learn(*SH.group_of(sigs[0].op, sigs[0].args), sigs)
    assert cls.ranges == (("s0", 8, 24),)
    fp, before = fingerprint("cpu"), _built_wrappers()
    out = compile_and_publish(Cache(tmp_path / "c"), AOTICompiler(measure_speed=False), fp, cls, owner="t")
    assert out.status == "failed" and out.error.startswith("eager raises on an adversarial input"), out.error
    assert "no fixed index guard" in out.error, out.error
    assert _built_wrappers() == before                       # no wrapper was built
