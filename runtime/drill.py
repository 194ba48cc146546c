"""The differential drill: do served calls return what eager returns?

A corpus of op cases (one per op family the recorder supports, plus each known divergence
of a served kernel from eager: docs/verification.md; :mod:`aoti_farm.runtime.drillcorpus`) is recorded, compiled into a fresh
cache, then replayed under the serving hook
with ``serve="always"`` (so the speed gate hides no wrong kernel) and compared with eager
call by call: values within :mod:`aoti_farm.compile.tolerance`, dtype, shape, strides, the sign of
zeros, NaN/inf positions, and errors (eager raises => the served call raises the same type).

Each case has a random input set (the one recorded and compiled) and adversarial sets of
the same signature (signed zeros, +-inf, NaN, exact quotients 1.0 / 0.1, huge and tiny
magnitudes, integer extremes, indices at the bounds, negative and out of range), some under
a changed global (``torch.set_default_dtype(torch.float64)``, TF32 on CUDA).  Every set
runs at each thread count asked for (1, 2 and ``os.cpu_count()`` by default), under the hook
on the native hit path (``native="auto"``) and on the Python one (``native="off"``), and
once under ``aoti_farm.record``.  Cases marked ``compile=False`` are calls the hook must
leave to eager (a Python number next to 0-dim tensors): they check that an unserved call is
eager's own call.

Served or not is read from :meth:`Hook.stats` around each call (``hits``; otherwise the
fallback reason, miss, failed signature, gate or kernel error: ``runtime/hookstats.py``).

The replay runs in child processes: a wrong kernel reading out of bounds may crash its
process, and the drill must then report the case as wrong and go on.  Used by
``scripts/drill_differential.py`` (the full drill) and ``tests/e2e/test_drill_differential.py``
(its quick form).  Nothing here imports Ray: the full drill compiles through ``python -m
aoti_farm warm`` in a child.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import torch

from aoti_farm.startup import spawn

from .drillcorpus import GLOBALS, Case, corpus

aten = torch.ops.aten

SERVED, DECLINED, WRONG = "served-equal", "declined", "WRONG"
#: A served call that differs from eager only where the contract in force does not call it
#: a difference (docs/verification.md, "The contract"): under ``finite`` (the default) the
#: sign of a zero result, and any result of a call with a non-finite input.  Counted apart,
#: never as equal; under ``strict`` (``Plan.contract``) such a call is WRONG.
EDGE = "served-edge"


def _non_finite(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and x.numel() > 0 and not bool(torch.isfinite(x).all())
    if isinstance(x, (list, tuple)):
        return any(_non_finite(y) for y in x)
    return isinstance(x, float) and not math.isfinite(x)


def edge_class(case: "Case", inputs: tuple, eager: list, got: list) -> str | None:
    """Where a served result differs from eager's (``compare`` said so) only as the finite
    contract allows, the class of that edge ("non-finite inputs", "sign of zero"); None
    for a real difference.  Errors and unserved calls never reach here."""
    from aoti_farm.compile.tolerance import compare as tol_compare

    if not case.compile or len(eager) != len(got):
        return None
    if _non_finite(inputs):
        return "non-finite inputs"
    if tol_compare(eager, got, _extra(case, inputs, eager), zero_sign=False) is not None:
        return None
    for e, g in zip(eager, got):
        if e.is_floating_point():
            ec, gc = e.detach().cpu(), g.detach().cpu()
            if not (torch.equal(torch.isnan(ec), torch.isnan(gc)) and torch.equal(torch.isinf(ec), torch.isinf(gc))):
                return None
    return "sign of zero"

# -- comparing one call --------------------------------------------------------------------------


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_call(case: Case, inputs: tuple, glob: str | None):
    """(outputs, None) or (None, exception type name and message)."""
    with GLOBALS[glob]():
        try:
            out = case.call(*inputs)
            if any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- eager's own errors are part of the comparison
            return None, (type(e).__name__, str(e).splitlines()[0][:160] if str(e) else "")
    return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in _as_list(out)], None


def _extra(case: Case, inputs: tuple, expected) -> tuple[float, float]:
    """The stated extra tolerance of this call, as verification states it
    (``compile/checks.stated_tolerance``): length-scaled for sums, scans and matrix products,
    plus TF32's on CUDA where eager runs with TF32 allowed (its convolutions by default)."""
    from aoti_farm import signature as S
    from aoti_farm.compile.checks import stated_tolerance

    if case.op is None or not all(isinstance(t, torch.Tensor) for t in inputs):
        return 0.0, 0.0
    try:
        args = _aten_args(case, inputs)
        if args is None:
            return 0.0, 0.0
        sig = S.from_call(case.op, args, {})
        return stated_tolerance(sig, args, {}, expected)
    except Exception:  # noqa: BLE001 -- no extra tolerance: the dtype's own
        return 0.0, 0.0


def _aten_args(case: Case, inputs: tuple):
    """The positional aten arguments of the cases the tolerance scales (scans, sums, matrix
    products, convolutions): their calls pass exactly these."""
    op = case.op
    if op in (aten.cumsum.default,):
        return (inputs[0], 1)
    if op in (aten.sum.dim_IntList,):
        return (inputs[0], [1])
    if op in (aten.mm.default, aten.bmm.default, aten.addmm.default):
        return tuple(inputs)
    if op is aten.convolution.default and len(inputs) == 3:   # the corpus's conv: its fixed arguments
        return (*inputs, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return None


def compare(case: Case, inputs: tuple, eager, eager_err, got, got_err) -> str | None:
    """None when the served result is eager's, else what differs."""
    if eager_err or got_err:
        if eager_err and got_err:
            return None if eager_err[0] == got_err[0] else f"eager raises {eager_err[0]}, served raises {got_err[0]}: {got_err[1]}"
        if eager_err:
            return f"eager raises {eager_err[0]} ({eager_err[1]}), served returned a result"
        return f"served raises {got_err[0]} ({got_err[1]}), eager returned a result"
    if not case.compile:
        return compare_bytes(eager, got)
    return compare_outputs(case, inputs, eager, got)


def compare_bytes(eager: list, got: list) -> str | None:
    """An unserved call is eager's own call: the same dtype, shape, strides and bytes."""
    if len(eager) != len(got):
        return f"{len(got)} outputs, eager {len(eager)}"
    for n, (e, g) in enumerate(zip(eager, got)):
        for what, a, b in (("dtype", e.dtype, g.dtype), ("shape", list(e.shape), list(g.shape)),
                           ("strides", e.stride(), g.stride())):
            if a != b:
                return f"output {n}: {what}: eager {a}, served {b}"
        eb, gb = e.detach().cpu().contiguous(), g.detach().cpu().contiguous()
        if not torch.equal(eb.reshape(-1).view(torch.uint8), gb.reshape(-1).view(torch.uint8)):
            return f"output {n}: not eager's bytes: eager {eb.flatten()[:4].tolist()}, served {gb.flatten()[:4].tolist()}"
    return None


def compare_outputs(case: Case, inputs: tuple, eager: list, got: list) -> str | None:
    from aoti_farm.compile.tolerance import compare as tol_compare

    if len(eager) != len(got):
        return f"{len(got)} outputs, eager {len(eager)}"
    extra = _extra(case, inputs, eager)
    ev = tol_compare(eager, got, extra)
    if ev is not None:
        return _evidence_text(ev, eager, got) + _examples(inputs, eager, got, ev.get("output", 0), extra)
    for n, (e, g) in enumerate(zip(eager, got)):
        if e.is_floating_point():
            ec, gc = e.detach().cpu(), g.detach().cpu()
            both0 = (ec == 0) & (gc == 0)
            diff = both0 & (torch.signbit(ec) != torch.signbit(gc))
            if bool(diff.any()):
                i = int(diff.flatten().nonzero()[0])
                return (f"output {n}: sign of zero at flat index {i}: eager {float(ec.flatten()[i])!r}, "
                        f"served {float(gc.flatten()[i])!r}")
            for what, f in (("NaN", torch.isnan), ("inf", torch.isinf)):
                if not torch.equal(f(ec), f(gc)):
                    return f"output {n}: {what} positions differ"
    return None


def _examples(inputs: tuple, eager: list, got: list, n: int, extra: tuple[float, float], k: int = 3) -> str:
    """Up to ``k`` differing elements of output ``n`` as ``op inputs -> eager vs served``
    (the inputs shown where they have the output's shape: elementwise ops)."""
    from aoti_farm.compile.tolerance import TOLERANCES

    if n >= len(eager) or n >= len(got) or eager[n].shape != got[n].shape or eager[n].dtype != got[n].dtype:
        return ""
    e, g = eager[n].detach().cpu(), got[n].detach().cpu()
    if e.dtype in TOLERANCES and not e.is_complex():
        rtol, atol = TOLERANCES[e.dtype]
        bad = ~torch.isclose(g.double(), e.double(), rtol=rtol + extra[0], atol=atol + extra[1], equal_nan=True)
    else:
        bad = e != g
    # differing finite values first (1.0 // 0.1), then the ones involving NaN or inf
    finite = (torch.isfinite(e) & torch.isfinite(g)) if e.is_floating_point() else torch.ones_like(bad)
    idx = (bad & finite).flatten().nonzero().flatten().tolist() + (bad & ~finite).flatten().nonzero().flatten().tolist()
    shown, seen = [], set()
    for i in idx:
        ins = tuple(float(t.detach().cpu().flatten()[i]) if t.dtype.is_floating_point else int(t.detach().cpu().flatten()[i])
                    for t in inputs if isinstance(t, torch.Tensor) and t.shape == e.shape)
        if ins in seen:
            continue
        seen.add(ins)
        shown.append(f"({', '.join(map(repr, ins))}) -> eager {e.flatten()[i].item()!r}, served {g.flatten()[i].item()!r}"
                     if ins else f"[{i}] eager {e.flatten()[i].item()!r}, served {g.flatten()[i].item()!r}")
        if len(shown) == k:
            break
    return f"; e.g. {'; '.join(shown)}" if shown else ""


def _evidence_text(ev: dict, eager, got) -> str:
    p = ev.get("problem")
    o = ev.get("output", 0)
    if p == "values":
        s = f"output {o}: values at {ev.get('mismatched')}/{ev.get('numel')}"
        if "eager" in ev:
            s += f", first flat index {ev['first_index']}: eager {ev['eager']!r}, served {ev['kernel']!r}"
            if ev.get("max_abs_err") is not None and not (isinstance(ev["max_abs_err"], float) and math.isnan(ev["max_abs_err"])):
                s += f", max abs err {ev['max_abs_err']:.4g}"
        else:
            e, g = eager[o].flatten(), got[o].flatten()
            i = ev.get("first_index", 0)
            s += f", first flat index {i}: eager {e[i].item()!r}, served {g[i].item()!r}"
        return s
    if "eager" in ev:
        return f"output {o}: {p}: eager {ev['eager']}, served {ev['kernel']}"
    return f"output {o}: {p}"


# -- the replay in a child process ----------------------------------------------------------------


def _delta(before: dict, after: dict) -> dict:
    d = {}
    for k in ("hits", "misses", "failed_signatures", "gated", "gate_pending", "kernel_errors",
              "kernels_dropped", "load_errors", "load_unsafe", "integrity_failures"):
        x = after.get(k, 0) - before.get(k, 0)
        if x:
            d[k] = x
    fb = {r: n - before.get("fallbacks", {}).get(r, 0) for r, n in after.get("fallbacks", {}).items()}
    fb = {r: n for r, n in fb.items() if n}
    if fb:
        d["fallbacks"] = fb
    return d


def decline_reason(d: dict) -> str:
    """Why a call was not served, from the hook's counters around it (runtime/hookstats.py)."""
    parts = []
    if d.get("fallbacks"):
        parts += [f"fallback: {r}" for r in sorted(d["fallbacks"])]
    if d.get("failed_signatures"):
        parts.append("failed signature (no servable kernel: compile refused or failed)")
    if d.get("kernel_errors"):
        parts.append("kernel raised; dropped")
    elif d.get("kernels_dropped"):
        parts.append("kernel dropped")
    if d.get("load_errors") or d.get("load_unsafe") or d.get("integrity_failures"):
        parts.append("kernel not loadable")
    if d.get("gated") or d.get("gate_pending"):
        parts.append("speed gate")
    if d.get("misses") and not parts:
        parts.append("miss: no entry for this signature")
    return "; ".join(parts) or "not routed to the hook (op has no servable entry)"


def child_main(spec_path: str) -> int:
    """Replay the cases named in the spec under one hook mode and write one JSON line per
    call (after a ``begin`` line per case: the parent names a case whose call crashed us)."""
    import warnings

    warnings.filterwarnings("ignore")
    with open(spec_path) as f:
        spec = json.load(f)
    dev, mode, threads = spec["device"], spec["mode"], spec["threads"]
    contract = spec.get("contract", "finite")
    cases = {c.name: c for c in corpus()}
    todo = [cases[n] for n in spec["cases"] if n not in set(spec.get("skip", []))]
    out = open(spec["out"], "a", buffering=1)
    # eager first, with no hook installed, at each thread count
    plan = []
    for c in todo:
        for vi, v in enumerate(c.variants(dev)):
            for t in threads:
                torch.set_num_threads(t)
                e, ee = run_call(c, v.inputs, v.glob)
                plan.append((c, vi, v, t, e, ee))
    from . import Settings, install

    hook = install(cache_dir=spec["cache_dir"], devices=(dev,), on_miss="ignore", serve="always", contract=contract,
                   settings=Settings(native=mode, poll_interval=3600.0))
    try:
        current = None
        served_before: dict[str, bool] = {}
        for c, vi, v, t, e, ee in plan:
            if c.name != current:
                current = c.name
                out.write(json.dumps({"begin": c.name}) + "\n")
            torch.set_num_threads(t)
            before = hook.stats()
            g, ge = run_call(c, v.inputs, v.glob)
            if dev == "cuda":
                torch.cuda.synchronize()
            d = _delta(before, hook.stats())
            served = bool(d.get("hits"))
            why = compare(c, v.inputs, e, ee, g, ge)
            rec = {"case": c.name, "mode": f"native={mode}", "variant": v.label, "glob": v.glob, "threads": t,
                   "served": served, "counters": d, "eager_error": ee and ee[0], "served_error": ge and ge[0]}
            if why is None and ee is None and d.get("kernel_errors"):
                why = ("the served kernel raised on a call eager accepts (the hook fell back to eager and "
                       "dropped the kernel)")
            edge = (edge_class(c, v.inputs, e, g) if why is not None and served and ee is None and ge is None
                    and contract == "finite" else None)
            if edge is not None:
                rec.update(status=EDGE, why=f"{edge}: {why}")
            elif why is not None:
                rec.update(status=WRONG, why=why)
            elif served:
                rec.update(status=SERVED)
            else:
                rec.update(status=DECLINED, why=decline_reason(d))
            if v.label == "random" and v.glob is None:
                served_before.setdefault(c.name, served)
            if v.label == "random after error" and served_before.get(c.name) and not served and why is None:
                rec.update(status=WRONG, why="kernel dropped after eager raised a user error: a later valid "
                                             f"call was not served ({decline_reason(d)})")
            out.write(json.dumps(rec) + "\n")
        out.write(json.dumps({"done": True}) + "\n")
    finally:
        hook.uninstall()
    return 0


# -- the parent ------------------------------------------------------------------------------------


@dataclass
class Plan:
    device: str = "cpu"
    threads: list = field(default_factory=lambda: sorted({1, 2, os.cpu_count() or 1}))
    quick: bool = False
    ray: bool = True
    modes: tuple = ("auto", "off")
    log: Callable = print
    #: the serving contract the replay hooks run under and the drill judges by
    #: (docs/verification.md, "The contract"; the script resolves it like any setting)
    contract: str = "finite"


def select(plan: Plan) -> list[Case]:
    return [c for c in corpus() if plan.device in c.devices and (c.quick or not plan.quick)]


def record_check(cases: list[Case], plan: Plan, workdir: str) -> tuple[dict, list[dict]]:
    """Record each compiled case's first (random) call into its own trace, and run every
    call of every case under ``aoti_farm.record``, compared with eager.  Returns
    ({case: [signature dicts]}, records)."""
    from .recorder import record
    from aoti_farm.trace import load_trace

    sigs, recs = {}, []
    torch.set_num_threads(1)
    for i, c in enumerate(cases):
        vs = c.variants(plan.device)
        if c.compile:
            p = os.path.join(workdir, f"case{i}.json")
            with record(p, devices=(plan.device,)):
                run_call(c, vs[0].inputs, vs[0].glob)
            sigs[c.name] = [e.sig for e in load_trace(p).entries]
        for v in vs:
            e, ee = run_call(c, v.inputs, v.glob)
            with record(os.path.join(workdir, "all.json"), devices=(plan.device,)):
                g, ge = run_call(c, v.inputs, v.glob)
            why = compare(c, v.inputs, e, ee, g, ge)
            rec = {"case": c.name, "mode": "record", "variant": v.label, "glob": v.glob, "threads": 1,
                   "served": False, "status": WRONG if why else DECLINED, "why": why or "recording (eager's call)"}
            recs.append(rec)
    return sigs, recs


def compile_all(sigs: dict, plan: Plan, cache_dir: str, workdir: str) -> dict:
    """Compile every recorded signature into ``cache_dir``; {key: error or None}."""
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    uniq = {}
    for ss in sigs.values():
        for s in ss:
            uniq.setdefault(s.key, s)
    plan.log(f"drill: compiling {len(uniq)} signatures ({'Ray farm: aoti-farm warm' if plan.ray else 'in-process'})")
    if plan.ray:
        trace = os.path.join(workdir, "drill_trace.json")
        save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(uniq.values())]), trace)
        report = os.path.join(workdir, "warm_report.json")
        p = subprocess.run([*spawn.python("-m", "aoti_farm", "warm", "--model", trace), "--cache-dir", cache_dir,
                            "--dynamic", "off", "--report", report], capture_output=True, text=True)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"aoti-farm warm exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
        try:
            with open(report) as f:
                rows = json.load(f)
        except (OSError, ValueError):
            rows = {}
        items = rows.get("signatures", []) if isinstance(rows, dict) else []
        by_key = {r.get("key"): r for r in items if isinstance(r, dict)}
        out = {}
        for k in uniq:
            r = by_key.get(k)
            r = r or {}
            err = str(r.get("error") or r.get("status") or "not compiled")
            out[k] = None if r.get("status") in ("compiled", "cached") else (
                f"attempts {r.get('attempts', '?')}: {err[:100]}")
        return out
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish

    cache, fp = Cache(cache_dir), fingerprint(plan.device)
    compiler = AOTICompiler(measure_speed=not plan.quick)
    out = {}
    for k, s in uniq.items():
        try:
            o = compile_and_publish(cache, compiler, fp, s, owner="drill")
        except Exception as e:  # noqa: BLE001 -- an infrastructure error (the farm would retry it)
            out[k] = f"compile raised {type(e).__name__} (an infrastructure error to the farm: retried): " + \
                (str(e).splitlines() or [""])[0][:160]
            plan.log(f"drill:   {s.op}: {out[k]}")
            continue
        out[k] = None if o.status in ("compiled", "cached") else (o.error or o.status)
        plan.log(f"drill:   {s.op}: {o.status}{'' if out[k] is None else ' (' + str(out[k])[:100] + ')'}")
    return out


def replay(cases: list[Case], plan: Plan, cache_dir: str, workdir: str) -> list[dict]:
    """Each hook mode in a child process; a child that dies marks its case WRONG and the
    replay goes on without it."""
    recs = []
    names = [c.name for c in cases]
    for mode in plan.modes:
        skip: list[str] = []
        for attempt in range(len(names) + 1):
            out = os.path.join(workdir, f"replay-{mode}-{attempt}.jsonl")
            spec = os.path.join(workdir, f"spec-{mode}-{attempt}.json")
            with open(spec, "w") as f:
                json.dump({"device": plan.device, "mode": mode, "threads": plan.threads, "cases": names,
                           "skip": skip, "cache_dir": cache_dir, "out": out, "contract": plan.contract}, f)
            p = subprocess.run([*spawn.python("-c"), "import sys; from aoti_farm.runtime import drill; "
                                "sys.exit(drill.child_main(sys.argv[1]))", spec], capture_output=True, text=True)
            lines = []
            if os.path.exists(out):
                with open(out) as f:
                    lines = [json.loads(x) for x in f if x.strip()]
            recs += [x for x in lines if "case" in x]
            if any(x.get("done") for x in lines):
                break
            begun = [x["begin"] for x in lines if "begin" in x]
            if not begun:
                raise RuntimeError(f"drill replay (native={mode}) exited {p.returncode} before any case: "
                                   f"{p.stderr.strip()[-600:]}")
            recs.append({"case": begun[-1], "mode": f"native={mode}", "variant": "?", "glob": None, "threads": None,
                         "served": True, "status": WRONG,
                         "why": f"the serving process died (exit {p.returncode}) during this case"})
            skip.append(begun[-1])
    return recs


def summarize(cases: list[Case], recs: list[dict], compile_errors: dict, sigs: dict,
              contract: str = "finite") -> list[tuple]:
    """One (case, status, text, calls served) per case."""
    rows = []
    for c in cases:
        mine = [r for r in recs if r["case"] == c.name]
        wrong = [r for r in mine if r["status"] == WRONG]
        hook_calls = [r for r in mine if r["mode"] != "record"]
        served = [r for r in hook_calls if r["served"] and r["status"] != WRONG]
        n_served = sum(1 for r in hook_calls if r["served"])
        if wrong:
            seen, parts = set(), []
            for r in wrong:
                if r["why"] in seen:
                    continue
                seen.add(r["why"])
                where = f"{r['mode']}, {r['variant']}" + (f", {r['glob']}" if r.get("glob") else "") + (
                    f", {r['threads']} thr" if r.get("threads") else "")
                parts.append(f"[{where}] {r['why']}")
            more = f" (+{len(wrong) - 3} more)" if len(parts) > 3 else ""
            ncalls = f"{len(wrong)}/{len(mine)} calls"
            rows.append((c.name, WRONG, f"WRONG ({ncalls}: " + "; ".join(parts[:3]) + more + ")", n_served))
        elif served:
            dec = sorted({r["why"] for r in hook_calls if not r["served"]})
            edges = sorted({r["why"].split(":", 1)[0] for r in hook_calls if r["status"] == EDGE})
            note = f" ({len(served)}/{len(hook_calls)} calls served" + (
                f"; the rest declined: {'; '.join(dec)}" if dec else "") + (
                f"; differing only at an edge of the {contract} contract: {', '.join(edges)}" if edges else "") + ")"
            rows.append((c.name, EDGE if edges else SERVED, (EDGE if edges else SERVED) + note, n_served))
        else:
            reasons = sorted({r["why"] for r in hook_calls})
            errs = sorted({str(compile_errors.get(s.key))[:120] for s in sigs.get(c.name, [])
                           if compile_errors.get(s.key)})
            if errs:
                reasons.append("compile: " + "; ".join(errs))
            if c.compile and not sigs.get(c.name):
                reasons.append("nothing recorded for this call")
            if not c.compile:
                reasons.append("not compiled: a call the hook must leave to eager")
            rows.append((c.name, DECLINED, f"declined ({'; '.join(reasons)})", n_served))
    return rows


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run(plan: Plan, out_dir: str | None = None) -> tuple[int, list[tuple], str]:
    """The whole drill; returns (number of WRONG cases, per-case rows (case, status, line,
    calls served), summary line)."""
    cases = select(plan)
    workdir = tempfile.mkdtemp(prefix="aoti-farm-drill-")
    cache_dir = os.path.join(workdir, "cache")
    os.makedirs(cache_dir, mode=0o700)
    try:
        from . import native

        if "auto" in plan.modes and not native.disabled():
            native.build()
        sigs, recs = record_check(cases, plan, workdir)
        compile_errors = compile_all(sigs, plan, cache_dir, workdir)
        recs += replay(cases, plan, cache_dir, workdir)
        rows = summarize(cases, recs, compile_errors, sigs, plan.contract)
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    n = {s: sum(1 for r in rows if r[1] == s) for s in (SERVED, EDGE, DECLINED, WRONG)}
    dev = plan.device
    if dev == "cuda":
        dev += f" ({torch.cuda.get_device_name(0)})"
    summary = (f"drill: {len(rows)} op-cases: {n[SERVED]} served-equal, {n[EDGE]} served differing only at a "
               f"{plan.contract}-contract edge, {n[DECLINED]} declined, {n[WRONG]} WRONG; "
               f"{len(recs)} calls; device {dev}; threads {','.join(map(str, plan.threads))}; machine {machine()}; "
               f"torch {torch.__version__}; {'quick' if plan.quick else 'full'}, "
               f"{'Ray warm' if plan.ray else 'in-process compile'}; "
               f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "drill.json"), "w") as f:
            # published: the case's signatures with a kernel in the drill's cache (compile_all said
            # no error); a case without one (a correct refusal) can only be declined
            published = {c.name: sorted(s.key for s in sigs.get(c.name, []) if compile_errors.get(s.key, "") is None)
                         for c in cases}
            json.dump({"summary": summary, "cases": [{"case": a, "status": b, "line": c, "served_calls": d,
                                                      "published": published.get(a, [])} for a, b, c, d in rows],
                       "calls": recs, "compile_errors": compile_errors}, f, indent=1, default=str)
    return n[WRONG], rows, summary
