"""The unit tests split from tests/e2e/test_shapes.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import json

import pytest

from aoti_farm import shapes as SH, signature as S
from aoti_farm.errors import UserError


def T(sizes, strides=None, dt="float32"):
    if strides is None:
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.insert(0, acc)
            acc *= s
    return ("T", dt, tuple(sizes), tuple(strides), "cpu")


def add(a, b, alpha=1):
    return S.Signature("aten::add.Tensor", (a, b, ("i", alpha)))


# --- grouping (pure) ---------------------------------------------------------------------------


def test_signatures_differing_only_in_sizes_form_one_class_with_observed_ranges():
    sigs = [add(T((n, 16)), T((n, 16))) for n in (4, 8, 12)]
    cls, loose = SH.classes(sigs)
    assert loose == [] and len(cls) == 1
    c = cls[0]
    assert c.dims == (("s0", 16), ("s0", 16))          # the dim that varies, tied across both inputs
    assert c.ranges == (("s0", 4, 12),)
    assert c.key not in {s.key for s in sigs}
    assert SH.distinct_shapes(c) == 3
    # two dims varying independently get two symbols
    c2 = SH.classes([add(T((n, m)), T((n, m))) for n, m in ((4, 8), (8, 8), (8, 32))])[0][0]
    assert c2.ranges == (("s0", 4, 8), ("s1", 8, 32))


@pytest.mark.parametrize("other,why", [
    (add(T((16, 8), (1, 16)), T((16, 8), (1, 16))), "stride order (a transposed layout)"),
    (add(T((8, 16), (0, 1)), T((8, 16))), "a broadcast (stride-0) dim"),
    (add(T((1, 16)), T((1, 16))), "a dim of size 1"),
    (add(T((8, 16), dt="float64"), T((8, 16), dt="float64")), "dtype"),
    (add(T((8, 16)), T((8, 16)), alpha=2), "a non-tensor argument"),
    (add(T((2, 4, 16)), T((2, 4, 16))), "rank"),
])
def test_layout_and_argument_classes_never_merge(other, why):
    base = [add(T((n, 16)), T((n, 16))) for n in (4, 12)]
    cls, _ = SH.classes(base + [other])
    assert len(cls) == 2, why
    big = next(c for c in cls if len(c.members) == 2)
    assert big.bind(other.args) is None, why


def test_a_non_dense_tensor_has_its_strides_as_layout_class():
    """A slice of a wider buffer is in the strided layout class: its exact strides.  It
    never merges with a dense tensor of the same sizes, nor with other strides."""
    sliced = add(T((8, 16), (32, 1)), T((8, 16)))      # rows of a wider buffer
    cls, loose = SH.classes([sliced, add(T((4, 16)), T((4, 16))), add(T((8, 16), (64, 1)), T((8, 16)))])
    assert loose == [] and len(cls) == 3


def cat(tensors, dim=2):
    return S.Signature("aten::cat", (("TL", tuple(tensors)), ("i", dim)))


def test_kv_cache_decode_steps_form_one_class_with_fixed_strides():
    """GPT-2 decode's KV-cache append: the past [2,4,n,32] grows, the new key is one of
    q/k/v split from a fused projection (strides (384,32,128,1), not dense); and a slice
    [2,4,n,32] of a preallocated [2,4,64,32] buffer: its strides stay the buffer's while n
    varies.  Each forms one class; a point keeps the strided tensor's strides."""
    new = T((2, 4, 1, 32), (384, 32, 128, 1))
    steps = [cat([T((2, 4, n, 32)), new]) for n in (8, 9, 10, 12)]
    (c,), loose = SH.classes(steps)
    assert loose == [] and c.ranges == (("s0", 8, 12),) and c.dims == ((2, 4, "s0", 32), (2, 4, 1, 32))
    unseen = cat([T((2, 4, 11, 32)), new])
    assert c.bind(unseen.args) == {"s0": 11}
    assert c.point({"s0": 11}).key == unseen.key
    # another stride of the new key (another fused width) is another group
    assert c.bind(cat([T((2, 4, 11, 32)), T((2, 4, 1, 32), (768, 32, 256, 1))]).args) is None
    buf = (8192, 2048, 32, 1)                           # [2,4,64,32] contiguous
    sl = [add(T((2, 4, n, 32), buf), T((2, 4, n, 32))) for n in (8, 16, 24)]
    (c2,), _ = SH.classes(sl)
    assert c2.ranges == (("s0", 8, 24),)
    p = c2.point({"s0": 13})
    assert p.args[0][2:4] == ((2, 4, 13, 32), buf) and p.args[1][3] == (1664, 416, 32, 1)
    assert c2.bind(add(T((2, 4, 13, 32), buf), T((2, 4, 13, 32))).args) == {"s0": 13}
    # the same sizes, dense, are not in it
    assert c2.bind(add(T((2, 4, 13, 32)), T((2, 4, 13, 32))).args) is None
    assert SH.parse_class(json.loads(json.dumps(c2.to_obj()))).key == c2.key


def test_range_check_at_both_edges_and_one_past_them():
    c = SH.classes([add(T((n, 16)), T((n, 16))) for n in (4, 9, 12)])[0][0]
    assert c.bind(add(T((4, 16)), T((4, 16))).args) == {"s0": 4}
    assert c.bind(add(T((12, 16)), T((12, 16))).args) == {"s0": 12}
    assert c.bind(add(T((7, 16)), T((7, 16))).args) == {"s0": 7}        # unseen, inside
    assert c.bind(add(T((3, 16)), T((3, 16))).args) is None             # one below
    assert c.bind(add(T((13, 16)), T((13, 16))).args) is None           # one above
    assert c.bind(add(T((7, 16)), T((8, 16))).args) is None             # tied dims disagree
    assert c.bind(add(T((7, 17)), T((7, 17))).args) is None             # a fixed dim differs


def test_class_round_trips_and_its_key_covers_the_ranges():
    c = SH.classes([add(T((n, 16)), T((n, 16))) for n in (4, 12)])[0][0]
    obj = json.loads(json.dumps(c.to_obj()))
    assert SH.parse_class(obj).key == c.key
    obj["ranges"][0][2] = 64
    assert SH.parse_class(obj).key != c.key
    obj["example"]["args"][0]["sizes"] = [3, 16]
    with pytest.raises(ValueError, match="not a member"):
        SH.parse_class(obj)


def test_sample_points_cover_both_ends_an_odd_size_and_the_interior():
    c = SH.classes([add(T((n, 16)), T((n, 16))) for n in (8, 24, 40)])[0][0]
    pts = [p["s0"] for p in SH.sample_points(c, n_random=3)]
    assert pts[0] == 8 and pts[1] == 40
    assert any(v % 2 for v in pts)
    assert sum(8 < v < 40 for v in pts) >= 3
    assert {8, 24, 40} <= set(pts)


def test_trace_show_classes(tmp_path, capsys):
    from aoti_farm.cli import main
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    p = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(add(T((n, 16)), T((n, 16))) for n in (4, 8))]), p)
    assert main(["trace", "show", "--classes", str(p)]) == 0
    out = capsys.readouterr().out
    assert "s0=4..8" in out and "1 with varying sizes" in out


def test_dynamic_mode_is_validated(monkeypatch):
    from aoti_farm.config import FarmConfig, resolve

    assert resolve(FarmConfig, env={"AOTI_FARM_DYNAMIC": "auto"}).dynamic == "auto"
    with pytest.raises(UserError, match="dynamic"):
        resolve(FarmConfig, env={"AOTI_FARM_DYNAMIC": "sometimes"})
