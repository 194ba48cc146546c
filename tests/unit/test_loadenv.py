"""The unit tests split from tests/e2e/test_loadenv.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest

from aoti_farm.startup import loadenv

pytestmark = pytest.mark.skipif(loadenv.system_libstdcxx() is None, reason="no system libstdc++ to preload")


def test_child_env_adds_the_preload(monkeypatch):
    monkeypatch.setenv("AOTI_FARM_PRELOAD_LIBSTDCXX", "1")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert loadenv.child_env()["LD_PRELOAD"].startswith(loadenv.system_libstdcxx())
    assert not loadenv.load_safe()
    monkeypatch.setenv("AOTI_FARM_PRELOAD_LIBSTDCXX", "0")
    assert "LD_PRELOAD" not in loadenv.child_env()
    assert loadenv.load_safe()
