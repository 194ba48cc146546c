"""A regular (non-editable) install used from inside the checkout.

pyproject maps ``aoti_farm.workers`` -> ``workers/`` and ``aoti_farm.runtime`` -> ``runtime/``.
Ray puts the driver's working directory on its workers' ``sys.path`` and
``scripts/bench/run.py`` puts the checkout root there, so the checkout's ``aoti_farm/``
(which has neither folder) shadowed the installed package: every Ray actor of ``aoti-farm
warm`` died with ``No module named 'aoti_farm.workers'`` and the benchmarks with ``No module
named 'aoti_farm.runtime'``.  ``aoti_farm/__init__.py`` maps both names to the
checkout's sibling folders.

The install is a wheel built offline from a copy of the package's sources into a fresh
venv that sees this venv's dependencies (torch, ray, ...) through a ``.pth`` line, but not
its editable install (whose finder would map the names and hide the bug: a ``.pth`` file
in a directory added by another ``.pth`` line is not run): the ``regular_install`` fixture
(tests/e2e/_install.py).  One real compile (the warm).  The benchmark's whole quick mode runs
from inside the checkout on the same install in tests/e2e/test_bench_smoke.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from _install import clean_env

REPO = Path(__file__).resolve().parents[2]
TRACE = {"format": "aoti-farm-trace", "version": 1, "entries": [
    {"order": 0, "count": 1, "op": "aten::relu",
     "args": [{"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [8, 24], "strides": [24, 1],
               "device": "cpu"}]}]}


@pytest.fixture(scope="module")
def warmed(regular_install, tmp_path_factory):
    """`aoti-farm warm` of a one-signature trace with one CPU worker, started in the checkout."""
    py, script = regular_install
    d = tmp_path_factory.mktemp("warm")
    trace = d / "trace.json"
    trace.write_text(json.dumps(TRACE))
    ray_tmp = tempfile.mkdtemp(prefix="afi", dir="/tmp")   # short: Ray's socket paths live under it
    cache = d / "cache"
    # the console script as pip wrote it, run by the venv's interpreter (its shebang names ours)
    p = subprocess.run([str(py), str(script), "warm", "--model", str(trace), "--cpu-workers", "1",
                        "--cache-dir", str(cache), "--report", str(d / "report.json")],
                       cwd=REPO, env=clean_env(RAY_TMPDIR=ray_tmp), capture_output=True, text=True, timeout=600)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return p, cache, d


@pytest.mark.slow
def test_warm_from_inside_the_checkout(warmed):
    p, cache, d = warmed
    out = p.stdout + p.stderr
    assert "ModuleNotFoundError" not in out, out[-3000:]
    assert p.returncode == 0, out[-3000:]
    rows = json.loads((d / "report.json").read_text())["signatures"]
    assert [r["status"] for r in rows] == ["compiled"], rows
