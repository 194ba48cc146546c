"""The tests split from tests/unit/test_trace.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import subprocess
import sys

from unit.test_trace import CASES   # the unit tier's bad traces, here through the console entry point


def test_cli_process_bad_trace_no_traceback(tmp_path):
    """The real console entry point in a fresh process: one line on stderr, exit 2."""
    bad = tmp_path / "bad.json"
    bad.write_text(CASES["unknown-op"][0])
    p = subprocess.run([sys.executable, "-m", "aoti_farm", "trace", "validate", str(bad)],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "entries[1].op" in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""
