"""The tests split from tests/unit/test_cli.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import os
import subprocess
import sys


def test_help_imports_neither_torch_nor_ray():
    code = ("import sys\nfrom aoti_farm.cli import main\n"
            "rc = main(['--help'])\n"
            "print('LOADED', 'torch' in sys.modules, 'ray' in sys.modules, rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip().splitlines()[-1] == "LOADED False False 0"
    for cmd in ("warm", "serve", "run", "record", "trace", "key", "compile-one", "cache", "bench"):
        assert cmd in p.stdout


def test_console_script_and_module_agree():
    exe = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    a = subprocess.run([exe, "--version"], capture_output=True, text=True)
    b = subprocess.run([sys.executable, "-m", "aoti_farm", "--version"], capture_output=True, text=True)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and "aoti-farm 0.1.0" in a.stdout


def test_bench_subcommand_forwards_to_the_suite():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "aoti_farm", "bench", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--quick" in r.stdout and "--only" in r.stdout, r.stderr[-500:]
