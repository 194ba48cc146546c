"""The unit tests split from tests/e2e/test_compiler.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import os

import torch

from aoti_farm.cli import main
from aoti_farm.compile.tolerance import compare
from aoti_farm.trace import load_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "configs", "examples", "mlp_trace.json")


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_compare_reports_each_kind_of_mismatch():
    x = torch.randn(4, 5)
    assert compare(x, [x.clone()]) is None
    assert compare(x, [x.double()])["problem"] == "dtype"
    assert compare(x, [x[:3]])["problem"] == "shape"
    assert compare(x, [x.t().contiguous().t()])["problem"] == "strides"
    nan = x.clone()
    nan[1, 2] = float("nan")
    assert compare(x, [nan]) == {"output": 0, "problem": "NaN where eager has a number", "flat_index": 7}
    off = x.clone()
    off[3, 4] += 1.0
    bad = compare(x, [off])
    assert bad["problem"] == "values" and bad["first_index"] == 19 and bad["mismatched"] == 1
    assert compare(x, [x, x])["problem"] == "output count"
    ints = torch.arange(6)
    assert compare(ints, [ints + (ints == 5)])["first_index"] == 5


def test_example_trace_validates(capsys):
    t = load_trace(EXAMPLE)
    assert 6 <= len(t) <= 12, len(t)
    assert all(e.sig.device == "cpu" and e.count >= 1 for e in t)
    # the embedding's lookup was recorded with the index values seen, so example inputs
    # built from the trace are valid indices
    idx = [e for e in t if any(a[0] == "T" and a[1] == "int64" for a in e.sig.args)]
    assert idx and all(any("range" in h for h in e.sig.hints.values()) for e in idx)
    lo, hi = next(h["range"] for h in idx[0].sig.hints.values() if "range" in h)
    assert 0 <= lo <= hi < 64
    rc, out, _ = _cli(capsys, "trace", "validate", EXAMPLE)
    assert rc == 0 and f"{len(t)} unique signatures" in out
