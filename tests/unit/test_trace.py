"""trace.json: round trip, merge, and every validation error as one line, exit 2.

The tests of this module that compile, start Ray or start processes are in tests/e2e/test_trace.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cli import main
from aoti_farm.errors import UserError
from aoti_farm.trace import Trace, TraceEntry, load_trace, merge, save_trace

from conftest import sig_add_alpha, sig_mul

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, "configs", "trace.schema.json")
EXAMPLE = os.path.join(ROOT, "configs", "examples", "mlp_trace.json")


def _emb():
    s = S.from_call(torch.ops.aten.embedding.default, (torch.empty(64, 8), torch.zeros(4, 3, dtype=torch.long)), {})
    s.hints["indices"] = {"range": [0, 63]}
    return s


def _trace():
    return Trace([TraceEntry(sig_add_alpha(), 3, 0), TraceEntry(_emb(), 1, 1), TraceEntry(sig_mul(), 2, 2)])


def test_round_trip(tmp_path):
    p = tmp_path / "t.json"
    t = _trace()
    save_trace(t, p)
    doc = json.loads(p.read_text())
    assert doc["format"] == "aoti-farm-trace" and doc["version"] == 1
    assert doc["entries"][0]["args"] == sig_add_alpha().to_obj()["args"]
    assert doc["entries"][1]["args"][1]["range"] == [0, 63]
    back = load_trace(p)
    assert [(e.key, e.count, e.order) for e in back] == [(e.key, e.count, e.order) for e in t]
    assert back[1].sig.hints == {"indices": {"range": [0, 63]}}
    save_trace(back, tmp_path / "u.json")
    assert (tmp_path / "u.json").read_text() == p.read_text()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_merge_dedupes_sums_counts_keeps_first_seen_order():
    a = Trace([TraceEntry(sig_mul(), 2, 0), TraceEntry(sig_add_alpha(), 1, 1)])
    emb2 = _emb()
    emb2.hints["indices"] = {"range": [5, 70]}
    b = Trace([TraceEntry(emb2, 4, 0), TraceEntry(sig_mul(), 5, 1)])
    c = Trace([TraceEntry(_emb(), 1, 0)])
    m = merge([a, b, c])
    assert [e.key for e in m] == [sig_mul().key, sig_add_alpha().key, _emb().key]
    assert [e.count for e in m] == [7, 1, 5]
    assert [e.order for e in m] == [0, 1, 2]
    assert m[2].sig.hints["indices"]["range"] == [0, 70]  # widened to cover both
    assert a[0].count == 2  # inputs untouched


def test_trace_merge_cli(tmp_path, capsys):
    p1, p2, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    save_trace(Trace([TraceEntry(sig_mul(), 2, 0)]), p1)
    save_trace(Trace([TraceEntry(sig_add_alpha(), 1, 0), TraceEntry(sig_mul(), 1, 1)]), p2)
    assert main(["trace", "merge", str(out), str(p1), str(p2)]) == 0
    m = load_trace(out)
    assert [(e.key, e.count) for e in m] == [(sig_mul().key, 3), (sig_add_alpha().key, 1)]
    out2 = tmp_path / "m2.json"
    assert main(["trace", "merge", "--out", str(out2), str(p2)]) == 0
    assert len(load_trace(out2)) == 2


def _good_doc():
    return _trace().to_obj()


def _bad(mutate):
    doc = _good_doc()
    mutate(doc)
    return json.dumps(doc)


# name -> (file text, words that must appear in the one-line message)
CASES = {
    "malformed-json": ('{"format": "aoti-farm-trace", "version": 1, "entries": [', ["malformed JSON", "line 1"]),
    "not-utf8": (b"\xff\xfe{}", ["UTF-8"]),
    "top-level-list": ("[]", ["top level"]),
    "wrong-format": (_bad(lambda d: d.update(format="torch-trace")), ["'format'", "torch-trace"]),
    "wrong-version": (_bad(lambda d: d.update(version=2)), ["'version'", "2", "re-record"]),
    "entries-not-list": (_bad(lambda d: d.update(entries={})), ["'entries'"]),
    "unknown-op": (_bad(lambda d: d["entries"][1].update(op="aten::no_such_op")),
                   ["entries[1].op", "no_such_op"]),
    "unknown-overload": (_bad(lambda d: d["entries"][0].update(op="aten::add.NoSuchOverload")),
                         ["entries[0].op", "NoSuchOverload"]),
    "unqualified-op": (_bad(lambda d: d["entries"][0].update(op="add")), ["entries[0].op"]),
    "ineligible-op": (_bad(lambda d: d["entries"][0].update(op="aten::add_.Tensor")),
                      ["entries[0].op", "never be served"]),
    "arg-unknown-name": (_bad(lambda d: d["entries"][2]["args"][1].update(name="bogus")),
                         ["entries[2].args[1].name", "bogus"]),
    "arg-kind-mismatch": (_bad(lambda d: d["entries"][0]["args"][2].update(kind="str", value="x")),
                          ["entries[0].args[2]", "schema"]),
    "arg-missing-required": (_bad(lambda d: d["entries"][2]["args"].pop(1)), ["entries[2].args", "other"]),
    "arg-bad-dtype": (_bad(lambda d: d["entries"][0]["args"][0].update(dtype="float99")),
                      ["entries[0].args[0].dtype", "float99"]),
    "negative-size": (_bad(lambda d: d["entries"][0]["args"][0].update(sizes=[8, -16])),
                      ["entries[0].args[0].sizes", "negative"]),
    "absurd-size": (_bad(lambda d: d["entries"][0]["args"][0].update(sizes=[1 << 20, 1 << 20])),
                    ["entries[0].args[0].sizes", "limit"]),
    "absurd-strides": (_bad(lambda d: d["entries"][0]["args"][0].update(strides=[1 << 40, 1])),
                       ["entries[0].args[0].strides", "limit"]),
    "absurd-rank": (_bad(lambda d: d["entries"][0]["args"][0].update(sizes=[1] * 100, strides=[1] * 100)),
                    ["entries[0].args[0].sizes", "dimensions"]),
    "strides-rank": (_bad(lambda d: d["entries"][0]["args"][0].update(strides=[1])),
                     ["entries[0].args[0].strides"]),
    "bad-count": (_bad(lambda d: d["entries"][1].update(count=0)), ["entries[1].count"]),
    "unknown-entry-field": (_bad(lambda d: d["entries"][1].update(colour="red")), ["entries[1]", "colour"]),
    "bad-range": (_bad(lambda d: d["entries"][1]["args"][1].update(range=[9, 1])),
                  ["entries[1].args[1].range"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validation_error_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    text, words = CASES[case]
    bad = tmp_path / "bad.json"
    (bad.write_bytes if isinstance(text, bytes) else bad.write_text)(text)
    with pytest.raises(UserError) as ei:
        load_trace(bad)
    msg = str(ei.value)
    assert "\n" not in msg and str(bad) in msg
    for w in words:
        assert w in msg, (w, msg)
    capsys.readouterr()
    assert main(["trace", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aoti-farm: error: trace ") and str(bad) in err
    assert "Traceback" not in err
    # merging a good trace with the bad one writes nothing
    good, out = tmp_path / "good.json", tmp_path / "out.json"
    save_trace(_trace(), good)
    before = sorted(os.listdir(tmp_path))
    assert main(["trace", "merge", str(out), str(good), str(bad)]) == 2
    assert sorted(os.listdir(tmp_path)) == before and not out.exists()


def test_missing_file_and_directory(tmp_path, capsys):
    assert main(["trace", "validate", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["trace", "show", str(tmp_path)]) == 2
    assert "directory" in capsys.readouterr().err


def _schema_validator():
    jsonschema = pytest.importorskip("jsonschema")
    with open(SCHEMA) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_accepts_what_we_write_and_the_example(tmp_path):
    v = _schema_validator()
    p = tmp_path / "t.json"
    clamp = S.from_call(torch.ops.aten.clamp.default, (torch.empty(3), None, float("inf")), {})
    cat = S.from_call(torch.ops.aten.cat.default, ([torch.empty(2, 3), torch.empty(4, 3)],), {"dim": 0})
    save_trace(Trace(list(_trace()) + [TraceEntry(clamp, 1, 3), TraceEntry(cat, 1, 4)]), p)
    v.validate(json.loads(p.read_text()))
    with open(EXAMPLE) as f:
        v.validate(json.load(f))


def test_schema_rejects_what_load_trace_rejects():
    v = _schema_validator()
    for case in ("wrong-format", "wrong-version", "negative-size", "bad-count", "unknown-entry-field",
                 "arg-bad-dtype", "top-level-list"):
        assert not v.is_valid(json.loads(CASES[case][0])), case
