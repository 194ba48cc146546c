"""Start-up on many-core hosts: the farm's bytecode cache, the early
verification child with the candidate preload, and the loader probe's two loads at once.
Real processes throughout; the core-count thresholds are lowered so this 2-core box takes
the many-core paths.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_scaling_startup.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from _procs import warm_on_a_bad_trace

REPO = Path(__file__).resolve().parents[2]


def _apply_in_child(tmp_path: Path, env_extra: dict, make_pyc: bool = False) -> tuple[str, Path]:
    """A child started as a container image would start it (``PYTHONDONTWRITEBYTECODE=1``,
    a package without bytecode); it runs ``pycache.apply()`` (which must import nothing of
    that package) and then starts a grandchild that imports it.  (the child's answer,
    the package's folder)"""
    src = tmp_path / "src"
    sub = src / "probe_pkg" / "sub"
    sub.mkdir(parents=True, exist_ok=True)
    (src / "probe_pkg" / "__init__.py").write_text("")
    (sub / "__init__.py").write_text("")
    (sub / "probe_mod.py").write_text("X = 1\n")
    if make_pyc:
        import py_compile

        py_compile.compile(str(sub / "probe_mod.py"), doraise=True)
    code = textwrap.dedent("""
        import subprocess, sys
        from aoti_farm.startup import pycache
        pycache.PROBE = ("probe_pkg", "sub/probe_mod.py")
        d = pycache.apply()
        assert "probe_pkg.sub" not in sys.modules, "deciding imported the probed package"
        subprocess.run([sys.executable, "-c", "import probe_pkg.sub.probe_mod"], check=True)
        print("applied:", d)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": f"{src}{os.pathsep}{REPO}", **env_extra})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1], sub


def test_farm_children_cache_bytecode_privately_where_python_caches_none(tmp_path):
    """With bytecode writing off and a package without bytecode (the GPU host's image:
    every process compiled torch from source), the farm's children write and reuse
    ``.pyc`` files under the farm's own memo dir, never next to the sources."""
    answer, pkg = _apply_in_child(tmp_path, {"PYTHONDONTWRITEBYTECODE": "1"})
    prefix = tmp_path / "xdg" / "aoti-farm-private" / "pycache"
    assert answer == f"applied: {prefix}"
    cached = list(prefix.rglob("probe_mod.*.pyc"))
    assert cached, "the grandchild wrote no bytecode under the farm's prefix"
    assert not (pkg / "__pycache__").exists()
    assert oct(prefix.stat().st_mode & 0o777) == oct(0o700)


def test_bytecode_cache_left_alone_where_python_already_has_it(tmp_path):
    # bytecode writing on: Python's own __pycache__ does the job
    answer, _ = _apply_in_child(tmp_path / "a", {})
    assert answer == "applied: None"
    # writing off, but the packages were byte-compiled at install: keep using theirs
    answer, _ = _apply_in_child(tmp_path / "b", {"PYTHONDONTWRITEBYTECODE": "1"}, make_pyc=True)
    assert answer == "applied: None"
    # the user chose a prefix: theirs stays
    answer, _ = _apply_in_child(tmp_path / "c", {"PYTHONDONTWRITEBYTECODE": "1",
                                                 "PYTHONPYCACHEPREFIX": str(tmp_path / "mine")})
    assert answer == "applied: None"


def test_warm_driver_imports_through_the_farm_bytecode_cache_too(tmp_path):
    """``apply(here=True)`` (``warm``'s driver): this process's own later imports write
    and read their bytecode under the farm's prefix, never next to the sources."""
    src = tmp_path / "src" / "here_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "mod.py").write_text("X = 1\n")
    code = textwrap.dedent("""
        import sys
        from aoti_farm.startup import pycache
        pycache.PROBE = ("here_pkg", "mod.py")
        d = pycache.apply(here=True)
        import here_pkg.mod
        print(d, sys.pycache_prefix == d, sys.dont_write_bytecode)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX",)}
    env.update({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": f"{tmp_path / 'src'}{os.pathsep}{REPO}"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    prefix = tmp_path / "xdg" / "aoti-farm-private" / "pycache"
    assert out.stdout.split() == [str(prefix), "True", "False"]
    assert list(prefix.rglob("here_pkg/mod.*.pyc")) and not (src / "__pycache__").exists()


def _child_env_of(pid: int) -> dict:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:   # until the child has exec'ed (its own environment)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"aoti_farm.compile.compiler" in f.read():
                break
        time.sleep(0.05)
    with open(f"/proc/{pid}/environ", "rb") as f:
        return {k.decode(): v.decode() for k, v in
                (kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)}


def test_fresh_host_actor_starts_its_verification_child_at_warm_up_with_the_candidate_preload(tmp_path,
                                                                                               monkeypatch):
    """On a many-core fresh host (no loader memo) the actor's verification child starts at
    warm-up, preloaded with the only library the memo can ask for.  When the memo then
    says the host needs it, that same child serves (no second torch import); when it says
    kernels load in-process, the child is stopped unused."""
    from aoti_farm.startup import loadenv
    from aoti_farm.compile import verifyserver
    from aoti_farm.workers.compile_actor import CompileActor

    lib = loadenv.system_libstdcxx()
    if not lib or loadenv.preloaded():
        pytest.skip("needs a system libstdc++ not preloaded into this process")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)
    monkeypatch.setattr(CompileActor, "EARLY_VERIFIER_MIN_CORES", 1)
    verifyserver.stop()

    def run(needs_preload: bool):
        a = CompileActor(str(tmp_path / "cache"))
        before = verifyserver.stats()
        assert loadenv.needs_probe()
        a._verifier_when_needed()
        assert verifyserver._alive(), "no child started before the memo"
        pid = verifyserver._proc.pid
        assert lib in _child_env_of(pid).get("LD_PRELOAD", "").split(":")
        loadenv.remember({"needs_preload": needs_preload, "plain_rc": -11 if needs_preload else 0,
                          "preload_rc": 0, "preload": lib})
        time.sleep(1.0)   # the watcher polls every 0.2 s
        if needs_preload:
            verifyserver.prestart()   # what a verification does first: keeps a child with the wanted preload
        after = verifyserver.stats()
        return (after["started"] - before["started"], after["replaced_without_preload"]
                - before["replaced_without_preload"], verifyserver._alive(),
                verifyserver._proc.pid == pid if verifyserver._alive() else None)

    try:
        assert run(True) == (1, 0, True, True)
        verifyserver.stop()
        os.remove(loadenv._memo_path())
        assert run(False) == (1, 0, False, None)
    finally:
        verifyserver.stop()
        if os.path.exists(loadenv._memo_path()):
            os.remove(loadenv._memo_path())


def test_loader_probe_loads_plain_and_preloaded_at_once_on_many_cores(kernels, tmp_path, monkeypatch):
    """The loader probe's two children (plain, with the preload) run at once on a
    many-core host, for real, and answer as the one-after-the-other probe does here."""
    from conftest import sig_add_alpha

    from aoti_farm.startup import loadenv

    if not loadenv.system_libstdcxx():
        pytest.skip("needs a system libstdc++")
    sig = sig_add_alpha()
    kernels.ensure(sig)
    path = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(loadenv, "PARALLEL_PROBE_MIN_CORES", 1)
    real, lock, state = loadenv._try_load, threading.Lock(), {"now": 0, "most": 0, "calls": 0}

    def counted(*a, **k):
        with lock:
            state["now"] += 1
            state["calls"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            return real(*a, **k)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(loadenv, "_try_load", counted)
    res = loadenv.probe(path)
    assert state["calls"] == 2 and state["most"] == 2, state
    plain_ok = res["plain_rc"] == 0
    assert res["needs_preload"] == (not plain_ok and res["preload_rc"] == 0)
    assert loadenv.remembered() == res


def test_fresh_host_isa_probe_runs_in_a_child_not_in_the_warm_driver(tmp_path, monkeypatch):
    """On a fresh many-core host the planner's ISA probe runs in a child (for real: its
    check builds), so the driver's interpreter lock stays free for Ray's start; the
    driver then reads the memo without probing.  With the memo there, no child."""
    from aoti_farm import fingerprint
    from aoti_farm.compile import hostprep
    from aoti_farm.workers import warm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 1)
    assert not hostprep.isa_memo_known()
    probes_here = fingerprint.host_steps().get("isa_probe", 0)
    child = warm.isa_probe_in_child(3, None)
    out = child.result() if child is not None else None
    assert out is not None and out["status"] == "probed", out
    assert out["steps"].get("isa_probe") == 1          # the child probed ...
    assert hostprep.isa_memo_known()
    memo = fingerprint.host_isa_memo(need_checks=True)   # ... and left a memo with its check answers
    assert memo["isa"] == out["isa"]
    assert fingerprint.host_steps().get("isa_probe", 0) == probes_here   # ... this process did not
    assert warm.isa_probe_in_child(3, None) is None       # known host: nothing to do
    assert warm.isa_probe_in_child(0, None) is None


@pytest.mark.parametrize("early", ["1", "0"])
def test_warm_starts_the_isa_probe_child_before_reading_the_traces_and_stops_it_on_bad_input(
        tmp_path, monkeypatch, early):
    """Reading the traces imports torch (5 s on the 16-core host), and a fresh host's ISA
    probe is the longest step before the plan: by default ``warm`` starts the probe's
    child first (for real).  A trace that fails to load ends the command with its
    one-line error, and the child is stopped, not left behind.  ``fresh_isa=0`` (the A/B
    side) starts no child before the traces."""
    from aoti_farm.compile import hostprep
    from aoti_farm.startup import pycache
    from aoti_farm.workers import warm

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("AOTI_FARM_DEV", f"fresh_isa={early}")
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 1)
    monkeypatch.setattr(pycache, "apply", lambda here=False: None)   # not this test's subject
    children: list = []

    class Recorded(hostprep.IsaChild):
        def __init__(self):
            super().__init__()
            children.append(self)

    monkeypatch.setattr(hostprep, "IsaChild", Recorded)
    seen: dict = {}
    warm_on_a_bad_trace(tmp_path, monkeypatch,
                        lambda: seen.update(children_at_load=[c._proc.poll() is None for c in children]))
    if early == "0":
        assert children == [] and seen["children_at_load"] == []
        return
    assert seen["children_at_load"] == [True], seen          # started, and still running, before the traces
    assert children[0]._proc.poll() is not None               # stopped with the command
    memo_dir = tmp_path / "xdg"
    assert not [p for p in memo_dir.rglob("*.tmp")], list(memo_dir.rglob("*"))
