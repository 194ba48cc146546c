"""A/B of the fork server (workers/forkserver.py) on one warm, in turn.

    python scripts/bench/forkserver_ab.py [--model configs/examples/mlp_trace.json] [--pairs 4]

Runs ``aoti-farm warm --model MODEL`` with ``AOTI_FARM_DEV=fork_server=1`` and ``=0``
alternately (on, off, on, off, ...), each with a fresh cache directory and the same host
state otherwise (Inductor's cache and the host memos are shared by both sides, warmed by
one untimed run of each first). Prints each run's wall time and its report's start-up
marks, then the medians and the on/off ratio of each pair's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def one(model: str, on: bool, work: Path) -> dict:
    cache, report = work / "cache", work / "report.json"
    shutil.rmtree(cache, ignore_errors=True)
    report.unlink(missing_ok=True)
    env = {**os.environ, "AOTI_FARM_DEV": "fork_server=1" if on else "fork_server=0"}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "aoti_farm", "warm", "--model", model, "--cache-dir", str(cache),
                        "--report", str(report)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"forkserver_ab: warm failed (rc {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    tl = json.loads(report.read_text())["timeline"]
    rel = lambda k: round(tl[k] - tl["process_start"], 2) if tl.get(k) else None   # noqa: E731
    forks = sorted({(w.get("fork") or {}).get("imports") or "none" for w in tl.get("workers", [])})
    return {"on": on, "wall_s": round(wall, 2), "first_compile_s": rel("first_dispatch"),
            "shutdown_s": round(tl["ray_shutdown"] - tl["scheduler_done"], 2) if tl.get("ray_shutdown") else None,
            "forked_imports": forks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "configs" / "examples" / "mlp_trace.json"))
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    if not Path(a.model).is_file():
        sys.exit(f"forkserver_ab: --model {a.model}: no such file; name a trace file")
    with tempfile.TemporaryDirectory(prefix="aoti-farm-forkab-") as d:
        work = Path(d)
        print(f"forkserver_ab: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} cores, "
              f"model {a.model}, {a.pairs} pairs (on, off in turn) after one untimed run of each", flush=True)
        one(a.model, True, work), one(a.model, False, work)
        runs = []
        for i in range(a.pairs):
            for on in (True, False):
                r = one(a.model, on, work)
                runs.append(r)
                print(json.dumps(r), flush=True)
    on = [r for r in runs if r["on"]]
    off = [r for r in runs if not r["on"]]
    med = lambda rs, k: statistics.median(r[k] for r in rs)   # noqa: E731
    ratios = [x["wall_s"] / y["wall_s"] for x, y in zip(on, off)]
    print(f"median wall: on {med(on, 'wall_s'):.2f} s, off {med(off, 'wall_s'):.2f} s; on/off per pair "
          f"{[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}")
    print(f"median first compile: on {med(on, 'first_compile_s'):.2f} s, off {med(off, 'first_compile_s'):.2f} s; "
          f"median Ray shutdown: on {med(on, 'shutdown_s'):.2f} s, off {med(off, 'shutdown_s'):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
