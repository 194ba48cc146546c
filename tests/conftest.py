"""Shared fixtures.  Real compiles cost 6-15 s each on CI's 2 cores, so every test that
needs a compiled kernel gets it from one session-wide cache through ``kernels``.

Common signatures are built with the ``sig_*`` helpers below so tests ask for the same
ones and each is compiled once per session.
"""

from __future__ import annotations

import os
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache import Cache
from aoti_farm.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.job import compile_and_publish

# Keep Inductor single-process in tests (no compile subprocess pool on 2 cores).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# The hook's mechanism tests serve tiny kernels that are slower than eager: they run with
# the speed gate off (serve="always"); tests/test_gate.py turns it on explicitly.
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
    this checkout (tests/_install.py); shared by the install test and the benchmark smoke."""
    from _install import regular_install as build

    return build(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="session")
def kernels(tmp_path_factory):
    return Kernels(tmp_path_factory.mktemp("session-cache"))


@pytest.fixture(scope="session", autouse=True)
def native_hit_path():
    """Hooks in tests take the production path, the native hit path; it is built once
    per machine and torch build (a real C++ compile, about 30 s), here if not yet."""
    from aoti_farm.runtime import native

    if not native.disabled():
        native.build()
