"""Split vs whole AOTI wrapper build, side by side in one process (aoti_farm.build.splitbuild).

    python scripts/bench/splitbuild_ab.py cuda|cpu

One warm-up compile, then 8 compiles of distinct `add` signatures alternating
AOTI_FARM_DEV=split_build=1/0; prints each compile's wall and CPU seconds (own + C++
compiler children) and the medians.  Every kernel is verified against eager by
AOTICompiler.compile.  Results: docs/benchmarks.md, "Split build".
"""
import os, sys, time, tempfile
import torch
from aoti_farm import signature as S
from aoti_farm.build import splitbuild
from aoti_farm.compile.compiler import AOTICompiler
comp = AOTICompiler()
dev = sys.argv[1]
def sig(n, k):
    a, b = torch.empty(n, 64, device=dev), torch.empty(64, device=dev)
    return S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": k})
rows = []
comp.compile(sig(7, 2), tempfile.mkdtemp())  # first compile in the process (and the common object)
for i in range(4):
    for mode in (("1", "0") if i % 2 == 0 else ("0", "1")):
        os.environ["AOTI_FARM_DEV"] = f"{splitbuild.DEV}={mode}"
        t = time.perf_counter(); c0 = os.times()
        r = comp.compile(sig(8 + i * 2 + int(mode), 2), tempfile.mkdtemp())
        c1 = os.times()
        rows.append({"split": mode, "wall": round(time.perf_counter() - t, 2),
                     "cpu": round(c1.user - c0.user + c1.system - c0.system + c1.children_user - c0.children_user + c1.children_system - c0.children_system, 2),
                     "build": r.build.get("wrapper"), "ok": r.verification.get("ok")})
        print(dev, rows[-1], flush=True)
import statistics
for m in ("1", "0"):
    print(dev, "split" if m == "1" else "whole", "median wall", statistics.median(x["wall"] for x in rows if x["split"] == m),
          "median cpu", statistics.median(x["cpu"] for x in rows if x["split"] == m))
