"""The cost of one compiled signature at W=1, by phase, with a developer switch A/B'd in one
process (issue: a signature compiles in about a second).

    python scripts/bench/compile_cost.py [--switch split_overlap] [--pairs 6] [--device cpu|cuda]
                                         [--json OUT]

One warm-up compile on each side of the switch (imports, precompiled headers, the split
build's common object), then ``--pairs`` pairs of compiles of fresh signatures (a rotating set of
ops: add, gelu, addmm, sum, layer_norm, softmax), one with ``AOTI_FARM_DEV=<switch>=1`` and
one with ``=0``, the order alternating.  Every kernel is verified against eager by
``AOTICompiler.compile`` (a refused one is reported and left out of the medians).  Prints
each compile's wall seconds, its phases and the split build's record, then the medians and
the ratio of the switch's two sides.  ``--switch split_build`` A/Bs the split wrapper build
itself (docs/benchmarks.md, "Split build").

``--served N`` then asks whether the switch changes what a served call costs: N fresh
signatures (the same rotation), each built with the switch on and off, then ``--rounds``
rounds alternating which side goes first, each side's kernel timed as the hook serves it
(``speed.time_served_call``: through the dispatcher into the native hit path); prints
each signature's median served-call µs on both sides and the median of their ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import torch

from aoti_farm import signature as S
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.errors import CompileRefused

def ops(device: str) -> list:
    """Signature makers (``n`` -> a fresh signature) of the rotating ops, on ``device``."""
    def e(*shape):
        return torch.empty(*shape, device=device)
    return [
        lambda n: S.from_call(torch.ops.aten.add.Tensor, (e(n, 64), e(64)), {"alpha": 2}),
        lambda n: S.from_call(torch.ops.aten.gelu.default, (e(n, 96),), {}),
        lambda n: S.from_call(torch.ops.aten.addmm.default, (e(32), e(n, 16), e(16, 32)), {}),
        lambda n: S.from_call(torch.ops.aten.sum.dim_IntList, (e(n, 40), [1]), {}),
        lambda n: S.from_call(torch.ops.aten.native_layer_norm.default, (e(n, 48), [48], e(48), e(48), 1e-5), {}),
        lambda n: S.from_call(torch.ops.aten._softmax.default, (e(n, 24), 1, False), {}),
    ]


def served_ab(comp, OPS, a, root: str, n: int) -> list:
    """``--served``: each of ``a.served`` fresh signatures built with the switch on and off,
    then their served calls timed in alternating rounds (``speed.time_served_call``)."""
    from aoti_farm.speedgate.speed import time_served_call

    torch.set_num_threads(1)
    built = []
    for i in range(a.served):
        n += 1
        sig, paths = OPS[i % len(OPS)](n), {}
        for side in ("1", "0"):
            os.environ["AOTI_FARM_DEV"] = f"{a.switch}={side}"
            try:
                paths[side] = comp.compile(sig, tempfile.mkdtemp(dir=root)).files["kernel.so"]
            except CompileRefused as e:
                print(f"  {sig.op}: refused with {a.switch}={side} ({e})", flush=True)
        if len(paths) == 2:
            built.append((sig, paths))
    os.environ.pop("AOTI_FARM_DEV", None)
    times = {(j, side): [] for j in range(len(built)) for side in ("1", "0")}
    for r in range(a.rounds):
        for j, (sig, paths) in enumerate(built):
            for side in (("1", "0") if r % 2 == 0 else ("0", "1")):
                m = time_served_call(sig, paths[side], budget_s=0.05)
                if m is not None:
                    times[(j, side)].append(m["kernel_us"])
    out = []
    for j, (sig, _) in enumerate(built):
        on, off = times[(j, "1")], times[(j, "0")]
        if on and off:
            row = {"op": sig.op, "served_us[1]": round(statistics.median(on), 3),
                   "served_us[0]": round(statistics.median(off), 3),
                   "ratio_1_to_0": round(statistics.median(on) / statistics.median(off), 4)}
            out.append(row)
            print("  served", json.dumps(row), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", default="split_overlap", help="the AOTI_FARM_DEV switch to A/B (default split_overlap)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("--served", type=int, default=0, metavar="N",
                    help="then time N signatures' served calls, each built with the switch on and off")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of the --served timing (default 7)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("compile_cost: --device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    OPS = ops(a.device)
    comp = AOTICompiler()
    root = tempfile.mkdtemp(prefix="compile-cost-")
    # one warm-up compile on each side: a switch that changes the common half's text has a
    # common object (and precompiled headers) of its own to build first
    for i, side in enumerate(("1", "0")):
        os.environ["AOTI_FARM_DEV"] = f"{a.switch}={side}"
        t = time.perf_counter()
        comp.compile(OPS[0](3 + i), tempfile.mkdtemp(dir=root))
        print(f"warm-up compile, {a.switch}={side}: {time.perf_counter() - t:.2f} s", flush=True)
    rows = []
    n = 5
    for i in range(a.pairs):
        for side in (("1", "0") if i % 2 == 0 else ("0", "1")):
            n += 1
            os.environ["AOTI_FARM_DEV"] = f"{a.switch}={side}"
            sig = OPS[i % len(OPS)](n)
            t = time.perf_counter()
            try:
                r = comp.compile(sig, tempfile.mkdtemp(dir=root))
            except CompileRefused as e:
                print(f"  {a.switch}={side} {sig.op}: refused ({e})", flush=True)
                continue
            wall = time.perf_counter() - t
            row = {"switch": side, "op": sig.op, "wall_s": round(wall, 3),
                   "phases": {k: round(v, 3) for k, v in r.phases.items()},
                   "build": {k: v for k, v in r.build.items() if k.endswith("_s") or k == "wrapper"}}
            rows.append(row)
            print(" ", json.dumps(row), flush=True)
    served = served_ab(comp, OPS, a, root, n) if a.served else []
    os.environ.pop("AOTI_FARM_DEV", None)
    shutil.rmtree(root, ignore_errors=True)   # the kernels were scratch
    summary = {"machine": f"{platform.node()} {os.cpu_count()} cores", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "switch": a.switch, "device": a.device}
    for side in ("1", "0"):
        w = [r["wall_s"] for r in rows if r["switch"] == side]
        summary[f"median_wall_s[{side}]"] = round(statistics.median(w), 3) if w else None
    if summary["median_wall_s[1]"] and summary["median_wall_s[0]"]:
        summary["ratio_1_to_0"] = round(summary["median_wall_s[1]"] / summary["median_wall_s[0]"], 3)
    if served:
        summary["served_ratio_1_to_0"] = round(statistics.median(r["ratio_1_to_0"] for r in served), 4)
        summary["served_slower_with_1"] = sum(r["ratio_1_to_0"] > 1 for r in served)
        summary["served_signatures"] = len(served)
    print(json.dumps(summary))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "served": served, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
