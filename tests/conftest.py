"""What both test tiers share.  ``.venv/bin/pytest -q`` runs both tiers:

* tests/unit -- fast: no compile, no Ray, no subprocess, no native build (its conftest.py
  fails a test that starts one; tests/unit/test_tiers.py checks the files);
* tests/e2e  -- real compiles, Ray, subprocesses, the drills, the install and benchmark
  smoke tests; its conftest.py builds the native hit path for them.

A test file directly in tests/ (not yet sorted into a tier) runs as an e2e file does.

Real compiles cost 6-15 s each on CI's 2 cores, so every test that needs a compiled kernel
gets it from one session-wide cache through ``kernels``.  The session fixtures live here,
not in tests/e2e, so that an unsorted file in tests/ finds them too; a session fixture costs
nothing until a test asks for it, and no unit test may (tests/unit/test_tiers.py).

Common signatures are built with the ``sig_*`` helpers below so tests ask for the same
ones and each is compiled once per session.

Test helper modules are imported by bare name (``from _counters import assert_delta``,
``from conftest import sig_mul``): tests/ (shared helpers) and tests/e2e (the e2e tier's
own helpers) are put on ``sys.path`` here.  tests/unit and tests/e2e are packages, so that a
unit and an e2e file may share a basename (``unit.test_gate``, ``e2e.test_gate``); a test
module imports another one by its package name (``from e2e.test_gate import _add_call``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for _d in (TESTS / "e2e", TESTS):             # tests/ first
    if str(_d) in sys.path:
        sys.path.remove(str(_d))
    sys.path.insert(0, str(_d))

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish

# Keep Inductor single-process in tests (no compile subprocess pool on 2 cores).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# The hook's mechanism tests serve tiny kernels that are slower than eager: they run with
# the speed gate off (serve="always"); tests/e2e/test_gate.py turns it on explicitly.
os.environ.setdefault("AOTI_FARM_SERVE", "always")


def sig_add_alpha(shape=(8, 16)):
    a, b = torch.empty(shape), torch.empty(shape[-1:])
    return S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 2})


def sig_mul(shape=(8, 16)):
    a, b = torch.empty(shape), torch.empty(shape)
    return S.from_call(torch.ops.aten.mul.Tensor, (a, b), {})


class Kernels:
    """A session-wide cache and a memoised real compile into it."""

    def __init__(self, root):
        self.cache = Cache(root)
        self.fp = fingerprint("cpu")
        self.compiler = AOTICompiler()
        self.outcomes = {}

    def ensure(self, sig):
        if sig.key not in self.outcomes:
            self.outcomes[sig.key] = compile_and_publish(self.cache, self.compiler, self.fp, sig, owner="pytest")
        return self.outcomes[sig.key]

    def copy_to(self, dst):
        """A private copy of the session cache (for tests that damage or mutate it)."""
        import shutil

        shutil.copytree(self.cache.root, dst, symlinks=True, dirs_exist_ok=True)
        return Cache(dst)


@pytest.fixture(scope="session")
def regular_install(tmp_path_factory):
    """(python, console script) of a fresh venv with a regular (non-editable) install of
    this checkout (tests/e2e/_install.py); shared by the install test and the benchmark smoke."""
    from _install import regular_install as build

    return build(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="session")
def kernels(tmp_path_factory):
    return Kernels(tmp_path_factory.mktemp("session-cache"))


@pytest.fixture(scope="session")
def native_hit_path():
    """Hooks in tests take the production path, the native hit path; it is built once
    per machine and torch build (a real C++ compile, about 30 s), here if not yet.
    Every e2e test asks for it (tests/e2e/conftest.py); no unit test may."""
    from aoti_farm.runtime import native

    if not native.disabled():
        native.build()


@pytest.fixture(autouse=True)
def _unsorted_test_file_runs_as_e2e(request):
    """A test file directly in tests/ gets what an e2e test gets, until it is sorted."""
    if request.path.parent == TESTS:
        request.getfixturevalue("native_hit_path")


def pytest_collection_modifyitems(config, items):
    """Marks each test with its tier (``-m unit``, ``-m e2e``; an unsorted file in tests/ is
    e2e) and runs the unit tier first, so a plain ``pytest -q`` fails within a minute on
    a unit failure.  Within a tier the order is pytest's own."""
    def tier(item) -> str:
        return "unit" if TESTS / "unit" in item.path.parents else "e2e"

    for item in items:
        item.add_marker(tier(item))
    items.sort(key=lambda item: tier(item) != "unit")
