"""The tests split from tests/unit/test_cli.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from aoti_farm.trace import Trace, TraceEntry, save_trace

from conftest import sig_add_alpha, sig_mul


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


def _cli(capsys, *argv):
    from aoti_farm.cli import main

    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# the fingerprint runs the ISA probe (a child process) on a host that has no memo yet
def test_key_prints_fields_key_and_fingerprint(tmp_path, capsys):
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.signature import key_fields

    sig = sig_add_alpha()
    t = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig_mul(), 1, 0), TraceEntry(sig, 2, 1)]), t)
    rc, out, _ = _cli(capsys, "key", "--trace", str(t), "--index", "1", "--json")
    d = json.loads(out)
    fp = fingerprint("cpu")
    assert rc == 0 and d["key"] == sig.key and d["fingerprint_id"] == fp.id
    assert d["key_fields"] == json.loads(json.dumps(key_fields(sig.op, sig.args)))
    assert d["fingerprint"]["device_type"] == "cpu"
    rc, out, _ = _cli(capsys, "key", "--trace", str(t), "--index", "1")
    assert rc == 0 and sig.key in out and fp.id in out and "arg2 (alpha)" in out and '["i", 2]' in out
