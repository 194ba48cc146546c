"""The unit tests split from tests/e2e/test_explain.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest

from aoti_farm.cli import main


@pytest.fixture(autouse=True)
def _default_policy(monkeypatch):
    monkeypatch.delenv("AOTI_FARM_SERVE", raising=False)


def test_missing_trace_exit_2(tmp_path, capsys):
    assert main(["explain", "--trace", str(tmp_path / "nope.json"), "--cache-dir", str(tmp_path)]) == 2
    assert "nope.json" in capsys.readouterr().err
