"""The unit tests split from tests/e2e/test_scaling.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import logging

from aoti_farm.workers.placement import CPU, actor_options, worker_env


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
    assert sum(type(f).__name__ == "DropNotices" for f in lg.filters) == 1


def test_torch_cuda_runtime_notice_is_dropped_and_other_warnings_kept(caplog):
    """torch's CUDA build on a host without a GPU logs "No CUDA runtime is found" once per
    process that imports torch.utils.cpp_extension: the farm's own processes drop it
    (warm, serve, the actors); its other warnings still show."""
    from aoti_farm.startup import notices

    name = "torch.utils.cpp_extension"
    assert name in notices.TORCH_NOTICES
    lg = logging.getLogger(name)
    notices.drop(notices.TORCH_NOTICES)
    notices.drop(notices.TORCH_NOTICES)   # idempotent
    with caplog.at_level(logging.WARNING, logger=name):
        lg.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        lg.warning("There are no g++ version bounds defined for CUDA version 13.0")
    msgs = [r.getMessage() for r in caplog.records if r.name == name]
    assert msgs == ["There are no g++ version bounds defined for CUDA version 13.0"]
    assert sum(type(f).__name__ == "DropNotices" for f in lg.filters) == 1


def test_startup_line_names_the_slowest_phase():
    from aoti_farm.report.progress import startup_line

    tl = {"process_start": 100.0, "ray_started": 116.7, "first_dispatch": 132.3,
          "workers": [{"ready_seen": 132.3, "phases": {"import": [118.3, 132.1]}},
                      {"ready_seen": 135.5, "phases": {"boot": [113.9, 117.2], "import": [117.2, 135.2]}}]}
    line = startup_line(tl)
    assert "Ray up at 16.7s" in line and "2 actor(s) ready 32.3-35.5s (18.8s after Ray's start)" in line
    assert "first compile at 32.3s" in line and "longest phase: import 18.0s" in line
    assert startup_line({"process_start": 1.0, "workers": []}) is None


# --- start-up sized from the work, imports in Ray's prestarted workers -------------------


def test_embedded_ray_is_sized_from_the_work():
    """An embedded Ray advertises as many CPUs as the pool can use (Ray starts a worker
    process per CPU and ray.init waits for them): W when given, never more than the CPU
    signatures or the host's cores; every core where GPU signatures need actors too."""
    from aoti_farm.workers.placement import embedded_cpus, pool_sizes

    assert embedded_cpus(16, cpu_workers=1, n_cpu_sigs=85, n_gpu_sigs=0) == 1
    assert embedded_cpus(16, cpu_workers=None, n_cpu_sigs=85, n_gpu_sigs=0) == 16
    assert embedded_cpus(16, cpu_workers=None, n_cpu_sigs=3, n_gpu_sigs=0) == 3
    assert embedded_cpus(16, cpu_workers=32, n_cpu_sigs=85, n_gpu_sigs=0) == 16
    assert embedded_cpus(16, cpu_workers=8, n_cpu_sigs=5, n_gpu_sigs=0) == 5
    assert embedded_cpus(16, cpu_workers=None, n_cpu_sigs=85, n_gpu_sigs=2) is None
    assert embedded_cpus(16, cpu_workers=None, n_cpu_sigs=0, n_gpu_sigs=0) is None
    # the pool sized from such a cluster is the one asked for
    for w, n in ((1, 85), (None, 85), (None, 3), (8, 5)):
        cpus = embedded_cpus(16, cpu_workers=w, n_cpu_sigs=n, n_gpu_sigs=0)
        assert pool_sizes({"CPU": cpus}, cpu_workers=w, gpu_workers=None, gpus_per_worker=0.25,
                          n_cpu_tasks=n, n_gpu_tasks=0)["cpu"] == min(w or 16, n, 16)


def test_warm_preloads_only_for_the_real_compiler_on_a_many_core_host(monkeypatch):
    """On a many-core host a CPU-only job's actors are forked from one server that
    imported torch (workers/forkserver.py) instead of each importing it (the preload); a
    job with GPU signatures keeps the preload; a test double, no warm-up, a cluster or
    few cores get neither unless AOTI_FARM_DEV=fork_server=... says so."""
    from aoti_farm import signature as S
    from aoti_farm.config import FarmConfig
    from aoti_farm.workers import warm

    import torch

    sigs = [S.from_call(torch.ops.aten.relu.default, (torch.empty(n),), {}) for n in (4, 8, 16)]
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    monkeypatch.setattr(warm, "_host_cpus", lambda: 16)
    assert warm.embedded_ray_args(FarmConfig(cpu_workers=None), sigs, None) == {
        "num_cpus": 3, "preload": False, "hide_gpus": True, "fork_server": True}
    assert warm.embedded_ray_args(FarmConfig(cpu_workers=1), sigs, None) == {
        "num_cpus": 1, "preload": False, "hide_gpus": True, "fork_server": True}
    for odd in (warm.embedded_ray_args(FarmConfig(cpu_workers=None), sigs, object()),   # a test double
                warm.embedded_ray_args(FarmConfig(warmup="none"), sigs, None)):
        assert odd["preload"] is False and odd["fork_server"] is False
    assert warm.embedded_ray_args(FarmConfig(address="auto"), sigs, None) == {}                       # a cluster
    # a job with a GPU signature has GPU actors: its workers see the GPUs, and import torch themselves
    assert warm.embedded_ray_args_for(FarmConfig(cpu_workers=None), 3, 1, None) == {
        "num_cpus": None, "preload": False, "hide_gpus": False, "fork_server": False}
    monkeypatch.setenv("AOTI_FARM_DEV", "fork_server=0")   # each actor imports torch itself (A/B)
    assert warm.embedded_ray_args(FarmConfig(cpu_workers=None), sigs, None) == {
        "num_cpus": 3, "preload": True, "hide_gpus": True, "fork_server": False}
    monkeypatch.setattr(warm, "_host_cpus", lambda: 2)
    monkeypatch.delenv("AOTI_FARM_DEV")
    assert warm.embedded_ray_args(FarmConfig(cpu_workers=None), sigs, None) == {
        "num_cpus": 2, "preload": False, "hide_gpus": True, "fork_server": False}
    monkeypatch.setenv("AOTI_FARM_DEV", "fork_server=1")   # forced on few cores (the tests)
    assert warm.embedded_ray_args(FarmConfig(cpu_workers=None), sigs, None)["fork_server"] is True
