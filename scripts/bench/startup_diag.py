#!/usr/bin/env python
"""Start-up diagnostics (what an actor's imports cost on this host).

    python scripts/bench/startup_diag.py [--procs 16] [--out DIR]

Prints, each from fresh processes: the import of torch and of the actors' preload
(:mod:`aoti_farm.workers.actor_preload`) alone, with the GPU visible and hidden
(``CUDA_VISIBLE_DEVICES=``), whether triton got imported, the same with ``--procs``
processes at once, and ``python -X importtime``'s heaviest modules.  Nothing asserts."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_ONE = r"""
import json, sys, time
t0 = time.time()
import torch
t1 = time.time()
import aoti_farm.workers.actor_preload as p
t2 = time.time()
print(json.dumps({"torch": round(t1 - t0, 2), "preload": round(t2 - t1, 2), "error": p.ERROR,
                  "triton": "triton" in sys.modules, "modules": len(sys.modules)}))
"""


def one(env_extra: dict, n: int = 1) -> list:
    env = {**os.environ, **env_extra}
    t0 = time.time()
    ps = [subprocess.Popen([sys.executable, "-c", _ONE], env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(n)]
    outs = []
    for p in ps:
        o, _ = p.communicate()
        try:
            outs.append(json.loads(o.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            outs.append({"rc": p.returncode})
    return {"wall": round(time.time() - t0, 2), "runs": outs}


def importtime(env_extra: dict, top: int = 40) -> list:
    env = {**os.environ, **env_extra}
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import aoti_farm.workers.actor_preload"],
                       env=env, capture_output=True, text=True)
    rows = []
    for ln in p.stderr.splitlines():
        if not ln.startswith("import time:") or "cumulative" in ln:
            continue
        parts = ln[len("import time:"):].split("|")
        try:
            rows.append((int(parts[1]), int(parts[0]), parts[2].rstrip()))
        except (ValueError, IndexError):
            continue
    rows.sort(reverse=True)
    return [f"{c / 1e6:6.2f}s cum {s / 1e6:6.2f}s self {name}" for c, s, name in rows[:top]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    hidden = {"CUDA_VISIBLE_DEVICES": ""}
    one({})   # page cache
    for label, env in (("visible", {}), ("hidden", hidden), ("visible", {}), ("hidden", hidden)):
        print(f"[diag] alone, GPU {label}: {json.dumps(one(env))}", flush=True)
    for label, env in (("visible", {}), ("hidden", hidden)):
        r = one(env, a.procs)
        pre = sorted(x.get("preload", 0) + x.get("torch", 0) for x in r["runs"])
        print(f"[diag] {a.procs} at once, GPU {label}: wall {r['wall']}s, torch+preload each "
              f"{pre[0]:.2f}-{pre[-1]:.2f}s, triton imported {sum(bool(x.get('triton')) for x in r['runs'])}",
              flush=True)
    for label, env in (("visible", {}), ("hidden", hidden)):
        print(f"[diag] -X importtime, GPU {label} (heaviest cumulative):", flush=True)
        for ln in importtime(env):
            print("   ", ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
