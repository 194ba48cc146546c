#!/usr/bin/env python
"""aoti-farm benchmarks against upstream aoti_eager.

    python scripts/bench/run.py --out DIR       # full mode (docs/benchmarks.md; quiet machine)
    python scripts/bench/run.py --quick         # smoke mode: tiny sizes, no new compiles if
                                                # --kernel-cache holds a kernel (else one)
    python scripts/bench/run.py --only hit,miss --json out.json

Benchmarks (names for --only): warm, rerun, hit, miss, cold, startup, miss2hit, payoff
(scripts/bench/payoff.py: per-op suite and models, hooked vs eager, in one process),
scaling (scripts/bench/scaling.py: warm at W=1 and W=all).  Each prints its own table;
the run ends with one summary table (target / measured / met?) and writes everything,
with the machine and date, to ``--out DIR`` (bench-results.json and .md) or ``--json FILE``;
without either it writes nothing.  The baseline (eager,
upstream) is re-measured in the same run, in separate processes.

The other scripts of this folder measure one question each, with their own --help:
hitpath.py (a hit by call path), loadpath.py (private copy vs shared file), shapes.py
(shape-general kernels), explain_bench.py, metrics_hit_bench.py, contention.py (a
background compile beside eager), compile_peak_rss.py (the memory budget's calibration);
on a GPU host cuda_hit_ab.py (the CUDA hit path against upstream's holder);
compile_cost.py (one signature's compile, a build switch -- the split build's too -- A/B'd
in one process, on CPU or CUDA); refusals.py (what verification refuses of real workloads).  worker.py and common.py are their helpers.

How things are measured (see each bench_* function):
  * per-call times: median over R repeats of (N back-to-back calls)/N after a warm-up,
    one process per (signature, mode); upstream's holder serves the *same* kernel file
    as the hook (exported with aoti_farm.interop.upstream.export_upstream), so only the call
    path differs;
  * farm CPU: every process descending from the `aoti-farm warm` process (driver,
    raylet, Ray workers, g++): sampled from /proc every 0.2 s, each process's own time
    plus the time of the children it reaped, minus what would be counted twice
    (common.TreeCPU; the compilers' short processes and last intervals are in their
    parent's cutime -- sampling own time alone missed them).  getrusage(RUSAGE_CHILDREN)
    misses Ray's workers (nobody in the driver's chain reaps them) and the machine-wide
    busy CPU from /proc/stat (exact only on a quiet machine) are reported as
    cross-checks; upstream's CPU is getrusage(SELF+CHILDREN) of its one process, torch
    import included, like the farm's;
  * warm throughput: upstream's sequential time is the sum of its compiles in one
    process that has imported torch (its first compile, with Inductor's first-compile
    probes, included); the farm's time is the CLI process's wall time from its start.
    Both start from cold caches: a fresh Inductor cache each, and for the farm a fresh
    XDG_CACHE_HOME (its per-host ISA / libstdc++ memos); Inductor's precompiled headers
    live in a global directory both sides share;
  * fake entries (re-run, start-up) are copies of one real kernel, stripped (~0.3 MB),
    published under add.Tensor (1, k) signatures; they are never called.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import common as C  # noqa: E402

NAMES = ("warm", "rerun", "hit", "miss", "cold", "startup", "miss2hit", "payoff", "scaling")

# hit-path signatures: tiny to large (full mode); --quick uses the first kernel it has
HIT_SPECS = [
    {"op": "aten::add.Tensor", "shapes": [[64, 128], [64, 128]]},
    {"op": "aten::add.Tensor", "shapes": [[1024, 1024], [1024, 1024]]},
    {"op": "aten::mul.Tensor", "shapes": [[256, 256], [256, 256]]},
    {"op": "aten::relu.default", "shapes": [[1024, 1024]]},
    {"op": "aten::gelu.default", "shapes": [[256, 256]]},
    {"op": "aten::mm.default", "shapes": [[128, 128], [128, 128]]},
]


class Ctx:
    def __init__(self, args):
        self.quick = args.quick
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="aoti-bench-")).absolute()
        self.work.mkdir(parents=True, exist_ok=True)
        self.kcache = str(Path(args.kernel_cache).absolute()) if args.kernel_cache else str(self.work / "kernels")
        self.unique = args.unique
        self.targets: list[dict] = []
        self.iters = ({"warmup": 50, "repeats": 7, "inner": 100} if self.quick
                      else {"warmup": 500, "repeats": 31, "inner": 500})
        self._hit_sigs = None

    def dir(self, name: str) -> str:
        p = self.work / name
        C.rmtree(p)
        p.mkdir(parents=True)
        return str(p)

    def target(self, bench: str, what: str, target: str, measured, met):
        self.targets.append({"bench": bench, "what": what, "target": target,
                             "measured": measured, "met": met})

    # kernels -------------------------------------------------------------------------
    def hit_sigs(self) -> list:
        """Signatures with a real kernel in self.kcache (compiled here if needed)."""
        if self._hit_sigs is None:
            from aoti_farm.cache.store import Cache
            from aoti_farm.fingerprint import fingerprint

            if self.quick:
                found = (C.find_kernel(self.kcache, "aten::add.Tensor") or C.find_kernel(self.kcache, "aten::mul.Tensor")
                         or C.find_kernel(self.kcache))
                if found is None:
                    print("[bench] no kernel in the kernel cache; compiling one (add 8x16)", flush=True)
                    C.compile_into(self.kcache, [C.sig_from_spec({"op": "aten::add.Tensor", "shapes": [[8, 16], [8, 16]]})])
                    found = C.find_kernel(self.kcache)
                self._hit_sigs = [found[1]]
            else:
                sigs = [C.sig_from_spec(s) for s in HIT_SPECS]
                t0 = time.perf_counter()
                outs = C.compile_into(self.kcache, sigs)
                print(f"[bench] hit kernels ready ({time.perf_counter() - t0:.1f} s; "
                      f"{sum(o['status'] == 'compiled' for o in outs)} compiled)", flush=True)
                cache, fp = Cache(self.kcache, signing_key=None), fingerprint("cpu")
                self._hit_sigs = [s for s in sigs if cache.has_entry(fp.id, s.key)]
        return self._hit_sigs

    def any_kernel(self) -> str:
        sig = self.hit_sigs()[0]
        from aoti_farm.cache.store import Cache
        from aoti_farm.fingerprint import fingerprint
        return Cache(self.kcache, signing_key=None).open_entry(fingerprint("cpu"), sig.key).kernel_path


def table(title: str, header: list[str], rows: list[list]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "-" if v is None else str(v)
    cells = [[fmt(c) for c in r] for r in rows]
    w = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    print(f"\n== {title}")
    print("  ".join(h.ljust(w[i]) for i, h in enumerate(header)))
    for r in cells:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    sys.stdout.flush()


def err_line(results: list[dict], mode: str) -> str | None:
    """The last line of the first error a worker of ``mode`` reported, if any."""
    for r in results:
        e = (r.get(mode) or {}).get("error")
        if e:
            lines = [x for x in e.strip().splitlines() if x.strip()]
            return f"{mode} error: {lines[-1][:120] if lines else '?'}"
    return None


def upstream_env(ind_dir: str) -> dict:
    return {"TORCHINDUCTOR_CACHE_DIR": ind_dir}


# --- 1. warm throughput -------------------------------------------------------------------

def upstream_supports(sig) -> bool:
    """Upstream compiles only tensors, tensor lists and int/float/bool/str/dtype arguments
    (an int list such as a normalized_shape makes it give up)."""
    from aoti_farm import signature as S
    info = sig.info()
    for a, d in zip(sig.args, info.defaults):
        if a[0] in ("T", "b", "i", "f", "s", "dtype"):
            continue
        if a[0] == "TL" and all(t[0] == "T" for t in a[1]):
            continue
        if a[0] == "N" or (d is not S.NO_DEFAULT and S.decode_value(a) == d):
            continue  # left out at its default
        return False
    return True


def rusage_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli_warm(ctx: Ctx, trace: str, cache: str, workers: int, label: str, timeout: float = 3600,
                 sample_tree: bool = True, cold_host_memos: bool = False) -> dict:
    """`aoti-farm warm` as a separate process: wall time, CPU of its whole tree, report.

    ``cold_host_memos``: a fresh XDG_CACHE_HOME, so the farm's per-host memos (the CPU's
    vector ISA, the libstdc++ probe) start cold, as upstream's fresh Inductor cache does:
    each side pays its first-compile probes once per run."""
    report = str(ctx.work / f"report-{label}.json")
    ray_tmp = ray_tmpdir(ctx, f"raytmp-{label}")
    ind = ctx.dir(f"inductor-{label}")
    argv = ["warm", "--model", trace, "--cache-dir", cache, "--cpu-workers", str(workers), "--report", report]
    extra = {"TORCHINDUCTOR_CACHE_DIR": ind, "RAY_TMPDIR": ray_tmp, "AOTI_FARM_CACHE_DIR": cache}
    if cold_host_memos:
        extra["XDG_CACHE_HOME"] = ctx.dir(f"xdg-{label}")
    env = C.bench_env(extra)
    cmd = [C.PY, str(C.HERE / "worker.py"), "cli_warm", json.dumps({"argv": argv})]
    cpu0, sys0 = rusage_children(), C.system_busy_s()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree = C.TreeCPU(proc.pid) if sample_tree else None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    tree_cpu = tree.stop() if tree else None
    cpu, sys_busy = rusage_children() - cpu0, C.system_busy_s() - sys0
    p = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    res = {"wall_s": wall, "cpu_reaped_children_s": cpu, "cpu_tree_sampled_s": tree_cpu,
           "tree_pids_seen": tree.seen_pids if tree else None,
           "cpu_tree_by_process_s": {k: round(v, 2) for k, v in tree.by_name.items() if v >= 0.05} if tree else None,
           "system_busy_s (whole machine)": sys_busy, "returncode": p.returncode}
    for line in p.stdout.splitlines():
        if line.startswith(C.MARK):
            res.update(json.loads(line[len(C.MARK):]))
    if p.returncode != 0 or res.get("rc") != 0:
        res["stderr_tail"] = p.stderr[-2000:]
    res["ray_tmp_used"] = any(Path(ray_tmp).iterdir())
    try:
        res["report"] = json.loads(Path(report).read_text())
    except (OSError, ValueError):
        res["report"] = None
    return res


def ray_tmpdir(ctx: Ctx, name: str) -> str:
    """A fresh RAY_TMPDIR: in the work dir when short enough, else a new one in the system
    temp dir (Ray's AF_UNIX socket paths under it must stay within 107 bytes; a deep work
    dir, such as pytest's, broke `ray.init`)."""
    d = ctx.dir(name)
    if len(d) > 40:
        d = tempfile.mkdtemp(prefix="aoti-rt-")
    return d


def report_compile_seconds(report) -> tuple[float | None, int]:
    """Sum of per-signature compile seconds in a warm report (whatever its layout)."""
    tot, n = 0.0, 0

    def walk(x):
        nonlocal tot, n
        if isinstance(x, dict):
            st = x.get("status")
            if st == "compiled" and isinstance(x.get("seconds"), (int, float)):
                tot += float(x["seconds"])
                n += 1
                return
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(report)
    return (tot if n else None), n


def bench_warm(ctx: Ctx) -> dict:
    ncpu = os.cpu_count() or 1
    out: dict = {}
    trace_all = str(ctx.work / "mlp_trace_all.json")
    batches = list(range(1, 17)) if not ctx.quick else [1, 2]
    rec = C.run_worker("record_trace", {"path": trace_all, "batches": batches})
    out["trace"] = rec
    from aoti_farm.trace import Trace, load_trace, save_trace

    tr = load_trace(trace_all)
    usable = [e for e in tr if upstream_supports(e.sig)]
    out["trace_entries"], out["upstream_supported"] = len(tr), len(usable)
    U = min(ctx.unique, len(usable)) if ctx.unique else len(usable)   # default: the whole trace
    if ctx.quick:
        U = min(U, 1)   # quick: the same code path on one signature (one compile per side)
    trace = str(ctx.work / "mlp_trace.json")
    save_trace(Trace(usable[:U]), trace)
    out["unique"] = U
    # upstream: one warm process, one after another
    ind = ctx.dir("inductor-upstream-seq")
    sys0 = C.system_busy_s()
    up = C.run_worker("upstream_seq", {"trace": trace}, env=upstream_env(ind), timeout=7200)
    up["system_busy_s (whole machine)"] = C.system_busy_s() - sys0
    seq_s = sum(p["seconds"] for p in up["per_sig"])
    up_ok = sum(p["ok"] for p in up["per_sig"])
    # whole process (start, imports, every compile), like the farm's process tree
    up_cpu_per_sig = up["cpu_total_s"] / max(1, U)
    out["cpu_s_per_sig_upstream_loop_only"] = up["cpu_loop_s"] / max(1, U)
    out["upstream"] = up
    # farm at W=1 and W=all
    farm = {}
    for w in ([1] if ctx.quick else sorted({1, ncpu})):
        cache = ctx.dir(f"farm-cache-w{w}")
        r = run_cli_warm(ctx, trace, cache, w, f"w{w}", cold_host_memos=True)
        r["report_compile_seconds"], r["report_compiled"] = report_compile_seconds(r.get("report"))
        farm[w] = r
    out["farm"] = {str(k): v for k, v in farm.items()}
    # where a compile's time goes
    try:
        if ctx.quick:
            raise C.WorkerError("quick: not profiled")
        out["profile"] = C.run_worker("profile_compile", {"trace": trace, "warmup_index": 0,
                                                          "index": min(1, U - 1)},
                                      env={"TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-prof")}, timeout=1800)
    except C.WorkerError as e:
        out["profile"] = {"error": str(e)[-1500:]}
    # what the C++ side would give: the same profiled compile under Inductor knobs that
    # change only how the wrapper is built (each in a fresh process and inductor cache)
    variants = {}
    for label, env in () if ctx.quick else (("whole wrapper, no split build (AOTI_FARM_DEV=split_build=0)",
                                               {"AOTI_FARM_DEV": "split_build=0"}),
                                              ("wrapper -O0 (AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0)",
                                               {"AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL": "O0"}),):
        env = {**env, "TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-prof-variant")}
        try:
            v = C.run_worker("profile_compile", {"trace": trace, "warmup_index": 0, "index": min(1, U - 1), "top": 0},
                             env=env, timeout=1800)
            variants[label] = {"wall_s": v["wall_s"], "phases": v["phases"], "warmup_compile_s": v["warmup_compile_s"],
                               "build": v.get("build"),
                               "subprocesses": [{"seconds": q["seconds"], "cmd": q["cmd"][:120]} for q in v["subprocesses"]]}
        except C.WorkerError as e:
            variants[label] = {"error": str(e)[-800:]}
    out["profile_variants"] = variants
    rows = [["upstream sequential (1 process)", 1, seq_s, up["cpu_total_s"], up_cpu_per_sig, 1.0,
             f"{up_ok}/{U} ok; machine-busy-s={up['system_busy_s (whole machine)']:.1f}"]]
    eff_all = None
    for w, r in farm.items():
        ok = r.get("rc") == 0
        eff = seq_s / (w * r["wall_s"]) if r["wall_s"] and ok else None
        cpu = max(r["cpu_tree_sampled_s"] or 0.0, r["cpu_reaped_children_s"])
        rcs = r["report_compile_seconds"]
        rows.append([f"aoti-farm warm W={w}", w, r["wall_s"], cpu, cpu / max(1, U), eff,
                     f"rc={r.get('rc', r['returncode'])} report-compile-s={rcs if rcs is None else round(rcs, 1)} "
                     f"machine-busy-s={r['system_busy_s (whole machine)']:.1f}"])
        r["parallel_efficiency_vs_upstream_seq"] = eff
        if ok and rcs:
            r["fixed_overhead_s (wall - report compile s / W)"] = r["wall_s"] - rcs / w
        if w == max(farm) and ok:
            eff_all = eff
            out["cpu_s_per_sig_farm_tree"] = cpu / max(1, U)
            out["cpu_s_per_sig_farm_report"] = (rcs / max(1, r["report_compiled"])) if rcs else None
    out["sequential_s"] = seq_s
    secs = [p["seconds"] for p in up["per_sig"]]
    out["upstream_first_compile_s"] = secs[0] if secs else None   # includes the header precompile
    out["upstream_steady_median_s"] = C.summary(secs[1:]).get("median") if len(secs) > 1 else None
    out["cpu_s_per_sig_upstream"] = up_cpu_per_sig
    table(f"1. warm throughput: {U} unique MLP signatures, {ncpu} cores",
          ["run", "W", "wall s", "CPU s (process tree)", "CPU s/sig", "efficiency", "notes"], rows)
    prof = out.get("profile") or {}
    if "named_cumulative_s" in prof:
        table("1b. where one compile's time goes (cProfile, warm process)", ["part", "seconds"],
              [["wall", prof["wall_s"]], ["phases", json.dumps({k: round(v, 2) for k, v in prof["phases"].items()})],
               ["wrapper build", json.dumps(prof.get("build") or {})],
               ["C++ compiler CPU (children rusage)", prof["cpu_children_s (C++ compiler)"]]]
              + [[k, v] for k, v in prof["named_cumulative_s"].items()]
              + [[f"subprocess: {q['cmd'][:70]}...", q["seconds"]] for q in prof.get("subprocesses", [])]
              + [[f"variant {k}: compile wall", v.get("wall_s")] for k, v in out["profile_variants"].items()])
    ctx.target("warm", f"parallel efficiency at W={ncpu}", ">= 0.9", eff_all if eff_all is not None else "farm failed",
               None if eff_all is None else eff_all >= 0.9)
    if 1 in farm and ncpu in farm and ncpu > 1 and farm[1].get("rc") == 0 and farm[ncpu].get("rc") == 0:
        out["farm_scaling_efficiency"] = farm[1]["wall_s"] / (ncpu * farm[ncpu]["wall_s"])
        ctx.target("warm", f"farm's own scaling, W=1 wall / ({ncpu} x W={ncpu} wall)", "(context)",
                   out["farm_scaling_efficiency"], None)
    # the farm's CPU: every process of the CLI's tree (driver, raylet, workers, compilers),
    # sampled; the report's per-signature seconds are wall times inside the workers
    cps = out.get("cpu_s_per_sig_farm_tree") or out.get("cpu_s_per_sig_farm_report")
    ratio = cps / up_cpu_per_sig if cps and up_cpu_per_sig else None
    ctx.target("warm", "farm CPU-s/sig vs upstream (moonshot)", "<= 0.7x", ratio, None if ratio is None else ratio <= 0.7)
    return out


# --- 2. warm-cache re-run -----------------------------------------------------------------

def bench_rerun(ctx: Ctx) -> dict:
    n = 200 if ctx.quick else 1000
    cache = ctx.dir("rerun-cache")
    t0 = time.perf_counter()
    sigs = C.fake_cache(cache, ctx.any_kernel(), n)
    build = time.perf_counter() - t0
    trace = str(ctx.work / "rerun_trace.json")
    C.write_trace(trace, sigs)
    r = run_cli_warm(ctx, trace, cache, 1, "rerun", timeout=600, sample_tree=False)
    ok = r.get("rc") == 0 and not r.get("ray_initialized") and not r["ray_tmp_used"]
    table(f"2. warm-cache re-run ({n} entries, all cached)", ["measure", "value"],
          [["build fake cache s", build], ["aoti-farm warm wall s (process)", r["wall_s"]],
           ["rc", r.get("rc", r["returncode"])], ["ray imported", r.get("ray_imported")],
           ["ray initialised / RAY_TMPDIR used", f"{r.get('ray_initialized')} / {r['ray_tmp_used']}"]])
    what = f"warm over {n} cached entries (no Ray)"
    measured = r["wall_s"] if ok else (f"{r['wall_s']:.2f} s but rc={r.get('rc', r['returncode'])} "
                                       f"ray={r.get('ray_initialized') or r['ray_tmp_used']}")
    ctx.target("rerun", what, "<= 2 s", measured, ok and r["wall_s"] <= 2.0)
    if len(json.dumps(r.get("report"), default=str)) > 20000:
        r["report"] = "(large; omitted)"
    return {"entries": n, "build_s": build, **r}


# --- 3. hit path --------------------------------------------------------------------------

HIT_ROUNDS, HIT_ROUNDS_QUICK = 7, 3


def bench_hit(ctx: Ctx) -> dict:
    from aoti_farm.signature import describe

    sigs = ctx.hit_sigs()
    ind = ctx.dir("inductor-upstream-hit")
    via = C.export_to_upstream(ctx.kcache, ind)
    rows, res = [], []
    worst = None
    for i, s in enumerate(sigs):
        obj = s.to_obj()
        r = {"sig": describe(s)}
        # the ratio: eager, upstream and the hook interleaved in one process
        try:
            r["ab"] = C.run_worker("hit_ab", {"spec": obj, "iters": ctx.iters, "cache_dir": ctx.kcache,
                                              "rounds": HIT_ROUNDS_QUICK if ctx.quick else HIT_ROUNDS},
                                   env=upstream_env(ind))
        except C.WorkerError as e:
            r["ab"] = {"error": str(e)[-1500:]}
        # the pure-Python hook, and the breakdown, each in a process of its own
        for mode in ("hook-py",) + (("hook",) if i == 0 else ()):
            try:
                r[mode] = C.run_worker("hit", {"mode": mode, "spec": obj, "iters": ctx.iters,
                                                "cache_dir": ctx.kcache, "breakdown": mode == "hook"})
            except C.WorkerError as e:
                r[mode] = {"error": str(e)[-1500:]}
        us = r["ab"].get("us") or {}
        e, u, h = us.get("eager"), us.get("upstream"), us.get("hook")
        # the median of the per-round ratios (each round times both, in alternating order)
        ratio = r["ab"].get("hook_over_upstream_paired_median")
        r["hook_over_upstream"] = ratio
        if ratio is not None:
            worst = ratio if worst is None else max(worst, ratio)
        okd = r["ab"].get("matches_eager") or {}
        rows.append([r["sig"], e, u, h, ratio, r["hook-py"].get("us_median"), okd.get("upstream"),
                     okd.get("hook") and r["hook-py"].get("matches_eager")])
        res.append(r)
    n = HIT_ROUNDS_QUICK if ctx.quick else HIT_ROUNDS
    table(f"3. hit path (µs per call, median of {n} interleaved rounds in one process, hook/upstream the median "
          f"of the {n} per-round ratios; Python path in its own process)",
          ["signature", "eager", "upstream holder", "aoti-farm hook", "hook/upstream", "hook, Python path",
           "up ok", "hook ok"], rows)
    bd = (res[0].get("hook") or {}).get("breakdown") if res else None
    if bd:
        table(f"3b. hook hit breakdown ({res[0]['sig']}, µs)", ["piece", "µs"], [[k, v] for k, v in bd.items()])
    ctx.target("hit", "hook / upstream holder (worst signature)", "<= 1.0x",
               worst if worst is not None else err_line(res, "ab"), None if worst is None else worst <= 1.0)
    return {"upstream_layout_via": via, "signatures": res}


# --- 4. miss path -------------------------------------------------------------------------

def bench_miss(ctx: Ctx) -> dict:
    from aoti_farm.signature import describe

    specs = ([{"op": "aten::add.Tensor", "shapes": [[64, 128], [64, 128]]}] if ctx.quick else
             [{"op": "aten::add.Tensor", "shapes": [[64, 128], [64, 128]]},
              {"op": "aten::add.Tensor", "shapes": [[1024, 1024], [1024, 1024]]},
              {"op": "aten::mm.default", "shapes": [[128, 128], [128, 128]]}])
    rows, res, worst = [], [], None
    for spec in specs:
        r = {"sig": describe(C.sig_from_spec(spec))}
        try:
            ab = C.run_worker("miss_ab", {"spec": spec, "iters": ctx.iters,
                                          "cache_dir": ctx.dir(f"miss-empty-{len(res)}"),
                                          "rounds": HIT_ROUNDS_QUICK if ctx.quick else HIT_ROUNDS})
        except C.WorkerError as e:
            ab = {"error": str(e)[-1500:]}
        r["ab"] = ab
        for mode in ("eager", "hook-miss-ignore", "hook-miss-queue"):
            r[mode] = {"us_median": (ab.get("us") or {}).get(mode), "error": ab.get("error")}
        e = r["eager"].get("us_median")
        over = ab.get("over_eager_paired_median_us") or {}
        for m in ("hook-miss-ignore", "hook-miss-queue"):
            d = over.get(m)   # the median of the per-round differences
            if d is not None:
                worst = d if worst is None else max(worst, d)
        rows.append([r["sig"], e, r["hook-miss-ignore"].get("us_median"), r["hook-miss-queue"].get("us_median"),
                     over.get("hook-miss-ignore"), over.get("hook-miss-queue")])
        res.append(r)
    n = HIT_ROUNDS_QUICK if ctx.quick else HIT_ROUNDS
    table(f"4. miss path (µs per call, median of {n} interleaved rounds in one process, order alternating; "
          f"hook - eager the median of the per-round differences; empty cache)",
          ["signature", "eager", "hook ignore", "hook queue", "ignore - eager", "queue - eager"], rows)
    ctx.target("miss", "hook miss - eager (worst)", "<= +5 µs",
               worst if worst is not None else err_line(res, "hook-miss-ignore") or err_line(res, "hook-miss-queue"),
               None if worst is None else worst <= 5.0)
    return {"signatures": res}


# --- 5. cold-start serving ----------------------------------------------------------------

def bench_cold(ctx: Ctx) -> dict:
    from aoti_farm.trace import load_trace

    # quick: the same code path (empty cache, misses queued, background compile, serving
    # meanwhile), eager and the hook only, stopped after a few seconds whatever was compiled
    shapes = [1] if ctx.quick else [1, 8]
    reqs = [shapes[i % len(shapes)] for i in range(20 if ctx.quick else 200)]
    max_s = 8 if ctx.quick else 900
    trace = str(ctx.work / "cold_trace.json")
    rec = C.run_worker("record_trace", {"path": trace, "batches": shapes})
    ops = sorted({e.sig.op for e in load_trace(trace)})
    out = {"ops": ops, "shapes": shapes, "requests": len(reqs), "trace": rec}
    think = 0.01
    # eager gets 5x the requests (~10 s) so its p99 is not one transient's
    out["eager"] = C.run_worker("cold", {"mode": "eager", "batches": reqs * 5, "think_s": think})
    modes = ["eager", "hook"]
    if not ctx.quick:
        ind = ctx.dir("inductor-cold-upstream")
        out["upstream"] = C.run_worker("cold", {"mode": "upstream", "batches": reqs, "think_s": think, "ops": ops},
                                       env=upstream_env(ind), timeout=3600)
        modes.insert(1, "upstream")
    cache = ctx.dir("cold-cache")
    out["hook"] = C.run_worker("cold", {"mode": "hook", "batches": reqs, "think_s": think, "ops": ops,
                                        "cache_dir": cache, "max_s": max_s},
                               env={"TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-cold-hook")}, timeout=1800)
    cores = 1 if ctx.quick else (os.cpu_count() or 1)
    if cores > 1:
        # The same pair with the serving process's intra-op threads at cores - 1, leaving
        # the background compile a core (torch defaults to one thread per core, and an
        # OpenMP region then waits for the thread that shares its core with the compiler).
        t = cores - 1
        out[f"eager t={t}"] = C.run_worker("cold", {"mode": "eager", "batches": reqs * 5, "think_s": think,
                                                    "threads": t})
        out[f"hook t={t}"] = C.run_worker("cold", {"mode": "hook", "batches": reqs, "think_s": think, "ops": ops,
                                                   "cache_dir": ctx.dir("cold-cache-t"), "max_s": 900, "threads": t},
                                          env={"TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-cold-hook-t")},
                                          timeout=1800)
        modes += [f"eager t={t}", f"hook t={t}"]
    rows = [[m, out[m]["requests"], out[m]["lat_ms"]["p50"], out[m]["lat_ms"]["p99"], out[m]["lat_ms"]["max"],
             out[m].get("all_hit_after_s")] for m in modes]
    table(f"5. cold-start serving (MLP, empty cache; ms per request; {torch_threads()} intra-op threads unless t=)",
          ["mode", "requests", "p50", "p99", "max", "all hits after s"], rows)
    p99e, p99h = out["eager"]["lat_ms"]["p99"], out["hook"]["lat_ms"]["p99"]
    ratio = p99h / p99e if p99e else None
    ctx.target("cold", "hook p99 / eager p99", "<= 1.5x", ratio, None if ratio is None else ratio <= 1.5)
    if cores > 1:
        t = cores - 1
        e, h = out[f"eager t={t}"]["lat_ms"]["p99"], out[f"hook t={t}"]["lat_ms"]["p99"]
        r = h / e if e else None
        ctx.target("cold", f"hook p99 / eager p99, {t} intra-op thread(s)", "<= 1.5x", r, None if r is None else r <= 1.5)
    return out


def torch_threads() -> int:
    import torch
    return torch.get_num_threads()


# --- 6. start-up --------------------------------------------------------------------------

def bench_startup(ctx: Ctx) -> dict:
    sizes = [100, 300] if ctx.quick else [1000, 10000]
    kernel = ctx.any_kernel()
    rows, res = [], {}
    cache = ctx.dir("startup-cache")
    have = 0
    for n in sizes:
        t0 = time.perf_counter()
        sigs = C.fake_cache(cache, kernel, n - have, start=have + 1)
        have = n
        build = time.perf_counter() - t0
        ind = ctx.dir(f"inductor-startup-{n}")
        from aoti_farm.cache.store import Cache
        from aoti_farm.fingerprint import fingerprint
        c, fp = Cache(cache, signing_key=None), fingerprint("cpu")
        all_sigs = [C.add_sig(k) for k in range(1, n + 1)]
        del sigs
        C.upstream_in_place(ind, [(s, str(c.entry_dir(fp.id, s.key) / "kernel.so")) for s in all_sigs])
        via = "upstream JSON pointing at the aoti-farm entries (no copies)"
        probe = None  # fake entries must never be called: no first call
        r = {"build_s": build, "upstream_layout_via": via}
        for mode in ("hook", "upstream"):
            try:
                r[mode] = C.run_worker("startup", {"mode": mode, "cache_dir": cache, "probe": probe},
                                       env=upstream_env(ind) if mode == "upstream" else None, timeout=1800)
            except C.WorkerError as e:
                r[mode] = {"error": str(e)[-1500:]}
            rows.append([n, mode, (r[mode].get("install_s") or float("nan")) * 1e3, r[mode].get("rss_delta_mib"),
                         r[mode].get("peak_delta_mib")])
        res[str(n)] = r
    table("6. start-up (install over N cached entries)", ["entries", "who", "ms", "RSS delta MiB", "peak delta MiB"], rows)
    big = res[str(sizes[-1])]["hook"]
    if "install_s" in big:
        ms = big["install_s"] * 1e3
        mem = max(big.get("rss_delta_mib") or 0, big.get("peak_delta_mib") or 0)
        ctx.target("startup", f"hook install at {sizes[-1]} entries", "<= 100 ms", ms, ms <= 100)
        ctx.target("startup", f"hook memory at {sizes[-1]} entries", "<= 50 MB", mem, mem <= 50)
    else:
        ctx.target("startup", f"hook install at {sizes[-1]} entries", "<= 100 ms / 50 MB",
                   err_line([res[str(sizes[-1])]], "hook") or "error", None)
    return res


# --- 7. miss to hit -----------------------------------------------------------------------

def miss2hit_farm_serving(ctx: Ctx, spec: dict) -> dict:
    """`aoti-farm serve` (one CPU actor, embedded Ray) on a fresh cache, primed with one
    other signature so its actor is warm; then a fresh serving process with on_miss=queue
    misses ``spec`` at once after install."""
    from aoti_farm.cache import queue as missq
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    cache_dir = ctx.dir("m2h-cache-serve")
    env = C.bench_env({"TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-m2h-serve"), "RAY_TMPDIR": ray_tmpdir(ctx, "raytmp-m2h")})
    proc = subprocess.Popen([C.PY, "-m", "aoti_farm", "serve", "--cache-dir", cache_dir, "--cpu-workers", "1",
                             "--poll-interval", "0.1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(ctx.work / "m2h-serve.log", "w"))
    try:
        cache, fp = Cache(cache_dir, signing_key=None), fingerprint("cpu")
        cache.ensure(fp)
        prime = C.sig_from_spec({"op": "aten::add.Tensor", "shapes": [[8, 8], [8, 8]]})
        missq.enqueue(cache, fp.id, prime)
        t0 = time.monotonic()
        while not cache.has_entry(fp.id, prime.key):
            if proc.poll() is not None or time.monotonic() - t0 > 600:
                return {"error": f"aoti-farm serve did not compile the priming signature (rc={proc.poll()})"}
            time.sleep(0.1)
        r = C.run_worker("miss_to_hit", {"spec": spec, "cache_dir": cache_dir, "on_miss": "queue"},
                         env={"TORCHINDUCTOR_CACHE_DIR": ctx.dir("inductor-m2h-serve-client")}, timeout=900)
        r["serve_primed_after_s"] = time.monotonic() - t0
        return r
    except C.WorkerError as e:
        return {"error": str(e)[-1500:]}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench_miss2hit(ctx: Ctx) -> dict:
    # quick: the "worker ready" variant only (one real compile), nothing upstream
    spec = {"op": "aten::add.Tensor", "shapes": [[32, 48], [32, 48]]}
    out, rows = {}, []
    # "install -> miss at once": the miss comes while the compile worker the hook starts at
    # install is still importing torch.  "worker ready": the usual case in a serving process,
    # whose first miss comes after start-up (the hook's worker is started at install).
    for variant, warm in ((("worker ready", True),) if ctx.quick else (("miss at once", False), ("worker ready", True))):
        r = C.run_worker("miss_to_hit", {"spec": spec, "cache_dir": ctx.dir(f"m2h-cache-{warm}"), "warm_worker": warm},
                         env={"TORCHINDUCTOR_CACHE_DIR": ctx.dir(f"inductor-m2h-{warm}")}, timeout=900)
        ph = r.get("phases") or {}
        comp = sum(v for v in ph.values() if isinstance(v, (int, float))) or r.get("compile_seconds")
        r["compile_verify_s"] = comp
        m2h, pub = r.get("miss_to_hit_s"), r.get("published_after_s")
        rows.append([variant, m2h, comp, (m2h - comp) if m2h and comp else None, pub,
                     (pub - comp) if pub is not None and comp else None, (m2h - pub) if m2h and pub else None,
                     r.get("worker_ready_after_s")])
        out[variant] = r
    if ctx.quick:
        table("7. miss to hit (quick: add 32x48, worker ready; s)",
              ["variant", "miss -> first hit", "compile+verify", "overhead", "published after",
               "worker + queue + publish", "published -> hit", "worker ready after install"], rows)
        return out
    # the fleet set-up: a long-lived `aoti-farm serve` drains the miss queue (on_miss="queue"),
    # so a miss at once after the serving process starts needs no compile worker start-up
    r = miss2hit_farm_serving(ctx, spec)
    if "miss_to_hit_s" in r:
        ph = r.get("phases") or {}
        comp = sum(v for v in ph.values() if isinstance(v, (int, float))) or r.get("compile_seconds")
        r["compile_verify_s"] = comp
        m2h, pub = r.get("miss_to_hit_s"), r.get("published_after_s")
        rows.append(["miss at once, `aoti-farm serve` up (on_miss=queue)", m2h, comp,
                     (m2h - comp) if m2h and comp else None, pub,
                     (pub - comp) if pub is not None and comp else None, (m2h - pub) if m2h and pub else None, None])
    out["farm serving"] = r
    # what the same first miss costs with upstream's holder in a fresh process: it blocks
    # for the compile and everything a first compile pays once (Inductor's imports and ISA
    # checks on a cold Inductor cache)
    try:
        up = C.run_worker("upstream_first_call", {"spec": spec},
                          env=upstream_env(ctx.dir("inductor-m2h-upstream")), timeout=900)
    except C.WorkerError as e:
        up = {"error": str(e)[-1500:]}
    out["upstream first call"] = up
    rows.append(["upstream holder: first call blocks", up.get("first_call_s"), None, None, None, None, None, None])
    table("7. miss to hit (add 32x48; on_miss=compile unless said; s)",
          ["variant", "miss -> first hit", "compile+verify", "overhead", "published after",
           "worker + queue + publish", "published -> hit", "worker ready after install"], rows)
    for variant in ("miss at once", "worker ready", "farm serving"):
        r = out[variant]
        m2h, comp = r.get("miss_to_hit_s"), r.get("compile_verify_s")
        met = None if m2h is None or comp is None else m2h <= comp + 1.0
        ctx.target("miss2hit", f"miss -> hit ({variant})", "<= compile + 1 s",
                   None if met is None else f"{m2h:.2f} s (compile {comp:.2f} s)", met)
    m2h, blocked = out["miss at once"].get("miss_to_hit_s"), up.get("first_call_s")
    if m2h and blocked:
        ctx.target("miss2hit", "miss at once -> hit vs upstream's blocking first call", "(context)",
                   f"{m2h:.2f} s vs {blocked:.2f} s blocked", None)
    return out


def markdown(results: dict) -> str:
    """The README table: machine, date, mode, then target / measured / met per benchmark."""
    m = results["machine"]

    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else ("-" if v is None else str(v))
    lines = [f"Measured {m['date'][:10]} on {m['cpu_model']} ({m['cpu_count']} logical CPUs), {m['platform']}, "
             f"Python {m['python']}, torch {m['torch']}; {results['mode']} mode; baselines re-measured in the same run.",
             "", "| benchmark | what | target | measured | met? |", "|---|---|---|---|---|"]
    for t in results["summary"]:
        lines.append(f"| {t['bench']} | {t['what']} | {t['target']} | {fmt(t['measured'])} | "
                     f"{ {True: 'yes', False: '**no**', None: '?'}[t['met']] } |")
    return "\n".join(lines) + "\n"


def bench_payoff(ctx: Ctx) -> dict:
    """scripts/bench/payoff.py in its own process (it installs and removes the hook many
    times); quick: one op at a tiny size, no models (the code path, one compile)."""
    out_json = ctx.work / "payoff.json"
    cmd = [sys.executable, str(Path(__file__).with_name("payoff.py")), "--json", str(out_json),
           "--workdir", ctx.dir("payoff")]
    if ctx.quick:
        cmd += ["--quick", "--no-models", "--ops", "add, transposed input"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, env=C.bench_env())
    print(p.stdout, flush=True)
    if p.returncode != 0 or not out_json.exists():
        raise RuntimeError(f"payoff.py exited {p.returncode}: {p.stderr[-1500:]}")
    res = json.loads(out_json.read_text())
    for t in res["targets"]:
        ctx.target("payoff", t["target"], "see what", t["measured"], t["met"])
    return res


BENCHES = {"warm": bench_warm, "rerun": bench_rerun, "hit": bench_hit, "miss": bench_miss,
           "cold": bench_cold, "startup": bench_startup, "miss2hit": bench_miss2hit, "payoff": bench_payoff,
           "scaling": lambda ctx: __import__("scaling").bench_ctx(ctx)}   # scripts/bench/scaling.py


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny sizes, few iterations, skip compile-heavy benchmarks")
    C.add_output_args(ap, "bench-results")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(NAMES)}")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a fresh temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary scratch directory (caches, traces, reports)")
    ap.add_argument("--kernel-cache", default=None,
                    help="an aoti-farm cache that already holds real kernels to reuse (hit path, fake entries)")
    ap.add_argument("--hook-module", default=None,
                    help="module whose install(cache_dir=, ops=, on_miss=) is benchmarked (default aoti_farm.runtime); "
                         "for comparing hook implementations")
    ap.add_argument("--unique", type=int, default=0,
                    help="warm: compile only the first N unique signatures of the trace (default: all 64)")
    a = ap.parse_args(argv)
    only = [n.strip() for n in a.only.split(",") if n.strip()] or list(NAMES)
    bad = [n for n in only if n not in BENCHES]
    if bad:
        ap.error(f"unknown benchmark(s) {', '.join(bad)}; choose from {', '.join(NAMES)}")
    ctx = Ctx(a)
    if a.hook_module:
        os.environ["AOTI_BENCH_HOOK_MODULE"] = a.hook_module
    results = {"machine": C.machine(), "mode": "quick" if a.quick else "full", "workdir": str(ctx.work),
               "hook_module": a.hook_module or "aoti_farm.runtime",
               "benchmarks": {}}
    print(f"[bench] {results['machine']['cpu_model']} x{results['machine']['cpu_count']}, "
          f"{results['machine']['platform']}, torch {results['machine']['torch']}, {results['machine']['date']}",
          flush=True)
    if not a.hook_module and set(only) != {"scaling"}:
        # aoti-farm's hook runs with its native hit path, built here once (not timed)
        from aoti_farm.runtime import native
        t0 = time.perf_counter()
        results["native_library"] = str(native.build())
        print(f"[bench] native hit path: {results['native_library']} ({time.perf_counter() - t0:.1f} s)", flush=True)
    failed = 0
    for name in only:
        t0 = time.perf_counter()
        try:
            results["benchmarks"][name] = BENCHES[name](ctx)
        except Exception as e:  # noqa: BLE001 -- one broken benchmark must not hide the others
            failed += 1
            traceback.print_exc()
            results["benchmarks"][name] = {"error": f"{type(e).__name__}: {e}"[-3000:]}
            ctx.target(name, "ran", "no error", f"{type(e).__name__}", False)
        results["benchmarks"][name]["bench_wall_s"] = time.perf_counter() - t0
    results["summary"] = ctx.targets

    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else ("-" if v is None else str(v))
    table("summary", ["bench", "what", "target", "measured", "met?"],
          [[t["bench"], t["what"], t["target"], fmt(t["measured"]),
            {True: "yes", False: "NO", None: "?"}[t["met"]]] for t in ctx.targets])
    results["markdown"] = markdown(results)
    print(flush=True)
    if C.write_output(a, results) is None:
        print("[bench] nothing written: name --out DIR (or --json FILE) to keep the results", flush=True)
    else:
        C.write_output(a, results["markdown"], ".md")
    if not a.workdir and not a.keep:
        C.rmtree(ctx.work)   # full mode leaves GBs of fake entries otherwise
    else:
        print(f"[bench] scratch kept in {ctx.work}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
