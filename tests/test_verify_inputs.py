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
    from aoti_farm.tolerance import compare

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
