"""The unit tests split from tests/e2e/test_scaling_startup.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest


def test_no_early_verification_child_where_the_actor_has_the_preload_itself(tmp_path, monkeypatch):
    """An actor started with the libstdc++ preload (its Ray inherited it, as
    on a GPU host) loads kernels itself whatever the memo says: no child is started early."""
    from aoti_farm.startup import loadenv
    from aoti_farm.compile import verifyserver
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


def test_torch_git_version_is_read_without_importing_torch(tmp_path, monkeypatch):
    """``warm`` decides whether to start a fresh host's ISA probe before anything has
    imported torch: the memo's name needs torch's git version, read from the
    ``version.py`` of the torch ``import torch`` would load.  Unsure is None."""
    import importlib.util
    import sys
    from types import SimpleNamespace

    import torch

    from aoti_farm.startup import hostid

    monkeypatch.delitem(sys.modules, "torch.version")      # as if torch were not imported yet
    assert hostid.torch_git_version() == torch.version.git_version   # the real torch's file
    pkg = tmp_path / "torch"
    pkg.mkdir()
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(pkg)]))
    (pkg / "version.py").write_text("__version__ = '9.9'\ngit_version = 'abcdef0123456789'\n")
    assert hostid.torch_git_version() == "abcdef0123456789"
    for text in ("git_version = version_from_somewhere()\n", "", "git_version = 'a\nb'\n"):
        (pkg / "version.py").write_text(text)
        assert hostid.torch_git_version() is None, text
    (pkg / "version.py").unlink()
    assert hostid.torch_git_version() is None


def test_a_known_host_starts_no_isa_probe_child(tmp_path, monkeypatch):
    """The memo found without torch is the one the fingerprint writes and reads: with it,
    ``warm`` starts no probe child; without it (or a corrupt one) the host is not known."""
    from aoti_farm import fingerprint
    from aoti_farm.compile import hostprep
    from aoti_farm.workers import warm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 1)
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    started = []
    monkeypatch.setattr(hostprep, "IsaChild", lambda: started.append(1) or "child")
    assert not hostprep.isa_memo_known()
    assert warm.start_isa_probe(None) == "child" and started == [1]     # fresh host: the child starts
    path = fingerprint._isa_memo_path()
    with open(path, "w") as f:
        f.write("{not json")
    assert not hostprep.isa_memo_known()
    with open(path, "w") as f:
        f.write('{"isa": "avx2", "checks": {}}')
    assert hostprep.isa_memo_known()
    assert warm.start_isa_probe(None) is None and started == [1]         # known host: none
    assert warm.start_isa_probe(lambda: None) is None                   # a test double compiler: none
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 10 ** 6)
    monkeypatch.setattr(hostprep, "isa_memo_known", lambda: False)
    assert warm.start_isa_probe(None) is None and started == [1]         # few cores: none


def test_the_plan_waits_for_the_early_isa_probe_only_where_it_needs_the_cpu_fingerprint():
    """The probe starts before the traces are read; a job of CUDA signatures only (whose
    fingerprints hold no CPU ISA) must not wait for it.  With a CPU signature the plan
    waits and the timeline shows the child's span, ending where the child ended."""
    from types import SimpleNamespace

    from aoti_farm.workers import warm

    class Child:
        t0, end = 100.0, 130.0

        def __init__(self):
            self.waited = 0

        def result(self):
            self.waited += 1
            return {"status": "probed", "probe_s": 8.0, "done_at": 112.5}

    gpu, cpu = SimpleNamespace(device="cuda"), SimpleNamespace(device="cpu")
    child, timeline = Child(), {}
    warm.await_isa_probe(child, [gpu, gpu], timeline)
    assert child.waited == 0 and timeline == {}
    warm.await_isa_probe(child, [gpu, cpu], timeline)
    assert child.waited == 1
    assert timeline["isa_child"] == {"span": [100.0, 112.5], "status": "probed", "probe_s": 8.0}
    warm.await_isa_probe(None, [cpu], timeline)   # no early child: nothing to wait for
