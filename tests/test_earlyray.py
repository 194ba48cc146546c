"""`warm` starts an embedded Ray before it imports torch where the job surely has work
(workers/earlyray.py, #17).  The count is torch-free; the end-to-end runs are real
`aoti-farm warm` processes (real Ray, a real compile) with the core threshold lowered so
this 2-core box takes the many-core path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from _procs import alive

from aoti_farm import trace
from aoti_farm.workers import earlyray

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "examples" / "mlp_trace.json"


def _entries(path=EXAMPLE) -> list:
    return json.loads(Path(path).read_text())["entries"]


def _write(path: Path, entries: list) -> str:
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": entries}))
    return str(path)


def test_the_count_is_of_distinct_entries_per_pool_without_torch(tmp_path):
    entries = _entries()
    a = _write(tmp_path / "a.json", entries)
    assert earlyray.count_entries([a]) == {"cpu": len(entries), "gpu": 0}
    # the same entries again (another --model, other counts and order): counted once
    again = [{**e, "count": 99, "order": 1000 + i} for i, e in enumerate(entries)]
    b = _write(tmp_path / "b.json", again)
    assert earlyray.count_entries([a, b]) == {"cpu": len(entries), "gpu": 0}
    # a CUDA tensor (also inside a tensor list) makes an entry a GPU one
    cuda = json.loads(json.dumps(entries[0]))
    cuda["args"][0]["device"] = "cuda:0"
    listed = {"op": "aten::cat", "args": [{"name": "tensors", "kind": "tensor_list", "items": [
        {"name": "tensors[0]", "kind": "tensor", "dtype": "float32", "sizes": [2], "strides": [1], "device": "cuda:0"}]},
        {"name": "dim", "kind": "int", "value": 0}]}
    c = _write(tmp_path / "c.json", [cuda, listed])
    assert earlyray.count_entries([a, c]) == {"cpu": len(entries), "gpu": 2}
    assert "torch" not in _imports_of("from aoti_farm.workers import earlyray, warm, placement, raysetup")


def test_anything_odd_in_a_trace_means_no_count(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert earlyray.count_entries([str(bad)]) is None
    assert earlyray.count_entries([str(tmp_path / "missing.json")]) is None
    assert earlyray.count_entries([_write(tmp_path / "x.json", [{"op": "aten::relu"}])]) is None
    assert earlyray.MAX_TRACE_BYTES == trace.MAX_BYTES


def test_no_early_start_where_it_does_not_apply(tmp_path, monkeypatch):
    from aoti_farm.config import FarmConfig
    from aoti_farm.workers import warm

    monkeypatch.setattr(warm, "PREP_MIN_CORES", 1)
    steps = warm.early_steps()
    t = _write(tmp_path / "t.json", _entries()[:1])
    cfg = FarmConfig(cache_dir=str(tmp_path / "cache"))
    tl: dict = {}
    assert earlyray.begin(FarmConfig(cache_dir=cfg.cache_dir, address="auto"), [t], None, None, tl, steps) is None
    assert earlyray.begin(cfg, [t], None, object(), tl, steps) is None          # a test double compiler
    assert earlyray.begin(FarmConfig(cache_dir=cfg.cache_dir, dynamic="auto"), [t], None, None, tl, steps) is None
    assert earlyray.begin(cfg, [str(tmp_path / "missing.json")], None, None, tl, steps) is None
    monkeypatch.setenv("AOTI_FARM_DEV", f"{earlyray.DEV}=0")
    assert earlyray.begin(cfg, [t], None, None, tl, steps) is None
    monkeypatch.delenv("AOTI_FARM_DEV")
    monkeypatch.setattr(warm, "PREP_MIN_CORES", 10 ** 6)                       # the 2-core path
    assert earlyray.begin(cfg, [t], None, None, tl, warm.early_steps()) is None
    assert tl == {}


def _imports_of(code: str) -> set:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-1000:]
    return set(out.stdout.split())


_WARM = textwrap.dedent("""
    import os, sys
    from aoti_farm.workers import warm
    warm.PREP_MIN_CORES = 1      # take the many-core path on this box
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):   # as on an image without bytecode (aoti_farm/pycache.py)
        from aoti_farm import pycache, pyprecompile
        pycache.PROBE = ("probe_pkg", "probe_mod.py")
        pyprecompile.MIN_CORES = 1
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


def test_warm_starts_ray_before_loading_the_trace_and_compiles_for_real(tmp_path):
    relu = [e for e in _entries() if e["op"] == "aten::relu"]
    t = _write(tmp_path / "relu.json", relu)
    out, rep = _warm(tmp_path, t, "first", no_bytecode=True)
    assert out.returncode == 0, out.stderr[-3000:]
    # no notice a user cannot act on, from Ray or (a CUDA build of torch on a CPU host) torch,
    # in the driver, the actors or the children (aoti_farm/notices.py)
    assert "Token authentication is enabled" not in out.stderr, out.stderr[-3000:]
    assert "No CUDA runtime is found" not in out.stderr, out.stderr[-3000:]
    # nor Ray's notice of an actor class attribute that shadows one of its own
    assert "overwrites attribute" not in out.stderr, out.stderr[-3000:]
    tl = rep["timeline"]
    # an image without bytecode: the compile path's bytecode was compiled ahead, into the
    # farm's own cache (aoti_farm/pyprecompile.py), and the processes imported from it
    assert tl["pycache"] == str(tmp_path / "xdg" / "aoti-farm" / "pycache")
    pre = tl["precompile"]
    assert pre["failed"] == 0 and pre["compiled"] + pre["skipped"] == pre["files"] > 1000, pre
    assert tl["early_ray"] == {"entries": {"cpu": 1, "gpu": 0}}
    # Ray was imported by the main thread while the loader thread still imported torch
    assert tl["ray_imported"] < tl["loaded"] < tl["ray_started"]
    # a fresh host: the ISA probe was forked before any thread, and answered
    assert tl["isa_child"]["forked"] is True and tl["isa_child"]["status"] == "probed"
    assert [r["status"] for r in rep["signatures"]] == ["compiled"]
    assert rep["pool"]["actors_started"] == 1
    # a job without GPU signatures: the embedded Ray's workers saw no GPU (raysetup.start_ray),
    # and the warm's own process kept what it had
    assert [w["cuda_visible_devices"] for w in tl["workers"]] == [""], tl["workers"]
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
    assert earlyray.known_keys(str(tmp_path / "cache")) == 1
    assert earlyray.known_keys(str(tmp_path / "cache"), enough=0) == 0     # stops once it has enough
    assert earlyray.known_keys(str(tmp_path / "missing")) == 0
    # everything cached now: no early start, no Ray at all
    out, rep = _warm(tmp_path, t, "second")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "early_ray" not in rep["timeline"] and "ray_started" not in rep["timeline"]
    assert [r["status"] for r in rep["signatures"]] == ["cached"]


def test_a_bad_trace_on_the_early_path_is_one_line_and_writes_nothing(tmp_path):
    bad = json.loads(json.dumps(_entries()[:1]))
    bad[0]["op"] = "aten::no_such_op"
    t = _write(tmp_path / "bad.json", bad)
    out, rep = _warm(tmp_path, t, "bad")
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines()
             if ln.strip() and "WARNING" not in ln and not ln.startswith("aoti-farm-test:")]   # _WARM's own line
    assert len(lines) == 1 and "aten::no_such_op" in lines[0] and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert rep is None
    assert not list((tmp_path / "cache").rglob("manifest.msgpack"))
