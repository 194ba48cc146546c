"""The unit tests split from tests/e2e/test_shapes.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import json

import pytest

from aoti_farm.dynamic import shapes as SH
from aoti_farm import signature as S
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


def _isel(table, n):
    return S.Signature("aten::index_select", (T(table), ("i", 0), T((n,), dt="int64")))


def test_the_size_an_index_selects_from_is_never_a_symbol():
    """The table an index op selects from is pinned (``index_pins``): one class per table
    size, the index's length the symbol.  So the class kernel's index guard (the table's
    size) is one constant for every member."""
    sigs = [_isel(table, n) for table in ((1000, 128), (2, 128), (256, 128)) for n in (16, 40, 64)]
    cls, loose = SH.classes(sigs)
    assert loose == [] and len(cls) == 3
    assert sorted(c.dims for c in cls) == [((2, 128), ("s0",)), ((256, 128), ("s0",)), ((1000, 128), ("s0",))]
    assert all(c.ranges == (("s0", 16, 64),) for c in cls)
    assert SH.index_pins(sigs[0]) == (("self", 0, 1000),)
    # gather from a table as long as its index: the bound varies with the index, so no class
    g = [S.Signature("aten::gather", (T((4, n)), ("i", 1), T((4, n), dt="int64"), ("b", False))) for n in (8, 16)]
    assert [len(c.members) for c in SH.classes(g)[0]] == [1, 1]
    # a float tensor named like an index is not one; an op with no index argument pins nothing
    assert SH.index_pins(add(T((4, 16)), T((4, 16)))) == ()


def test_index_table_names_the_size_that_bounds_each_index_op():
    it = S.index_table
    assert it("aten::embedding", None, {"weight": 2, "indices": 2}, None) == ("weight", 0)
    assert it("aten::index_select", None, {"self": 2, "index": 1}, -1) == ("self", 1)
    assert it("aten::gather", None, {"self": 0, "index": 0}, 0) == ("self", None)      # a 0-dim table: bound 1
    assert it("aten::gather", None, {"self": 2, "index": 2}, 2) is None                  # dim out of range
    assert it("aten::nll_loss_forward", None, {"self": 2, "target": 1}, None) == ("self", 1)
    assert it("aten::nll_loss_forward", None, {"self": 1, "target": 0}, None) == ("self", 0)
    assert it("aten::index.Tensor", 1, {"self": 3}, None) == ("self", 1)
    assert it("aten::index.Tensor", 3, {"self": 3}, None) is None
    assert it("aten::add.Tensor", None, {"self": 2, "other": 2}, None) is None


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


def test_a_non_dense_tensor_is_in_the_strided_layout_class():
    """A slice of a wider buffer is in the strided layout class.  It never merges with a
    dense tensor of the same sizes; slices whose strides differ are one class, the stride
    that varies a symbol."""
    sliced = [add(T((8, 16), (st, 1)), T((8, 16))) for st in (32, 64)]     # rows of wider buffers
    cls, loose = SH.classes(sliced + [add(T((4, 16)), T((4, 16)))])
    assert loose == [] and len(cls) == 2
    c = next(c for c in cls if len(c.members) == 2)
    assert c.dims[0] == (8, 16, "s0", 1) and c.ranges == (("s0", 32, 64),) and c.stride_symbols == {"s0"}
    assert c.bind(add(T((8, 16)), T((8, 16))).args) is None               # dense: another group


def test_gpt2_decode_add_on_a_column_of_a_growing_buffer_is_one_class():
    """GPT-2 decode's int64 ``add([1,1], [2,1])``: the [2,1] operand is the last column of
    the growing [2, n] ids buffer, strides (n, 1), a new stride every step.  The steps form
    one class whose stride is a symbol with the recorded range; an unseen step inside it
    binds (and its point is exactly that call), one outside does not; the sample points
    take the stride to both ends of its range."""
    def step(n):
        return add(T((1, 1), dt="int64"), T((2, 1), (n, 1), dt="int64"))
    (c,), loose = SH.classes([step(n) for n in range(8, 40)])
    assert loose == [] and c.ranges == (("s0", 8, 39),) and c.stride_symbols == {"s0"}
    assert c.dims == ((1, 1), (2, 1, "s0", 1)) and c.strided == (False, True)
    assert c.describe() == "aten::add.Tensor([1,1], [2,1]:(s0,1)) s0=8..39"
    assert c.bind(step(23).args) == {"s0": 23} and c.point({"s0": 23}).key == step(23).key
    assert c.bind(step(40).args) is None and c.bind(step(7).args) is None
    pts = [p["s0"] for p in SH.sample_points(c)]
    assert pts[:2] == [8, 39]
    assert SH.parse_class(json.loads(json.dumps(c.to_obj()))).key == c.key
    # a stride of 0 or 1, or another order of the strides, is another group
    assert c.bind(add(T((1, 1), dt="int64"), T((2, 1), (1, 16), dt="int64")).args) is None
    assert c.bind(add(T((1, 1), dt="int64"), T((2, 1), (0, 1), dt="int64")).args) is None


def test_a_call_whose_elements_overlap_is_not_in_a_class_of_non_overlapping_members():
    """Sizes and strides varying apart: [2, n] rows of stride st.  Inside both ranges, n > st
    makes rows overlap (eager refuses to write to such a tensor, and a kernel would not):
    another group, not served by the class."""
    (c,), _ = SH.classes([add(T((2, n), (st, 1)), T((2, n))) for n, st in ((4, 20), (8, 30), (12, 40))])
    assert c.ranges == (("s0", 4, 12), ("s1", 20, 40))
    assert SH.overlaps((2, 12), (11, 1)) and not SH.overlaps((2, 12), (12, 1)) and not SH.overlaps((2, 1), (8, 1))
    assert c.bind(add(T((2, 10), (25, 1)), T((2, 10))).args) == {"s0": 10, "s1": 25}
    c2 = SH.classes([add(T((2, n), (st, 1)), T((2, n))) for n, st in ((4, 5), (30, 40))])[0][0]
    assert c2.ranges == (("s0", 4, 30), ("s1", 5, 40))
    assert c2.bind(add(T((2, 20), (10, 1)), T((2, 20))).args) is None     # rows overlap


def test_a_stride_always_equal_to_a_size_is_tied_to_it():
    """cat([ids [2,n], column [2,1] of a [2,n] buffer]): the column's stride is n in every
    member, so it shares n's symbol; a call where they differ is outside the class."""
    def step(n, st=None):
        return cat([T((2, n), dt="int64"), T((2, 1), (n if st is None else st, 1), dt="int64")], dim=1)
    (c,), _ = SH.classes([step(n) for n in (8, 9, 12)])
    assert c.dims == ((2, "s0"), (2, 1, "s0", 1)) and c.ranges == (("s0", 8, 12),)
    assert c.bind(step(10).args) == {"s0": 10}
    assert c.bind(step(10, 11).args) is None


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
    assert loose == [] and c.ranges == (("s0", 8, 12),) and c.dims == ((2, 4, "s0", 32), (2, 4, 1, 32, 384, 32, 128, 1))
    assert not c.stride_symbols                          # compiled with constant strides
    unseen = cat([T((2, 4, 11, 32)), new])
    assert c.bind(unseen.args) == {"s0": 11}
    assert c.point({"s0": 11}).key == unseen.key
    # another stride of the new key (another fused width): a fixed stride differs
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
