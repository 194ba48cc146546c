#!/usr/bin/env python
"""Real models served with the defaults: never slower than eager.

    python scripts/bench/real_models.py --out DIR [--models gpt2,bert,mlp] [--rounds N]
                                        [--cache-dir C] [--threads 2]

Models nobody on the project wrote, built from small configs with random weights (no hub
downloads; ``transformers`` is in the ``test`` extra):

* ``gpt2``: ``GPT2LMHeadModel`` (2 layers, 4 heads, width 128, vocab 1,000), greedy
  ``generate(ids, max_new_tokens=32, do_sample=False)`` on 2 prompts of length 8: many
  small calls, a growing KV cache, a new sequence length each decode step;
* ``bert``: a tiny ``BertModel`` forward (2 layers, width 128) on a batch of 2 x 16;
* ``mlp``: the README's example model (``scripts/make_example_trace.py``'s ``TinyMLP``).

For each model, as a user would: the program is recorded (``aoti_farm.record``, in a
child process), its trace warmed with the defaults (``aoti-farm warm --model T
--cache-dir C``; an already warm cache costs little), then, in ONE process at the
program's own thread count (``torch.set_num_threads(--threads)``), eager and hooked
phases interleave for ``--rounds`` rounds, the order alternating: a hooked phase installs
the hook with its defaults (``install(cache_dir=C)``: ``on_miss="compile"``,
``serve="faster"``, ``route="paying"``, the install-time trials), runs the workload
``--warmup`` times (the gate's background trials), times it, and uninstalls.  A phase's
time is the median (and the min) of ``--batches`` x ``BATCHES[model]`` timed calls.  Per
model: ``ratio`` = median over rounds of hooked/eager of that round (the quartiles too),
``ratio_of_mins`` the same of the phases' minima (the steadier one on a shared host), whether every output equalled
eager's (gpt2: identical tokens), the thread count after the hooked phases, and the
hook's summary (``stats()["summary"]``).  Output: one line per round, a table, and the
raw JSON (machine, date, every round) in ``--out``/real_models.json.

The bar: every model at most 1.02x eager.  A shared or loaded host moves the
ratios; the pairing (phases seconds apart, alternating order) is what keeps them
comparable, so say what else ran on the host when quoting them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

MODELS = ("gpt2", "bert", "mlp")


def build(name: str):
    """(workload, output-of-one-call) for ``name``: a fresh model, seeded."""
    import torch

    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, bos_token_id=0, eos_token_id=None)
        model = GPT2LMHeadModel(cfg).eval()
        model.generation_config.eos_token_id = None   # always 32 new tokens
        model.generation_config.pad_token_id = 0
        ids = torch.randint(1, 1000, (2, 8))
        mask = torch.ones_like(ids)

        def run():
            with torch.no_grad():
                return model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
        return run
    if name == "bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                         vocab_size=1000, max_position_embeddings=64)
        model = BertModel(cfg).eval()
        ids = torch.randint(0, 1000, (2, 16))

        def run():
            with torch.no_grad():
                return model(ids).last_hidden_state
        return run
    if name == "mlp":
        from make_example_trace import TinyMLP

        model = TinyMLP().eval()
        tokens = torch.randint(0, 64, (4, 8))

        def run():
            with torch.inference_mode():
                return model(tokens)
        return run
    raise SystemExit(f"--models: {name!r} is not one of {', '.join(MODELS)}")


def record_child(name: str, trace: str, threads: int) -> None:
    """In a child process: record one call of the workload."""
    import torch

    import aoti_farm

    torch.set_num_threads(threads)
    run = build(name)
    with aoti_farm.record(trace):
        run()


def same(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) if a.dtype == torch.long
                                                             else torch.allclose(a, b, rtol=1e-4, atol=1e-5))


#: Timed calls per phase, by model (a phase of the MLP is ~50x shorter than one of GPT-2's).
BATCHES = {"gpt2": 1, "bert": 10, "mlp": 50}


def phase(run, batches: int) -> tuple[float, float, object]:
    """(median, min, last output) of ``batches`` timed calls.  The min is the call least
    disturbed by other work: on a shared host it is the steadier statistic."""
    times, out = [], None
    gc.disable()
    try:
        for _ in range(batches):
            t0 = time.perf_counter()
            out = run()
            times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(times), min(times), out


def bench_model(name: str, cache: str, args) -> dict:
    import torch

    from aoti_farm.runtime import install

    run = build(name)
    expected = run()
    rounds, all_same, threads_after, summaries = [], True, [], []
    for r in range(args.rounds):
        order = ("eager", "hooked") if r % 2 == 0 else ("hooked", "eager")
        t, tmin = {}, {}
        n = args.batches * BATCHES[name]
        for ph in order:
            if ph == "eager":
                for _ in range(args.warmup):
                    run()
                t["eager"], tmin["eager"], out = phase(run, n)
            else:
                hook = install(cache_dir=cache)
                try:
                    for _ in range(args.warmup):
                        run()
                    t["hooked"], tmin["hooked"], out = phase(run, n)
                    summaries.append(hook.stats()["summary"])
                finally:
                    hook.uninstall()
                threads_after.append(torch.get_num_threads())
            all_same = all_same and same(out, expected)
        ratio = t["hooked"] / t["eager"]
        ratio_min = tmin["hooked"] / tmin["eager"]
        rounds.append({"round": r, "order": order, "eager_s": t["eager"], "hooked_s": t["hooked"], "ratio": ratio,
                       "eager_min_s": tmin["eager"], "hooked_min_s": tmin["hooked"], "ratio_min": ratio_min,
                       "calls_per_phase": n})
        print(f"{name} round {r}: eager {t['eager'] * 1e3:.2f} ms (min {tmin['eager'] * 1e3:.2f}), hooked "
              f"{t['hooked'] * 1e3:.2f} ms (min {tmin['hooked'] * 1e3:.2f}), ratio {ratio:.3f}, "
              f"of mins {ratio_min:.3f}", flush=True)
    ratios = sorted(x["ratio"] for x in rounds)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return {"model": name, "ratio": statistics.median(ratios), "q1": q[0], "q3": q[2],
            "ratio_of_mins": statistics.median(x["ratio_min"] for x in rounds), "rounds": rounds,
            "outputs_equal": all_same, "threads_set": args.threads, "threads_after": threads_after,
            "summary_last": summaries[-1] if summaries else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for real_models.json and the traces")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=5,
                    help="timed calls per phase, times the model's BATCHES (median and min kept)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before each phase")
    ap.add_argument("--threads", type=int, default=2, help="the program's torch.set_num_threads")
    ap.add_argument("--cache-dir", default=None, help="the cache to warm and serve from (default: under --out)")
    ap.add_argument("--no-warm", action="store_true", help="serve the cache as it is")
    ap.add_argument("--record-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.record_child:
        record_child(args.record_child[0], args.record_child[1], args.threads)
        return 0
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            print(f"real_models: --models: {m!r} is not one of {', '.join(MODELS)}", file=sys.stderr)
            return 2
    if args.rounds < 1:
        print("real_models: --rounds must be at least 1", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    cache = args.cache_dir or os.path.join(args.out, "cache")
    cli = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    prep = {}
    for m in models:
        trace = os.path.join(args.out, f"{m}_trace.json")
        t0 = time.monotonic()
        if not args.no_warm:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--out", args.out, "--threads",
                            str(args.threads), "--record-child", m, trace], check=True)
            w = subprocess.run([cli, "warm", "--model", trace, "--cache-dir", cache], stdout=subprocess.DEVNULL)
            if w.returncode not in (0, 1):   # 1: some signatures failed (recorded, served eager)
                raise SystemExit(f"real_models: warm of {trace} exited {w.returncode}")
        prep[m] = round(time.monotonic() - t0, 1)

    import torch

    from common import machine

    torch.set_num_threads(args.threads)
    info = machine()
    results = []
    for m in models:
        results.append(bench_model(m, cache, args))
    doc = {"bench": "real_models", "machine": info, "args": vars(args), "cache": cache,
           "record_and_warm_s": prep, "results": results}
    path = os.path.join(args.out, "real_models.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"\n{info['date']}  {info['cpu_model']}  cpus={info['cpu_count']}  torch {info['torch']}  "
          f"load at start {info['loadavg_at_start']}")
    print(f"{'model':6} {'hooked/eager':>12} {'q1':>6} {'q3':>6} {'of mins':>8}  same  threads  hit rate  top not-served")
    for r in results:
        s = r["summary_last"] or {}
        print(f"{r['model']:6} {r['ratio']:12.3f} {r['q1']:6.3f} {r['q3']:6.3f} {r['ratio_of_mins']:8.3f}  {str(r['outputs_equal']):5} "
              f"{sorted(set(r['threads_after']))}  {s.get('hit_rate', 0):8.3f}  {s.get('top_reason')}")
    print(f"raw: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
