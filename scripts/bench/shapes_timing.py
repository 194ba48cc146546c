"""Helpers of ``shapes.py``'s timing child (issue 15): where one forward's time goes.

* :func:`routed_calls`: every call of the cached ops one forward makes, one per distinct
  signature with its count (timed one by one, they split the model's row by op);
* :func:`profile`: torch.profiler over a few forwards, per forward: each routed op's host
  time, on CUDA the runtime calls and the GPU kernels;
* :func:`progress`: a line in the run's log at once (a child killed by a time limit
  leaves what it measured).
"""

from __future__ import annotations

import os
import sys
import time


def progress(line: str) -> None:
    """A line in the run's log at once (a child killed by a time limit leaves its rounds)."""
    path = os.environ.get("AOTI_SHAPES_BENCH_LOG")
    print(line, file=sys.stderr, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def routed_calls(m, ids, ops: set) -> list:
    """The calls of ``ops`` (the ops the caches hold) one forward of ``m`` makes, eager,
    one per distinct (op, sizes, strides, dtypes, other arguments) with how many times the
    forward makes it: timed one by one, they split the model's row by op."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def part(a):
        if isinstance(a, torch.Tensor):
            return ("T", str(a.dtype), tuple(a.shape), tuple(a.stride()))
        if isinstance(a, (list, tuple)):
            return tuple(part(x) for x in a)
        return repr(a)

    calls: dict = {}

    class Rec(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.name() == "aten::embedding" and "aten::index_select" in ops:
                # eager's embedding calls index_select below this mode (the hook sees that call)
                w, idx = args[0], args[1]
                sel = (w, 0, idx.reshape(-1))
                k = ("aten::index_select", part(sel), "")
                if k in calls:
                    calls[k][3] += 1
                else:
                    calls[k] = [torch.ops.aten.index_select.default, sel, {}, 1]
                return func(*args, **kwargs)
            if func.name() in ops:
                k = (func.name(), part(args), part(sorted(kwargs.items())))
                if k in calls:
                    calls[k][3] += 1
                else:
                    calls[k] = [func, args, kwargs, 1]
            return func(*args, **kwargs)

    with torch.no_grad(), Rec():
        m(ids)
    out = []
    for (name, a, _), (func, args, kwargs, count) in calls.items():
        shapes = ",".join("x".join(map(str, x[2])) + ("" if _contig(x) else "s" + "_".join(map(str, x[3])))
                          for x in a if isinstance(x, tuple) and x and x[0] == "T")
        out.append((f"{name.split('::')[1]}[{shapes}]", func, args, kwargs, count))
    return out


def _contig(t) -> bool:
    """Whether a ``part`` of a tensor has contiguous strides."""
    sizes, strides = t[2], t[3]
    want, acc = [], 1
    for n in reversed(sizes):
        want.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(want)) == tuple(strides)


def profile(fn, n: int, ops: set, device: str, sync) -> dict:
    """torch.profiler over ``n`` calls of ``fn`` (CPU, and CUDA on the GPU), per call: each
    routed op's host time (its dispatcher entry: our kernel or eager's), the device runtime
    calls (launches, copies, synchronisations) and the GPU kernels' time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    fn()
    sync()
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        wall = (time.perf_counter() - t) / n
    rows = []
    for e in prof.key_averages():
        dev = float(getattr(e, "self_device_time_total", 0) or 0)
        rows.append({"name": e.key, "calls": round(e.count / n, 2), "cpu_us": round(e.cpu_time_total / n, 1),
                     "self_cpu_us": round(e.self_cpu_time_total / n, 1), "device_us": round(dev / n, 1)})
    api = [r for r in rows if r["name"].startswith(("cuda", "cu")) and not r["device_us"]]
    kernels = [r for r in rows if r["device_us"] and not r["name"].startswith("aten::")]
    names = {o.split(".")[0] for o in ops}   # the profiler names aten::add.Tensor "aten::add"
    routed = [r for r in rows if r["name"] in names]
    return {"wall_us": round(wall * 1e6, 1), "profiled_calls": n,
            "routed_ops": sorted(routed, key=lambda r: -r["cpu_us"]),
            "device_api": sorted(api, key=lambda r: -r["self_cpu_us"])[:20],
            "gpu_kernels": sorted(kernels, key=lambda r: -r["device_us"])[:30],
            "gpu_kernel_us": round(sum(r["device_us"] for r in kernels), 1),
            "gpu_kernel_launches": round(sum(r["calls"] for r in kernels), 1),
            "top_host": sorted(rows, key=lambda r: -r["self_cpu_us"])[:25]}


def hybrid_caches(exact: str, dyn: str, out_dir: str, fp_id: str) -> dict:
    """Per op that has a shape class: a copy of the ``dyn`` cache plus ``exact``'s entries
    of that op (the hook tries exact keys first, so that op is served by exact kernels and
    every other op by its classes).  Timing the model under each says how much of the
    shape-general row each op's class kernel accounts for, in the model itself."""
    import shutil
    from pathlib import Path

    from aoti_farm.cache import Cache

    ce, cd = Cache(exact), Cache(dyn)

    def op_of(c, k):
        try:
            m = c.read_manifest(c.entry_dir(fp_id, k))
            return str(m["signature"]["op"]), m.get("shape_class") is not None
        except Exception:  # noqa: BLE001 -- an unreadable entry is left out
            return None, False

    class_ops = {op for op, is_class in (op_of(cd, k) for k in cd.list_keys(fp_id)) if is_class and op}
    by_op: dict = {}
    for k in ce.list_keys(fp_id):
        op, _ = op_of(ce, k)
        by_op.setdefault(op, []).append(k)
    out = {}
    for op in sorted(class_ops):
        dest = Path(out_dir) / ("dyn+exact-" + op.replace("::", "-").replace(".", "-"))
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(dyn, dest, symlinks=True)
        hc = Cache(str(dest))
        for k in by_op.get(op, []):
            to = hc.entry_dir(fp_id, k)
            if not to.exists():
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(ce.entry_dir(fp_id, k), to)
        out[op] = str(dest)
    return out
