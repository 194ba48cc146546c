"""A/B of how a CPU kernel threads (issue 13, item 1), one process, interleaved with eager.

For each op, three builds of the same signature:

* ``old-farm``: Inductor's default options, built where torch has 1 intra-op thread (a
  Ray actor with ``num_cpus=1``, as ``aoti-farm warm`` built kernels before);
* ``old-local``: Inductor's default options, built in this process at its default count
  (what ``compile-one`` in a serving process built);
* ``new-farm``: aoti-farm's options (``cpp.dynamic_threads`` + loops parallel from ATen's
  grain size), built at 1 thread.

Then each kernel is timed against eager (``gate.time_against_eager``: same inputs,
interleaved rounds, median of per-round ratios) with the serving process at each thread
count in ``--threads``.  Prints one line per (threads, op, build) and the load average.

    python scripts/bench/threads_ab.py [--threads 1,2] [--budget 1.0]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from aoti_farm import signature as S  # noqa: E402
from aoti_farm.compiler import AOTICompiler, flat_tensors, load_runner  # noqa: E402
from aoti_farm.speed import time_against_eager  # noqa: E402

OPS = {
    "gelu_tanh 1024x1024": lambda: S.from_call(torch.ops.aten.gelu.default, (torch.empty(1024, 1024),),
                                               {"approximate": "tanh"}),
    "var_mean dim0 2048x256": lambda: S.from_call(torch.ops.aten.var_mean.correction, (torch.empty(2048, 256),),
                                                  {"dim": [0]}),
    "sum f64 dim1 1024x1024": lambda: S.from_call(torch.ops.aten.sum.dim_IntList, (torch.empty(1024, 1024), [1]),
                                                  {"dtype": torch.float64}),
    "add 64x128": lambda: S.from_call(torch.ops.aten.add.Tensor, (torch.empty(64, 128), torch.empty(64, 128)), {}),
}
OLD = {"cpp.dynamic_threads": False, "aoti_farm.parallel_min_work": None}


def build(sig, options, threads: int) -> str:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return AOTICompiler(options, measure_speed=False).compile(sig, tempfile.mkdtemp(prefix="threads-ab-")).files[
            "kernel.so"]
    finally:
        torch.set_num_threads(before)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--budget", type=float, default=1.0)
    ns = ap.parse_args()
    default = torch.get_num_threads()
    print(f"# {platform.node()} {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, default threads {default}", flush=True)
    kernels = {}
    for name, mk in OPS.items():
        sig = mk()
        kernels[name] = (sig, {"old-farm": build(sig, OLD, 1), "old-local": build(sig, OLD, default),
                               "new-farm": build(sig, None, 1)})
    print(f"# built; load average {os.getloadavg()}", flush=True)
    print(f"{'threads':>7} {'op':24} {'build':10} {'kernel_us':>10} {'eager_us':>10} {'kernel/eager':>12}")
    for n in (int(x) for x in ns.threads.split(",")):
        torch.set_num_threads(n)
        for name, (sig, paths) in kernels.items():
            args, kwargs = S.materialize(sig, 0)
            tensors = flat_tensors(sig, args, kwargs)
            op = S.resolve_op(sig.op)
            for build_name, path in paths.items():
                r = load_runner(path, "cpu")
                m = time_against_eager(lambda: r.run(tensors), lambda: op(*args, **kwargs), "cpu",
                                       budget_s=ns.budget)
                print(f"{n:>7} {name:24} {build_name:10} {m['kernel_us']:>10.1f} {m['eager_us']:>10.1f} "
                      f"{m['ratio']:>12.3f}", flush=True)
    print(f"# load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
