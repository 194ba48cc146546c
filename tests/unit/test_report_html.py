"""The unit tests split from tests/e2e/test_report_html.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

from aoti_farm.cli import main


def test_report_bad_input_exit_2(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text('{"format": "something-else"}')
    assert main(["report", str(p), "--html", str(tmp_path / "o.html")]) == 2
    assert "aoti-farm-warm-report" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "none.json"), "--html", str(tmp_path / "o.html")]) == 2
    assert not (tmp_path / "o.html").exists()


def test_a_report_whose_evidence_holds_infinities_is_read_by_report(tmp_path, capsys):
    """A refusal's evidence may hold eager's inf or NaN; warm's report is strict JSON
    (``"inf"``/``"nan"`` as strings), so ``aoti-farm report`` reads it, while a report
    that holds the bare ``Infinity`` token is still refused (a hostile one would draw
    without end)."""
    import json

    from aoti_farm.report.progress import write_report
    from aoti_farm.report.report_html import load_report

    path = tmp_path / "r.json"
    write_report(str(path), [{"key": "k" * 64, "op": "aten::gelu", "status": "failed", "seconds": 1.0,
                              "span": [100.0, 101.0], "evidence": {"eager": float("inf"), "kernel": float("nan"),
                                                                   "pair": (float("-inf"), 2.0)}}])
    doc = load_report(str(path))
    assert doc["signatures"][0]["evidence"] == {"eager": "inf", "kernel": "nan", "pair": ["-inf", 2.0]}
    assert main(["report", str(path), "--html", str(tmp_path / "r.html")]) == 0, capsys.readouterr()
    raw = json.loads(path.read_text())
    raw["signatures"][0]["seconds"] = float("inf")
    path.write_text(json.dumps(raw))
    assert main(["report", str(path), "--html", str(tmp_path / "r2.html")]) == 2
