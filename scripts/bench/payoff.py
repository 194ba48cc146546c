#!/usr/bin/env python
"""Serving payoff: is a hooked program at least as fast as eager, and faster where
Inductor's kernel is better?

    python scripts/bench/payoff.py [--device cpu|cuda] [--quick] [--json out.json]
    python scripts/bench/run.py --only payoff          # the same, inside the bench runner

What it measures, in ONE process, eager and hooked interleaved:

* a per-op suite (pointwise, reductions, norms, softmax, pooling, upsampling, scans, ops
  on non-contiguous inputs) at compute-bound sizes;
* whole-model latency: a small transformer (transformers' ``BertModel`` from a
  ``BertConfig``, random weights, no hub; skipped when transformers is missing), a small
  conv/vision block, and a block made of ops where Inductor's kernel beats eager's.

How:

1. Every served signature is recorded (the recorder uses the hook's own encoding), then
   compiled through the real compile path (``job.compile_and_publish``: compile, verify
   against eager, time against eager for the speed gate, publish) by ``--jobs`` spawned
   processes.  ``--caches own`` (the default) warms the op suite and each model into a
   cache of its own, as a team that warms its model does; ``--caches shared`` puts every
   item's entries into one cache, as a fleet cache warmed by many models.
2. Rounds: each round times every item eagerly (no hook installed) and hooked once per
   route (``--route``, default the hook's default with ``on_miss="ignore"``,
   ``servable-at-install``; ``--also-route`` adds more, same rounds;
   ``servable-at-install:first-call`` is that route without the install-time trials,
   ``install_trial=0``), the hook installed
   on the item's cache with ``on_miss="ignore"`` and ``--serve``; the phases' order
   alternates between rounds.  Hooked items are warmed up first, so the hook's on-host
   gate trials are done (``hook.gate.wait``) and, under ``route="servable"``, the routed
   ops re-computed (one poll) before timing.  An item's time in a phase is the median of
   :data:`BATCHES` batches of ``n`` calls (``n`` sized once so that a batch takes about
   ``--batch-ms``, 4x that for a model), CUDA synchronised around each batch, garbage
   collection held off during a batch.  Each round's ratios are logged as it ends.
   ``--pairs N`` repeats every item's phases N times back to back within a round (the
   order alternating each time), so a ratio pairs phases seconds apart: on a host whose
   speed drifts (docs/benchmarks.md, "Host noise") that is what resolves a model.
3. Per item and route: ``ratio`` = median over rounds of (hooked / eager) of that round,
   with the quartiles of those ratios; ``served``: the hook ran a kernel for it (its hits
   went up while timing); ``gated``: cached kernels that the speed gate declined (eager ran).

Targets: no served op slower than 1.05x eager; every model <= 1.0x eager; a
model rich in ops where Inductor wins <= 0.9x eager.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gc
import inspect
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:  # an installed aoti-farm (e.g. pip install --target) first, else this checkout
    import aoti_farm.runtime  # noqa: F401
except ImportError:
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OP_TARGET = 1.05
#: The hook's routes (``runtime/settings.py``); the first is its default with on_miss="ignore".
ROUTES = ("servable-at-install", "servable", "all", "servable-at-install:first-call")
#: A route's ``:first-call`` variant installs with ``install_trial=0``: no install-time
#: trials (runtime/pretrial.py), every kernel decided on its first call (the hook before them).
FIRST_CALL = ":first-call"
MODEL_TARGET = 1.0
WINS_TARGET = 0.9


# --- the per-op suite ------------------------------------------------------------------------

def _sizes(device: str, quick: bool) -> dict:
    if quick:
        return {"R": 64, "C": 128, "img": (2, 8, 16, 16), "groups": 4}
    if device == "cuda":
        return {"R": 8192, "C": 2048, "img": (32, 64, 128, 128), "groups": 8}
    return {"R": 1024, "C": 1024, "img": (8, 32, 64, 64), "groups": 8}


def op_suite(device: str, quick: bool) -> list[tuple[str, object]]:
    """[(name, fn)]: each fn() calls one served aten op on fixed inputs."""
    z = _sizes(device, quick)
    R, C, img = z["R"], z["C"], z["img"]
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)

    a, b = rnd(R, C), rnd(R, C)
    at = rnd(C, R).t()                       # (R, C), strides (1, R): not contiguous
    row = rnd(C)
    mask = rnd(R, C) > 0
    w, bias = rnd(C), rnd(C)
    x = rnd(*img)
    xcl = x.contiguous(memory_format=torch.channels_last)
    ycl = rnd(*img).contiguous(memory_format=torch.channels_last)
    ch = img[1]
    cw, cb, rm, rv = rnd(ch), rnd(ch), rnd(ch), rnd(ch).abs() + 0.5
    aten = torch.ops.aten
    return [
        ("add", lambda: a + b),
        ("add, transposed input", lambda: at + b),
        ("mul, broadcast row", lambda: a * row),
        ("sub, transposed input", lambda: at - row),
        ("gelu(tanh)", lambda: F.gelu(a, approximate="tanh")),
        ("silu", lambda: F.silu(a)),
        ("sigmoid", lambda: torch.sigmoid(a)),
        ("tanh", lambda: torch.tanh(a)),
        ("where", lambda: torch.where(mask, a, b)),
        ("clamp", lambda: torch.clamp(a, -0.5, 0.5)),
        ("sum(dim=-1)", lambda: a.sum(-1)),
        ("sum(dim=-1, float64)", lambda: a.sum(-1, dtype=torch.float64)),
        ("mean(dim=0)", lambda: a.mean(0)),
        ("amax(dim=-1)", lambda: a.amax(-1)),
        ("var_mean(dim=-1)", lambda: torch.var_mean(a, dim=-1)),
        ("vector norm(dim=-1)", lambda: torch.linalg.vector_norm(a, dim=-1)),
        ("layer_norm", lambda: F.layer_norm(a, (C,), w, bias)),
        ("softmax(dim=-1)", lambda: torch.softmax(a, -1)),
        ("log_softmax(dim=-1)", lambda: torch.log_softmax(a, -1)),
        ("cumsum(dim=-1)", lambda: torch.cumsum(a, -1)),
        ("avg_pool2d 3x3/2", lambda: F.avg_pool2d(x, 3, 2, 1)),
        ("max_pool2d 3x3/2", lambda: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])),
        ("upsample_bilinear2d x2", lambda: F.interpolate(x, scale_factor=2, mode="bilinear")),
        ("upsample_nearest2d x2", lambda: F.interpolate(x, scale_factor=2, mode="nearest")),
        ("group_norm", lambda: F.group_norm(x, z["groups"], cw, cb)),
        ("batch_norm (eval)", lambda: F.batch_norm(x, rm, rv, cw, cb, training=False)),
        ("add, channels_last", lambda: xcl + ycl),
    ]


# --- the models ---------------------------------------------------------------------------------

class ConvBlock(torch.nn.Module):
    """A small vision block: conv-bn-relu x2 with a residual, max-pool, upsample back."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)) + x)
        y = F.max_pool2d(y, 2)
        return F.interpolate(y, scale_factor=2, mode="bilinear")


class InductorWins(torch.nn.Module):
    """A block made mostly of ops where Inductor's kernel beats eager's (as
    measured: var_mean, sum in float64, adds of transposed inputs on CPU; bilinear
    upsampling, float64 sums, average pooling on the H100)."""

    def __init__(self, c: int):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(c))

    def forward(self, xt, img):
        y = xt + self.bias                                   # a transposed (non-contiguous) input
        v, m = torch.var_mean(y, dim=-1, keepdim=True)
        s = y.sum(-1, dtype=torch.float64) + v.squeeze(-1) + m.squeeze(-1)
        u = F.avg_pool2d(F.interpolate(img, scale_factor=2, mode="bilinear"), 3, 2, 1)
        return s, u


def models(device: str, quick: bool) -> tuple[list[tuple[str, object, bool]], str | None]:
    """[(name, fn, wins)] and why the transformer is missing (or None)."""
    z = _sizes(device, quick)
    g = torch.Generator().manual_seed(1)
    out = []
    skipped = None
    try:
        from transformers import BertConfig, BertModel
    except Exception as e:  # noqa: BLE001 -- a benchmark-only dependency
        skipped = f"transformers not importable ({type(e).__name__}); the BERT models are skipped"
    else:
        specs = [("tiny BERT (hidden 128, 2 layers, batch 2x32)", dict(hidden_size=128, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=512), (2, 32))]
        if device == "cuda" and not quick:
            specs.append(("mid BERT (hidden 512, 4 layers, batch 8x128)", dict(hidden_size=512, num_hidden_layers=4,
                          num_attention_heads=8, intermediate_size=2048), (8, 128)))
        for name, kw, (bs, seq) in specs:
            torch.manual_seed(2)
            cfg = BertConfig(vocab_size=1000, max_position_embeddings=256, **kw)
            m = BertModel(cfg).eval().to(device)
            ids = torch.randint(0, 1000, (bs, seq), generator=g).to(device)
            att = torch.ones(bs, seq, dtype=torch.long, device=device)
            out.append((name, (lambda m=m, ids=ids, att=att: m(input_ids=ids, attention_mask=att).last_hidden_state),
                        False))
    torch.manual_seed(3)
    n, c, h, w = (2, 8, 16, 16) if quick else ((16, 32, 64, 64) if device == "cuda" else (4, 32, 32, 32))
    conv = ConvBlock(c).eval().to(device)
    xi = torch.randn(n, c, h, w, generator=g).to(device)
    out.append((f"conv block ({n}x{c}x{h}x{w})", lambda: conv(xi), False))
    R, C = z["R"], z["C"]
    wins = InductorWins(C).eval().to(device)
    xt = torch.randn(C, R, generator=g).to(device).t()
    img = torch.randn(*z["img"], generator=g).to(device)
    out.append((f"Inductor-wins block ({R}x{C} transposed, image {'x'.join(map(str, z['img']))})",
                lambda: wins(xt, img), True))
    return out, skipped


# --- compile ------------------------------------------------------------------------------------

def _compile_shard(units: list[tuple[str, str, int]], device: str, threads: int | None = None) -> list[dict]:
    """Compile ``units`` (trace path, cache dir, entry index) through the real compile path,
    with ``threads`` intra-op threads (the compile-time timing's: shards that share the
    cores each get their part, as the farm's one-CPU actors do, so eager's parallel ops are
    not timed against each other's spin-waits)."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if threads:
        torch.set_num_threads(threads)
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish
    from aoti_farm.trace import load_trace

    comp, fp = AOTICompiler(), fingerprint(device)
    traces: dict[str, list] = {}
    out = []
    for trace_path, cache_dir, i in units:
        if trace_path not in traces:
            traces[trace_path] = list(load_trace(trace_path))
        e = traces[trace_path][i]
        t0 = time.perf_counter()
        try:
            o = compile_and_publish(Cache(cache_dir, signing_key=None), comp, fp, e.sig,
                                    owner="bench-payoff").to_dict()
        except Exception as ex:  # noqa: BLE001
            o = {"status": "error", "error": f"{type(ex).__name__}: {ex}"}
        o["op"], o["seconds"], o["cache"] = e.sig.op, round(time.perf_counter() - t0, 2), os.path.basename(cache_dir)
        out.append(o)
    return out


def record_and_compile(groups: dict[str, list], device: str, work: str, jobs: int, log) -> dict:
    """Record each group's served signatures into its own trace and compile them into the
    group's own cache (``work/cache-<group>``), every group's signatures in one pool."""
    from aoti_farm.runtime.recorder import Recorder
    from aoti_farm.trace import save_trace

    units, per_group, skipped = [], {}, {}
    for gid, items in groups.items():
        rec = Recorder(devices=(device,))
        try:
            with torch.no_grad():
                for _, fn in items:
                    fn()
        finally:
            rec.stop()
        trace = rec.trace()
        path = os.path.join(work, f"payoff-trace-{gid}.json")
        save_trace(trace, path)
        n = len(list(trace))
        per_group[gid] = n
        for k, v in dict(rec.skipped).items():
            skipped[k] = skipped.get(k, 0) + v
        units += [(path, cache_dir(work, gid), i) for i in range(n)]
    log(f"recorded {len(units)} signatures in {len(groups)} cache(s) {per_group}; compiling them with {jobs} process(es)")
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        futs = [ex.submit(_compile_shard, units[k::jobs], device, threads) for k in range(jobs) if units[k::jobs]]
        outs = [o for f in futs for o in f.result()]
    by = {}
    for o in outs:
        by[o["status"]] = by.get(o["status"], 0) + 1
    wall = time.perf_counter() - t0
    log(f"compiled in {wall:.0f} s: {by}")
    failed = [{"op": o["op"], "cache": o["cache"], "error": (o.get("error") or "")[:200]}
              for o in outs if o["status"] not in ("compiled", "cached")]
    return {"signatures": len(units), "per_cache": per_group, "statuses": by, "seconds": round(wall, 1),
            "not_published": failed, "recorder_skipped": skipped}


def cache_dir(work: str, gid: str) -> str:
    return os.path.join(work, f"cache-{gid}")


# --- timing -------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _batch(fn, n: int, device: str) -> float:
    """Microseconds per call over ``n`` back-to-back calls (garbage collection held off)."""
    gc.collect()
    gc.disable()
    try:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(device)
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        gc.enable()


def _calibrate(fn, device: str, batch_ms: float) -> int:
    for _ in range(3):
        fn()
    one = _batch(fn, 3, device)
    return max(3, min(20000, int(batch_ms * 1000 / max(one, 0.5))))


#: With route="servable" the hook re-computes its routed ops after each poll; the timing
#: waits for one poll after the gate's trials so that declined ops leave the hook.
ROUTE_POLL_S = 1.0


def _install(cache_dir: str, device: str, serve: str, route: str | None):
    from aoti_farm.runtime import Settings, install

    kw = {"route": route}
    trial = {}
    if route and route.endswith(FIRST_CALL):
        kw["route"] = route = route[:-len(FIRST_CALL)]
        trial["install_trial"] = 0
    if _hook_takes("serve"):
        kw["serve"] = serve
    poll = ROUTE_POLL_S if route == "servable" else 3600
    return install(cache_dir=cache_dir, devices=(device,), on_miss="ignore",
                   settings=Settings(poll_interval=poll, **trial), **kw)


def _hook_takes(name: str) -> bool:
    """Whether ``install`` takes ``name`` (itself, or passed on to ``Hook``)."""
    from aoti_farm.runtime import hook

    return any(name in inspect.signature(f).parameters for f in (hook.install, hook.Hook.__init__))


def _counts(st: dict) -> tuple[int, int]:
    return st.get("hits", 0), st.get("gated", 0)


#: Batches per item and phase; the phase's time is their median.
BATCHES = 5


def _quartiles(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [round(xs[0], 3)] * 2 if xs else []
    q = statistics.quantiles(xs, n=4)
    return [round(q[0], 3), round(q[2], 3)]


def _warm_calls(items) -> None:
    """Every phase's warm-up calls (the eager phase runs them too: both sides of a ratio
    start timing from the same state, e.g. a GPU that was just busy)."""
    for _ in range(3):
        for _, fn in items:
            for _ in range(5):
                fn()


def _warm_hook(hook, items, route) -> bool:
    """Warm-up: kernels loaded, the gate's on-host trials done, routes re-computed."""
    _warm_calls(items)
    settled = True
    gate = getattr(hook, "gate", None)  # trials may run in the background (Gate.wait: public)
    if gate is not None and hasattr(gate, "wait"):
        settled = gate.wait(600)
    if route == "servable":   # one poll: ops whose every entry was declined leave the hook
        time.sleep(3 * ROUTE_POLL_S)
    for _, fn in items:                # decisions remembered on the hit path
        for _ in range(3):
            fn()
    return settled


def measure(groups: dict[str, list], device: str, work: str, rounds: int, batch_ms: float, serve: str, log,
            model_names: frozenset = frozenset(), routes: tuple = ("servable-at-install",), pairs: int = 1,
            control: bool = False) -> dict:
    """Per item: eager and hooked per-call microseconds per round, and what the hook did.

    Each group is timed against its own cache (``cache_dir(work, group)``); every round
    times each group eager and once hooked per route in ``routes``, ``pairs`` times back to
    back, in an order that alternates every time (a ratio pairs the eager and hooked phases
    of one repetition: a host whose speed drifts over seconds moves both).  ``control``
    adds a second eager phase to every repetition: its ratio to the first (eager/eager,
    an A/A) is the run's own noise floor, beside each hook/eager ratio."""
    ns = {}
    with torch.no_grad():
        for items in groups.values():
            for name, fn in items:
                # a model's batch is longer (its calls vary more than one op's)
                ns[name] = _calibrate(fn, device, batch_ms * (4 if name in model_names else 1))
    hooks = [f"hook:{r}" for r in routes]
    phases = ["eager", *(["control"] if control else []), *hooks]
    res = {name: {"n": ns[name], **{ph: [] for ph in phases}, "hits": {}, "gated": {}}
           for items in groups.values() for name, _ in items}
    hook_info: dict = {}
    settled: list = []
    for r in range(rounds):
        for gid, items in groups.items():
            for rep in range(pairs):
                order = phases if (r * pairs + rep) % 2 == 0 else phases[::-1]
                for phase in order:
                    route = routes[hooks.index(phase)] if phase in hooks else None
                    hook = _install(cache_dir(work, gid), device, serve, route) if route else None
                    try:
                        with torch.no_grad():
                            if hook is not None:
                                settled.append(_warm_hook(hook, items, route))
                            else:
                                _warm_calls(items)
                                for _, fn in items:
                                    for _ in range(3):
                                        fn()
                            for name, fn in items:
                                before = _counts(hook.stats()) if hook is not None else None
                                t = statistics.median(_batch(fn, ns[name], device) for _ in range(BATCHES))
                                res[name][phase].append(t)
                                if hook is not None:
                                    h, gt = _counts(hook.stats())
                                    res[name]["hits"][phase] = max(res[name]["hits"].get(phase, 0), h - before[0])
                                    res[name]["gated"][phase] = max(res[name]["gated"].get(phase, 0), gt - before[1])
                        if hook is not None:
                            st = hook.stats()
                            info = {k: st.get(k) for k in ("serve", "gate_trials", "gated_signatures", "gate_errors",
                                                           "kernels_loaded", "kernel_errors", "load_errors", "serving")}
                            info["native"] = st.get("native")
                            info["install_trial"] = st.get("install_trial")
                            ops = sorted(hook.ops) if hasattr(hook, "ops") else None
                            info["routed_ops"] = ops if ops is None or len(ops) <= 40 else f"{len(ops)} ops"
                            hook_info.setdefault(phase, {})[gid] = info
                    finally:
                        if hook is not None:
                            hook.uninstall()
        done = "; ".join(f"{name[:24]} " + "/".join(f"{res[name][ph][-1] / res[name]['eager'][-1]:.3f}" for ph in phases[1:])
                         for name in res if res[name]["eager"] and all(res[name][ph] for ph in phases[1:]))
        log(f"round {r + 1}/{rounds} done; hook/eager ({', '.join(p[5:] if p in hooks else 'A/A' for p in phases[1:])}): {done}")
    out = {}
    for name, d in res.items():
        variants = {}
        for phase in hooks:
            ratios = [h / e for h, e in zip(d[phase], d["eager"])]
            variants[phase[5:]] = {
                "hook_us": round(statistics.median(d[phase]), 2), "ratio": round(statistics.median(ratios), 3),
                "ratio_iqr": _quartiles(ratios), "ratios": [round(x, 3) for x in ratios],
                "hook_us_rounds": [round(x, 2) for x in d[phase]],
                "served": d["hits"].get(phase, 0) > 0, "gated": d["gated"].get(phase, 0) > 0}
        first = variants[hooks[0][5:]]
        if control:
            aa = [c / e for c, e in zip(d["control"], d["eager"])]
            first = {**first, "control_ratio": round(statistics.median(aa), 3), "control_iqr": _quartiles(aa),
                     "control_ratios": [round(x, 3) for x in aa]}
        out[name] = {"eager_us": round(statistics.median(d["eager"]), 2),
                     "eager_us_rounds": [round(x, 2) for x in d["eager"]], "calls_per_batch": d["n"],
                     **{k: first[k] for k in ("hook_us", "ratio", "ratio_iqr", "ratios", "hook_us_rounds",
                                              "served", "gated", "control_ratio", "control_iqr", "control_ratios")
                        if k in first},
                     "variants": variants}
    primary = hooks[0]
    info = {"route": routes[0], "gate_settled_before_timing": settled,
            "per_cache": hook_info.get(primary, {}), "other_routes": {p[5:]: hook_info.get(p, {}) for p in hooks[1:]}}
    # the older flat summary (the bench runner and the smoke test read these)
    firstc = next(iter(hook_info.get(primary, {}).values()), {})
    for k in ("serve", "gate_trials", "gated_signatures", "gate_errors", "kernels_loaded", "kernel_errors",
              "load_errors", "serving"):
        info[k] = sum(c.get(k) or 0 for c in hook_info.get(primary, {}).values()) if k not in ("serve", "serving") \
            else firstc.get(k)
    return {"items": out, "hook": info}


def _gate_status() -> dict:
    try:
        from aoti_farm.runtime import gate

        return {"present": True, "GATE_RATIO": getattr(gate, "GATE_RATIO", None),
                "install_takes_serve": _hook_takes("serve")}
    except Exception as e:  # noqa: BLE001
        return {"present": False, "why": f"{type(e).__name__}: {e}"}


def run(device: str = "cpu", quick: bool = False, workdir: str | None = None, jobs: int | None = None,
        rounds: int | None = None, batch_ms: float | None = None, serve: str = "faster", with_models: bool = True,
        only_ops: list[str] | None = None, log=print, route: str = "servable-at-install", caches: str = "own",
        also_routes: tuple = (), pairs: int = 1, control: bool = False) -> dict:
    """``caches="own"``: the op suite and each model are warmed into a cache of their own
    and timed against it (a team that warms its model; the default); ``"shared"``: one
    cache holds every item's entries (a fleet cache warmed by many models).  ``route`` is
    the hook's route for the targets; ``also_routes`` are timed beside it, same rounds."""
    from aoti_farm.runtime import native

    work = workdir or tempfile.mkdtemp(prefix="aoti-payoff-")
    os.makedirs(work, exist_ok=True)
    rounds = rounds or (1 if quick else 7)
    batch_ms = batch_ms or (2.0 if quick else 30.0)
    jobs = jobs or (1 if quick else max(1, min(8, (os.cpu_count() or 2))))
    ops = op_suite(device, quick)
    if only_ops:
        unknown = set(only_ops) - {n for n, _ in ops}
        if unknown:
            raise ValueError(f"unknown op(s) {sorted(unknown)}; choose from {[n for n, _ in ops]}")
        ops = [(n, f) for n, f in ops if n in only_ops]
    mods, skipped = models(device, quick) if with_models else ([], "--no-models")
    wins = {n for n, _, w in mods if w}
    if caches == "own":
        groups = {"ops": list(ops)} if ops else {}
        groups.update({f"model{i + 1}": [(n, f)] for i, (n, f, _) in enumerate(mods)})
    elif caches == "shared":
        groups = {"shared": [(n, f) for n, f in ops] + [(n, f) for n, f, _ in mods]}
    else:
        raise ValueError(f"caches: {caches!r} is not 'own' or 'shared'")
    comp = record_and_compile(groups, device, work, jobs, log)
    if not native.disabled():
        try:
            native.build()  # the hook's production path (waits for a build under way elsewhere)
        except Exception as e:  # noqa: BLE001 -- measured on the Python path then (reported)
            log(f"native build failed: {e}")
    routes = tuple(dict.fromkeys((route, *also_routes)))
    m = measure(groups, device, work, rounds, batch_ms, serve, log, frozenset(n for n, _, _ in mods), routes, pairs,
                control)
    opnames = [n for n, _ in ops]
    served = [n for n in opnames if m["items"][n]["served"]]
    worst = max((m["items"][n]["ratio"] for n in served), default=None)
    targets = [{"target": f"no served op slower than {OP_TARGET}x eager", "measured": worst,
                "met": worst is None or worst <= OP_TARGET}]
    for n, _, w in mods:
        lim = WINS_TARGET if w else MODEL_TARGET
        targets.append({"target": f"{n} <= {lim}x eager", "measured": m["items"][n]["ratio"],
                        "met": m["items"][n]["ratio"] <= lim})
    return {"device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "threads": torch.get_num_threads(), "quick": quick, "rounds": rounds, "batch_ms": batch_ms,
            "batches": BATCHES, "pairs": pairs, "control": control, "serve": serve, "route": route,
            "routes": list(routes), "caches": caches, "groups": {g: [n for n, _ in it] for g, it in groups.items()},
            "gate": _gate_status(), "native_built": native.library_path().exists(),
            "compile": comp, "ops": {n: m["items"][n] for n in opnames},
            "models": {n: m["items"][n] for n, _, _ in mods}, "wins_models": sorted(wins),
            "models_skipped": skipped, "hook": m["hook"], "targets": targets}


def print_report(res: dict, out=sys.stdout) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"== payoff ({res['device']}{' ' + res['device_name'] if res['device_name'] else ''}, "
      f"{res['threads']} intra-op threads, {res['rounds']} rounds, serve={res['serve']}, "
      f"route={res.get('route', 'all')}, gate={res['gate']})")
    p(f"compiled: {res['compile']['statuses']} of {res['compile']['signatures']} signatures "
      f"in {res['compile']['seconds']} s")
    per = "repetitions (rounds x pairs)" if res.get("pairs", 1) > 1 else "rounds"
    p(f"caches: {res.get('caches', 'shared')}; ratio = median over {per} of hook/eager, [quartiles]"
      + ("; A/A = the same repetitions' second eager phase / eager (the run's noise)" if res.get("control") else ""))
    for route in res.get("routes", [res.get("route", "all")]):
        p(f"-- route={route}")
        aa = bool(res.get("control"))
        p(f"{'item':58s} {'eager us':>10s} {'hook us':>10s} {'hook/eager':>10s} {'quartiles':>13s}"
          + (f" {'A/A':>6s} {'A/A quartiles':>13s}" if aa else "") + "  what ran")
        for section in ("ops", "models"):
            for n, d in res[section].items():
                v = d.get("variants", {}).get(route, d)
                what = "kernel" if v["served"] else ("eager (gated)" if v["gated"] else "eager")
                if section == "models":
                    what = f"{'kernels+eager' if v['served'] else 'eager'}{', some gated' if v['gated'] else ''}"
                q = v.get("ratio_iqr") or []
                qs = f"{q[0]:.3f}-{q[1]:.3f}" if len(q) == 2 else ""
                cq = d.get("control_iqr") or []
                ctl = (f" {d['control_ratio']:6.3f} {cq[0]:.3f}-{cq[1]:.3f}" if aa and len(cq) == 2 else "")
                p(f"{n[:58]:58s} {d['eager_us']:10.1f} {v['hook_us']:10.1f} {v['ratio']:10.3f} {qs:>13s}{ctl}  {what}")
    if res.get("models_skipped"):
        p(f"models skipped: {res['models_skipped']}")
    p(f"hook: {res['hook']}")
    p("== targets")
    for t in res["targets"]:
        p(f"  {'MET ' if t['met'] else 'MISS'} {t['target']}: {t['measured']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke run)")
    import common
    common.add_output_args(ap, "payoff")
    ap.add_argument("--workdir")
    ap.add_argument("--jobs", type=int, help="compile processes (default: cores, at most 8)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--batch-ms", type=float)
    ap.add_argument("--serve", default="faster", choices=("faster", "always"))
    ap.add_argument("--route", default="servable-at-install", choices=ROUTES,
                    help="the hook's route for the targets (default: the hook's default with on_miss='ignore')")
    ap.add_argument("--also-route", action="append", default=[], choices=ROUTES,
                    help="time the hook with this route too, in the same rounds (repeatable)")
    ap.add_argument("--caches", default="own", choices=("own", "shared"),
                    help="own: the op suite and each model warmed into a cache of their own (default); "
                         "shared: one cache with every item's entries")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--pairs", type=int, default=1,
                    help="eager/hooked phases back to back per item and round (ratios pair each repetition's phases)")
    ap.add_argument("--control", action="store_true",
                    help="a second eager phase in every repetition: eager/eager (A/A), the run's own noise")
    ap.add_argument("--ops", action="append", help="only this op of the suite (repeatable; its name as printed)")
    ap.add_argument("--threads", type=int, help="intra-op threads of this process (torch.set_num_threads)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("payoff: --device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    try:
        res = run(a.device, a.quick, a.workdir, a.jobs, a.rounds, a.batch_ms, a.serve, not a.no_models, a.ops,
                  log=lambda s: print(f"[payoff] {s}", file=sys.stderr, flush=True),
                  route=a.route, caches=a.caches,
                  also_routes=tuple(a.also_route), pairs=a.pairs, control=a.control)
    except Exception:
        traceback.print_exc()
        return 1
    from common import machine

    res["machine"] = machine()
    print_report(res)
    common.write_output(a, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
