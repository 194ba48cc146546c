"""`aoti-farm trace show` never prints two different signatures identically: where two
differ only by strides (a slice of a wider buffer vs a dense tensor), both are shown with
their tensors' strides; other signatures keep the short form."""

from __future__ import annotations

from aoti_farm.signature import Signature
from aoti_farm.trace import Trace, TraceEntry, save_trace


def T(sizes, strides, dt="float32"):
    return ("T", dt, tuple(sizes), tuple(strides), "cpu")


def test_signatures_differing_by_strides_show_them(tmp_path, capsys):
    from aoti_farm.cli import main

    dense = Signature("aten::add.Tensor", (T((2, 8), (8, 1)), T((2, 8), (8, 1)), ("i", 1)))
    sliced = Signature("aten::add.Tensor", (T((2, 8), (40, 1)), T((2, 8), (8, 1)), ("i", 1)))
    other = Signature("aten::add.Tensor", (T((4, 8), (8, 1)), T((4, 8), (8, 1)), ("i", 1)))
    assert len({dense.key, sliced.key, other.key}) == 3
    p = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate((dense, sliced, other))]), p)
    assert main(["trace", "show", str(p)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "aten::add.Tensor(" in ln]
    assert len(lines) == 3
    assert "float32[2, 8]/[8, 1]" in lines[0] and "float32[2, 8]/[40, 1]" in lines[1], lines
    assert "/[" not in lines[2] and "float32[4, 8]" in lines[2], lines
    assert len({ln.split("  ", 2)[-1] for ln in lines}) == 3
