"""The verification contract (docs/verification.md, "The contract"): a difference from
eager seen only on non-finite inputs, at magnitudes whose sum of squares overflows a
reduction, or in the sign of a zero result is an *edge note* on the entry, not a refusal;
``contract="finite"`` (the default) serves such a kernel, ``contract="strict"`` does not.
The README example's gelu and native_layer_norm were refused over exactly these."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish


@pytest.fixture(scope="module")
def noted(tmp_path_factory):
    """gelu (differs on infinities and NaN, and in the sign of gelu(-0.0)) and
    native_layer_norm (differs at a quarter of float32's max) compiled and verified for real."""
    cache = Cache(tmp_path_factory.mktemp("contract") / "c")
    fp = fingerprint("cpu")
    sigs = {"gelu": S.from_call(torch.ops.aten.gelu.default, (torch.empty(4, 64),), {}),
            "layer_norm": S.from_call(torch.ops.aten.native_layer_norm.default,
                                      (torch.empty(4, 32), [32], torch.empty(32), torch.empty(32), 1e-5), {})}
    out = {n: compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, s, owner="t") for n, s in sigs.items()}
    return cache, fp, sigs, out


def test_edge_differences_are_notes_not_refusals(noted):
    cache, fp, sigs, out = noted
    for name, o in out.items():
        assert o.status == "compiled", (name, o.error, o.evidence)
    notes = {n: cache.open_entry(fp, s.key).manifest["verification"].get("edge_notes") for n, s in sigs.items()}
    assert {x["class"] for x in notes["gelu"]} >= {"non-finite inputs"}, notes
    assert {x["class"] for x in notes["layer_norm"]} == {"overflowing magnitudes"}, notes
    for n in notes.values():
        assert all(x["case"] and x["class"] in ("sign of zero", "non-finite inputs", "overflowing magnitudes")
                   for x in n)


def _serve(cache, contract, calls):
    from aoti_farm.runtime import Settings, install

    with install(cache_dir=str(cache.root), serve="always", on_miss="ignore", contract=contract,
                 settings=Settings(install_trial=0)) as hook:
        got = [fn() for fn in calls]
        st = hook.stats()["summary"]
    return got, st


def test_finite_serves_noted_kernels_and_strict_does_not(noted):
    """The same calls under both levels: finite serves both kernels, strict runs eager for
    both and names the note; every result equals eager's on these finite inputs."""
    cache, fp, sigs, _ = noted
    x, y = torch.randn(4, 64), torch.randn(4, 32)
    w, b = torch.randn(32), torch.randn(32)
    calls = [lambda: torch.ops.aten.gelu.default(x),
             lambda: torch.ops.aten.native_layer_norm.default(y, [32], w, b, 1e-5)]
    with torch.no_grad():
        want = [fn() for fn in calls]
        got_f, st_f = _serve(cache, "finite", calls)
        got_s, st_s = _serve(cache, "strict", calls)
    assert st_f["served"] == 2, st_f
    assert st_s["served"] == 0, st_s
    assert st_s["ineligible_by_reason"] == {"contract: strict (non-finite inputs)": 1,
                                            "contract: strict (overflowing magnitudes)": 1}, st_s
    for got in (got_f, got_s):
        assert torch.allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        assert all(torch.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got[1], want[1]))


def test_a_finite_input_difference_is_still_refused(tmp_path):
    """Float floor division differs from eager on finite inputs (1.0 // 0.1): refused at
    both levels, never a note."""
    a, b = torch.empty(8, 8), torch.empty(8, 8)
    sig = S.from_call(torch.ops.aten.floor_divide.default, (a, b), {})
    out = compile_and_publish(Cache(tmp_path / "c"), AOTICompiler(measure_speed=False), fingerprint("cpu"), sig,
                              owner="t")
    assert out.status == "failed" and "finite special values" in (out.error or ""), (out.error, out.evidence)


def test_explain_names_the_note_under_strict(noted, tmp_path, capsys):
    import json

    from aoti_farm.cli import main
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    cache, fp, sigs, _ = noted
    trace = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sigs["gelu"], 1, 0)]), trace)
    base = ["explain", "--trace", str(trace), "--cache-dir", str(cache.root), "--serve", "always", "--json"]
    assert main(base) == 0
    row, = json.loads(capsys.readouterr().out)["signatures"]
    assert row["outcome"] == "hit" and any("edge notes: non-finite inputs" in d for d in row["details"]), row
    assert main(base + ["--contract", "strict"]) == 0
    row, = json.loads(capsys.readouterr().out)["signatures"]
    assert row["outcome"] == "ineligible" and "non-finite inputs" in row["reason"], row
