#!/usr/bin/env python
"""Does loading the verified private copy change a hit's per-call time?

    python scripts/bench/loadpath.py [--rounds 9] [--calls 2000] [--json out.json]

Compiles ``add`` (64x128 + 128, alpha=2) and ``relu`` (1024x1024) through the real
compile path into a temporary cache, then loads each kernel twice in this process: from
the shared ``kernel.so`` (what the hook did before) and from the sealed private copy
``Cache.open_entry(private=True)`` makes (what it does now).  Eager and both runners are
timed interleaved for ``--rounds`` rounds of ``--calls`` calls each, in alternating order;
each figure is the median of the per-round medians, and each ratio the median of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from aoti_farm import signature as S  # noqa: E402
from aoti_farm.cache.store import Cache  # noqa: E402
from aoti_farm.compile.compiler import AOTICompiler, load_runner  # noqa: E402
from aoti_farm.fingerprint import fingerprint  # noqa: E402
from aoti_farm.compile.job import compile_and_publish  # noqa: E402


def _per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=2000)
    import common
    common.add_output_args(ap, "loadpath")
    ns = ap.parse_args()
    cases = {
        "add 64x128": (torch.ops.aten.add.Tensor, (torch.randn(64, 128), torch.randn(128)), {"alpha": 2}),
        "relu 1024x1024": (torch.ops.aten.relu.default, (torch.randn(1024, 1024),), {}),
    }
    out: dict = {"machine": " ".join(Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0]
                                     .strip(": \t").split()) if Path("/proc/cpuinfo").exists() else "?",
                 "torch": torch.__version__, "threads": torch.get_num_threads(), "cases": {}}
    with tempfile.TemporaryDirectory() as d:
        cache, fp = Cache(Path(d) / "c", signing_key=None), fingerprint("cpu")
        for name, (op, args, kwargs) in cases.items():
            sig = S.from_call(op, args, kwargs)
            status = compile_and_publish(cache, AOTICompiler(), fp, sig, owner="bench").status
            assert status in ("compiled", "cached"), status
            shared = load_runner(str(cache.entry_dir(fp.id, sig.key) / "kernel.so"), "cpu")
            entry = cache.open_entry(fp, sig.key, private=True)
            private = load_runner(entry.load_path, "cpu")
            entry.close()
            tensors = list(args)
            fns = {"eager": lambda: op(*args, **kwargs), "shared path": lambda: shared.run(tensors),
                   "private copy": lambda: private.run(tensors)}
            assert torch.equal(private.run(tensors)[0], shared.run(tensors)[0])
            rounds: dict[str, list[float]] = {k: [] for k in fns}
            for r in range(ns.rounds):
                order = list(fns) if r % 2 == 0 else list(reversed(fns))
                for k in order:
                    _per_call(fns[k], ns.calls // 10)   # warm
                    rounds[k].append(_per_call(fns[k], ns.calls))
            med = {k: statistics.median(v) for k, v in rounds.items()}
            ratio = statistics.median(p / s for p, s in zip(rounds["private copy"], rounds["shared path"]))
            eager_ratio = statistics.median(p / e for p, e in zip(rounds["private copy"], rounds["eager"]))
            out["cases"][name] = {"us": med, "private/shared": ratio, "private/eager": eager_ratio,
                                  "rounds": rounds}
            print(f"{name}: eager {med['eager']:.2f} us, shared path {med['shared path']:.2f} us, "
                  f"private copy {med['private copy']:.2f} us; private/shared {ratio:.3f}, "
                  f"private/eager {eager_ratio:.3f}")
    common.write_output(ns, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
