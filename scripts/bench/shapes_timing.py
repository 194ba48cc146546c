"""Helpers of ``shapes.py``'s timing child: where one forward's time goes.

* :func:`routed_calls`: every call of the cached ops one forward makes, one per distinct
  signature with its count (timed one by one, they split the model's row by op);
* :func:`profile`: torch.profiler over a few forwards, per forward: each routed op's host
  time, on CUDA the runtime calls and the GPU kernels;
* :func:`progress`: a line in the run's log at once (a child killed by a time limit
  leaves what it measured);
* :func:`hybrid_caches`: the shape-general cache with one op's classes replaced by exact
  kernels (``--hybrid``);
* :func:`child_timing`: the timing step itself (see ``shapes.py``'s docstring, step 4).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

#: Back-to-back (paired) blocks per item and round (see child_timing).
PAIRED_REPS = 3


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

    from aoti_farm.cache.store import Cache

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


def _time(fn, n: int, sync, reps: int = 5) -> float:
    import gc

    fn()
    sync()
    out = []
    for _ in range(reps):
        gc.disable()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t) / n)
        gc.enable()
    return statistics.median(out)


def child_timing(model_fn, ids_fn, sync, device: str, exact: str, dyn: str, L: int, unseen_L: int, rounds: int,
                 threads: int, ops: list, hybrid: bool = False) -> dict:
    """Eager vs exact hit vs shape-general hit at length ``L`` (and the model at ``unseen_L``):
    a profile per mode, then ``rounds`` rounds of per-mode blocks, paired blocks and the
    per-op split; every round logged as it ends (:func:`progress`)."""
    import torch

    from aoti_farm.runtime import install

    if threads:
        torch.set_num_threads(threads)

    m = model_fn()
    g = torch.Generator().manual_seed(1)
    x_ff = torch.randn(2, L, 512, generator=g).to(device)
    x_h = torch.randn(2, L, 128, generator=g).to(device)
    w, b = torch.randn(128, generator=g).to(device), torch.randn(128, generator=g).to(device)
    ids, ids_u = ids_fn(L), ids_fn(unseen_L)
    items = {
        f"gelu[2,{L},512]": (lambda: torch.ops.aten.gelu.default(x_ff), 2000),
        f"add[2,{L},128]": (lambda: torch.ops.aten.add.Tensor(x_h, x_h), 4000),
        f"layer_norm[2,{L},128]": (lambda: torch.ops.aten.native_layer_norm.default(x_h, [128], w, b, 1e-12), 2000),
        f"bert L={L}": (lambda: m(ids), 20),
        f"bert L={unseen_L} (unseen)": (lambda: m(ids_u), 20),
    }
    # every routed call of the model at L, one by one (the split of the bert L row by op)
    routed = routed_calls(m, ids, set(ops))
    per_forward = {}
    for name, func, args, kwargs, count in routed:
        k = f"op {name}"
        items[k] = ((lambda f=func, a=args, kw=kwargs: f(*a, **kw)), 1000)
        per_forward[k] = count
    res: dict = {k: {"eager": [], "exact": [], "dynamic": []} for k in items}
    stats: dict = {}
    # first (so a run cut short has it): where the time of one forward at L goes, per mode
    profiles: dict = {}
    with torch.no_grad():
        for mode in ("eager", "exact", "dynamic"):
            fwd = items[f"bert L={L}"][0]
            if mode == "eager":
                profiles[mode] = profile(fwd, 10, set(ops), device, sync)
            else:
                with install(exact if mode == "exact" else dyn, on_miss="ignore", serve="always"):
                    fwd(), fwd()
                    profiles[mode] = profile(fwd, 10, set(ops), device, sync)
            pr = profiles[mode]
            progress(f"[profile] bert L={L} {mode}: {pr['wall_us']} us per forward under the profiler; GPU kernels "
                      f"{pr['gpu_kernel_launches']} per forward, {pr['gpu_kernel_us']} us; routed ops (calls, host us "
                      "per forward): " + "  ".join(f"{r['name']} {r['calls']:g} {r['cpu_us']}" for r in pr["routed_ops"])
                      + "; device API: " + "  ".join(f"{r['name']} {r['calls']:g} {r['self_cpu_us']}"
                                                     for r in pr["device_api"][:8]))
    # the model under the shape-general cache with one op's classes replaced by its exact kernels
    from aoti_farm.fingerprint import fingerprint

    hyb = hybrid_caches(exact, dyn, str(Path(dyn).parent / "hybrid"),
                          fingerprint("cuda:0" if device == "cuda" else "cpu").id) if hybrid else {}
    res_h: dict = {op: [] for op in hyb}
    paired = [k for k in items if not k.startswith("op ")]
    res_p: dict = {k: {"eager": [], "exact": [], "dynamic": []} for k in paired}
    progress(f"[timing] L={L} unseen L={unseen_L}, {len(routed)} distinct routed calls per forward "
              f"({sum(per_forward.values())} calls), {rounds} rounds, threads {torch.get_num_threads()}")
    with torch.no_grad():
        for r in range(rounds):
            t_round = time.perf_counter()
            for mode in (("eager", "exact", "dynamic") if r % 2 == 0 else ("dynamic", "exact", "eager")):
                if mode == "eager":
                    for k, (fn, n) in items.items():
                        res[k]["eager"].append(_time(fn, n, sync))
                    continue
                # both hooks installed the same way: the bench's serving settings, route
                # and on_miss alike (stats()["route"] says which route that was)
                with install(exact if mode == "exact" else dyn, on_miss="ignore", serve="always") as h:
                    for fn, _ in items.values():   # decide, load, remember natively
                        fn(), fn()
                    s0 = h.stats()
                    per_item = {}
                    for k, (fn, n) in items.items():
                        a = h.stats()
                        res[k][mode].append(_time(fn, n, sync))
                        z = h.stats()
                        per_item[k] = {"hits": z["hits"] - a["hits"], "misses": z["misses"] - a["misses"],
                                       "slow_calls": z["native"].get("slow_calls", 0) - a["native"].get("slow_calls", 0),
                                       "miss_ops": {o: v["misses"] - a["per_op"].get(o, {}).get("misses", 0)
                                                    for o, v in z["per_op"].items()
                                                    if v["misses"] - a["per_op"].get(o, {}).get("misses", 0)}}
                    st = h.stats()
                    stats[mode] = {"hits_while_timing": st["hits"] - s0["hits"],
                                   "misses_while_timing": st["misses"] - s0["misses"], "misses": st["misses"],
                                   "native": st["native"].get("active"), "route": st.get("route"),
                                   "routed_ops": st.get("routed_ops"), "on_miss": "ignore", "serve": st.get("serve"),
                                   "slow_calls_while_timing": st["native"].get("slow_calls", 0)
                                   - s0["native"].get("slow_calls", 0),
                                   "shape_classes": st.get("shape_classes"), "per_item": per_item}
            # paired: the same item under each mode back to back (a hook installed for each
            # block of calls), so a host whose speed drifts between states over seconds
            # (seen on a GPU host) slows both sides of a pair alike
            for k in paired:
                fn, n = items[k]
                for rep in range(PAIRED_REPS):
                    order = ("eager", "exact", "dynamic") if (r + rep) % 2 == 0 else ("dynamic", "exact", "eager")
                    for mode in order:
                        if mode == "eager":
                            res_p[k][mode].append(_time(fn, n, sync, reps=1))
                            continue
                        with install(exact if mode == "exact" else dyn, on_miss="ignore", serve="always"):
                            fn(), fn()
                            res_p[k][mode].append(_time(fn, n, sync, reps=1))
            progress(f"[timing] round {r + 1}/{rounds} paired, dynamic/exact per pair: " + "  ".join(
                f"{k}: " + " ".join(f"{d / e:.3f}" for d, e in zip(res_p[k]["dynamic"][-PAIRED_REPS:],
                                                               res_p[k]["exact"][-PAIRED_REPS:])) for k in paired))
            for op, path in hyb.items():   # the bert L row only
                fwd, n = items[f"bert L={L}"]
                with install(path, on_miss="ignore", serve="always"):
                    fwd(), fwd()
                    res_h[op].append(_time(fwd, n, sync))
            if hyb:
                progress(f"[timing] round {r + 1}/{rounds} bert L={L} under the shape-general cache with one op's "
                           "classes replaced by its exact kernels, us: "
                           + "  ".join(f"{op}: {v[-1] * 1e6:.1f}" for op, v in res_h.items()))
            line = "  ".join(f"{k}: " + "/".join(f"{res[k][md][-1] * 1e6:.1f}" for md in ("eager", "exact", "dynamic"))
                             for k in items if not k.startswith("op "))
            progress(f"[timing] round {r + 1}/{rounds} ({time.perf_counter() - t_round:.1f}s, load average "
                       f"{os.getloadavg()[0]:.2f}) eager/exact/dynamic us: "
                      f"{line}")
            ops_line = "  ".join(f"{k[3:]}x{per_forward[k]}: " + "/".join(f"{res[k][md][-1] * 1e6:.1f}"
                                                                           for md in ("eager", "exact", "dynamic"))
                                 for k in items if k.startswith("op "))
            progress(f"[timing] round {r + 1}/{rounds} per op (xcalls per forward) eager/exact/dynamic us: {ops_line}")
            for md in ("exact", "dynamic"):
                pi = stats[md]["per_item"]
                progress(f"[timing] round {r + 1}/{rounds} {md} hook (route {stats[md]['route']}, "
                          f"{stats[md]['routed_ops']} ops routed): "
                          + "  ".join(f"{k}: hits {v['hits']} misses {v['misses']} slow {v['slow_calls']}"
                                      + (f" {v['miss_ops']}" if v["miss_ops"] else "")
                                      for k, v in pi.items() if not k.startswith("op ") or v["misses"] or v["slow_calls"]))
    out = {}
    for k, v in res.items():
        med = {mode: statistics.median(t) * 1e6 for mode, t in v.items()}
        row = {f"{mode}_us": round(us, 2) for mode, us in med.items()}
        for mode in ("exact", "dynamic"):
            row[f"{mode}_vs_eager"] = round(med[mode] / med["eager"], 3)
        row["dynamic_vs_exact"] = round(med["dynamic"] / med["exact"], 3)
        if k in per_forward:
            row["calls_per_forward"] = per_forward[k]
        out[k] = row
    if per_forward:   # the routed calls of one forward, summed from their one-by-one times
        tot = {md: sum(out[k][f"{md}_us"] * c for k, c in per_forward.items()) for md in ("eager", "exact", "dynamic")}
        out[f"bert L={L} routed ops, summed"] = {**{f"{md}_us": round(v, 2) for md, v in tot.items()},
                                               "dynamic_vs_exact": round(tot["dynamic"] / tot["exact"], 3),
                                               "calls_per_forward": sum(per_forward.values())}
    for k, v in res_p.items():
        ratios = sorted(d / e for d, e in zip(v["dynamic"], v["exact"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out[f"{k} (paired)"] = {**{f"{md}_us": round(statistics.median(t) * 1e6, 2) for md, t in v.items()},
                                "dynamic_vs_exact": round(statistics.median(ratios), 3),
                                "dynamic_vs_exact_quartiles": [round(q[0], 3), round(q[2], 3)],
                                "exact_vs_eager": round(statistics.median(e / g for e, g in zip(v["exact"], v["eager"])), 3),
                                "dynamic_vs_eager": round(statistics.median(d / g for d, g in zip(v["dynamic"], v["eager"])),
                                                          3),
                                "pairs": len(ratios)}
    b = out[f"bert L={L}"]
    for op, v in res_h.items():
        us = statistics.median(v) * 1e6
        out[f"bert L={L}, {op} exact, other classes"] = {
            "us": round(us, 2), "vs_exact": round(us / b["exact_us"], 3), "vs_dynamic": round(us / b["dynamic_us"], 3)}
    return {"items": out, "rounds": rounds, "hooks": stats, "threads": torch.get_num_threads(), "profile": profiles}
