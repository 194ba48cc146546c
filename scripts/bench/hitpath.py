#!/usr/bin/env python
"""What one cache hit costs, by call path, in one process.

    python scripts/bench/hitpath.py [--device cpu|cuda] [--json out.json]

For ``add`` at a tiny and a large size (CPU 64x128 and 1024x1024; CUDA 64x128 and
8192x1024) it compiles the kernel through the real compile path into a temp cache, then
times, interleaved over rounds (median of per-round medians, CUDA synchronised around each
batch of calls):

* ``eager``                 torch.add
* ``container run``         torch's AOTIModelContainerRunner{Cpu,Cuda}(path, 1).run (the
                            default container run: each call waits for a free model)
* ``pooled runner``         aoti_farm.compile.runner.PooledRunner.run (single-threaded containers)
* ``load_runner``           what aoti_farm.compile.compiler.load_runner returns for the device
* ``hook (native)``         torch.add with the serving hook installed (serve="always")
* ``hook (native, all boxed)``  (``--ab-typed``) the same with every op registered boxed
                            (``AOTI_FARM_DEV=typed_entry=0``: fastpath.cpp's typed entry off),
                            timed beside the hook in each round, the two in alternating order
"""

from __future__ import annotations

import argparse
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


def _batch(fn, n, sync):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def _with_dev(value: str, fn):
    import os

    prev = os.environ.get("AOTI_FARM_DEV")
    os.environ["AOTI_FARM_DEV"] = value
    try:
        return fn()
    finally:
        if prev is None:
            os.environ.pop("AOTI_FARM_DEV", None)
        else:
            os.environ["AOTI_FARM_DEV"] = prev


def run(device: str, rounds: int = 7, calls: int = 2000, workdir: str | None = None, quick: bool = False,
        ab_typed: bool = False) -> dict:
    from aoti_farm import signature as S
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler, load_runner
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish
    from aoti_farm.compile.runner import PooledRunner
    from aoti_farm.runtime import install
    from aoti_farm.runtime.hook import Hook
    from aoti_farm.runtime.hook import install as install_fn
    import inspect

    work = workdir or tempfile.mkdtemp(prefix="aoti-hitpath-")
    cache = Cache(str(Path(work) / "cache"), signing_key=None)
    fp = fingerprint(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    shapes = [(64, 128)] if quick else ([(64, 128), (8192, 1024)] if device == "cuda" else [(64, 128), (1024, 1024)])
    out = {"device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
           "threads": torch.get_num_threads(), "rounds": rounds, "shapes": {}}
    for shape in shapes:
        a, b = torch.randn(shape, device=device), torch.randn(shape, device=device)
        sig = S.from_call(torch.ops.aten.add.Tensor, (a, b), {})
        o = compile_and_publish(cache, AOTICompiler(), fp, sig, owner="bench-hitpath")
        if o.status not in ("compiled", "cached"):
            out["shapes"]["x".join(map(str, shape))] = {"error": o.to_dict()}
            continue
        path = cache.open_entry(fp, sig.key).kernel_path
        container = (torch._C._aoti.AOTIModelContainerRunnerCuda(path, 1, "cuda:0") if device == "cuda"
                     else torch._C._aoti.AOTIModelContainerRunnerCpu(path, 1))
        pooled = PooledRunner(path, "cuda:0" if device == "cuda" else "cpu")
        lr = load_runner(path, "cuda:0" if device == "cuda" else "cpu")
        exp = torch.add(a, b)
        for r in (container, pooled, lr):
            assert torch.equal(r.run([a, b])[0], exp)
        takes = {n for f in (install_fn, Hook.__init__) for n in inspect.signature(f).parameters}
        kw = {"serve": "always"} if "serve" in takes else {}
        hook = install(cache_dir=cache.root, ops=["aten::add.Tensor"], devices=(device,), on_miss="ignore", route="all", **kw)
        hook_on = [True]

        def hooked():
            return torch.add(a, b)

        def _all_boxed():
            hb = _with_dev("typed_entry=0", lambda: install(cache_dir=cache.root, ops=["aten::add.Tensor"],
                                                          devices=(device,), on_miss="ignore", route="all", **kw))
            try:
                assert not hb.stats()["native"].get("typed_ops")
                for _ in range(200):
                    hooked()
                return _batch(hooked, calls, sync)
            finally:
                hb.uninstall()

        paths = {"eager": lambda: torch.add(a, b), "container run": lambda: container.run([a, b]),
                 "pooled runner": lambda: pooled.run([a, b]), "load_runner": lambda: lr.run([a, b])}
        res = {k: [] for k in list(paths) + ["hook (native)"] + (["hook (native, all boxed)"] if ab_typed else [])}
        try:
            assert torch.equal(hooked(), exp)
            for _ in range(200):
                hooked()
            for r in range(rounds):
                names = list(paths) if r % 2 == 0 else list(reversed(paths))
                # eager paths are timed with the hook out of the way, the hook with it in
                hook.uninstall() if hook_on[0] else None
                hook_on[0] = False
                for k in names:
                    for _ in range(50):
                        paths[k]()
                    res[k].append(_batch(paths[k], calls, sync))
                if ab_typed and r % 2 == 1:          # the all-boxed hook alone (the other uninstalled)
                    res["hook (native, all boxed)"].append(_all_boxed())
                hook = install(cache_dir=cache.root, ops=["aten::add.Tensor"], devices=(device,), on_miss="ignore", route="all", **kw)
                hook_on[0] = True
                for _ in range(200):
                    hooked()
                res["hook (native)"].append(_batch(hooked, calls, sync))
                st = hook.stats()
                if ab_typed and r % 2 == 0:
                    hook.uninstall()
                    hook_on[0] = False
                    res["hook (native, all boxed)"].append(_all_boxed())
                    hook = install(cache_dir=cache.root, ops=["aten::add.Tensor"], devices=(device,), on_miss="ignore",
                                   route="all", **kw)
                    hook_on[0] = True
        finally:
            if hook_on[0]:
                hook.uninstall()
        out["shapes"]["x".join(map(str, shape))] = {
            "us": {k: round(statistics.median(v), 2) for k, v in res.items()},
            "native_active": st.get("native", {}).get("active"), "hits": st.get("hits")}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    import common
    common.add_output_args(ap, "hitpath")
    ap.add_argument("--workdir")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ab-typed", action="store_true",
                    help="also time the hook with every op registered boxed (AOTI_FARM_DEV=typed_entry=0)")
    a = ap.parse_args(argv)
    res = run(a.device, a.rounds, a.calls, a.workdir, a.quick, a.ab_typed)
    from common import machine

    res["machine"] = machine()
    print(f"== hit path ({res['device']}{' ' + res['device_name'] if res['device_name'] else ''}, "
          f"{res['threads']} threads, median of {res['rounds']} rounds), us per call")
    for shape, d in res["shapes"].items():
        if "error" in d:
            print(f"{shape}: {d['error']}")
            continue
        print(f"{shape:>10s}: " + "  ".join(f"{k} {v:.2f}" for k, v in d["us"].items())
              + f"  (native {d['native_active']}, hits {d['hits']})")
    common.write_output(a, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
