"""Start-up on a fresh many-core host: a process that has the libstdc++ preload
does not wait for another process's loader probe.  A real compile (the ``kernels``
fixture).  The ISA prediction and the forked ISA probe this file also tested were
removed (they saved less than 5%: docs/benchmarks.md).
"""

from __future__ import annotations

import os

import pytest


def test_a_preloaded_process_verifies_without_waiting_for_anothers_loader_probe(kernels, tmp_path, monkeypatch):
    """A process with the libstdc++ preload loads kernels itself whatever the loader
    memo will say, so while another process holds the probe lock its first verification
    goes ahead (16 first verifications at once would otherwise wait); it does not probe."""
    import functools

    from conftest import sig_add_alpha
    from filelock import FileLock

    from aoti_farm.compile import compiler
    from aoti_farm.startup import loadenv
    from aoti_farm.security.fsutil import memo_dir

    lib = loadenv.system_libstdcxx()
    if not lib:
        pytest.skip("needs a system libstdc++")
    sig = sig_add_alpha()
    kernels.ensure(sig)
    path = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)
    monkeypatch.setenv("LD_PRELOAD", lib)   # what preloaded() reads
    # a waiting verification would time out after 2 s and probe: the assertion below fails
    monkeypatch.setattr(compiler, "_probe_lock", functools.partial(compiler._probe_lock, 2.0))
    probes: list = []
    monkeypatch.setattr(loadenv, "probe", lambda *a, **k: probes.append(a))
    os.makedirs(memo_dir(), exist_ok=True)
    other = FileLock(os.path.join(memo_dir(), "loadenv-probe.lock"))
    other.acquire()   # another process probes right now
    try:
        assert loadenv.needs_probe()
        out = compiler.AOTICompiler(measure_speed=False).verify(sig, path)
    finally:
        other.release()
    assert probes == [] and "probe" in out["timing"], out
