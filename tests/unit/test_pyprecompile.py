"""The unit tests split from tests/e2e/test_pyprecompile.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

from aoti_farm import pyprecompile


def test_nothing_starts_where_it_does_not_apply(tmp_path, monkeypatch):
    assert pyprecompile.start(None, n_cpu=16) is None                       # no farm bytecode cache
    assert pyprecompile.start(str(tmp_path), n_cpu=pyprecompile.MIN_CORES - 1) is None
    monkeypatch.setenv("AOTI_FARM_DEV", f"{pyprecompile.DEV}=0")
    assert pyprecompile.start(str(tmp_path), n_cpu=16) is None
    assert list(tmp_path.iterdir()) == []
