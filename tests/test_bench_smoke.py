"""Smoke test of the benchmark runner: ``scripts/bench/run.py --quick`` runs end to end,
prints its tables and writes its JSON.  No timing is asserted (CI machines are noisy);
the numbers only matter in full mode on a quiet machine.

The kernel it needs comes from the session cache (``kernels`` fixture), so the run itself
compiles nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import sig_mul

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "scripts" / "bench" / "run.py"
BENCHES = ("warm", "rerun", "hit", "miss", "cold", "startup", "miss2hit")


@pytest.mark.slow
def test_bench_quick_runs_end_to_end(kernels, tmp_path):
    out = kernels.ensure(sig_mul())
    assert out.status in ("compiled", "cached"), out
    kcache = kernels.copy_to(tmp_path / "kernels")
    res = tmp_path / "bench.json"
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
    p = subprocess.run([sys.executable, str(RUN), "--quick", "--json", str(res), "--workdir", str(tmp_path / "w"),
                        "--kernel-cache", str(kcache.root)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(res.read_text())
    # the machine is named, the run is dated, and every benchmark reported something
    for k in ("platform", "cpu_count", "cpu_model", "date", "torch"):
        assert data["machine"][k], k
    assert data["mode"] == "quick"
    assert set(data["benchmarks"]) == set(BENCHES)
    errors = {n: b["error"] for n, b in data["benchmarks"].items() if "error" in b}
    assert not errors, errors
    assert p.returncode == 0, p.stderr[-3000:]
    assert "== summary" in p.stdout
    # the baseline is re-measured in the same run
    hit = data["benchmarks"]["hit"]["signatures"][0]
    assert all(hit["ab"]["us"][m] > 0 for m in ("eager", "upstream", "hook")), hit["ab"]
    assert hit["ab"]["matches_eager"] == {"upstream": True, "hook": True}
    assert data["summary"], "no targets were compared"


def test_bench_only_rejects_unknown_names():
    p = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "nope"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown benchmark" in p.stderr
