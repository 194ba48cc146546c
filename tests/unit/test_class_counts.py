"""Every refusal and every edge note has a named class, and the farm's readers count them
alike: warm's summary, ``aoti-farm cache stats`` and the HTML report
(:func:`aoti_farm.cache.failures.tally` / ``refusal_class``; docs/verification.md)."""

from __future__ import annotations

import io
import json

import torch

from aoti_farm import signature as S
from aoti_farm.cache.failures import REFUSAL_CLASSES, refusal_class, tally
from aoti_farm.cache.store import Cache
from aoti_farm.cli import main
from aoti_farm.fingerprint import Fingerprint
from aoti_farm.report.progress import Progress, write_report

STRIDES = ("kernel disagrees with eager: output 0 strides", {"problem": "strides"})
VALUES = ("kernel disagrees with eager at 2 intra-op threads", {"problem": "values"})
PRECISION = ("kernel less accurate than eager on ill-conditioned inputs: large offset", {"problem": "precision"})


def _sig(n):
    return S.from_call(torch.ops.aten.add.Tensor, (torch.empty(n, 4), torch.empty(4)), {})


def _results():
    rows = []
    for i, (reason, ev) in enumerate((STRIDES, VALUES, VALUES, PRECISION)):
        rows.append({"key": f"{i:064x}", "op": "aten::add.Tensor", "status": "failed", "refused": True,
                     "error": reason, "evidence": ev, "seconds": 1.0, "span": [10.0 + i, 11.0 + i]})
    rows.append({"key": "f" * 64, "op": "aten::gelu", "status": "compiled", "seconds": 1.0, "span": [20.0, 21.0],
                 "evidence": {"edge_notes": ["sign of zero", "non-finite inputs"]}})
    rows.append({"key": "e" * 64, "op": "aten::max_pool2d", "status": "compiled", "seconds": 1.0,
                 "span": [22.0, 23.0], "evidence": {"edge_notes": ["sign of zero"]}})
    return rows


def test_each_refusal_reason_has_its_named_class():
    assert refusal_class(*STRIDES) == "layout" and refusal_class(*VALUES) == "values"
    assert refusal_class(*PRECISION) == "precision"
    assert refusal_class("kernel aborts the process where eager raises: SIGABRT") == "aborts"
    assert refusal_class("something new") == "other"
    assert {refusal_class(*STRIDES), refusal_class(*VALUES)} <= set(REFUSAL_CLASSES)


def test_warm_summary_and_the_html_report_count_the_same_classes(tmp_path, capsys):
    rows = _results()
    assert tally(rows) == ({"layout": 1, "values": 2, "precision": 1}, {"sign of zero": 2, "non-finite inputs": 1})
    text = Progress(4, stream=io.StringIO(), tty=False).summary(rows)
    assert "refused by verification (4: layout 1, precision 1, values 2;" in text
    assert "edge notes on 2 published kernel(s)" in text and "non-finite inputs 1, sign of zero 2" in text
    report = tmp_path / "r.json"
    write_report(str(report), rows)
    assert main(["report", str(report), "--html", str(tmp_path / "r.html")]) == 0, capsys.readouterr()
    page = (tmp_path / "r.html").read_text()
    assert "<th>refused by verification</th><td>layout 1, precision 1, values 2</td>" in page
    assert "non-finite inputs 1, sign of zero 2</td>" in page


def test_cache_stats_counts_failures_and_edge_notes_by_class(tmp_path, capsys):
    fp = Fingerprint((("device_type", "cpu"), ("test", "class counts")))   # a namespace; nothing is built
    cache = Cache(tmp_path / "c", signing_key=None)
    for n, (reason, ev) in zip((1, 2, 3), (STRIDES, VALUES, VALUES)):
        cache.record_failure(fp, _sig(n), reason, evidence=ev)
    lib = tmp_path / "kernel.so"
    lib.write_bytes(b"\x7fELF not really")
    for n, notes in ((4, ["sign of zero"]), (5, ["sign of zero", "overflowing magnitudes"]), (6, [])):
        cache.publish(fp, _sig(n), {"kernel.so": str(lib)},
                      {"verification": {"edge_notes": [{"class": c, "case": "x"} for c in notes]}})
    assert main(["cache", "stats", "--cache-dir", str(tmp_path / "c"), "--json"]) == 0
    per = json.loads(capsys.readouterr().out)["fingerprints"][fp.id]
    assert per["failure_classes"] == {"layout": 1, "values": 2}
    assert per["edge_notes"] == {"sign of zero": 2, "overflowing magnitudes": 1}
    assert main(["cache", "stats", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "failures by class: layout 1, values 2" in out
    assert "edge notes (served under contract 'finite', not 'strict'): overflowing magnitudes 1, sign of zero 2" in out
