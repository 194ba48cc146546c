"""GPU validation steps, run by scripts/gpu/validate.sh on a host with a CUDA GPU.

1. mixed warm: a trace with CUDA and CPU signatures through `aoti-farm warm` with 4 GPU
   actors at num_gpus=0.25 beside CPU actors; every kernel verified against eager on the GPU;
2. differential: hook vs eager on CUDA (hits through the CUDA runner, misses on eager);
3. benchmarks on CUDA: hit and miss path per call against upstream's C++ holder, and warm
   throughput of the GPU actors against upstream's sequential compile, in the same run;
4. fingerprint: GPU name / compute capability / CUDA version are in the fingerprint, and an
   entry with another GPU arch is not served.
Writes $OUT/gpu-results.json; prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

RESULTS: dict = {}


def log(*a):
    print("[gpu]", *a, flush=True)


def cuda_sigs():
    from aoti_farm import signature as S

    d = "cuda"
    x = lambda *s, dt=torch.float32: torch.empty(*s, device=d, dtype=dt)  # noqa: E731
    A = torch.ops.aten
    calls = [
        (A.add.Tensor, (x(64, 128), x(64, 128)), {"alpha": 2}),
        (A.add.Tensor, (x(1024, 1024), x(1024, 1024)), {}),
        (A.mul.Tensor, (x(64, 128), x(128)), {}),
        (A.div.Tensor_mode, (x(32, 64), x(32, 64)), {"rounding_mode": "floor"}),
        (A.sum.dim_IntList, (x(16, 256), [1]), {"dtype": torch.float64}),
        (A.relu.default, (x(256, 256),), {}),
        (A.gelu.default, (x(64, 512),), {}),
        (A.mm.default, (x(128, 256), x(256, 64)), {}),
        (A.add.Tensor, (x(64, 128).t(), x(128, 64)), {}),
        (A.bitwise_and.Tensor, (x(64, dt=torch.int32), x(64, dt=torch.int32)), {}),
        (A.logical_not.default, (x(128, dt=torch.bool),), {}),
        (A.cat.default, ([x(8, 16), x(4, 16)],), {}),
    ]
    return [S.from_call(op, a, k) for op, a, k in calls]


def cpu_sigs():
    from aoti_farm import signature as S

    A = torch.ops.aten
    return [S.from_call(A.add.Tensor, (torch.empty(8, 16), torch.empty(16)), {"alpha": 2}),
            S.from_call(A.mul.Tensor, (torch.empty(8, 16), torch.empty(8, 16)), {})]


def write_trace(sigs, path):
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(sigs)]), path)


def step_warm(out, cache_dir):
    trace = os.path.join(out, "mixed_trace.json")
    write_trace(cuda_sigs() + cpu_sigs(), trace)
    report = os.path.join(out, "warm_report.json")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "aoti_farm", "warm", "--model", trace, "--cache-dir", cache_dir,
                        "--gpu-workers", "4", "--gpus-per-worker", "0.25", "--cpu-workers", "4",
                        "--report", report], text=True, capture_output=True)
    wall = time.perf_counter() - t0
    print(r.stdout[-4000:], r.stderr[-4000:])
    rep = json.load(open(report)) if os.path.exists(report) else {}
    RESULTS["mixed_warm"] = {"exit": r.returncode, "wall_s": wall, "report": rep}
    # first-compile cost per actor: each worker's first signature vs its later ones
    per_worker: dict = {}
    for row in rep.get("signatures", []):
        if row.get("status") == "compiled":
            per_worker.setdefault(str(row.get("worker")), []).append(row)
    summary = {}
    for w, rows in per_worker.items():
        rows.sort(key=lambda x: x.get("started", 0) or 0)
        secs = [float(x.get("seconds") or 0) for x in rows]
        summary[w] = {"n": len(secs), "first_s": secs[0], "later_mean_s": (sum(secs[1:]) / len(secs[1:])) if secs[1:] else None,
                      "ops": [x.get("op") for x in rows]}
    RESULTS["per_actor_compile"] = summary
    log(f"mixed warm: exit {r.returncode} in {wall:.1f}s")
    for w, v in summary.items():
        log(f"  actor {w}: {v['n']} compiles, first {v['first_s']:.1f}s, later mean {v['later_mean_s']}")
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-upstream-seq", action="store_true")
    ns = ap.parse_args()
    os.makedirs(ns.out, exist_ok=True)
    RESULTS["machine"] = {"gpu": torch.cuda.get_device_name(0), "cc": torch.cuda.get_device_capability(0),
                          "cuda": torch.version.cuda, "torch": torch.__version__, "cpus": os.cpu_count(),
                          "host": platform.node(), "date": datetime.date.today().isoformat()}
    log(RESULTS["machine"])
    cache_dir = "/tmp/aoti-farm-gpu-cache"
    rc = step_warm(ns.out, cache_dir)
    # steps 2-4 run in a child re-exec'ed with the libstdc++ preload when the host needs it
    env = dict(os.environ)
    from aoti_farm.startup.loadenv import child_env, remembered

    RESULTS["loadenv"] = remembered()
    env = child_env(env)
    log("loader probe:", RESULTS["loadenv"], "LD_PRELOAD for serving steps:", env.get("LD_PRELOAD"))
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "serving_checks.py"),
                        "--cache-dir", cache_dir, "--out", ns.out] + (["--skip-upstream-seq"] if ns.skip_upstream_seq else []),
                       env=env)
    RESULTS["serving_checks_exit"] = r.returncode
    with open(os.path.join(ns.out, "gpu-results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    return 0 if rc == 0 and r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
