"""A regular (non-editable) install of aoti-farm in a fresh venv, for tests that run the
package from inside the checkout as a user with such an install would (see
tests/e2e/test_install.py for why)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra) -> dict:
    """This environment without what would point the child at the checkout or a cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AOTI_FARM_CACHE_DIR")}
    env.update({"TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    env.update(extra)
    return env


def regular_install(d: Path) -> tuple[Path, Path]:
    """(python, console script) of a fresh venv in ``d`` holding a regular install of
    aoti-farm built from this checkout's sources."""
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
                       cwd=d, capture_output=True, text=True, env=clean_env())
    assert p.returncode == 0 and p.stdout.strip().startswith(purelib), p.stdout + p.stderr
    return py, env_dir / "bin" / "aoti-farm"
