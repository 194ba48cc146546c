"""The unit tests split from tests/e2e/test_recorder.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest
import torch

import aoti_farm
from aoti_farm import signature as S
from aoti_farm.trace import load_trace


def test_record_counts_order_ranges_and_same_keys_as_hook(tmp_path):
    x = torch.randn(10, 5)
    idx = torch.tensor([3, 9, 1])
    path = tmp_path / "t.json"
    with aoti_farm.record(path) as rec:
        torch.add(x, x, alpha=2)
        x * 2.5                                            # number-as-tensor: not servable
        torch.index_select(x, 0, idx)
        torch.index_select(x, 0, torch.tensor([0, 20 - 16, 2]))
        torch.add(x, x, alpha=2)
        torch.cat([x, x])
        torch.relu(torch.randn(3, requires_grad=True))     # requires_grad: not servable
    t = load_trace(path)
    ops = [e.sig.op for e in t]
    assert ops == ["aten::add.Tensor", "aten::index_select", "aten::cat"], ops
    add, sel, cat = t.entries
    assert (add.count, sel.count, cat.count) == (2, 2, 1)
    assert [e.order for e in t] == [0, 1, 2]
    assert sel.sig.hints == {"index": {"range": [0, 9]}}
    assert add.key == S.from_call(torch.ops.aten.add.Tensor, (x, x), {"alpha": 2}).key
    assert cat.key == S.from_call(torch.ops.aten.cat.default, ([x, x],), {}).key
    assert rec.skipped.get("requires_grad", 0) >= 1
    assert any("expected a tensor" in r for r in rec.skipped)
    print(f"recorded {len(t)} signatures; skipped {rec.skipped}")


def test_record_writes_even_when_the_block_raises(tmp_path):
    path = tmp_path / "t.json"
    with pytest.raises(ZeroDivisionError):
        with aoti_farm.record(path):
            torch.neg(torch.ones(2))
            1 / 0
    assert [e.sig.op for e in load_trace(path)] == ["aten::neg"]
