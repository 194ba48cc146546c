"""Measurements that run in their own interpreter: ``python worker.py FUNC 'JSON-ARGS'``.

Each function prints one ``BENCH_JSON:`` line (see common.emit).  The parent
(scripts/bench/run.py) sets TORCHINDUCTOR_CACHE_DIR and friends through the environment.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

from common import emit, summary, time_per_call  # noqa: E402

torch.set_grad_enabled(False)


# --- helpers ------------------------------------------------------------------------------

def _cpu_s() -> dict:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"self": s.ru_utime + s.ru_stime, "children": c.ru_utime + c.ru_stime}


def _mem() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) / 1024.0  # MiB
    return out


def _sig(spec):
    """A signature from its to_obj() form, or from a short spec (common.sig_from_spec)."""
    if "args" in spec:
        from aoti_farm.signature import parse_signature
        return parse_signature(spec)
    from common import sig_from_spec
    return sig_from_spec(spec)


def _call_of(sig, seed=0):
    """(op, args, kwargs) for a signature, the way a user would call the op."""
    from aoti_farm import signature as S
    args, kwargs = S.materialize(sig, seed=seed)
    return S.resolve_op(sig.op), args, kwargs


def upstream_call_args(sig, seed=0):
    """(args, kwargs) as upstream's holder passes them to its compile: positional
    arguments in order, kwarg-only ones only when they differ from the default."""
    from aoti_farm import signature as S
    args, kwargs = S.materialize(sig, seed=seed)
    info = sig.info()
    kw = {}
    for name, default in zip(info.arg_names, info.defaults):
        if name in kwargs:
            v = kwargs[name]
            if v is None or (default is not S.NO_DEFAULT and v == default):
                continue
            kw[name] = v
    return args, kw


def _stat_sum(stats, word: str) -> int:
    """Total of integer counters whose name contains ``word`` (the hook's stats layout is
    its own; we only need hits and misses)."""
    tot = 0
    if isinstance(stats, dict):
        for k, v in stats.items():
            if isinstance(v, dict):
                tot += _stat_sum(v, word)
            elif isinstance(v, int) and not isinstance(v, bool) and word in str(k).lower():
                tot += v
    return tot


def _stats(hook) -> dict:
    try:
        s = hook.stats()
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}
    if hasattr(s, "to_dict"):
        s = s.to_dict()
    elif hasattr(s, "__dataclass_fields__"):
        import dataclasses
        s = dataclasses.asdict(s)
    return s if isinstance(s, dict) else {"repr": repr(s)}


def _hits(hook) -> int:
    s = _stats(hook)
    return s.get("hits", _stat_sum(s, "hit")) if isinstance(s.get("hits"), int) else _stat_sum(s, "hit")


def _close(got, expected) -> bool:
    """Tolerance check that calls no aten::add/mul on CPU (allclose does, and a holder
    registered for add.Tensor would then compile -- and upstream's crashes on the wrapped
    scalar it gets).  The ops under test are never sub/abs/amax."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if torch.equal(got, expected):
        return True
    d = torch.sub(got.double(), expected.double()).abs().amax().item()
    scale = expected.double().abs().amax().item()
    return d <= 1e-5 + 1e-4 * scale


def _uninstall(hook) -> None:
    try:
        hook.uninstall(stop_worker=True)   # leave no background compiler behind
    except TypeError:
        hook.uninstall()


def _install(cache_dir, ops, on_miss, native="require", **kw):
    """The hook under test.  aoti-farm's own runs with its native hit path required (built
    before the benchmarks start; ``native="off"`` is the pure-Python path); ``kw``: more
    of aoti-farm's install options.  ``serve="always"`` unless ``kw`` says otherwise: these
    benchmarks time the hit path itself (under the default ``"faster"`` a kernel the gate
    declines would be timed as eager); whether a kernel is worth serving is payoff.py's."""
    import importlib
    name = os.environ.get("AOTI_BENCH_HOOK_MODULE") or "aoti_farm.runtime"
    rt = importlib.import_module(name)
    if name == "aoti_farm.runtime":
        kw.setdefault("serve", "always")
        return rt.install(cache_dir=cache_dir, ops=ops, on_miss=on_miss, settings=rt.Settings(native=native), **kw)
    return rt.install(cache_dir=cache_dir, ops=ops, on_miss=on_miss)


# --- hit / miss path (benchmarks 3 and 4) -------------------------------------------------

def hit(mode: str, spec: dict, iters: dict, cache_dir: str | None = None, breakdown: bool = False) -> None:
    """Per-call time of one signature: mode eager | upstream | hook | hook-py (the pure-Python
    path) | hook-miss-<on_miss>."""
    sig = _sig(spec)
    op, args, kwargs = _call_of(sig)
    expected = op(*args, **kwargs)
    from aoti_farm.signature import describe
    out = {"mode": mode, "sig": describe(sig)}
    if mode == "upstream":
        lib = torch.library.Library("aten", "IMPL")
        t0 = time.perf_counter()
        lib._impl_with_aoti_compile(sig.op.split("::")[-1], "CPU")
        out["register_s"] = time.perf_counter() - t0
    elif mode.startswith("hook"):
        on_miss = "ignore" if mode in ("hook", "hook-py") else mode.split("-")[-1]
        t0 = time.perf_counter()
        hook = _install(cache_dir, [sig.op], on_miss, native="off" if mode == "hook-py" else "require")
        out["install_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = op(*args, **kwargs)
    out["first_call_s"] = time.perf_counter() - t0
    out["matches_eager"] = _close(got, expected)
    out.update(time_per_call(lambda: op(*args, **kwargs), **iters))
    if mode.startswith("hook"):
        out["stats"] = _stats(hook)
        out["hits"] = _hits(hook)
        _uninstall(hook)
        if breakdown:
            out["breakdown"] = _hook_breakdown(sig, op, args, kwargs, cache_dir, iters)
            out["breakdown"]["hook_total_us"] = out["us_median"]
            out["breakdown"]["eager_same_process_us"] = time_per_call(lambda: op(*args, **kwargs), **iters)["us_median"]
    emit(out)


def hit_ab(spec: dict, iters: dict, cache_dir: str, rounds: int = 3) -> None:
    """Eager, upstream's holder and the hook, interleaved in ONE process for ``rounds``
    rounds (each registered, timed and removed in turn), so that the ratio is not the
    difference between two processes' memory layouts.  Needs TORCHINDUCTOR_CACHE_DIR
    pointing at upstream's layout of the same kernels."""
    sig = _sig(spec)
    op, args, kwargs = _call_of(sig)
    expected = op(*args, **kwargs)
    per = {"eager": [], "upstream": [], "hook": []}
    ok = {"upstream": True, "hook": True}
    f = lambda: op(*args, **kwargs)  # noqa: E731
    def upstream():
        lib = torch.library.Library("aten", "IMPL")
        lib._impl_with_aoti_compile(sig.op.split("::")[-1], "CPU")
        ok["upstream"] &= _close(f(), expected)
        per["upstream"].append(time_per_call(f, **iters)["us_median"])
        lib._destroy()

    def hook():
        h = _install(cache_dir, [sig.op], "ignore")
        ok["hook"] &= _close(f(), expected)
        per["hook"].append(time_per_call(f, **iters)["us_median"])
        hits = _hits(h)
        _uninstall(h)
        if not hits:
            ok["hook"] = False

    for k in range(rounds):
        per["eager"].append(time_per_call(f, **iters)["us_median"])
        # alternate which of the two goes first, so neither always inherits the other's state
        for run in ((upstream, hook) if k % 2 == 0 else (hook, upstream)):
            run()
    import statistics
    paired = [h / u for h, u in zip(per["hook"], per["upstream"])]
    emit({"sig": spec, "rounds": per, "us": {k: statistics.median(v) for k, v in per.items()},
          "hook_over_upstream_paired": paired, "hook_over_upstream_paired_median": statistics.median(paired),
          "matches_eager": ok})


def miss_ab(spec: dict, iters: dict, cache_dir: str, rounds: int = 3) -> None:
    """Eager and the hook on a miss (empty cache; on_miss ignore and queue), interleaved
    in one process for ``rounds`` rounds."""
    import statistics
    sig = _sig(spec)
    op, args, kwargs = _call_of(sig)
    expected = op(*args, **kwargs)
    f = lambda: op(*args, **kwargs)  # noqa: E731
    per = {"eager": [], "hook-miss-ignore": [], "hook-miss-queue": []}
    ok = True

    def eager():
        per["eager"].append(time_per_call(f, **iters)["us_median"])

    for k in range(rounds):
        hooks = []
        for mode in ("ignore", "queue"):
            def hook(mode=mode):
                nonlocal ok
                h = _install(os.path.join(cache_dir, f"{mode}-{k}"), [sig.op], mode)
                ok &= _close(f(), expected)
                per[f"hook-miss-{mode}"].append(time_per_call(f, **iters)["us_median"])
                _uninstall(h)
            hooks.append(hook)
        # eager first in even rounds, last in odd ones
        for run in ([eager] + hooks if k % 2 == 0 else hooks + [eager]):
            run()
    paired = {m: [h - e for h, e in zip(per[m], per["eager"])] for m in ("hook-miss-ignore", "hook-miss-queue")}
    emit({"rounds": per, "us": {m: statistics.median(v) for m, v in per.items()},
          "over_eager_paired_us": paired,
          "over_eager_paired_median_us": {m: statistics.median(v) for m, v in paired.items()}, "matches_eager": ok})


def _hook_breakdown(sig, op, args, kwargs, cache_dir, iters) -> dict:
    """Where a hit's time goes, measured piece by piece with the project's own functions:
    key building (op_info + encode_call), the in-memory lookup, building the runner's
    input list, the runner call itself, and a do-nothing Python kernel registered through
    torch.library (the dispatcher -> Python round trip every Python hook pays)."""
    from aoti_farm import signature as S
    from aoti_farm.compile.runner import flat_tensors
    from aoti_farm.compile.compiler import load_runner
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    r = {}
    info = S.op_info(op)
    r["key_build_us"] = time_per_call(lambda: S.encode_call(info, args, kwargs), **iters)["us_median"]
    # a lower bound for any Python key: the raw metadata of the tensor arguments
    tens = [a for a in args if isinstance(a, torch.Tensor)]
    r["minimal_tensor_key_us (lower bound)"] = time_per_call(
        lambda: tuple((t.dtype, t.shape, t.stride()) for t in tens), **iters)["us_median"]
    enc = S.encode_call(info, args, kwargs)
    table = {enc: object()}
    for k in range(1000):  # a realistically sized table
        table[(k,)] = k
    r["dict_lookup_us"] = time_per_call(lambda: table.get(enc), **iters)["us_median"]
    r["flat_tensors_us"] = time_per_call(lambda: flat_tensors(sig, args, kwargs), **iters)["us_median"]
    cache = Cache(cache_dir, signing_key=None)
    entry = cache.open_entry(fingerprint("cpu"), sig.key, check_hashes=False)
    runner = load_runner(entry.kernel_path, "cpu")
    ins = flat_tensors(sig, args, kwargs)
    r["runner_run_us"] = time_per_call(lambda: runner.run(ins), **iters)["us_median"]
    # the Python dispatch round trip: a fresh op whose CPU kernel is a Python function
    lib = torch.library.Library("aotibench", "DEF")
    lib.define("noop(Tensor a) -> Tensor")
    lib.impl("noop", lambda a: a, "CPU")
    noop = torch.ops.aotibench.noop.default
    a0 = ins[0]
    r["python_dispatch_roundtrip_us"] = time_per_call(lambda: noop(a0), **iters)["us_median"]
    r["aten_alias_us"] = time_per_call(lambda: torch.ops.aten.alias.default(a0), **iters)["us_median"]
    # the native path without the kernel: the same call remembered as a miss (boxed
    # dispatch into our C++ kernel + fast key + lookup + the original kernel), vs eager
    import tempfile
    with tempfile.TemporaryDirectory() as empty:
        hook = _install(empty, [sig.op], "ignore")
        op(*args, **kwargs)
        r["native_remembered_miss_us"] = time_per_call(lambda: op(*args, **kwargs), **iters)["us_median"]
        _uninstall(hook)
    r["eager_us"] = time_per_call(lambda: op(*args, **kwargs), **iters)["us_median"]
    r["native_key_lookup_dispatch_us (miss - eager)"] = r["native_remembered_miss_us"] - r["eager_us"]
    return r


# --- start-up (benchmark 6) ---------------------------------------------------------------

def startup(mode: str, cache_dir: str | None = None, op: str = "aten::add.Tensor",
            probe: dict | None = None) -> None:
    """Install the hook (mode=hook) or register upstream's holder (mode=upstream; the
    environment points TORCHINDUCTOR_CACHE_DIR at the exported layout); time + memory."""
    import gc
    if mode == "hook":  # import cost is not start-up over the cache
        import importlib
        mod = os.environ.get("AOTI_BENCH_HOOK_MODULE") or "aoti_farm.runtime"
        importlib.import_module(mod)
        try:
            importlib.import_module(mod + ".hook")
        except ImportError:
            pass
    else:  # the same courtesy for upstream: the modules its loader imports
        import torch._inductor.aoti_eager  # noqa: F401
        import torch._inductor.codecache  # noqa: F401
    gc.collect()
    m0 = _mem()
    t0 = time.perf_counter()
    if mode == "hook":
        hook = _install(cache_dir, [op], "ignore")
    else:
        lib = torch.library.Library("aten", "IMPL")
        lib._impl_with_aoti_compile(op.split("::")[-1], "CPU")
    t1 = time.perf_counter()
    m1 = _mem()
    out = {"mode": mode, "install_s": t1 - t0, "rss_before_mib": m0.get("VmRSS"),
           "rss_delta_mib": m1.get("VmRSS", 0) - m0.get("VmRSS", 0),
           "peak_delta_mib": m1.get("VmHWM", 0) - m0.get("VmHWM", 0)}
    if probe:  # first call of one cached signature (lazy loading shows up here)
        sig = _sig(probe)
        pop, args, kwargs = _call_of(sig)
        t0 = time.perf_counter()
        pop(*args, **kwargs)
        out["first_call_s"] = time.perf_counter() - t0
        m2 = _mem()
        out["rss_delta_after_first_call_mib"] = m2.get("VmRSS", 0) - m0.get("VmRSS", 0)
        out["peak_delta_after_first_call_mib"] = m2.get("VmHWM", 0) - m0.get("VmHWM", 0)
    if mode == "hook":
        out["stats"] = _stats(hook)
    emit(out)


# --- compiles (benchmark 1) ---------------------------------------------------------------

def upstream_seq(trace: str) -> None:
    """Compile every signature of a trace, one after another, with upstream's
    aoti_compile_with_persistent_cache in this (warm) process."""
    from torch._inductor.aoti_eager import aoti_compile_with_persistent_cache
    from aoti_farm import signature as S
    from aoti_farm.trace import load_trace

    t_start = time.perf_counter()
    c_start = _cpu_s()
    per = []
    for e in load_trace(trace):
        sig = e.sig
        args, kwargs = upstream_call_args(sig)
        opo = S.resolve_op(sig.op)
        name = sig.op.split("::")[-1]
        c0, t0 = _cpu_s(), time.perf_counter()
        path = aoti_compile_with_persistent_cache("aten", name, "cpu", False, opo, args, kwargs)
        t1, c1 = time.perf_counter(), _cpu_s()
        per.append({"key": sig.key, "op": sig.op, "ok": bool(path), "seconds": t1 - t0,
                    "cpu_s": (c1["self"] - c0["self"]) + (c1["children"] - c0["children"]),
                    "cpu_children_s": c1["children"] - c0["children"]})
    c_end = _cpu_s()
    emit({"per_sig": per, "loop_s": time.perf_counter() - t_start,
          "cpu_total_s": c_end["self"] + c_end["children"],
          "cpu_loop_s": (c_end["self"] - c_start["self"]) + (c_end["children"] - c_start["children"])})


def profile_compile(trace: str, warmup_index: int = 0, index: int = 1, top: int = 40) -> None:
    """Where one compile's time goes: AOTICompiler phases, C++ compiler CPU (children
    rusage) and a cProfile of the compile, after a warm-up compile in the same process."""
    import cProfile
    import pstats
    import tempfile
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.trace import load_trace

    tr = load_trace(trace)
    comp = AOTICompiler()
    wd = tempfile.mkdtemp(prefix="bench-prof-")
    t0 = time.perf_counter()
    comp.compile(tr[warmup_index].sig, os.path.join(wd, "w"))
    warm_s = time.perf_counter() - t0
    sig = tr[index].sig
    # log every subprocess the compile starts (the C++ compiler and linker calls)
    import subprocess as sp
    procs = []
    real = {n: getattr(sp, n) for n in ("run", "check_call", "check_output", "call")}

    def wrap(name):
        def f(*a, **k):
            cmd = a[0] if a else k.get("args")
            t = time.perf_counter()
            try:
                return real[name](*a, **k)
            finally:
                c = cmd if isinstance(cmd, str) else " ".join(map(str, cmd or []))
                procs.append({"via": name, "seconds": time.perf_counter() - t, "cmd": c[:600]})
        return f
    for n in real:
        setattr(sp, n, wrap(n))
    prof = cProfile.Profile()
    c0, t0 = _cpu_s(), time.perf_counter()
    prof.enable()
    res = comp.compile(sig, os.path.join(wd, "p"))
    prof.disable()
    wall, c1 = time.perf_counter() - t0, _cpu_s()
    for n, f in real.items():
        setattr(sp, n, f)
    st = pstats.Stats(prof)
    rows = []
    for (fn, line, name), (cc, nc, tt, ct, callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"func": f"{os.path.relpath(fn, os.path.dirname(torch.__file__)) if 'torch' in fn else os.path.basename(fn)}:{line}({name})",
                     "cum_s": ct, "self_s": tt, "calls": nc})
    rows.sort(key=lambda r: -r["cum_s"])
    # named buckets, by substring of the profiled function (cumulative; buckets nest)
    buckets = {
        "torch.export.export": "export/_trace.py",
        "inductor compile_fx (whole)": "compile_fx.py",
        "graph lowering (GraphLowering.run)": "graph.py:(run)",
        "scheduler/codegen": "scheduler.py",
        "AotCodeCompiler.compile": "codecache.py",
        "C++ build (CppBuilder.build)": "cpp_builder.py",
        "subprocess wait (C++ compiler)": "subprocess.py",
        "verify (AOTICompiler.verify)": "compiler.py:(verify)",
    }
    named = {}
    for label, pat in buckets.items():
        path_pat, _, fname = pat.partition(":")
        best = 0.0
        for r in rows:
            if path_pat in r["func"] and (not fname or fname in r["func"]):
                best = max(best, r["cum_s"])
        named[label] = best
    emit({"sig": sig.op, "warmup_compile_s": warm_s, "wall_s": wall, "phases": res.phases,
          "compile_seconds": res.seconds, "build": res.build,
          "cpu_self_s": c1["self"] - c0["self"], "cpu_children_s (C++ compiler)": c1["children"] - c0["children"],
          "named_cumulative_s": named, "subprocesses": procs, "top": rows[:top]})


# --- cold-start serving (benchmark 5) -----------------------------------------------------

def _mlp(d=64, h=128):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d), torch.nn.ReLU()).eval()


def cold(mode: str, batches: list, think_s: float, cache_dir: str | None = None, ops: list | None = None,
         until_hit_plus: int = 30, max_s: float = 300.0, threads: int | None = None) -> None:
    """A request loop over a small MLP.  mode: eager | upstream | hook.  ``batches`` is the
    request stream (batch size per request); the hook keeps cycling it until every
    request is a hit, then ``until_hit_plus`` more requests.  ``threads``: torch's
    intra-op threads (default: torch's, one per core)."""
    if threads:
        torch.set_num_threads(threads)
    model = _mlp()
    xs = {b: torch.randn(b, 64) for b in set(batches)}
    for _ in range(3):  # warm torch's lazy initialisation, eagerly, before anything is registered
        for x in xs.values():
            model(x)
    hook = None
    if mode == "upstream":
        lib = torch.library.Library("aten", "IMPL")
        for op in ops:
            lib._impl_with_aoti_compile(op.split("::")[-1], "CPU")
    elif mode == "hook":
        hook = _install(cache_dir, ops, "compile")
    lat, hitflags, tstamps = [], [], []
    t_start = time.perf_counter()
    all_hit_at = None
    consecutive = 0
    i = 0
    while True:
        b = batches[i % len(batches)]
        h0 = _hits(hook) if hook else 0
        t0 = time.perf_counter()
        model(xs[b])
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        tstamps.append(t1 - t_start)
        if hook:
            m = _stat_sum(_stats(hook), "miss")
            hitflags.append((_hits(hook) - h0, m))
        i += 1
        if mode != "hook":
            if i >= len(batches):
                break
        else:
            misses_now = hitflags[-1][1]
            prev_m = hitflags[-2][1] if len(hitflags) > 1 else 0
            if misses_now == prev_m and hitflags[-1][0] > 0:
                consecutive += 1
                if consecutive == 1:
                    all_hit_at = tstamps[-2] if len(tstamps) > 1 else 0.0
            else:
                consecutive = 0
                all_hit_at = None
            if consecutive >= until_hit_plus or t1 - t_start > max_s:
                break
        time.sleep(think_s)
    out = {"mode": mode, "threads": torch.get_num_threads(), "requests": len(lat), "lat_ms": summary([x * 1e3 for x in lat]),
           "wall_s": time.perf_counter() - t_start}
    if mode == "upstream":
        # every first occurrence of a shape blocks on compiles; later ones hit by design
        firsts = {}
        for k, b in enumerate(batches):
            firsts.setdefault(b, k)
        out["all_hit_after_s"] = tstamps[max(firsts.values())]
    if hook:
        out["all_hit_after_s"] = all_hit_at
        out["reached_all_hit"] = consecutive >= until_hit_plus
        out["stats"] = _stats(hook)
        _uninstall(hook)
    emit(out)


# --- miss to hit (benchmark 7) ------------------------------------------------------------

def miss_to_hit(spec: dict, cache_dir: str, poll_s: float = 0.005, max_s: float = 300.0,
                warm_worker: bool = False, on_miss: str = "compile") -> None:
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    sig = _sig(spec)
    op, args, kwargs = _call_of(sig)
    t_install = time.perf_counter()
    hook = _install(cache_dir, [sig.op], on_miss)
    ready = None
    if warm_worker:
        # wait until the worker the hook started at install says it is up (its first log line)
        log_path = getattr(hook, "worker_log", None)
        while log_path and time.perf_counter() - t_install < 120:
            try:
                if '"event": "ready"' in open(log_path).read():
                    ready = time.perf_counter() - t_install
                    break
            except OSError:
                pass
            time.sleep(0.01)
    t0, w0 = time.perf_counter(), time.time()
    op(*args, **kwargs)
    first = time.perf_counter() - t0
    h = None
    while time.perf_counter() - t0 < max_s:
        h0 = _hits(hook)
        op(*args, **kwargs)
        if _hits(hook) > h0:
            h = time.perf_counter() - t0
            break
        time.sleep(poll_s)
    out = {"first_call_s": first, "miss_to_hit_s": h, "stats": _stats(hook), "worker_ready_after_s": ready}
    try:
        m = Cache(cache_dir, signing_key=None).open_entry(fingerprint("cpu"), sig.key, check_hashes=False).manifest
        out["compile_seconds"] = m.get("compile_seconds")
        out["phases"] = m.get("phases")
        out["published_after_s"] = m.get("created", 0) - w0
    except Exception as e:  # noqa: BLE001
        out["entry_error"] = repr(e)
    _uninstall(hook)
    emit(out)



def upstream_first_call(spec: dict) -> None:
    """Upstream's holder in a fresh process (as the hook's miss_to_hit run is): its first
    call of a signature blocks on the compile, one-time costs included; then a hit."""
    sig = _sig(spec)
    op, args, kwargs = _call_of(sig)
    lib = torch.library.Library("aten", "IMPL")
    lib._impl_with_aoti_compile(sig.op.split("::")[-1], "CPU")
    t0 = time.perf_counter()
    op(*args, **kwargs)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    op(*args, **kwargs)
    emit({"first_call_s": first, "second_call_s": time.perf_counter() - t1})


# --- traces -------------------------------------------------------------------------------

def record_trace(path: str, batches: list) -> None:
    """Record the MLP of the cold-start benchmark at several batch sizes.  Uses
    aoti_farm.record when the recorder exists, else a TorchDispatchMode stand-in that
    goes through the same signature normalisation."""
    model = _mlp()
    xs = [torch.randn(b, 64) for b in batches]   # made outside the recording
    via = "aoti_farm.record"
    try:
        import aoti_farm
        from aoti_farm.runtime import recorder  # noqa: F401
        with aoti_farm.record(path):
            for x in xs:
                model(x)
    except ImportError:
        from torch.utils._python_dispatch import TorchDispatchMode
        from aoti_farm import signature as S
        from aoti_farm.errors import Ineligible
        from common import write_trace

        seen = {}

        class Rec(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                try:
                    s = S.from_call(func, args, kwargs)
                    seen.setdefault(s.key, s)
                except (Ineligible, Exception):  # noqa: BLE001
                    pass
                return func(*args, **kwargs)

        with Rec():
            for x in xs:
                model(x)
        write_trace(path, list(seen.values()))
        via = "TorchDispatchMode fallback (aoti_farm.runtime.recorder not importable)"
    from aoti_farm.trace import load_trace
    emit({"via": via, "entries": len(load_trace(path))})


def verify_checks(spec: str) -> None:
    """Each kernel of the ``spec`` file verified (``AOTICompiler.verify``) ``repeats`` times
    after one warm-up: the median wall and CPU (this process's, all its threads) of one
    verification, in ms (scripts/bench/ompwait.py)."""
    import statistics
    from pathlib import Path

    from aoti_farm import signature as S
    from aoti_farm.compile.compiler import AOTICompiler

    spec = json.loads(Path(spec).read_text())
    verifier = AOTICompiler({}, measure_speed=False, builds=False)
    out = {}
    for name, k in spec["kernels"].items():
        sig = S.parse_signature(k["sig"])
        verifier.verify(sig, k["path"])
        walls, cpus = [], []
        for _ in range(spec["repeats"]):
            c0, t0 = _cpu_s()["self"], time.perf_counter()
            verifier.verify(sig, k["path"])
            walls.append(time.perf_counter() - t0)
            cpus.append(_cpu_s()["self"] - c0)
        out[name] = {"wall_ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus)}
    emit({"kernels": out, "policy": os.environ.get("OMP_WAIT_POLICY", "default")})


def cli_warm(argv: list) -> None:
    """Run the aoti-farm CLI in this process and tell whether it touched Ray."""
    from aoti_farm.cli import main
    rc = main(argv)
    ray_init = False
    if "ray" in sys.modules:
        try:
            ray_init = bool(sys.modules["ray"].is_initialized())
        except Exception:  # noqa: BLE001
            pass
    emit({"rc": rc, "ray_imported": "ray" in sys.modules, "ray_initialized": ray_init})


if __name__ == "__main__":
    fn = globals()[sys.argv[1]]
    fn(**json.loads(sys.argv[2]))
