"""The e2e tier: real compiles, Ray, subprocesses.  Its shared fixtures (``kernels``,
``regular_install``, ``native_hit_path``) are in tests/conftest.py; here every e2e test
asks for the native hit path, so hooks in these tests take the production path."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _e2e_native_hit_path(native_hit_path):
    """Built once per machine and torch build (tests/conftest.py)."""
