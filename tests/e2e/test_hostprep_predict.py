"""Start-up on a fresh many-core host (#17, run 12): the host preparation builds on the
ISA predicted from the CPU's flags while the real probe runs (aoti_farm/isapredict.py),
and nothing of it counts until the probe agrees; a process that has the libstdc++
preload does not wait for another process's loader probe.  No real compile here: the
compiler is a double that calls ``verify`` where the real one does, and the prediction
is stated by the test (the real one was checked on the GPU host's runs, whose report
names it).

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_hostprep_predict.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aoti_farm.compiler import CompileResult


class _Double:
    """Compiles nothing; the host's probe 'finishes' during the compile (the memo is
    written), then ``verify`` is called as the real compiler calls it, after the build."""

    verified: list = []
    write_memo = None

    def __init__(self, inductor_options=None):
        self._options = dict(inductor_options or {})

    def options(self) -> dict:
        return dict(self._options)

    def compile(self, sig, workdir: str) -> CompileResult:
        _Double.write_memo()
        path = os.path.join(workdir, "kernel.so")
        with open(path, "wb") as f:
            f.write(b"placeholder")
        self.verify(sig, path)
        return CompileResult(files={"kernel.so": path}, seconds=0.0, build={"wrapper": "split"})

    def verify(self, sig, kernel_path: str) -> dict:
        _Double.verified.append(kernel_path)   # where the real compiler runs the loader probe
        return {}


@pytest.mark.parametrize("right", [True, False])
def test_host_prep_on_a_predicted_isa_counts_only_once_the_probe_agrees(right, tmp_path, monkeypatch):
    """On a fresh host (no ISA memo) the host preparation compiles on the predicted
    ISA.  A prediction the probe confirms: verified (the loader probe), fingerprinted,
    marked prepared.  A wrong one: no verification, no fingerprint, no marker, and the
    answer ``mispredicted`` (its process compiles nothing more)."""
    from aoti_farm import fingerprint, hostprep, isapredict, splitbuild

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(splitbuild, "common_dir", lambda: str(tmp_path / "common"))
    picked = {"isa": "avx512", "used": {"k1": True, "k2": True}}
    monkeypatch.setattr(isapredict, "pick", lambda: picked)
    probed = {"isa": "avx512" if right else "avx2", "checks": {"k1": True, "k2": right},
              "compiler": fingerprint._compiler_id()}

    def write_memo():
        path = fingerprint._isa_memo_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(probed, f)

    fps: list = []
    real_fp = fingerprint.fingerprint
    monkeypatch.setattr(fingerprint, "fingerprint", lambda *a, **k: fps.append(a) or real_fp(*a, **k))
    monkeypatch.setattr(fingerprint, "cpu_isa", lambda: fingerprint.host_isa_memo()["isa"])   # not lru-cached
    monkeypatch.setattr(_Double, "verified", [])
    monkeypatch.setattr(_Double, "write_memo", staticmethod(write_memo))
    assert hostprep.isa_memo_missing()
    out = hostprep.prepare(compiler_factory=_Double, predict=True)
    markers = list((tmp_path / "common").glob("prep-*.json"))
    if right:
        assert out["status"] == "prepared" and out["isa"] == {"predicted": "avx512", "confirmed": True}, out
        assert len(_Double.verified) == 1 and len(fps) == 1 and len(markers) == 1
        assert dict(real_fp("cpu", {}).fields)["cpu_isa"] == "avx512"
    else:
        assert out["status"] == "mispredicted" and out["isa"] == {"predicted": "avx512", "probed": "avx2"}, out
        assert _Double.verified == [] and fps == [] and markers == []


def test_a_preloaded_process_verifies_without_waiting_for_anothers_loader_probe(kernels, tmp_path, monkeypatch):
    """A process with the libstdc++ preload loads kernels itself whatever the loader
    memo will say, so while another process holds the probe lock its first verification
    goes ahead (run 11: 16 first verifications waited 2.1 s); it does not probe."""
    import functools

    from conftest import sig_add_alpha
    from filelock import FileLock

    from aoti_farm import compiler, loadenv
    from aoti_farm.fsutil import memo_dir

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


def test_the_forked_probe_answers_through_its_pipe_and_is_not_started_beside_other_threads(tmp_path):
    """aoti_farm/isafork.py in a fresh interpreter (forking pytest itself, with its
    threads, is what it must refuse): a fork's answer comes back, the driver's buffered
    output is not written twice, a child that says nothing within the timeout is killed
    and reported, and with another Python thread running there is no fork."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import json, os, sys, threading, time
        from aoti_farm import isafork
        print("buffered in the driver", end="")          # must not be flushed by the child too
        f = isafork.start(lambda: {"status": "probed", "pid": os.getpid()})
        out = f.result()
        assert out["status"] == "probed" and out["pid"] != os.getpid(), out
        slow = isafork.start(lambda: time.sleep(30) or {})
        late = slow.result(timeout=0.5)
        assert late["status"] == "failed" and "no answer" in late["error"], late
        ev = threading.Event()
        th = threading.Thread(target=ev.wait); th.start()
        assert isafork.start(lambda: {}) is None          # another thread: no fork
        ev.set(); th.join()
        os.environ["AOTI_FARM_DEV"] = "isa_fork=0"
        assert isafork.start(lambda: {}) is None
        print(" ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "buffered in the driver ok\n", out.stdout
