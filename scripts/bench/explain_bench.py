"""How long `aoti-farm explain` takes on a large cache (the aim: <= 2 s for a
10,000-entry cache and a 1,000-signature trace).

Builds (once, under --dir) a cache of N entries spread over 16 elementwise ops and many
shapes, plus a foreign namespace (another cpu_isa) of 500 entries, and a trace of T
signatures: a quarter hits, the rest misses of several kinds (a shape change, a changed
scalar, a dtype change, an op with no entry, a key only under the foreign fingerprint).
The entries' kernel.so is a few placeholder bytes: explain never hashes or loads kernels
(the bench cache is thrown away; nothing serves from it).

Measures, in one run:
* ``explain_s``: index + explanation of the whole trace in this process (what the command
  does after its imports and the fingerprint);
* ``command_s``: the whole `aoti-farm explain --json` command in a fresh process
  (interpreter, torch import, fingerprint, trace load, explain, JSON output, exit);
  ``command_cpu_s`` its CPU seconds (user + system), steadier than wall time on a busy
  machine; ``load_avg`` the load average at the end.

    .venv/bin/python scripts/bench/explain_bench.py [--entries 10000] [--trace 1000] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine, no_fsync, write_trace  # noqa: E402

UNARY = ["aten::relu.default", "aten::sigmoid.default", "aten::tanh.default", "aten::exp.default",
         "aten::neg.default", "aten::abs.default", "aten::sqrt.default", "aten::sin.default"]
BINARY = ["aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor", "aten::div.Tensor",
          "aten::maximum.default", "aten::minimum.default", "aten::pow.Tensor_Tensor", "aten::atan2.default"]


def make_sig(op: str, shape: tuple, alpha: int | None = None, dtype=None):
    import torch

    from aoti_farm import signature as S

    dt = dtype or torch.float32
    a = torch.empty(shape, dtype=dt)
    kw = {"alpha": alpha} if alpha is not None and op in ("aten::add.Tensor", "aten::sub.Tensor") else {}
    args = (a,) if op in UNARY else (a, a)
    return S.from_call(S.resolve_op(op), args, kw)


def build(root: str, n: int, n_trace: int, seed: int = 0):
    import torch

    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import Fingerprint, fingerprint

    rng = random.Random(seed)
    cache = Cache(os.path.join(root, "cache"), signing_key=None)
    fp = fingerprint("cpu")
    foreign = Fingerprint(tuple((k, ("avx512" if v != "avx512" else "avx2") if k == "cpu_isa" else v)
                                for k, v in fp.fields))
    kernel = os.path.join(root, "placeholder.so")
    with open(kernel, "wb") as f:
        f.write(b"placeholder: explain never loads kernels\n")
    ops = UNARY + BINARY
    sigs, seen = [], set()
    while len(sigs) < n:
        op = rng.choice(ops)
        shape = (rng.choice([1, 2, 4, 8, 16, 32]), rng.randint(1, 512))
        s = make_sig(op, shape, alpha=rng.choice([None, 2]))
        if s.key not in seen:
            seen.add(s.key)
            sigs.append(s)
    fsigs = [make_sig(rng.choice(BINARY), (3, rng.randint(600, 5000))) for _ in range(500)]
    t0 = time.perf_counter()
    with no_fsync():
        have = cache.list_keys(fp.id)
        for s in sigs:
            if s.key not in have:
                cache.publish(fp, s, {"kernel.so": kernel}, {"compile_seconds": 0.0, "bench_fake": True})
        fhave = cache.list_keys(foreign.id)
        for s in fsigs:
            if s.key not in fhave:
                cache.publish(foreign, s, {"kernel.so": kernel}, {"compile_seconds": 0.0, "bench_fake": True})
    build_s = time.perf_counter() - t0
    trace = []
    for i in range(n_trace):
        r = i % 8
        base = sigs[rng.randrange(len(sigs))]
        op, shape = base.op, tuple(base.args[0][2])
        if r < 2:
            trace.append(base)                                                   # hit
        elif r == 2:
            trace.append(make_sig(op, (shape[0], shape[1] + 1000 + i)))          # shape change
        elif r == 3:
            trace.append(make_sig("aten::add.Tensor", (shape[0], shape[1] + 1000 + i), alpha=3))  # scalar + shape
        elif r == 4:
            trace.append(make_sig(op, (shape[0], 2000 + i), dtype=torch.float16))  # dtype + shape
        elif r == 5:
            trace.append(make_sig("aten::cos.default", (shape[0], 3000 + i)))  # no entry of this op
        elif r == 6:
            trace.append(fsigs[i % len(fsigs)])                                  # foreign fingerprint only
        else:
            trace.append(make_sig(op, (64, 7000 + i)))                           # shape change, both dims
    uniq = list({s.key: s for s in trace}.values())
    path = os.path.join(root, "trace.json")
    write_trace(path, uniq)
    return cache, fp, path, build_s, len(uniq)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=10000)
    ap.add_argument("--trace", type=int, default=1000)
    ap.add_argument("--dir", default=None, help="where the bench cache is built (kept; reused when present)")
    ap.add_argument("--rounds", type=int, default=3)
    import common
    common.add_output_args(ap, "explain-bench")
    a = ap.parse_args(argv)
    root = a.dir or tempfile.mkdtemp(prefix="aoti-explain-bench-")
    os.makedirs(root, exist_ok=True)
    cache, fp, trace_path, build_s, n_trace = build(root, a.entries, a.trace)

    from aoti_farm.report.explain import Explainer
    from aoti_farm.trace import load_trace

    tr = load_trace(trace_path)
    inproc, outcomes = [], {}
    for _ in range(a.rounds):
        os.sync()
        t0 = time.perf_counter()
        ex = Explainer(cache, {"cpu": fp})
        rows = [ex.explain(e.sig, i) for i, e in enumerate(tr)]
        inproc.append(time.perf_counter() - t0)
        outcomes = {}
        for r in rows:
            k = r.outcome + (f":{r.category}" if r.category else "")
            outcomes[k] = outcomes.get(k, 0) + 1
    cmd = [sys.executable, "-m", "aoti_farm", "explain", "--trace", trace_path, "--cache-dir", str(cache.root),
           "--json"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    walls, cpus, reported = [], [], []
    for _ in range(a.rounds):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)   # steadier than wall under load
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        reported.append(json.loads(p.stdout)["seconds"])
    res = {"bench": "explain", "machine": machine(), "entries": a.entries, "foreign_entries": 500,
           "trace_signatures": n_trace, "cache_build_s": round(build_s, 1),
           "explain_s": [round(x, 3) for x in inproc], "explain_s_median": round(statistics.median(inproc), 3),
           "command_s": [round(x, 3) for x in walls], "command_s_median": round(statistics.median(walls), 3),
           "command_cpu_s": [round(x, 3) for x in cpus], "command_cpu_s_median": round(statistics.median(cpus), 3),
           "load_avg": [round(x, 2) for x in os.getloadavg()],
           "command_explain_s": [round(x, 3) for x in reported], "outcomes": outcomes,
           "manifests_read": ex.index.manifests_read, "target_s": 2.0}
    print(json.dumps(res, indent=1))
    common.write_output(a, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
