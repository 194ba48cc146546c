"""The compiler's verification refuses wrong kernels; the example trace compiles for real
through `aoti-farm compile-one`.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_compiler.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.errors import CompileRefused
from aoti_farm.trace import Trace, TraceEntry, load_trace, save_trace

from conftest import sig_add_alpha
from unit.test_compiler import EXAMPLE, _cli   # the unit tier's example trace and CLI runner


def test_a_kernel_of_another_op_is_refused(kernels):
    """add(x, y, alpha=2)'s kernel handed in as sub(x, y, alpha=2)'s: same inputs, wrong
    values.  Verification must refuse it with evidence, and accept the right one."""
    add = sig_add_alpha()
    assert kernels.ensure(add).status in ("compiled", "cached")
    path = kernels.cache.open_entry(kernels.fp, add.key).kernel_path
    a, b = torch.empty(8, 16), torch.empty(16)
    sub = S.from_call(torch.ops.aten.sub.Tensor, (a, b), {"alpha": 2})
    assert [x for x in sub.args if x[0] == "T"] == [x for x in add.args if x[0] == "T"]
    with pytest.raises(CompileRefused) as ei:
        AOTICompiler().verify(sub, path)
    ev = ei.value.evidence
    assert ei.value.reason == "kernel disagrees with eager"
    assert ev["problem"] == "values" and ev["mismatched"] > 0 and ev["max_abs_err"] > ev["atol"]
    assert AOTICompiler().verify(add, path)["ok"] is True


def test_compile_one_compiles_example_entries_into_a_fresh_cache(tmp_path, capsys):
    """Two of the example trace's smallest entries, compiled for real, then cached."""
    t = load_trace(EXAMPLE)

    def cost(e):
        return sum(max(1, int(torch.tensor(a[2]).prod())) for a in e.sig.args if a[0] == "T")

    picks = sorted(range(len(t)), key=lambda i: cost(t[i]))[:2]
    cache_dir = tmp_path / "fresh"
    for i in picks:
        rc, out, err = _cli(capsys, "compile-one", "--trace", EXAMPLE, "--index", str(i),
                            "--cache-dir", str(cache_dir), "--json")
        res = json.loads(out)
        assert rc == 0 and res["status"] == "compiled", (out, err)
        assert res["key"] == t[i].key
    cache = Cache(cache_dir)
    fp_id = res["fingerprint_id"]
    assert cache.list_keys(fp_id) == {t[i].key for i in picks}
    for i in picks:
        e = cache.open_entry(fp_id, t[i].key)
        AOTICompiler().verify(t[i].sig, e.kernel_path)  # still agrees with eager
    rc, out, _ = _cli(capsys, "compile-one", "--trace", EXAMPLE, "--index", str(picks[0]),
                      "--cache-dir", str(cache_dir))
    assert rc == 0 and out.startswith("cached ")


def test_compile_one_failure_exits_1_and_is_recorded(tmp_path, capsys):
    """A signature eager itself rejects (index out of range for the embedding) is refused
    deterministically: exit 1, a failure record, and no second attempt."""
    weight, idx = torch.empty(4, 3), torch.zeros(2, dtype=torch.long)
    sig = S.from_call(torch.ops.aten.embedding.default, (weight, idx), {})
    sig.hints["indices"] = {"range": [100, 200]}
    trace = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig, 1, 0)]), trace)
    cache_dir = tmp_path / "c"
    rc, out, _ = _cli(capsys, "compile-one", "--trace", str(trace), "--index", "0", "--cache-dir", str(cache_dir))
    assert rc == 1 and out.startswith("failed ") and "eager rejects" in out
    cache = Cache(cache_dir)
    (fp_id,) = cache.fingerprint_ids()
    assert "eager rejects" in cache.failure(fp_id, sig.key)["reason"]
    rc, out, _ = _cli(capsys, "compile-one", "--trace", str(trace), "--index", "0", "--cache-dir", str(cache_dir))
    assert rc == 1 and out.startswith("failed ")
