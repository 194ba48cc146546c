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
