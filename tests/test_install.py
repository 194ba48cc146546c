"""A regular (non-editable) install used from inside the checkout.

pyproject maps ``aoti_farm.workers`` -> ``workers/`` and ``aoti_farm.runtime`` -> ``runtime/``.
Ray puts the driver's working directory on its workers' ``sys.path`` and
``scripts/bench/run.py`` puts the checkout root there, so the checkout's ``aoti_farm/``
(which has neither folder) shadowed the installed package: every Ray actor of ``aoti-farm
warm`` died with ``No module named 'aoti_farm.workers'`` and the benchmarks with ``No module
named 'aoti_farm.runtime'`` (issue 14).  ``aoti_farm/__init__.py`` maps both names to the
checkout's sibling folders.

The install is a wheel built offline from a copy of the package's sources into a fresh
venv that sees this venv's dependencies (torch, ray, ...) through a ``.pth`` line, but not
its editable install (whose finder would map the names and hide the bug: a ``.pth`` file
in a directory added by another ``.pth`` line is not run).  One real compile (the warm);
the benchmark reuses its kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACE = {"format": "aoti-farm-trace", "version": 1, "entries": [
    {"order": 0, "count": 1, "op": "aten::relu",
     "args": [{"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [8, 24], "strides": [24, 1],
               "device": "cpu"}]}]}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AOTI_FARM_CACHE_DIR")}
    env.update({"AOTI_FARM_RAY_DASHBOARD": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, console script) of a fresh venv holding a regular install of aoti-farm."""
    d = tmp_path_factory.mktemp("install")
    src = d / "src"                   # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    for p in ("aoti_farm", "workers", "runtime"):
        shutil.copytree(REPO / p, src / p, ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = d / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--ignore-installed", "--prefix", str(env_dir), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # outside the checkout, that venv imports the installed copy (not the editable one)
    p = subprocess.run([str(py), "-c", "import aoti_farm, aoti_farm.workers; print(aoti_farm.workers.__file__)"],
                       cwd=d, capture_output=True, text=True, env=_env())
    assert p.returncode == 0 and p.stdout.strip().startswith(purelib), p.stdout + p.stderr
    return py, env_dir / "bin" / "aoti-farm"


@pytest.fixture(scope="module")
def warmed(installed, tmp_path_factory):
    """`aoti-farm warm` of a one-signature trace with one CPU worker, started in the checkout."""
    py, script = installed
    d = tmp_path_factory.mktemp("warm")
    trace = d / "trace.json"
    trace.write_text(json.dumps(TRACE))
    ray_tmp = tempfile.mkdtemp(prefix="afi", dir="/tmp")   # short: Ray's socket paths live under it
    cache = d / "cache"
    # the console script as pip wrote it, run by the venv's interpreter (its shebang names ours)
    p = subprocess.run([str(py), str(script), "warm", "--model", str(trace), "--cpu-workers", "1",
                        "--cache-dir", str(cache), "--report", str(d / "report.json")],
                       cwd=REPO, env=_env(RAY_TMPDIR=ray_tmp), capture_output=True, text=True, timeout=600)
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


@pytest.mark.slow
def test_bench_quick_from_inside_the_checkout(installed, warmed, tmp_path):
    """The benchmark runner puts the checkout root on sys.path; its quick hit-path
    benchmark (worker processes that import aoti_farm.runtime) serves the warm's kernel."""
    py, _ = installed
    _, cache, _ = warmed
    res = tmp_path / "bench.json"
    p = subprocess.run([str(py), str(REPO / "scripts" / "bench" / "run.py"), "--quick", "--only", "hit",
                        "--json", str(res), "--workdir", str(tmp_path / "w"), "--kernel-cache", str(cache)],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert "ModuleNotFoundError" not in out, out[-3000:]
    assert p.returncode == 0 and res.exists(), out[-3000:]
    hit = json.loads(res.read_text())["benchmarks"]["hit"]
    assert "error" not in hit, hit
    ab = hit["signatures"][0]["ab"]
    assert ab["matches_eager"] == {"upstream": True, "hook": True}, ab
