"""The unit tests split from tests/e2e/test_scaling_startup.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest


def test_no_early_verification_child_where_the_actor_has_the_preload_itself(tmp_path, monkeypatch):
    """An actor started with the libstdc++ preload (its Ray inherited it, as
    on a GPU host) loads kernels itself whatever the memo says: no child is started early."""
    from aoti_farm import loadenv, verifyserver
    from aoti_farm.workers.compile_actor import CompileActor

    lib = loadenv.system_libstdcxx()
    if not lib:
        pytest.skip("needs a system libstdc++")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)
    monkeypatch.setenv("LD_PRELOAD", lib)   # what preloaded() reads; this process is not restarted
    monkeypatch.setattr(CompileActor, "EARLY_VERIFIER_MIN_CORES", 1)
    verifyserver.stop()
    before = verifyserver.stats()["started"]
    try:
        a = CompileActor(str(tmp_path / "cache"))
        assert loadenv.needs_probe()
        a._verifier_when_needed()
        assert verifyserver.stats()["started"] == before and not verifyserver._alive()
    finally:
        verifyserver.stop()
