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
