"""scripts/bench/scaling.py's own logic, without running a warm: --combine (a comparison
from runs measured by separate invocations: W=1 on a big job outlasts one command on a
lent machine) and the CPU breakdown by process.  The runs themselves are real in the
benchmark, never here.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_scaling_bench.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench" / "scaling.py"


def _part(path: Path, workers: int, wall: float, sha: str = "ab" * 32, cpu: str = "Xeon") -> str:
    run = {"label": f"w{workers}", "workers": workers, "rc": 0, "wall_s": wall, "compile_s": {"median": 5.0}}
    machine = {"platform": "Linux", "cpu_count": 64, "cpu_model": cpu, "python": "3.12", "torch": "2.11",
               "date": f"2026-11-27T06:{workers:02d}:00+00:00", "loadavg_at_start": [workers / 10, 0, 0]}
    path.write_text(json.dumps({"machine": machine,
                                "job": {"source": "t", "signatures": 169, "trace_sha256": sha}, "runs": [run]}))
    return str(path)


def _combine(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), "--combine", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_combine_compares_runs_of_one_trace(tmp_path):
    a, b = _part(tmp_path / "a.json", 64, 20.0), _part(tmp_path / "b.json", 1, 800.0)
    p = subprocess.run([sys.executable, str(SCRIPT), "--combine", a, b, "--json", str(tmp_path / "c.json")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "c.json").read_text())
    assert [r["workers"] for r in out["runs"]] == [64, 1]
    assert out["speedup"] == 40.0 and out["farm_scaling"] == 800.0 / (64 * 20.0)
    assert "speed-up W=1 / W=64: 40.00x" in p.stdout


def test_combine_refuses_runs_of_different_traces_or_hosts(tmp_path):
    a = _part(tmp_path / "a.json", 64, 20.0)
    for other in (_part(tmp_path / "b.json", 1, 800.0, sha="cd" * 32),
                  _part(tmp_path / "c.json", 1, 800.0, cpu="EPYC")):
        p = _combine(a, other, cwd=tmp_path)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert p.stderr.strip().count("\n") == 0 and "--combine" in p.stderr
    (tmp_path / "bad.json").write_text("{")
    p = _combine(a, str(tmp_path / "bad.json"), cwd=tmp_path)
    assert p.returncode != 0 and "Traceback" not in p.stderr and "bad.json" in p.stderr


def test_cpu_sampler_splits_the_hosts_cpu_time_by_state():
    """The host's CPU seconds by state over a run (/proc/stat): a niced busy child shows
    as "nice", which is how Ray runs its workers (niceness 15), apart from "user"."""
    sys.path.insert(0, str(SCRIPT.parent))
    import time

    import scaling

    t0 = time.time()
    with scaling.CpuSampler(every=0.2) as cs:
        subprocess.run(["nice", "-n", "15", sys.executable, "-c", "import time\nt = time.time()\n"
                        "while time.time() - t < 1.5: pass"], check=True, timeout=60)
    states = cs.summary(t0)["states_s"]
    assert set(states) == set(scaling.CpuSampler.STATES)
    assert states["nice"] >= 0.5, states   # most of the child's 1.5 s of CPU, at niceness 15


def test_cpu_sampler_keeps_a_process_whose_command_line_is_gone(monkeypatch):
    """A process counted as an actor keeps its count when its command line can no longer be
    read (a zombie's is empty: Ray's shutdown kills every actor at once). Before, such
    processes were dropped, and at W=64 the breakdown counted 0-3 of 64 actors."""
    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    cs = scaling.CpuSampler()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen = []

        def kind(pid, argv=None):
            if pid != str(child.pid):
                return None
            seen.append(pid)
            return "actors" if len(seen) == 1 else None   # then: no command line

        monkeypatch.setattr(scaling, "_proc_kind", kind)
        cs._scan()
        cs._scan()
    finally:
        child.kill()
        child.wait()
    assert len(seen) == 2
    assert cs.cpu_by_kind()["actors"]["processes"] == 1


def test_a_forked_copy_counts_as_an_actor_and_the_fork_server_as_itself():
    """The fork server's processes share its command line; a copy renames itself
    (workers/forkserver.py's COPY_NAME), which is how the breakdown counts it as an actor."""
    import subprocess

    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    from aoti_farm.workers.forkserver import COPY_NAME

    code = ("import sys, time\n"
            "if sys.argv[2] == 'copy':\n"
            "    open('/proc/self/comm', 'w').write(sys.argv[3])\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    procs = {role: subprocess.Popen([sys.executable, "-c", code, "aoti_farm.workers.forkserver", role, COPY_NAME],
                                    stdout=subprocess.PIPE, text=True) for role in ("copy", "server")}
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        assert scaling._proc_kind(str(procs["copy"].pid)) == "actors"
        assert scaling._proc_kind(str(procs["server"].pid)) == "fork server"
    finally:
        for p in procs.values():
            p.kill()


def test_cpu_sampler_names_the_processes_that_took_the_most_cpu():
    """An outlier warm showed hundreds of CPU-seconds in the driver's reaped children and
    no way to tell which process took them: the sampler now names the heaviest processes
    (own CPU, parent, command line after exec), whatever their kind."""
    sys.path.insert(0, str(SCRIPT.parent))
    import scaling

    with scaling.CpuSampler(every=0.2) as cs:
        subprocess.run([sys.executable, "-c", "import time\nt = time.time()\n"
                        "while time.time() - t < 1.5: pass", "busy-marker"], check=True, timeout=60)
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6)", "idle-marker"], check=True, timeout=60)
    top = cs.heaviest(5)
    assert "busy-marker" in top[0]["cmd"] and top[0]["own_s"] >= 0.8, top
    assert top[0]["ppid"] == os.getpid()
    idle = [p for p in top if "idle-marker" in p["cmd"]]
    assert idle and idle[0]["own_s"] < top[0]["own_s"], top
