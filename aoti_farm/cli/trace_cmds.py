"""`aoti-farm trace validate|show|merge`, `key` and `compile-one`: the commands about a
trace and its entries."""

from __future__ import annotations

import json
import os
import warnings

from aoti_farm.cli.flags import PROG, farm_config as _farm_config, signing_key as _signing_key
from aoti_farm.errors import UserError


def _budget_check(ns):
    """The memory-budget check of a trace's entries (flag > env > [farm] > a quarter of
    this host's memory): a function for ``load_trace(check=...)`` and the budget in bytes."""
    from aoti_farm import budget
    from aoti_farm.config import FarmConfig, resolve

    cfg = resolve(FarmConfig, cli={"memory_budget": getattr(ns, "memory_budget", None)},
                  config_path=getattr(ns, "config", None))

    def check(sig):
        over = budget.refusal(sig, cfg.memory_budget)
        return over[0] if over else None

    return check, budget.current(cfg.memory_budget)[0]


def cmd_trace_validate(ns) -> int:
    from aoti_farm.trace import load_trace

    check, limit = _budget_check(ns)
    t = load_trace(ns.file, check=check)
    calls = sum(e.count for e in t)
    ops = sorted({e.sig.op for e in t})
    if ns.json:
        print(json.dumps({"file": ns.file, "ok": True, "entries": len(t), "calls": calls, "ops": ops,
                          "memory_budget": limit}))
    else:
        print(f"{ns.file}: ok, {len(t)} unique signatures, {calls} calls, {len(ops)} ops ({', '.join(ops)})")
    return 0


def _with_strides(sig) -> str:
    """``describe(sig)`` with every tensor's strides: ``f32[2,8]/[16,1]``."""
    def one(t) -> str:
        if t[0] != "T":
            return "None"
        return f"{t[1]}{list(t[2])}/{list(t[3])}" + ("" if t[4] == "cpu" else f"@{t[4]}")

    parts = []
    for name, a in zip(sig.info().arg_names, sig.args):
        if a[0] == "T":
            parts.append(one(a))
        elif a[0] == "TL":
            parts.append("[" + ", ".join(one(t) for t in a[1]) + "]")
        elif a[0] != "N":
            parts.append(f"{name}={a[1]!r}")
    return f"{sig.op}({', '.join(parts)})"


def _descriptions(t) -> list[str]:
    """Each entry's short form; where two different signatures would read the same (they
    differ by strides), both are shown with their tensors' strides (``sizes/strides``)."""
    from aoti_farm.signature import describe

    short = [describe(e.sig) for e in t]
    seen: dict[str, set] = {}
    for d, e in zip(short, t):
        seen.setdefault(d, set()).add(e.key)
    return [_with_strides(e.sig) if len(seen[d]) > 1 else d for d, e in zip(short, t)]


def cmd_trace_show(ns) -> int:
    from aoti_farm.trace import load_trace

    t = load_trace(ns.file)
    if getattr(ns, "classes", False):
        return _show_classes(t, ns.json)
    desc = _descriptions(t)
    if ns.json:
        rows = [{"index": i, "order": e.order, "count": e.count, "key": e.key, "op": e.sig.op,
                 "device": e.sig.device, "description": desc[i]} for i, e in enumerate(t)]
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'idx':>4} {'count':>6}  {'key':16}  signature (sizes/strides where signatures differ by strides)")
    for i, e in enumerate(t):
        print(f"{i:>4} {e.count:>6}  {e.key[:16]}  {desc[i]}")
    print(f"{len(t)} unique signatures, {sum(e.count for e in t)} calls")
    return 0


def cmd_trace_merge(ns) -> int:
    from aoti_farm.trace import load_trace, merge, save_trace

    files = list(ns.files)
    out = ns.out
    if out is None:
        if len(files) < 2:
            raise UserError("trace merge: give OUT and at least one input (`trace merge OUT IN...`), "
                            "or --out OUT IN...")
        out, files = files[0], files[1:]
    if not files:
        raise UserError("trace merge: no input traces; name at least one IN file")
    traces = [load_trace(f) for f in files]  # every input validated before anything is written
    merged = merge(traces)
    save_trace(merged, out)
    msg = (f"wrote {out}: {len(merged)} unique signatures, {sum(e.count for e in merged)} calls "
           f"from {len(files)} traces")
    print(json.dumps({"out": out, "entries": len(merged), "inputs": files}) if ns.json else msg)
    return 0


def _entry(ns):
    from aoti_farm.trace import load_trace

    t = load_trace(ns.trace)
    if not 0 <= ns.index < len(t):
        raise UserError(f"--index {ns.index}: trace {ns.trace} has {len(t)} entries (0..{len(t) - 1}); "
                        f"see `{PROG} trace show {ns.trace}`")
    return t[ns.index]


def cmd_key(ns) -> int:
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.signature import canonical_bytes, conditions, describe, key_fields

    e = _entry(ns)
    sig = e.sig
    fields = key_fields(sig.op, sig.args)
    cfg = _farm_config(ns)
    fp = fingerprint(sig.device, cfg.inductor_options)
    if ns.json:
        print(json.dumps({"op": sig.op, "description": describe(sig), "key_fields": [[k, v] for k, v in fields],
                          "key": sig.key, "canonical_bytes": len(canonical_bytes(fields)),
                          "device": sig.device, "fingerprint": fp.as_dict(), "fingerprint_id": fp.id,
                          "serving_conditions": conditions.for_device(sig.device),
                          "threads": _THREADS if sig.device == "cpu" else None},
                         indent=1, default=list))
        return 0
    print(f"signature   {describe(sig)}")
    print("key fields (sha256 of their canonical msgpack form):")
    names = dict((f"arg{i}", n) for i, n in enumerate(sig.info().arg_names))
    for k, v in fields:
        label = f"{k} ({names[k]})" if k in names else k
        print(f"  {label:24} {json.dumps(v, default=list)}")
    print(f"key         {sig.key}")
    print(f"fingerprint fields ({sig.device}):")
    for k, v in fp.as_dict().items():
        print(f"  {k:20} {json.dumps(v, default=list)}")
    print(f"fingerprint {fp.id}")
    print("serving conditions (not in the key: served only while these are what the kernel was verified "
          "under, the manifest's 'conditions', absent = these defaults):")
    for k, v in conditions.for_device(sig.device).items():
        print(f"  {k:26} {json.dumps(v)}")
    if sig.device == "cpu":
        print(f"  {'threads':26} {_THREADS}")
    return 0


_THREADS = ("the calling thread's torch.get_num_threads() in the manifest's verified_threads (absent: [1]); "
            "at another count the kernel is checked against eager first")


def cmd_compile_one(ns) -> int:
    from aoti_farm.cache.opening import open_cache
    from aoti_farm.signature import describe

    e = _entry(ns)
    sig = e.sig
    cfg = _farm_config(ns)
    from aoti_farm import budget

    over = budget.refusal(sig, cfg.memory_budget)   # before anything is allocated or leased
    if over is not None:
        raise UserError(f"trace {ns.trace} entry {ns.index}: {describe(sig)}: {over[0]}")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import torch

    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish
    from aoti_farm.cache.leases import new_owner

    if sig.device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"trace {ns.trace} entry {ns.index} is a CUDA signature and this machine has no GPU; "
                        f"run compile-one on a GPU machine")
    cache = open_cache(cfg.cache_dir, create=True, signing_key=_signing_key(cfg))
    fp = fingerprint(sig.device if sig.device == "cpu" else "cuda:0", cfg.inductor_options)
    out = compile_and_publish(cache, AOTICompiler(cfg.inductor_options), fp, sig, owner=new_owner("compile-one"),
                              lease_ttl=cfg.lease_ttl, memory_budget=cfg.memory_budget)
    if ns.json:
        print(json.dumps({**out.to_dict(), "description": describe(sig), "fingerprint_id": fp.id,
                          "cache_dir": str(cache.root)}, default=str))
    else:
        line = f"{out.status} {sig.key[:16]} {describe(sig)}"
        if out.seconds:
            line += f" in {out.seconds:.1f}s"
        if out.error:
            line += f": {out.error}"
        if out.evidence:
            line += f" {json.dumps(out.evidence, default=str)}"
        if out.status == "busy":
            line += " (another worker holds the lease; try again later)"
        print(line)
    return 0 if out.status in ("compiled", "cached") else 1


def _show_classes(trace, as_json: bool = False) -> int:
    """``aoti-farm trace show --classes``: one line per class (key, members, ranges)."""
    from aoti_farm.dynamic.shapes import classes, distinct_shapes
    from aoti_farm.signature import describe

    cls, loose = classes(trace.signatures)
    if as_json:
        rows = [{"key": c.key, "op": c.op, "members": len(c.members), "shapes": distinct_shapes(c),
                 "ranges": {n: [lo, hi] for n, lo, hi in c.ranges}, "pattern": c.describe(),
                 "member_keys": [m.key for m in c.members]} for c in cls]
        rows += [{"key": s.key, "op": s.op, "members": 1, "shapes": 1, "ranges": {},
                  "pattern": describe(s), "no_class": "an argument has no layout class"} for s in loose]
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'key':16}  {'sigs':>4}  class")
    for c in cls:
        print(f"{c.key[:16]}  {len(c.members):>4}  {c.describe()}")
    for s in loose:
        print(f"{s.key[:16]}  {1:>4}  {describe(s)}  (no class: an argument has no layout class)")
    n_var = sum(1 for c in cls if c.varies)
    print(f"{len(trace)} signatures in {len(cls)} classes ({n_var} with varying sizes), {len(loose)} without a class")
    return 0
