#!/usr/bin/env python
"""What routing an op through the hook costs when the call then runs eager.

    python scripts/bench/routecost.py [--device cpu|cuda] [--rounds 15] [--json out.json]

A routed op enters the hook's kernel on every call, even where the hook has nothing to
serve (a remembered miss, a gated or failed signature): the dispatcher boxes the
arguments, the native path builds the call's key and looks it up, and eager's kernel runs
from the boxed arguments.  This times that, per call, for ops a small transformer calls
(at its sizes), in one process, interleaved rounds:

* ``eager``: no hook installed;
* ``routed``: ``install(route="all", on_miss="ignore")`` on an empty cache, every call a
  remembered miss (the native path's hot path for a call it does not serve);
* ``boxed only``: the same hook, the calls made inside ``Routes.bypassed()`` (the kernel
  returns to eager at once: the dispatcher's boxing and unboxing alone; with the typed
  entry, an op it registers unboxed pays no boxing here);
* ``routed, all boxed`` (``--ab-typed``): ``routed`` with ``AOTI_FARM_DEV=typed_entry=0``,
  every op registered boxed (fastpath.cpp's typed entry off), in the same rounds.

Per op: the median over rounds of each phase's median batch, and the differences.  With
``route="servable-at-install"`` (the hook's default with ``on_miss="ignore"``) an op with
nothing servable is not routed at all and pays none of this.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:  # an installed aoti-farm (e.g. pip install --target) first, else this checkout
    import aoti_farm.runtime  # noqa: F401
except ImportError:
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def cases(device: str) -> list[tuple[str, str, object]]:
    """(name, aten op, fn) at a tiny BERT's sizes (batch 2 x 32 tokens, hidden 128)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    x, y, w, b = r(2, 32, 128), r(2, 32, 128), r(128, 128), r(128)
    x2 = x.view(64, 128)
    lw, lb = r(128), r(128)
    return [
        ("add 2x32x128", "aten::add.Tensor", lambda: x + y),
        ("addmm 64x128 @ 128x128", "aten::addmm", lambda: torch.addmm(b, x2, w)),
        ("layer_norm 2x32x128", "aten::native_layer_norm", lambda: F.layer_norm(x, (128,), lw, lb)),
        ("gelu 2x32x128", "aten::gelu", lambda: F.gelu(x)),
    ]


def _batch(fn, n: int, device: str) -> float:
    gc.collect()
    gc.disable()
    try:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        gc.enable()


def _install(cache, ops, device, typed: bool):
    import os

    from aoti_farm.runtime import Settings, install

    prev = os.environ.get("AOTI_FARM_DEV")
    os.environ["AOTI_FARM_DEV"] = "" if typed else "typed_entry=0"   # read by install()
    try:
        return install(cache_dir=cache, ops=ops, devices=(device,), on_miss="ignore", route="all",
                       settings=Settings(poll_interval=3600, native="require"))
    finally:
        if prev is None:
            os.environ.pop("AOTI_FARM_DEV", None)
        else:
            os.environ["AOTI_FARM_DEV"] = prev


def run(device: str, rounds: int, calls: int, ab_typed: bool = False) -> dict:
    from aoti_farm.runtime import native

    native.build()
    cache = tempfile.mkdtemp(prefix="aoti-routecost-")
    cs = cases(device)
    ops = sorted({op for _, op, _ in cs})
    res = {name: {"eager": [], "routed": [], "boxed only": [], **({"routed, all boxed": []} if ab_typed else {})}
           for name, _, _ in cs}
    info = {}
    with torch.no_grad():
        for _, _, fn in cs:
            for _ in range(50):
                fn()
        for r in range(rounds):
            order = ["eager", "hook"] + (["all boxed"] if ab_typed else [])
            order = order[r % len(order):] + order[:r % len(order)]
            for phase in order:
                if phase == "eager":
                    for name, _, fn in cs:
                        res[name]["eager"].append(statistics.median(_batch(fn, calls, device) for _ in range(3)))
                    continue
                hook = _install(cache, ops, device, typed=phase == "hook")
                try:
                    for name, _, fn in cs:
                        for _ in range(20):
                            fn()                                   # remembered on the native path
                        t = statistics.median(_batch(fn, calls, device) for _ in range(3))
                        if phase == "all boxed":
                            res[name]["routed, all boxed"].append(t)
                            continue
                        res[name]["routed"].append(t)
                        with hook._routes.bypassed():
                            res[name]["boxed only"].append(
                                statistics.median(_batch(fn, calls, device) for _ in range(3)))
                    st = hook.stats()
                    if phase == "hook":
                        info = {"routed_ops": st["routed_ops"], "native": {k: st["native"].get(k) for k in
                                                                           ("active", "slow_calls", "unkeyable",
                                                                            "typed_ops")}}
                finally:
                    hook.uninstall()
    out = {}
    for name, d in res.items():
        med = {k: statistics.median(v) for k, v in d.items()}
        out[name] = {**{f"{k}_us": round(v, 3) for k, v in med.items()},
                     "routed_minus_eager_us": round(statistics.median(
                         [a - b for a, b in zip(d["routed"], d["eager"])]), 3),
                     "boxing_us": round(statistics.median([a - b for a, b in zip(d["boxed only"], d["eager"])]), 3),
                     "routed_over_eager": round(statistics.median([a / b for a, b in zip(d["routed"], d["eager"])]), 3)}
        if ab_typed:
            out[name]["all_boxed_minus_eager_us"] = round(statistics.median(
                [a - b for a, b in zip(d["routed, all boxed"], d["eager"])]), 3)
    return {"device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "threads": torch.get_num_threads(), "rounds": rounds, "calls_per_batch": calls, "ops": out,
            "hook": info}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=5000, help="calls per batch")
    ap.add_argument("--threads", type=int, help="intra-op threads (torch.set_num_threads)")
    ap.add_argument("--ab-typed", action="store_true",
                    help="also time each op routed with every op registered boxed (AOTI_FARM_DEV=typed_entry=0)")
    import common
    common.add_output_args(ap, "routecost")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("routecost: --device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    res = run(a.device, a.rounds, a.calls, a.ab_typed)
    from common import machine

    res["machine"] = machine()
    print(f"== routing cost ({res['device']}{' ' + res['device_name'] if res['device_name'] else ''}, "
          f"{res['threads']} threads, {a.rounds} rounds x 3 batches of {a.calls} calls), us per call")
    print(f"{'op':28s} {'eager':>8s} {'routed':>8s} {'boxed only':>10s} {'routed-eager':>12s} {'boxing':>8s} "
          f"{'routed/eager':>12s}" + (f" {'all boxed-eager':>15s}" if a.ab_typed else ""))
    for n, d in res["ops"].items():
        print(f"{n:28s} {d['eager_us']:8.2f} {d['routed_us']:8.2f} {d['boxed only_us']:10.2f} "
              f"{d['routed_minus_eager_us']:12.2f} {d['boxing_us']:8.2f} {d['routed_over_eager']:12.3f}"
              + (f" {d['all_boxed_minus_eager_us']:15.2f}" if a.ab_typed else ""))
    print(f"hook: {res['hook']}")
    common.write_output(a, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
