"""Farm scaling (issue 17): per-host steps run once when several actors start together;
actors take the workers Ray prestarts; the embedded Ray's unactionable notice is dropped.

The timing side is measured by scripts/bench/scaling.py, never asserted here.
"""

from __future__ import annotations

import logging

from aoti_farm.workers.placement import CPU, actor_options, worker_env


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
    memo = list((tmp_path / "xdg" / "aoti-farm").glob("isa-*.json"))
    assert len(memo) == 1


def test_actors_without_a_runtime_env_when_the_embedded_ray_inherits_it():
    """An actor with a runtime_env cannot use Ray's prestarted workers; with an embedded
    Ray that inherited the actors' variables, none is set, and only what differs is."""
    env = worker_env()
    assert "runtime_env" not in actor_options(CPU, 0.25, inherited=dict(env))
    missing = {k: v for k, v in env.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    o = actor_options(CPU, 0.25, inherited=missing)
    assert o["runtime_env"] == {"env_vars": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}
    assert actor_options(CPU, 0.25)["runtime_env"]["env_vars"] == env   # a cluster: everything


def test_embedded_ray_token_notice_is_dropped_and_other_warnings_kept(caplog):
    from aoti_farm.workers.raysetup import EMBEDDED_RAY_NOTICES, quiet_embedded_ray

    name = next(iter(EMBEDDED_RAY_NOTICES))
    lg = logging.getLogger(name)
    quiet_embedded_ray()
    quiet_embedded_ray()   # idempotent
    with caplog.at_level(logging.WARNING, logger=name):
        lg.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        lg.warning("Token authentication is enabled but no authentication token was found")
    msgs = [r.getMessage() for r in caplog.records if r.name == name]
    assert msgs == ["Token authentication is enabled but no authentication token was found"]
    assert sum(type(f).__name__ == "_DropNotices" for f in lg.filters) == 1


def test_startup_line_names_the_slowest_phase():
    from aoti_farm.progress import startup_line

    tl = {"process_start": 100.0, "ray_started": 116.7, "first_dispatch": 132.3,
          "workers": [{"ready_seen": 132.3, "phases": {"import": [118.3, 132.1]}},
                      {"ready_seen": 135.5, "phases": {"boot": [113.9, 117.2], "import": [117.2, 135.2]}}]}
    line = startup_line(tl)
    assert "Ray up at 16.7s" in line and "2 actor(s) ready 32.3-35.5s (18.8s after Ray's start)" in line
    assert "first compile at 32.3s" in line and "longest phase: import 18.0s" in line
    assert startup_line({"process_start": 1.0, "workers": []}) is None


def test_process_start_time_is_the_process_age_from_boot():
    """The timeline's zero: a process 1.5 s old says so (its age counted from boot)."""
    import subprocess
    import sys

    code = ("import time; time.sleep(1.5)\n"
            "from aoti_farm.progress import process_start_time\n"
            "print(time.time() - process_start_time())")
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               check=True).stdout.strip())
    assert 1.4 <= age < 10, age
