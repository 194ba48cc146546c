"""The quick form of the differential drill (scripts/drill_differential.py, docs/verification.md):
a representative subset of the corpus (the known divergences, the U-Net var_mean, one
case per risky family) compiled for real in this process, replayed under the hook with
random and adversarial inputs at 1 and N threads, on the native and Python hit paths and
under ``aoti_farm.record``.  It fails on any WRONG line and prints them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aoti_farm.runtime import drill

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "drill_differential.py"


def test_quick_drill_has_no_wrong_results(tmp_path):
    plan = drill.Plan(quick=True, ray=False, log=lambda s: print(s, file=sys.stderr))
    n_wrong, rows, summary = drill.run(plan, out_dir=str(tmp_path / "log"))
    for name, _, line, _ in rows:
        print(f"{name}: {line}")
    print(summary)
    assert {r[0] for r in rows} == {c.name for c in drill.select(plan)}
    # the drill serves: one that declines every call proves nothing.  Each case with a
    # published kernel is served at least once, right or wrong (where the serving conditions
    # hold: a call under another default dtype is correctly declined); a case whose compile
    # verification refused (no kernel published) can only be declined
    doc = json.loads((tmp_path / "log" / "drill.json").read_text())
    published = {r["case"] for r in doc["cases"] if r["published"]}
    compiled = {c.name for c in drill.select(plan) if c.compile}
    assert published and published <= compiled, doc["cases"]
    unserved = [(name, line) for name, _, line, n in rows if name in published and n == 0]
    assert not unserved, unserved
    wrong = [f"{name}: {line}" for name, status, line, _ in rows if status == drill.WRONG]
    assert not wrong, f"{len(wrong)} WRONG op-cases:\n" + "\n".join(wrong)


@pytest.mark.parametrize("argv, needle", [(["--bogus"], "unrecognized arguments"),
                                          (["--threads", "0"], "--threads"),
                                          (["--device", "tpu"], "--device")])
def test_bad_flag_is_one_line_and_exit_2(argv, needle):
    p = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr
