"""The unit tests split from tests/e2e/test_launch.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import argparse
import sys

import pytest

from aoti_farm.errors import UserError
from aoti_farm.runtime import launch


def _ns(add, argv):
    """``argv`` parsed by the arguments ``add`` declares (``launch.add_run_args``, ``add_record_args``)."""
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_run_refuses_a_stats_folder_that_does_not_exist(tmp_path, monkeypatch):
    """Bad input, caught before the program starts: one line naming it and the fix."""
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("AOTI_FARM_HOOK_STATS", str(missing))
    marker = tmp_path / "ran"
    ns = _ns(launch.add_run_args, ["--cache-dir", str(tmp_path / "c"), "--on-miss", "ignore", "--", sys.executable,
                                   "-c", f"open({str(marker)!r}, 'w').close()"])
    with pytest.raises(UserError, match="AOTI_FARM_HOOK_STATS") as e:
        launch.run_command(ns)
    assert str(missing) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()

