"""Farm scaling: per-host steps run once when several actors start together;
actors take the workers Ray prestarts; the embedded Ray's unactionable notice is dropped.

The timing side is measured by scripts/bench/scaling.py, never asserted here.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_scaling.py.
"""

from __future__ import annotations

import logging

from aoti_farm.workers.placement import CPU


def test_isa_probe_runs_once_when_actors_start_together(tmp_path):
    """Three real compile actors warm up at the same moment on a host with no ISA memo
    (a fresh XDG_CACHE_HOME): exactly one of them probes Inductor's vector ISA, and every
    actor, the prober included, gets Inductor's ISA answers without running a single
    check build of its own after the probe (the others replay the recorded answers).
    Before the fix each actor ran Inductor's checks itself, under the checks' shared file
    locks, so actors became ready one after another."""
    import ray

    from aoti_farm.workers.compile_actor import CompileActor

    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    ray.init(address="local", num_cpus=3, include_dashboard=False, logging_level=logging.ERROR,
             runtime_env={"env_vars": env})
    try:
        cls = ray.remote(CompileActor).options(num_cpus=1)
        actors = [cls.remote(str(tmp_path / "cache"), "cpu") for _ in range(3)]
        infos = ray.get([a.warmup.remote() for a in actors], timeout=900)
    finally:
        ray.shutdown()
    steps = [i["host_steps"] for i in infos]
    assert len({i["pid"] for i in infos}) == 3
    assert sum(s["isa_probe"] for s in steps) == 1, steps           # the per-host step: once
    assert len({i["fp_id"] for i in infos}) == 1                      # one answer for all
    for s in steps:
        if s["isa_probe"]:
            assert s["isa_checks_run"] >= 1, s                        # the prober really probed
        else:
            assert s["isa_checks_run"] == 0 and s["isa_checks_replayed"] >= 1, s
    for i in infos:
        assert set(i["warmup_phases"]) >= {"import", "setup", "isa", "export"}, i["warmup_phases"]
    memo = list((tmp_path / "xdg" / "aoti-farm-private").glob("isa-*.json"))
    assert len(memo) == 1


def test_process_start_time_is_the_process_age_from_boot():
    """The timeline's zero: a process 1.5 s old says so (its age counted from boot)."""
    import subprocess
    import sys

    code = ("import time; time.sleep(1.5)\n"
            "from aoti_farm.report.progress import process_start_time\n"
            "print(time.time() - process_start_time())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())
    assert 1.4 <= age < 10, age


def test_command_start_is_the_exec_not_the_shells_fork():
    """``bash -c "sleep 6 && exec python ..."``: the process was forked by the shell 6 s
    before python ran (more than EXEC_SLACK_S); /proc's start says so, the command's does not."""
    import subprocess
    import sys

    code = ("import time\n"
            "from aoti_farm.report.progress import command_start_time, process_start_time\n"
            "now = time.time()\n"
            "print(now - process_start_time(), now - command_start_time())")
    from aoti_farm.report.progress import EXEC_SLACK_S

    out = subprocess.run(["bash", "-c", f"sleep {EXEC_SLACK_S + 1} && exec {sys.executable} -c '{code}'"],
                         capture_output=True, text=True, check=True).stdout.split()
    fork_age, command_age = float(out[0]), float(out[1])
    assert fork_age >= EXEC_SLACK_S + 0.9 and command_age < 3, (fork_age, command_age)


def test_prestarted_workers_import_the_actors_modules(monkeypatch):
    """start_ray(num_cpus=1, preload=True): the embedded Ray advertises one CPU, and the
    worker Ray prestarted had imported aoti_farm.workers.actor_preload (torch, Inductor,
    the compile path) before the actor was created on it; the driver's environment no
    longer names the preload afterwards.  Without the preload the actor's process has
    not imported it."""
    import sys

    import ray

    from aoti_farm.config import FarmConfig
    from aoti_farm.workers.raysetup import PRELOAD_MODULE, RAY_PRELOAD_VAR, start_ray, stop_ray

    class Probe:
        def __init__(self):
            self.seen_at_init = PRELOAD_MODULE in sys.modules

        def report(self):
            mod = sys.modules.get(PRELOAD_MODULE)
            return {"at_init": self.seen_at_init, "span": getattr(mod, "SPAN", None),
                    "error": getattr(mod, "ERROR", None), "inductor": "torch._inductor.compile_fx" in sys.modules}

    for k in ("RAY_ADDRESS", "AOTI_FARM_ADDRESS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    for preload in (True, False):
        ray_, started = start_ray(FarmConfig(), num_cpus=1, preload=preload)
        try:
            assert started and ray_.cluster_resources()["CPU"] == 1
            assert RAY_PRELOAD_VAR not in __import__("os").environ
            got = ray_.get(ray_.remote(Probe).options(num_cpus=1).remote().report.remote(), timeout=300)
        finally:
            stop_ray(ray_)
        if preload:
            assert got["at_init"] and got["span"] and got["error"] is None and got["inductor"], got
        else:
            assert not got["at_init"] and got["span"] is None, got
    assert not ray.is_initialized()


def test_host_prep_in_a_child_answers_its_status():
    """hostprep.prepare_in_child: the child's answer line comes back as prepare()'s dict
    (here a failure: Inductor options this torch does not know), marked as from a child."""
    from aoti_farm.compile import hostprep

    out = hostprep.prepare_in_child({"no_such_inductor_option": 1}, timeout=300)
    assert out["child"] is True and out["status"] == "failed", out
    assert "no_such_inductor_option" in out["error"], out


def test_actor_starts_its_verification_child_when_the_loader_memo_appears(tmp_path, monkeypatch):
    """On a fresh host (no loader memo) an actor's warm-up leaves a watcher: when the
    memo appears and says this process cannot load kernels (the libstdc++ trap), the
    verification child is started then, before any kernel waits for it.  Where kernels
    load in-process, none is started."""
    import time

    from aoti_farm.startup import loadenv
    from aoti_farm.compile import verifyserver
    from aoti_farm.workers.compile_actor import CompileActor

    if not loadenv.system_libstdcxx() or loadenv.preloaded():
        import pytest

        pytest.skip("needs a system libstdc++ not preloaded into this process")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)
    with verifyserver._lock:
        verifyserver._drop_locked()

    def watch_then(needs_preload: bool) -> int:
        a = CompileActor(str(tmp_path / "cache"))
        started = verifyserver.stats()["started"]
        assert loadenv.needs_probe()
        a._verifier_when_needed()
        time.sleep(0.5)
        assert verifyserver.stats()["started"] == started     # nothing known yet: nothing started
        loadenv.remember({"needs_preload": needs_preload, "plain_rc": -11, "preload_rc": 0,
                          "preload": loadenv.system_libstdcxx()})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and a.verifier_started is None:
            time.sleep(0.1)
        if not needs_preload:
            time.sleep(0.6)
        return verifyserver.stats()["started"] - started, a.verifier_started

    try:
        assert watch_then(True) == (1, "when the loader memo appeared")
        with verifyserver._lock:
            verifyserver._drop_locked()
        import os

        os.remove(loadenv._memo_path())
        assert watch_then(False) == (0, None)
    finally:
        with verifyserver._lock:
            verifyserver._drop_locked()


def test_loader_probe_runs_once_when_first_verifications_start_together(kernels, tmp_path, monkeypatch):
    """On a fresh host (no loader memo), three first verifications at once: exactly one
    runs the loader probe (two children importing torch each, for real); the others wait
    for its memo and verify without probing."""
    import threading

    from conftest import sig_add_alpha

    from aoti_farm.startup import loadenv
    from aoti_farm.compile.compiler import AOTICompiler

    sig = sig_add_alpha()
    kernels.ensure(sig)
    path = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)
    assert loadenv.needs_probe()
    real, calls = loadenv.probe, []

    def counted(*a, **k):
        calls.append(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(loadenv, "probe", counted)
    results, errors = [], []

    def verify():
        try:
            results.append(AOTICompiler(measure_speed=False).verify(sig, path))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=verify) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and len(results) == 3, errors
    assert len(calls) == 1, calls
    assert not loadenv.needs_probe()


def test_a_verification_child_without_the_wanted_preload_is_replaced(tmp_path, monkeypatch):
    """A verification child started before the host's loader memo existed has no
    libstdc++ preload.  Once the memo says the host needs it, that child is never used:
    the next prestart (or request) replaces it with a preloaded one.  (0ad8a99 started
    children ahead of the memo and on the 16-core host 16 first kernels crashed such a
    child: failure records for good kernels.)"""
    import os

    from aoti_farm.startup import loadenv
    from aoti_farm.compile import verifyserver

    lib = loadenv.system_libstdcxx()
    if not lib or loadenv.preloaded():
        import pytest

        pytest.skip("needs a system libstdc++ not preloaded into this process")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AOTI_FARM_PRELOAD_LIBSTDCXX", raising=False)

    def child_preload() -> str:
        from e2e.test_scaling_startup import _child_env_of

        return _child_env_of(verifyserver._proc.pid).get("LD_PRELOAD", "")

    try:
        verifyserver.stop()
        before = verifyserver.stats()
        verifyserver.prestart()                      # no memo yet: no preload
        assert lib not in child_preload()
        first = verifyserver._proc.pid
        verifyserver.prestart()                      # nothing changed: the same child
        assert verifyserver._proc.pid == first
        loadenv.remember({"needs_preload": True, "plain_rc": -11, "preload_rc": 0, "preload": lib})
        verifyserver.prestart()
        assert verifyserver._proc.pid != first and lib in child_preload()
        after = verifyserver.stats()
        assert after["started"] - before["started"] == 2
        assert after["replaced_without_preload"] - before["replaced_without_preload"] == 1
        verifyserver.prestart()                      # a preloaded child stays
        assert verifyserver.stats()["started"] == after["started"]
    finally:
        verifyserver.stop()
        if os.path.exists(loadenv._memo_path()):
            os.remove(loadenv._memo_path())
