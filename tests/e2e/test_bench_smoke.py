"""Smoke test of the benchmark runner: ``scripts/bench/run.py --quick`` runs end to end,
prints its tables and writes its JSON.  No timing is asserted (CI machines are noisy);
the numbers only matter in full mode on a quiet machine.

The hit-path kernel comes from the session cache (``kernels`` fixture).  Quick mode still
runs every code path on one signature each (real compiles): warm (upstream's loop and the
farm at W=1), cold-start serving from an empty cache, miss -> hit with the compile worker
ready, and the payoff suite (one op, hooked vs eager in one process).

It runs as a user with a regular (non-editable) install does, from inside the checkout
(``regular_install``, tests/e2e/_install.py): the runner puts the checkout root on sys.path
and its Ray actors start in the checkout, where ``aoti_farm/`` has no ``workers/`` or
``runtime/`` of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _install import clean_env
from conftest import sig_mul

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "scripts" / "bench" / "run.py"
sys.path.insert(0, str(RUN.parent))
from run import NAMES as BENCHES  # noqa: E402  -- every benchmark the runner has


@pytest.mark.slow
def test_bench_quick_runs_end_to_end(kernels, regular_install, tmp_path):
    out = kernels.ensure(sig_mul())
    assert out.status in ("compiled", "cached"), out
    kcache = kernels.copy_to(tmp_path / "kernels")
    res = tmp_path / "bench.json"
    py, _ = regular_install
    p = subprocess.run([str(py), str(RUN), "--quick", "--json", str(res), "--workdir", str(tmp_path / "w"),
                        "--kernel-cache", str(kcache.root)],
                       cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert "ModuleNotFoundError" not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
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
    b = data["benchmarks"]
    # the compile-heavy paths ran too, each on one signature
    warm = b["warm"]
    assert warm["unique"] == 1 and warm["farm"]["1"]["rc"] == 0, warm.get("farm")
    assert [s["ok"] for s in warm["upstream"]["per_sig"]] == [True], warm["upstream"]
    cold = b["cold"]
    assert cold["hook"]["requests"] > 0 and cold["eager"]["requests"] > 0, cold
    m2h = b["miss2hit"]["worker ready"]
    assert m2h.get("miss_to_hit_s") is not None, m2h          # the miss became a hit
    pay = b["payoff"]
    assert pay["compile"]["statuses"] == {"compiled": 1}, pay["compile"]
    op = pay["ops"]["add, transposed input"]
    assert op["eager_us"] > 0 and op["hook_us"] > 0 and pay["hook"]["kernel_errors"] == 0, pay


def test_bench_only_rejects_unknown_names():
    p = subprocess.run([sys.executable, str(RUN), "--quick", "--only", "nope"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown benchmark" in p.stderr
