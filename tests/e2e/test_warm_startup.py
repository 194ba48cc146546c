"""`warm`'s one start-up path on a many-core host, end to end: a real `aoti-farm warm`
process (real Ray, a real compile) with the core threshold lowered so this 2-core box
takes the many-core path.  Where the job surely has work, Ray starts while the planner's
thread probes a fresh host's ISA in an exec'd child (workers/warm.py); a CPU-only job's
actor compiles in a copy forked from the fork server (workers/forkserver.py); an image
without bytecode gets the farm's own bytecode cache (aoti_farm/startup/pycache.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from _procs import alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "examples" / "mlp_trace.json"


def _write(path: Path, entries: list) -> str:
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": entries}))
    return str(path)


_WARM = textwrap.dedent("""
    import os, sys
    from aoti_farm.workers import warm
    warm.PREP_MIN_CORES = 1      # take the many-core path on this box
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):   # as on an image without bytecode (aoti_farm/startup/pycache.py)
        from aoti_farm.startup import pycache
        pycache.PROBE = ("probe_pkg", "probe_mod.py")
    from aoti_farm.cli import main
    rc = main(["warm", "--model", sys.argv[1], "--cache-dir", sys.argv[2], "--report", sys.argv[3]])
    print("aoti-farm-test: CUDA_VISIBLE_DEVICES=" + repr(os.environ.get("CUDA_VISIBLE_DEVICES")), file=sys.stderr)
    sys.exit(rc)
""")


def _warm(tmp_path: Path, trace_path: str, name: str, no_bytecode: bool = False
          ) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")          # a fresh host: no ISA memo yet
    env["CUDA_VISIBLE_DEVICES"] = "7"                       # a user's choice of GPU (none here)
    if no_bytecode:   # Python writes none and the probed package has none: the farm's own cache is used
        (tmp_path / "src" / "probe_pkg").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "probe_pkg" / "__init__.py").write_text("")
        (tmp_path / "src" / "probe_pkg" / "probe_mod.py").write_text("X = 1\n")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "src"), str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    report = tmp_path / f"{name}-report.json"
    out = subprocess.run([sys.executable, "-c", _WARM, trace_path, str(tmp_path / "cache"), str(report)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    return out, (json.loads(report.read_text()) if report.exists() else None)


def test_warm_starts_ray_while_planning_and_compiles_in_a_forked_copy(tmp_path):
    relu = [e for e in json.loads(EXAMPLE.read_text())["entries"] if e["op"] == "aten::relu"]
    t = _write(tmp_path / "relu.json", relu)
    out, rep = _warm(tmp_path, t, "first", no_bytecode=True)
    assert out.returncode == 0, out.stderr[-3000:]
    # no notice a user cannot act on, from Ray or (a CUDA build of torch on a CPU host) torch,
    # in the driver, the actors or the children (aoti_farm/startup/notices.py)
    assert "Token authentication is enabled" not in out.stderr, out.stderr[-3000:]
    assert "No CUDA runtime is found" not in out.stderr, out.stderr[-3000:]
    # nor Ray's notice of an actor class attribute that shadows one of its own
    assert "overwrites attribute" not in out.stderr, out.stderr[-3000:]
    tl = rep["timeline"]
    # an image without bytecode: the farm's processes use the farm's own bytecode cache
    assert tl["pycache"] == str(tmp_path / "xdg" / "aoti-farm-private" / "pycache")
    assert list((tmp_path / "xdg" / "aoti-farm-private" / "pycache").rglob("*.pyc"))
    # the job surely had work: Ray started while the planner ran, not after it
    assert tl["loaded"] < tl["ray_started"] and tl["ray_imported"] < tl["planned"], tl
    # a fresh host: the planner's ISA probe ran in an exec'd child, and answered
    assert tl["isa_child"]["status"] == "probed", tl["isa_child"]
    # ... and the hit path's extension was not built: its build started with the warm, before
    # the first compile (aoti_farm/compile/hostprep.py: start_native_build), and that compile
    # timed its kernel through it, as the hook serves it
    assert tl["loaded"] <= tl["native_build_started"] < tl["first_dispatch"], tl
    assert list((tmp_path / "xdg" / "aoti-farm-private" / "native").rglob("_aoti_farm_native*.so"))
    assert [r["status"] for r in rep["signatures"]] == ["compiled"]
    assert rep["pool"]["actors_started"] == 1
    from aoti_farm.cache.store import Cache
    cache = Cache(tmp_path / "cache")
    (fp_id,) = cache.fingerprint_ids()
    m = cache.read_manifest(cache.entry_dir(fp_id, rep["signatures"][0]["key"]))
    assert m["speed"]["via"] == "hit path", m["speed"]
    # a job without GPU signatures: the embedded Ray's workers saw no GPU (raysetup.start_ray),
    # and the warm's own process kept what it had
    assert [w["cuda_visible_devices"] for w in tl["workers"]] == [""], tl["workers"]
    # the compile process verifies at every thread count with waiting threads asleep (aoti_farm/startup/ompwait.py)
    assert [w["omp_wait_policy"] for w in tl["workers"]] == ["PASSIVE"], tl["workers"]
    # a CPU-only job on a many-core host: the actor's compiling copy was forked from the fork
    # server, which had imported torch (workers/forkserver.py); the compile ran in the copy
    fork = tl["workers"][0]["fork"]
    assert fork["pid"] == tl["workers"][0]["pid"] and fork["server_pid"] not in (None, fork["pid"]), fork
    assert fork["span"][1] - fork["span"][0] < 60 and "error" not in fork and "lost" not in fork, fork
    assert fork["imports"] == "all" and fork["threads_seen"] == [], fork   # Inductor too, single-threaded
    assert rep["signatures"][0]["worker"].endswith(f":{fork['pid']}")
    assert "preload" in tl["workers"][0]["phases"] and "fork" in tl["workers"][0]["phases"]
    assert tl["workers"][0]["proxy_imported_torch"] is False   # Ray's actor process never imported torch
    assert not alive(fork["server_pid"])   # stopped with Ray
    assert "aoti-farm-test: CUDA_VISIBLE_DEVICES='7'" in out.stderr, out.stderr[-2000:]
    # everything cached now: no Ray at all
    out, rep = _warm(tmp_path, t, "second")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ray_started" not in rep["timeline"] and "isa_child" not in rep["timeline"]
    assert [r["status"] for r in rep["signatures"]] == ["cached"]
