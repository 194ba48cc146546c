"""Peak memory of one compile + verification, for calibrating aoti_farm/budget.py.

    .venv/bin/python scripts/bench/compile_peak_rss.py      # the three signatures below

Each signature runs in a fresh process: a tiny compile first (imports, Inductor state),
then the signature's compile; it prints the peak RSS over the process's RSS before the
second compile, next to budget.estimate().  Linux only (ru_maxrss, /proc).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SIGS = {
    "relu float32[2**24]": {"op": "aten::relu", "args": [
        {"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [1 << 24], "strides": [1], "device": "cpu"}]},
    "relu float16[2**24]": {"op": "aten::relu", "args": [
        {"name": "self", "kind": "tensor", "dtype": "float16", "sizes": [1 << 24], "strides": [1], "device": "cpu"}]},
    "add float32[4096,1]+[1,4096]": {"op": "aten::add.Tensor", "args": [
        {"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [4096, 1], "strides": [1, 1], "device": "cpu"},
        {"name": "other", "kind": "tensor", "dtype": "float32", "sizes": [1, 4096], "strides": [4096, 1],
         "device": "cpu"}]},
}


def one(spec: dict) -> dict:
    import resource
    import tempfile
    import warnings

    warnings.filterwarnings("ignore")
    from aoti_farm import budget
    from aoti_farm import signature as S
    from aoti_farm.compile.compiler import AOTICompiler

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

    c = AOTICompiler()
    tiny = S.parse_signature({"op": "aten::relu", "args": [
        {"name": "self", "kind": "tensor", "dtype": "float32", "sizes": [4], "strides": [1], "device": "cpu"}]})
    with tempfile.TemporaryDirectory() as d:
        c.compile(tiny, d)
    sig = S.parse_signature(spec)
    base = rss()
    with tempfile.TemporaryDirectory() as d:
        c.compile(sig, d)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"baseline_bytes": base, "peak_over_baseline_bytes": peak - base,
            "estimate_bytes": budget.estimate(sig).bytes}


def main() -> int:
    if len(sys.argv) > 1:
        print(json.dumps(one(json.loads(sys.argv[1]))))
        return 0
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    for name, spec in SIGS.items():
        p = subprocess.run([sys.executable, __file__, json.dumps(spec)], capture_output=True, text=True, env=env)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{name:30} peak over baseline {r['peak_over_baseline_bytes'] / 1e9:.2f} GB, estimate "
              f"{r['estimate_bytes'] / 1e9:.2f} GB ({r['estimate_bytes'] / r['peak_over_baseline_bytes']:.2f}x), "
              f"baseline {r['baseline_bytes'] / 1e9:.2f} GB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
