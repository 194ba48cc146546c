"""The unit tests split from tests/e2e/test_scaling_bench.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench" / "scaling.py"


def test_cpu_by_process_kind_reads_the_command_lines_ray_and_the_farm_use():
    """The benchmark's CPU breakdown: Ray's raylet names default_worker.py in its own
    arguments and Ray names its agents ray::...Agent, neither of which is an actor."""
    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    site = "/v/lib/python3.11/site-packages/ray"
    cases = {
        (f"{site}/core/src/ray/raylet/raylet", "--python_worker_command=/v/bin/python "
         f"{site}/_private/workers/default_worker.py"): "ray daemons",
        (f"{site}/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/x"): "ray daemons",
        ("ray::DashboardAgent",): "ray python",
        ("ray::RuntimeEnvAgent",): "ray python",
        ("/v/bin/python", "-u", f"{site}/_private/log_monitor.py", "--session-dir=/tmp/x"): "ray python",
        ("ray::IDLE",): "actors",
        ("ray::CompileActor.compile",): "actors",
        ("/v/bin/python", f"{site}/_private/workers/default_worker.py", "--node-ip-address=1"): "actors",
        ("/v/bin/python", "-m", "aoti_farm", "warm", "--model", "t.json"): "driver and its children",
        ("/v/bin/python", "-m", "aoti_farm.workers.forkserver", "/tmp/aoti-farm-fork-x/s"): "fork server",
        ("/v/bin/python", "-m", "aoti_farm.compile.compiler", "--serve"): "verification children",
        ("/opt/gcc/bin/g++", "-O2", "-c", "k.cpp"): None,
    }
    for argv, kind in cases.items():
        assert scaling.kind_of(list(argv)) == kind, argv


def test_the_ceiling_replays_a_recorded_compile_into_its_own_object():
    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    rec = {"argv": ["g++", "/w/captured/model_half.cpp", "-O1", "-include", "/p/x.h", "-c", "-o", "/gone/m.o"]}
    assert scaling._replay(rec, 3) == ["g++", "/w/captured/model_half.cpp", "-O1", "-include", "/p/x.h", "-c",
                                       "-o", "/w/captured/model_half.ceiling3.o"]
    assert rec["argv"][-1] == "/gone/m.o"


def test_run_plan_rotates_each_round_and_labels_are_directory_names():
    """An A/B in one invocation: every side once per round, the order rotated per round;
    an --also-env value with slashes (another checkout on PYTHONPATH) is still one short
    directory name (Ray's socket paths under it are limited to 107 bytes), and the first
    round keeps the plain labels the summary reads."""
    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    plan = scaling.run_plan([16], also_env=["AOTI_FARM_DEV=fresh_isa=0", "PYTHONPATH=/w/.whl/old:/tmp/site"],
                            rounds=3)
    labels = [label for _, label, _ in plan]
    assert labels[:3] == ["w16-0fresh_isa=0", "w16-1old_tmp_site", "w16"]
    assert labels[3:6] == ["w16-1old_tmp_site-r1", "w16-r1", "w16-0fresh_isa=0-r1"]
    assert labels[6:9] == ["w16-r2", "w16-0fresh_isa=0-r2", "w16-1old_tmp_site-r2"]
    assert all("/" not in label and len(label) <= 24 for label in labels) and len(set(labels)) == 9
    assert plan[1][2] == {"PYTHONPATH": "/w/.whl/old:/tmp/site"}
    both = scaling.run_plan([16], also_env=["A_B=0;C_D=x=1"])   # several variables in one run
    assert both[0][2] == {"A_B": "0", "C_D": "x=1"} and both[0][1] == "w16-00_x=1"
    assert [w for w, _, _ in scaling.run_plan([1, 16])] == [16, 1]


def test_each_side_of_an_ab_has_its_precompiled_headers_built_before_the_runs(monkeypatch, tmp_path):
    """A code from before the private Inductor cache keeps its precompiled headers in
    Inductor's global directory: unless they are built before the runs, that side's first
    warm of the invocation builds them too and its pair favours the other side.  So the
    prebuild runs once for the current code and once per distinct --also-env side (not for
    the ISA switch, which runs the current code), before the first warm."""
    sys.path.insert(0, str(SCRIPT.parent))
    import common
    import scaling

    events = []

    def prebuild(work, extra_env=None, name="headers"):
        events.append(("prebuild", extra_env, name))
        return {"seconds": 0.0, "rc": 0, "out": '"prepared"'}

    def warm(trace, w, work, label, env, fresh_headers=False, timeout=0):
        events.append(("warm", env, label))
        return {"label": label, "workers": w, "env": env or {}, "rc": 0, "wall_s": 1.0, "stderr_tail": ""}

    monkeypatch.setattr(scaling, "prebuild_headers", prebuild)
    monkeypatch.setattr(scaling, "run_warm", warm)
    monkeypatch.setattr(scaling, "summarise", lambda out, workers, log=print: None)
    monkeypatch.setattr(common, "machine", lambda: {})   # lscpu: a subprocess
    old = "PYTHONPATH=/w/old:/tmp/site"
    out = scaling.bench([16], tmp_path, trace=str(REPO / "configs" / "examples" / "mlp_trace.json"),
                        log=lambda *a: None, ceiling=False, also_env=[old, old], rounds=2,
                        isa_replay_off_too=True)
    prebuilds = [e for e in events if e[0] == "prebuild"]
    assert prebuilds == [("prebuild", None, "headers"), ("prebuild", {"PYTHONPATH": "/w/old:/tmp/site"}, "headers-0")]
    assert events.index(prebuilds[-1]) < min(i for i, e in enumerate(events) if e[0] == "warm")
    assert out["headers_prebuilt_also"][0]["env"] == {"PYTHONPATH": "/w/old:/tmp/site"}
    assert sum(e[0] == "warm" for e in events) == 2 * 4
