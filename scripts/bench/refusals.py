#!/usr/bin/env python
"""How many of a real workload's signatures verification refuses, per workload and device.

    python scripts/bench/refusals.py --out DIR [--device cpu|cuda] [--models gpt2,bert,unet,mlp]
                                     [--contract finite|strict] [--cpu-workers N]

As a user would: each workload is recorded on ``--device`` (``aoti_farm.record``, in a
child process), then warmed into its own fresh cache with ``aoti-farm warm --model T
--cache-dir C --report R`` (the defaults; an embedded local Ray), and the warm's report is
read.  Per workload it prints the signatures, how many were published, how many
verification refused (the contract's refusals: a final outcome after which eager serves
the call), how many failed otherwise, each refusal's op and first line, and the edge notes
the published kernels carry.  The issue's bar: at the default level at most 1 signature
in 20 refused.

Workloads (nobody on the project wrote the first two; random weights from small configs):
``gpt2`` greedy generate and ``bert`` forward as in ``real_models.py``, ``unet`` the
U-Net-style block of issue 31 (conv, group norm, SiLU, average and max pooling, bilinear
upsampling, a skip concat, ``var_mean``), ``mlp`` the README's example model.  Writes
``refusals.json`` (machine, date, per-workload rows) and the traces and reports under
``--out``; the caches go to ``--out`` too (delete them after).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from real_models import MODELS, build  # noqa: E402 -- the workloads real_models.py serves


def record_child(name: str, device: str, trace: str) -> None:
    import aoti_farm

    run = build(name, device=device)
    run()                                   # first-call set-up (lazy modules) outside the trace
    with aoti_farm.record(trace, devices=(device,)):
        run()


def summarize(report_path: str) -> dict:
    """The counts of one warm report, read and checked as ``aoti-farm report`` reads it, and
    classed as warm's own summary classes them (``cache.failures.tally``)."""
    from aoti_farm.cache.failures import tally
    from aoti_farm.report.report_html import load_report

    rows = load_report(report_path)["signatures"]
    published = [r for r in rows if r.get("status") in ("compiled", "cached")]
    refused = [r for r in rows if r.get("status") == "failed" and r.get("refused")]
    other = [r for r in rows if r.get("status") not in ("compiled", "cached") and not r.get("refused")]
    first = lambda r: (r.get("error") or "").strip().splitlines()[0][:160] if r.get("error") else ""
    refused_by, notes_by = tally(rows)
    return {"signatures": len(rows), "published": len(published), "refused": len(refused),
            "failed_other": len(other), "refused_by_class": refused_by,
            "refusals": [{"op": r.get("op"), "description": r.get("description"), "why": first(r)} for r in refused],
            "failures": [{"op": r.get("op"), "status": r.get("status"), "why": first(r)} for r in other],
            "edge_notes": notes_by}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for refusals.json, the traces, reports and caches")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--contract", choices=("finite", "strict"), default=None,
                    help="the verification contract (default: the warm's own, i.e. $AOTI_FARM_CONTRACT or finite)")
    ap.add_argument("--cpu-workers", type=int, default=None, help="passed to warm")
    ap.add_argument("--record-child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.record_child:
        record_child(*a.record_child)
        return 0
    names = [m for m in a.models.split(",") if m]
    for m in names:
        if m not in MODELS:
            print(f"refusals: --models: {m!r} is not one of {', '.join(MODELS)}", file=sys.stderr)
            return 2
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    if a.contract:
        env["AOTI_FARM_CONTRACT"] = a.contract
    results = {}
    for m in names:
        trace = os.path.join(a.out, f"{m}-{a.device}.json")
        report = os.path.join(a.out, f"{m}-{a.device}-report.json")
        cache = os.path.join(a.out, f"cache-{m}-{a.device}")
        t0 = time.time()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--out", a.out, "--record-child", m, a.device, trace],
                       check=True)
        cmd = [sys.executable, "-m", "aoti_farm", "warm", "--model", trace, "--cache-dir", cache, "--report", report]
        if a.cpu_workers:
            cmd += ["--cpu-workers", str(a.cpu_workers)]
        rc = subprocess.run(cmd, env=env).returncode
        s = summarize(report)
        s["warm_rc"], s["seconds"] = rc, round(time.time() - t0, 1)
        results[m] = s
        print(f"[refusals] {m} on {a.device}: {s['signatures']} signatures, {s['published']} published, "
              f"{s['refused']} refused, {s['failed_other']} failed otherwise ({s['seconds']} s)", flush=True)
    import platform

    import torch

    print("\nworkload | device | signatures | published | refused | failed | bar (<= 1 in 20)")
    for m, s in results.items():
        ok = s["refused"] * 20 <= s["signatures"]
        print(f"{m} | {a.device} | {s['signatures']} | {s['published']} | {s['refused']} | {s['failed_other']} | "
              f"{'met' if ok else 'NOT met'}")
        for r in s["refusals"]:
            print(f"    refused {r['op']} {r['description']}: {r['why']}")
        for r in s["failures"]:
            print(f"    failed {r['op']} ({r['status']}): {r['why']}")
        if s["edge_notes"]:
            print(f"    edge notes: {s['edge_notes']}")
    out = {"machine": platform.node(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "contract": a.contract or "default", "workloads": results}
    with open(os.path.join(a.out, "refusals.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0 if all(s["warm_rc"] == 0 for s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
