#!/usr/bin/env python
"""What a served call costs inside a real model, stage by stage, against what it costs alone.

    python scripts/bench/served_call.py --out DIR [--model gpt2] [--threads 2] [--rounds 5]
                                        [--runs 5] [--cache-dir C] [--no-warm] [--device cuda]

The model is one of scripts/bench/real_models.py's (nobody on the project wrote it: GPT-2
greedy generation from a small config by default).  Its trace is recorded and warmed with
the defaults (``--no-warm``: serve the cache as it is), then, in ONE process at the
program's thread count:

1. **In the model**, rounds alternate an eager phase (no hook) and a served phase
   (``install(serve="always", on_miss="ignore")``: every verified kernel is served), each
   the median of ``--runs`` runs after two untimed ones.  The served phase also turns on
   the native path's stage profile (``runtime/fastpath.cpp``): per served call the time of
   its key, lookup, inputs (runner inputs, AOTI handles, a container checked out), run
   (AOTInductor's container run: the kernel with its output allocation) and outputs
   (stolen handles wrapped, pushed).  The profile costs a few timestamps a call; the
   model's times are taken with it on in both the served phase and the isolated loops.
2. **Alone**, per served signature of the trace: eager's call and the served call (the
   same op through the same hook, at the same inputs) in a hot loop, the stage profile of
   the served one, and its count in the workload.

Reported (per round, then medians over rounds):

* the model's served/eager ratio, and served calls per run;
* ``measured``: the model's change per served call, (served - eager) / served calls;
* ``isolated``: the sum of the signatures' isolated changes, count-weighted, per served
  call: what the model would gain if each served call cost in the model what it costs
  alone (negative: a saving);
* ``in-model overhead``: measured - isolated, per served call: what running inside the
  model adds to a served call;
* the stages in the model and alone, per served call, and the *remainder* alone (the
  served call's time minus its stages: the dispatcher's entry and boxing, the Python call).
  The kernel's own time is the ``run`` stage alone; a served call's overhead over it in the
  model is every other stage in the model, plus the run's growth in the model, plus the
  remainder.

``--device cuda`` records, warms and serves the model on the GPU.  Every timed run and every
hot-loop batch then ends with ``torch.cuda.synchronize()`` (real_models.py's ``timed``), so
the model's times include the GPU's work; the stages are the host's: ``run`` is
AOTInductor's container run, which on CUDA launches the kernel (its own GPU time is in the
model's and the loop's wall, not in the stage).

Output: one line per round, a table, and the raw JSON (machine, date, every round) in
``--out``/served_call.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

STAGES = ("key", "lookup", "inputs", "run", "outputs")


def _native():
    from aoti_farm.runtime import native

    mod = native.load()
    if mod is None or not hasattr(mod, "set_profile"):
        raise SystemExit(f"served_call: the native hit path is not built or has no stage profile ({native.error()}); "
                         "build it: python -m aoti_farm.runtime.native build")
    return mod


def _per_call(prof: dict, outcome: str = "served") -> dict:
    p = prof[outcome]
    n = max(1, p["calls"])
    return {"calls": p["calls"], "outliers": p.get("outliers", 0), **{s: p[s] / n for s in STAGES}}


def _median_time(run, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _hot(fn, inner: int = 200, repeats: int = 7, sync=None) -> float:
    """Median over ``repeats`` batches of ``inner`` calls, seconds per call (``sync``: called
    at the end of each batch, inside its time: the GPU's queue drained)."""
    for _ in range(20):
        fn()
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        per.append((time.perf_counter() - t0) / inner)
    return statistics.median(per)


def _sync(device: str):
    if device != "cuda":
        return None
    import torch

    return torch.cuda.synchronize


def _all_boxed(run, cache: str, runs: int, device: str) -> float:
    """The served phase again with every op registered boxed (``AOTI_FARM_DEV=typed_entry=0``,
    read when the hook installs): the typed entry's A/B, without the stage profile."""
    from aoti_farm.runtime import install

    prev = os.environ.get("AOTI_FARM_DEV")
    os.environ["AOTI_FARM_DEV"] = "typed_entry=0"
    try:
        hook = install(cache_dir=cache, serve="always", on_miss="ignore", devices=(device,))
    finally:
        if prev is None:
            os.environ.pop("AOTI_FARM_DEV", None)
        else:
            os.environ["AOTI_FARM_DEV"] = prev
    try:
        assert not hook.stats()["native"].get("typed_ops"), "typed_entry=0 registered an op typed"
        run()
        run()
        return _median_time(run, runs)
    finally:
        hook.uninstall()


def model_round(run, cache: str, runs: int, mod, device: str = "cpu", ab_typed: bool = False,
                boxed_first: bool = False) -> dict:
    from aoti_farm.runtime import install

    run()
    e = _median_time(run, runs)
    b = _all_boxed(run, cache, runs, device) if ab_typed and boxed_first else None
    hook = install(cache_dir=cache, serve="always", on_miss="ignore", devices=(device,))
    try:
        run()
        run()
        mod.reset_profile()
        mod.set_profile(True)
        before = hook.stats()["summary"]["served"]
        h = _median_time(run, runs)
        served = (hook.stats()["summary"]["served"] - before) / runs
        mod.set_profile(False)
        prof = mod.profile_stats()
    finally:
        mod.set_profile(False)
        hook.uninstall()
    if ab_typed and not boxed_first:
        b = _all_boxed(run, cache, runs, device)
    extra = {"all_boxed_s": b, "ratio_all_boxed": b / e, "typed_over_all_boxed": h / b} if ab_typed else {}
    return {**extra, "eager_s": e, "served_s": h, "ratio": h / e, "served_per_run": served,
            "measured_us": (h - e) / served * 1e6 if served else None, "stages_in_model_ns": _per_call(prof)}


def isolated(trace_path: str, cache: str, mod, device: str = "cpu") -> dict:
    """Each signature of the trace alone: eager's call in a hot loop (no hook), then the
    served call (the same op, inputs and thread count, through the hook) with its stage
    profile; a signature the hook does not serve has no row."""
    import torch

    from aoti_farm import signature as S
    from aoti_farm.runtime import install
    from aoti_farm.trace import load_trace

    calls = []
    for ent in load_trace(trace_path).entries:
        op = S.resolve_op(ent.sig.op)
        args, kwargs = S.materialize(ent.sig, seed=0)
        calls.append((ent, op, args, kwargs))
    sync = _sync(device)
    with torch.no_grad():
        eager = [_hot(lambda: op(*args, **kwargs), sync=sync) for _, op, args, kwargs in calls]
        rows = []
        hook = install(cache_dir=cache, serve="always", on_miss="ignore", devices=(device,))
        try:
            for (ent, op, args, kwargs), e in zip(calls, eager):
                before = hook.stats()["summary"]["served"]
                op(*args, **kwargs)
                if hook.stats()["summary"]["served"] == before:
                    continue
                mod.reset_profile()
                mod.set_profile(True)
                served = _hot(lambda: op(*args, **kwargs), sync=sync)
                mod.set_profile(False)
                prof = _per_call(mod.profile_stats())
                rows.append({"key": ent.sig.key, "signature": S.describe(ent.sig), "count": ent.count,
                             "eager_us": e * 1e6, "served_us": served * 1e6,
                             "stages_ns": {k: prof[k] for k in STAGES}})
        finally:
            mod.set_profile(False)
            hook.uninstall()
    n = sum(r["count"] for r in rows)
    if not n:
        return {"rows": rows, "served_calls": 0}
    w = lambda f: sum(f(r) * r["count"] for r in rows) / n   # noqa: E731 -- count-weighted mean per served call
    stages = {k: w(lambda r, k=k: r["stages_ns"][k]) for k in STAGES}
    served_ns = w(lambda r: r["served_us"] * 1e3)
    return {"rows": rows, "served_calls": n, "change_us": w(lambda r: r["served_us"] - r["eager_us"]),
            "eager_us": w(lambda r: r["eager_us"]), "served_us": served_ns / 1e3,
            "stages_ns": stages, "remainder_ns": served_ns - sum(stages.values()),
            "faster": sum(1 for r in rows if r["served_us"] < r["eager_us"]), "signatures": len(rows)}


def prepare(model: str, out: str, cache: str, threads: int, device: str = "cpu") -> str:
    """Record the workload on ``device`` and warm its trace (real_models.py's record,
    ``aoti-farm warm`` with the defaults)."""
    trace = os.path.join(out, f"{model}_trace.json")
    subprocess.run([sys.executable, os.path.join(HERE, "real_models.py"), "--out", out, "--threads", str(threads),
                    "--device", device, "--record-child", model, trace], check=True)
    w = subprocess.run([sys.executable, "-m", "aoti_farm", "warm", "--model", trace, "--cache-dir", cache],
                       stdout=subprocess.DEVNULL)
    if w.returncode not in (0, 1):
        raise SystemExit(f"served_call: warm of {trace} exited {w.returncode}")
    return trace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for served_call.json and the trace")
    ap.add_argument("--model", default="gpt2", help="a model of real_models.py (gpt2, bert, mlp)")
    ap.add_argument("--threads", type=int, default=2, help="the program's torch.set_num_threads")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per phase (median)")
    ap.add_argument("--cache-dir", default=None, help="the cache to warm and serve (default: under --out)")
    ap.add_argument("--no-warm", action="store_true", help="serve the cache as it is (the trace must be in --out)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model runs (recorded, warmed and served there; timed runs end synchronized)")
    ap.add_argument("--ab-typed", action="store_true",
                    help="each round also serves with every op registered boxed (AOTI_FARM_DEV=typed_entry=0), "
                         "the two served phases in alternating order")
    args = ap.parse_args(argv)
    from real_models import MODELS, build, timed

    if args.model not in MODELS:
        print(f"served_call: --model: {args.model!r} is not one of {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.runs < 1:
        print("served_call: --rounds and --runs must be at least 1", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    cache = args.cache_dir or os.path.join(args.out, "cache")
    trace = os.path.join(args.out, f"{args.model}_trace.json")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("served_call: --device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
            return 2
    if not args.no_warm:
        prepare(args.model, args.out, cache, args.threads, args.device)
    elif not os.path.exists(trace):
        print(f"served_call: --no-warm: no trace {trace}; run once without --no-warm", file=sys.stderr)
        return 2

    import torch

    from common import machine

    torch.set_num_threads(args.threads)
    mod = _native()
    info = machine()
    info["device"] = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    run = timed(build(args.model, device=args.device), args.device)
    rounds = []
    for r in range(args.rounds):
        one = model_round(run, cache, args.runs, mod, args.device, args.ab_typed, boxed_first=r % 2 == 1)
        rounds.append(one)
        st = one["stages_in_model_ns"]
        print(f"round {r}: eager {one['eager_s'] * 1e3:.2f} ms, served {one['served_s'] * 1e3:.2f} ms "
              f"(ratio {one['ratio']:.3f}), {one['served_per_run']:.0f} served calls a run, "
              f"{one['measured_us'] if one['measured_us'] is None else round(one['measured_us'], 2)} us a served call; "
              + (f"all boxed {one['all_boxed_s'] * 1e3:.2f} ms (ratio {one['ratio_all_boxed']:.3f}, typed/boxed "
                 f"{one['typed_over_all_boxed']:.3f}); " if args.ab_typed else "") +
              f"stages ns " + " ".join(f"{k} {st[k]:.0f}" for k in STAGES), flush=True)
    alone = isolated(trace, cache, mod, args.device)
    med = lambda k: statistics.median(x[k] for x in rounds if x[k] is not None)   # noqa: E731
    in_model = {k: statistics.median(x["stages_in_model_ns"][k] for x in rounds) for k in STAGES}
    measured = med("measured_us") if any(x["measured_us"] is not None for x in rounds) else None
    summary = {"ratio": med("ratio"), "served_per_run": med("served_per_run"), "measured_us": measured,
               "isolated_us": alone.get("change_us"),
               "in_model_overhead_us": (measured - alone["change_us"]) if measured is not None and
               alone.get("change_us") is not None else None,
               "stages_in_model_ns": in_model, "stages_alone_ns": alone.get("stages_ns"),
               "remainder_alone_ns": alone.get("remainder_ns")}
    if args.ab_typed:
        summary["ratio_all_boxed"] = med("ratio_all_boxed")
        summary["typed_over_all_boxed"] = med("typed_over_all_boxed")
    if alone.get("stages_ns"):
        run_alone = alone["stages_ns"]["run"]
        summary["overhead_over_kernel_in_model_us"] = (
            sum(in_model[k] for k in STAGES if k != "run") + (in_model["run"] - run_alone)
            + alone["remainder_ns"]) / 1e3
        summary["kernel_alone_us"] = run_alone / 1e3
    doc = {"bench": "served_call", "machine": info, "args": vars(args), "cache": cache, "summary": summary,
           "rounds": rounds, "isolated": alone}
    path = os.path.join(args.out, "served_call.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    s = summary
    print(f"\n{info['date']}  {info['cpu_model']}  cpus={info['cpu_count']}  torch {info['torch']}  "
          f"device {info['device']}  threads {args.threads}  model {args.model}")
    print(f"model served/eager {s['ratio']:.3f} (median of {args.rounds} rounds), {s['served_per_run']:.0f} served "
          f"calls a run; {alone.get('signatures', 0)} signatures served alone, {alone.get('faster', 0)} faster than eager")
    if args.ab_typed:
        print(f"every op registered boxed: served/eager {s['ratio_all_boxed']:.3f}; typed entry / all boxed "
              f"{s['typed_over_all_boxed']:.3f} (medians of rounds)")
    if measured is not None and alone.get("change_us") is not None:
        print(f"per served call: measured in the model {measured:+.2f} us, isolated {alone['change_us']:+.2f} us "
              f"(eager {alone['eager_us']:.2f}, served {alone['served_us']:.2f}): in-model overhead "
              f"{s['in_model_overhead_us']:+.2f} us")
        print(f"kernel's own time (run, alone) {s['kernel_alone_us']:.2f} us; a served call's overhead over it in the "
              f"model {s['overhead_over_kernel_in_model_us']:.2f} us")
        print(f"{'stage':10} {'in model ns':>12} {'alone ns':>10}")
        for k in STAGES:
            print(f"{k:10} {in_model[k]:12.0f} {alone['stages_ns'][k]:10.0f}")
        print(f"{'remainder':10} {'':>12} {alone['remainder_ns']:10.0f}  (dispatcher entry, boxing, the Python call)")
    print(f"raw: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
