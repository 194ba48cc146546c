"""The tests split from tests/unit/test_trace.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from aoti_farm import signature as S
from aoti_farm.trace import Trace, TraceEntry

from conftest import sig_add_alpha, sig_mul


def _emb():
    s = S.from_call(torch.ops.aten.embedding.default, (torch.empty(64, 8), torch.zeros(4, 3, dtype=torch.long)), {})
    s.hints["indices"] = {"range": [0, 63]}
    return s


def _trace():
    return Trace([TraceEntry(sig_add_alpha(), 3, 0), TraceEntry(_emb(), 1, 1), TraceEntry(sig_mul(), 2, 2)])


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


def test_cli_process_bad_trace_no_traceback(tmp_path):
    """The real console entry point in a fresh process: one line on stderr, exit 2."""
    bad = tmp_path / "bad.json"
    bad.write_text(CASES["unknown-op"][0])
    p = subprocess.run([sys.executable, "-m", "aoti_farm", "trace", "validate", str(bad)],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "entries[1].op" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""
