"""scripts/bench/scaling.py --combine: a comparison from runs measured by separate
invocations (W=1 on a big job outlasts one command on a lent machine).  Arithmetic and
refusals only; the runs themselves are real in the benchmark, never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench" / "scaling.py"


def _part(path: Path, workers: int, wall: float, sha: str = "ab" * 32, cpu: str = "Xeon") -> str:
    run = {"label": f"w{workers}", "workers": workers, "rc": 0, "wall_s": wall, "compile_s": {"median": 5.0}}
    machine = {"platform": "Linux", "cpu_count": 64, "cpu_model": cpu, "python": "3.12", "torch": "2.11",
               "date": f"2026-11-27T06:{workers:02d}:00+00:00", "loadavg_at_start": [workers / 10, 0, 0]}
    path.write_text(json.dumps({"machine": machine,
                                "job": {"source": "t", "signatures": 169, "trace_sha256": sha}, "runs": [run]}))
    return str(path)


def _combine(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), "--combine", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_combine_compares_runs_of_one_trace(tmp_path):
    a, b = _part(tmp_path / "a.json", 64, 20.0), _part(tmp_path / "b.json", 1, 800.0)
    p = subprocess.run([sys.executable, str(SCRIPT), "--combine", a, b, "--json", str(tmp_path / "c.json")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "c.json").read_text())
    assert [r["workers"] for r in out["runs"]] == [64, 1]
    assert out["speedup"] == 40.0 and out["farm_scaling"] == 800.0 / (64 * 20.0)
    assert "speed-up W=1 / W=64: 40.00x" in p.stdout


def test_combine_refuses_runs_of_different_traces_or_hosts(tmp_path):
    a = _part(tmp_path / "a.json", 64, 20.0)
    for other in (_part(tmp_path / "b.json", 1, 800.0, sha="cd" * 32),
                  _part(tmp_path / "c.json", 1, 800.0, cpu="EPYC")):
        p = _combine(a, other, cwd=tmp_path)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert p.stderr.strip().count("\n") == 0 and "--combine" in p.stderr
    (tmp_path / "bad.json").write_text("{")
    p = _combine(a, str(tmp_path / "bad.json"), cwd=tmp_path)
    assert p.returncode != 0 and "Traceback" not in p.stderr and "bad.json" in p.stderr
