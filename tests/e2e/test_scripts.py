"""The tests split from tests/unit/test_scripts.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SH = sorted(SCRIPTS.rglob("*.sh"))


@pytest.mark.parametrize("path", SH, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_shell_script_parses(path):
    p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
