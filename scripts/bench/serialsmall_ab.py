#!/usr/bin/env python
"""Small CPU kernels with and without aoti_farm/build/serialsmall.py, in one process.

    python scripts/bench/serialsmall_ab.py [--threads 2] [--rounds 3] [--out DIR | --json FILE]

Each signature (GPT-2-sized: a [2, 1, 128] add and layer norm, a 78-element int64 cat, a
[2, 1, 512] mul, and an addmm whose matrix product is an extern call) is compiled and
verified twice: with the default options (``aoti_farm.serial_nests_below``: no OpenMP
region for a loop nest below 4096 elements) and with ``aoti_farm.serial_nests_below=0``
(Inductor's own decision: a parallel scope in every kernel under ``cpp.dynamic_threads``).  Then, at ``--threads``
intra-op threads, per round and alternating, the median microseconds per call of:

* ``hot``: the kernel's runner in a loop (``runner.run``);
* ``beside mm``: each runner call followed by an eager 256x256 ``mm`` (which uses the
  OpenMP team, as a model's eager ops do between served calls), minus the ``mm`` alone;
* ``eager``: the op itself in a loop.

Medians over rounds; the ratio serial/inductor side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _timed(fn, inner: int = 200, repeats: int = 15, between=None) -> float:
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
            if between is not None:
                between()
        per.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(per)


def main(argv=None) -> int:
    from common import add_output_args, machine, write_output

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    add_output_args(ap, "serialsmall_ab")
    ns = ap.parse_args(argv)

    import torch

    from aoti_farm.build import serialsmall
    from aoti_farm import signature as S
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler, load_runner
    from aoti_farm.compile.runner import flat_tensors
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish

    torch.set_num_threads(ns.threads)
    a, E, L = torch.ops.aten, torch.empty, torch.long
    corpus = {"add [2,1,128]": (a.add.Tensor, (E(2, 1, 128), E(2, 1, 128)), {}),
              "cat int64 [2,38]+[2,1]": (a.cat.default, ([E(2, 38, dtype=L), E(2, 1, dtype=L)], -1), {}),
              "native_layer_norm [2,1,128]": (a.native_layer_norm.default,
                                              (E(2, 1, 128), [128], E(128), E(128), 1e-5), {}),
              "mul [2,1,512]": (a.mul.Tensor, (E(2, 1, 512), E(2, 1, 512)), {}),
              "addmm [2,128]x[128,384]": (a.addmm.default, (E(384), E(2, 128), E(128, 384)), {})}
    runners = {}
    with tempfile.TemporaryDirectory() as root:
        for label, opts in (("serial", {}), ("inductor", {serialsmall.OPTION: 0})):
            comp = AOTICompiler(opts, measure_speed=False)
            fp = fingerprint("cpu", comp.options())
            cache = Cache(os.path.join(root, label))
            for name, (op, args, kwargs) in corpus.items():
                sig = S.from_call(op, args, kwargs)
                out = compile_and_publish(cache, comp, fp, sig, owner="bench")
                if out.status != "compiled":
                    raise SystemExit(f"serialsmall_ab: {name} ({label}) was not published: {out.error}")
                runners[(label, name)] = (sig, load_runner(cache.open_entry(fp, sig.key).kernel_path, "cpu"))
        big = torch.randn(256, 256)

        def mm():
            torch.mm(big, big)

        rows = []
        for name, (op, _, _) in corpus.items():
            sig = runners[("serial", name)][0]
            args, kwargs = S.materialize(sig, seed=0)
            ins = flat_tensors(sig, args, kwargs)
            res: dict[str, list] = {}
            for _ in range(ns.rounds):
                base = _timed(lambda: None, inner=50, between=mm)
                for label in ("serial", "inductor"):
                    r = runners[(label, name)][1]
                    res.setdefault(f"{label}_hot_us", []).append(_timed(lambda: r.run(ins)))
                    res.setdefault(f"{label}_beside_mm_us", []).append(
                        _timed(lambda: r.run(ins), inner=50, between=mm) - base)
                res.setdefault("eager_hot_us", []).append(_timed(lambda: op(*args, **kwargs)))
            row = {"signature": name, **{k: statistics.median(v) for k, v in res.items()}}
            row["hot_ratio"] = row["serial_hot_us"] / row["inductor_hot_us"]
            rows.append(row)
            print(f"{name:30} hot: serial {row['serial_hot_us']:6.2f} us, inductor {row['inductor_hot_us']:6.2f} us "
                  f"({row['hot_ratio']:.2f}x), eager {row['eager_hot_us']:6.2f} us; beside an eager mm: serial "
                  f"{row['serial_beside_mm_us']:+6.2f} us, inductor {row['inductor_beside_mm_us']:+6.2f} us",
                  flush=True)
    write_output(ns, {"bench": "serialsmall_ab", "machine": machine(), "threads": ns.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
