"""The tests split from tests/unit/test_signature.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import sig_add_alpha

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_key_is_stable_across_processes():
    sig = sig_add_alpha()
    code = (
        "import warnings; warnings.filterwarnings('ignore');"
        f"import sys, torch; sys.path.insert(0, {TESTS!r});"
        "from conftest import sig_add_alpha; print(sig_add_alpha().key)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == sig.key
    assert len(sig.key) == 64 and int(sig.key, 16) >= 0
