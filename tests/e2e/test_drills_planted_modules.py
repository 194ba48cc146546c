"""Drill: modules planted in a shared working directory never run in a process the farm
starts (issue: the hook's helpers imported from the serving program's working directory).

A second local user (``aotiattacker``, as in test_drills_env_attacks.py) writes
``argparse.py``, ``json.py``, ``subprocess.py``, ``msgpack.py``, ``filelock.py`` and an
``aoti_farm/`` package into a world-writable directory.  Each records the pid and command
line of any process that imports it.  Then, with that directory as the working directory:

* a serving program (started by its path, as users start one) installs the hook and
  misses: the hook starts its compile worker, which compiles, probes the loader and
  verifies, and the native hit path's background build;
* ``aoti-farm warm`` (the console script) compiles a one-signature trace on an embedded
  Ray: host preparation, the bytecode compilers, the fork server, Ray's workers and the
  compile actors.

Both run in a fresh private directory (``XDG_CACHE_HOME``), so every memo is missing
and every helper starts.  Nothing planted may run.  The fix is aoti_farm/startup/spawn.py; the
test that every spawn site goes through it is tests/unit/test_spawn_sites.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_drills_env_attacks import as_attacker, attacker, shared  # noqa: F401 -- fixtures

REPO = Path(__file__).resolve().parents[2]
PLANTED = ("argparse", "json", "subprocess", "msgpack", "filelock", "aoti_farm")

#: What each planted module does: leave a mark naming the process that imported it.
PAYLOAD = textwrap.dedent("""
    import os as _os, sys as _sys
    _d = {here!r}
    with open(_os.path.join(_d, "ran-{name}-%d" % _os.getpid()), "w") as _f:
        _f.write(" ".join(_sys.argv))
""")


def _plant(pw, d: Path) -> None:
    script = [f"mkdir -p {d}/aoti_farm"]
    for name in PLANTED:
        path = d / ("aoti_farm/__init__.py" if name == "aoti_farm" else f"{name}.py")
        script.append(f"cat > {path} <<'PY'\n{PAYLOAD.format(here=str(d), name=name)}PY")
    as_attacker(pw, "\n".join(script))
    assert (d / "argparse.py").stat().st_uid == pw.pw_uid


def _marks(d: Path) -> list[str]:
    return sorted(f"{p.name}: {p.read_text()[:200]}" for p in d.glob("ran-*"))


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONWARNINGS": "ignore",
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "xdg" / "inductor-unused")}


def test_planted_modules_never_run_in_the_hooks_helpers(attacker, shared, tmp_path):
    _plant(attacker, shared)
    (tmp_path / "xdg").mkdir(mode=0o700)
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    prog_dir = tmp_path / "prog"
    prog_dir.mkdir(mode=0o700)
    prog = prog_dir / "serve.py"
    cache = tmp_path / "cache"
    prog.write_text(textwrap.dedent(f"""
        import glob, json, time, torch
        import aoti_farm.runtime as rt

        x = torch.randn(8, 16)
        with rt.install(cache_dir={str(cache)!r}, serve="always", on_miss="compile") as hook:
            want = torch.relu(x)          # a miss: the compile worker starts and compiles it
            end = time.time() + 240
            while time.time() < end and not glob.glob({str(shared)!r} + "/ran-*"):
                got = torch.relu(x)
                if hook.stats()["summary"]["served"]:
                    break
                time.sleep(0.5)
            st = hook.stats()
        print(json.dumps({{"served": st["summary"]["served"], "equal": bool(torch.equal(got, want))}}))
    """))
    env = _env(tmp_path)
    env.pop("TORCHINDUCTOR_CACHE_DIR")
    r = subprocess.run([sys.executable, str(prog)], cwd=shared, env=env, capture_output=True, text=True,
                       timeout=600)
    marks = _marks(shared)
    assert not marks, f"planted modules ran in processes the hook started: {marks}"
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"served": out["served"], "equal": True} and out["served"] >= 1, (out, r.stderr[-2000:])


def test_planted_modules_never_run_in_warm_its_ray_workers_or_actors(attacker, shared, tmp_path):
    _plant(attacker, shared)
    (tmp_path / "xdg").mkdir(mode=0o700)
    entry = next(e for e in json.loads((REPO / "configs/examples/mlp_trace.json").read_text())["entries"]
                 if e["op"] == "aten::relu")
    doc = json.loads((REPO / "configs/examples/mlp_trace.json").read_text())
    trace = tmp_path / "relu.json"
    trace.write_text(json.dumps({**doc, "entries": [entry]}))
    env = _env(tmp_path)
    env.pop("TORCHINDUCTOR_CACHE_DIR")
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([str(REPO / ".venv/bin/aoti-farm"), "warm", "--model", str(trace), "--cache-dir",
                        str(tmp_path / "cache"), "--report", str(tmp_path / "report.json")],
                       cwd=shared, env=env, capture_output=True, text=True, timeout=600)
    marks = _marks(shared)
    assert not marks, f"planted modules ran in processes warm started: {marks}"
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    from aoti_farm.cache.store import Cache

    cache = Cache(tmp_path / "cache")
    assert sum(len(cache.list_keys(f)) for f in cache.fingerprint_ids()) == 1, r.stdout[-2000:]
