"""The ``aoti-farm`` command (also ``python -m aoti_farm``).

Subcommands import what they implement lazily, so ``aoti-farm --help`` starts fast and
imports neither torch nor Ray.  Bad input of any kind ends in one line
``aoti-farm: error: ...`` and exit 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import warnings

# torch warns once per process when NumPy is absent; it is not needed here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from aoti_farm import __version__  # noqa: E402
from aoti_farm.cli import flags  # noqa: E402
from aoti_farm.errors import FarmError, UserError  # noqa: E402

PROG = "aoti-farm"


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2 (no usage dump)."""

    def error(self, message: str):  # type: ignore[override]
        msg = " ".join(message.split())
        self.exit(2, f"{PROG}: error: {self.prog.removeprefix(PROG).strip() + ': ' if self.prog != PROG else ''}"
                     f"{msg}; see `{self.prog} --help`\n")


# --- subcommands that live in other modules -------------------------------------------------

#: command -> (module, add-args function, command function)
EXTERNAL = {
    "warm": ("aoti_farm.cli.farm_cmds", "add_warm_args", "warm_command",
             "compile every signature of a trace into the cache, in parallel on Ray"),
    "serve": ("aoti_farm.cli.farm_cmds", "add_serve_args", "serve_command",
              "keep compiling what serving processes missed (drains the miss queue)"),
    "run": ("aoti_farm.runtime.launch", "add_run_args", "run_command",
            "run a Python program with the serving hook installed"),
    "record": ("aoti_farm.runtime.launch", "add_record_args", "record_command",
               "run a Python program and record the op signatures it calls into a trace"),
    "explain": ("aoti_farm.explain", "add_explain_args", "explain_command",
                "say what a serving process here would do with each signature of a trace, and why"),
    "report": ("aoti_farm.cli.report_cmd", "add_report_args", "report_command",
               "render a warm report (--report JSON) as a self-contained HTML timeline"),
}


def _module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (e.name == name or name.startswith(e.name + ".")):
            raise UserError(f"`{PROG} {what}` is not available in this installation ({name} is missing); "
                            f"reinstall aoti-farm") from None
        raise


def _external(cmd: str):
    modname, _, fn, _ = EXTERNAL[cmd]

    def run(ns) -> int:
        return getattr(_module(modname, cmd), fn)(ns)

    return run


# --- trace ------------------------------------------------------------------------------


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


def cmd_trace_show(ns) -> int:
    from aoti_farm.signature import describe
    from aoti_farm.trace import load_trace

    t = load_trace(ns.file)
    if getattr(ns, "classes", False):
        from aoti_farm.shapes import show_classes

        return show_classes(t, ns.json)
    if ns.json:
        rows = [{"index": i, "order": e.order, "count": e.count, "key": e.key, "op": e.sig.op,
                 "device": e.sig.device, "description": describe(e.sig)} for i, e in enumerate(t)]
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'idx':>4} {'count':>6}  {'key':16}  signature")
    for i, e in enumerate(t):
        print(f"{i:>4} {e.count:>6}  {e.key[:16]}  {describe(e.sig)}")
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


def _farm_config(ns):
    from aoti_farm.config import FarmConfig, resolve

    return resolve(FarmConfig, cli={"cache_dir": getattr(ns, "cache_dir", None),
                                    "memory_budget": getattr(ns, "memory_budget", None)},
                   config_path=getattr(ns, "config", None))


def _signing_key(cfg):
    from aoti_farm.config import signing_key

    return signing_key(cfg)   # fails closed: an empty or unreadable key is a UserError


def cmd_key(ns) -> int:
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.signature import canonical_bytes, describe, key_fields

    e = _entry(ns)
    sig = e.sig
    fields = key_fields(sig.op, sig.args)
    cfg = _farm_config(ns)
    fp = fingerprint(sig.device, cfg.inductor_options)
    if ns.json:
        print(json.dumps({"op": sig.op, "description": describe(sig), "key_fields": [[k, v] for k, v in fields],
                          "key": sig.key, "canonical_bytes": len(canonical_bytes(fields)),
                          "device": sig.device, "fingerprint": fp.as_dict(), "fingerprint_id": fp.id},
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
    return 0


def cmd_compile_one(ns) -> int:
    from aoti_farm.cachedir import open_cache
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

    from aoti_farm.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.job import compile_and_publish
    from aoti_farm.leases import new_owner

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


# --- cache ------------------------------------------------------------------------------


def _cache_cmd(name: str):
    def run(ns) -> int:
        from aoti_farm.cli import cache_cmds

        cfg = _farm_config(ns)
        ns.cache_dir, ns.signing_key = cfg.cache_dir, _signing_key(cfg)
        return cache_cmds.COMMANDS[name](ns)

    return run


def _upstream(fn: str):
    def run(ns) -> int:
        cfg = _farm_config(ns)
        ns.cache_dir, ns.signing_key = cfg.cache_dir, _signing_key(cfg)
        return getattr(_module("aoti_farm.cli.upstream_cmds", f"cache {fn.split('_')[0]}-upstream"), fn)(ns)

    return run


def cmd_bench(argv: list[str]) -> int:
    mod = _module("aoti_farm.cli.bench", "bench")
    rc = mod.main(argv)
    return int(rc or 0)


# --- parser -----------------------------------------------------------------------------


_common, _memory_budget_arg = flags.common, flags.memory_budget


def build_parser(command: str | None = None) -> Parser:
    """The parser; ``command`` names the subcommand whose external arguments to load
    (only that module is imported)."""
    p = Parser(prog=PROG, description="A compile farm for PyTorch AOTInductor eager kernels: parallel warm-up "
                                      "on Ray, a shared verified kernel cache, a non-blocking runtime hook.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    for name, (modname, add, _, help_) in EXTERNAL.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        if command == name:
            getattr(_module(modname, name), add)(sp)
        sp.set_defaults(func=_external(name))

    tr = sub.add_parser("trace", help="validate, show or merge trace files")
    tsub = tr.add_subparsers(dest="trace_command", metavar="ACTION", parser_class=Parser)
    tsub.required = True
    v = tsub.add_parser("validate", help="check a trace file (exit 2 with the reason if bad)")
    v.add_argument("file")
    _memory_budget_arg(v)
    _common(v, cache=False)
    v.set_defaults(func=cmd_trace_validate)
    s = tsub.add_parser("show", help="list a trace's signatures")
    s.add_argument("file")
    s.add_argument("--classes", action="store_true",
                   help="group signatures that differ only in tensor sizes (shape classes, their ranges)")
    _common(s, cache=False)
    s.set_defaults(func=cmd_trace_show)
    m = tsub.add_parser("merge", help="merge traces: dedupe by key, sum counts (OUT IN... or --out OUT IN...)")
    m.add_argument("--out", "-o", default=None, help="output trace (else the first positional)")
    m.add_argument("files", nargs="+", metavar="FILE")
    _common(m, cache=False)
    m.set_defaults(func=cmd_trace_merge)

    k = sub.add_parser("key", help="show the fields hashed into a trace entry's key and its fingerprint")
    k.add_argument("--trace", required=True)
    k.add_argument("--index", type=int, required=True, help="entry index (see `trace show`)")
    _common(k)
    k.set_defaults(func=cmd_key)

    c1 = sub.add_parser("compile-one", help="compile, verify and publish one trace entry in this process")
    c1.add_argument("--trace", required=True)
    c1.add_argument("--index", type=int, required=True, help="entry index (see `trace show`)")
    _memory_budget_arg(c1)
    _common(c1)
    c1.set_defaults(func=cmd_compile_one)

    ca = sub.add_parser("cache", help="inspect and maintain a cache directory")
    csub = ca.add_subparsers(dest="cache_command", metavar="ACTION", parser_class=Parser)
    csub.required = True
    x = csub.add_parser("stats", help="entries, bytes, failures, queue, leases per fingerprint")
    _common(x)
    x.set_defaults(func=_cache_cmd("stats"))
    x = csub.add_parser("ls", help="list entries: key, size, compile time, signature")
    x.add_argument("--failed", action="store_true", help="also list failure records")
    _common(x)
    x.set_defaults(func=_cache_cmd("ls"))
    x = csub.add_parser("verify", help="fully verify every entry; exit 1 if any is bad")
    x.add_argument("--repair", action="store_true",
                   help="remove bad entries, tmp/ orphans older than an hour, stale leases, unreadable records")
    _common(x)
    x.set_defaults(func=_cache_cmd("verify"))
    x = csub.add_parser("gc", help="evict least-recently-used entries down to a size")
    x.add_argument("--max-size", required=True, help="e.g. 500M, 2G, 1024K")
    _common(x)
    x.set_defaults(func=_cache_cmd("gc"))
    x = csub.add_parser("rm", help="remove entries by key (or prefix), failure records, or everything")
    x.add_argument("keys", nargs="*", metavar="KEY")
    x.add_argument("--failed", action="store_true", help="remove every failure record (so they are retried)")
    x.add_argument("--all", action="store_true", help="remove every entry and failure record")
    _common(x)
    x.set_defaults(func=_cache_cmd("rm"))
    x = csub.add_parser("export-upstream", help="copy entries into torch's aoti_eager cache layout")
    x.add_argument("--to", required=True, metavar="DIR")
    _common(x)
    x.set_defaults(func=_upstream("export_command"))
    x = csub.add_parser("import-upstream", help="import (and verify) kernels from torch's aoti_eager cache")
    x.add_argument("--from", dest="src", required=True, metavar="DIR")
    _common(x)
    x.set_defaults(func=_upstream("import_command"))

    nat = sub.add_parser("native", help="build the serving hook's native hit path, or show its status")
    nat.add_argument("action", choices=("build", "status"), help="build: compile it for this torch (about 30 s); "
                     "status: where it is and whether it is built")
    nat.set_defaults(func=cmd_native)

    sub.add_parser("bench", help="benchmarks (`aoti-farm bench --help`)", add_help=False)
    return p


def cmd_native(ns) -> int:
    from aoti_farm.runtime import native

    return native.main([ns.action])


def _command_of(argv: list[str]) -> str | None:
    for a in argv:
        if not a.startswith("-"):
            return a
        if a in ("-h", "--help", "--version"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    process_entry = argv is None   # the command line's own call: the process ends after it
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command = _command_of(argv)
        if command == "bench":
            return cmd_bench(argv[argv.index("bench") + 1:])
        try:
            ns = build_parser(command).parse_args(argv)
        except SystemExit as e:  # --help, --version, or a usage error already printed
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        rc = ns.func(ns)
        if process_entry and getattr(ns, "freeze_at_exit", False):
            # What is alive now stays out of the interpreter's final garbage collections
            # (0.25 s with torch imported); atexit handlers and stream flushes still run.
            gc.freeze()
        return int(rc or 0)
    except UserError as e:
        _err(str(e))
        return 2
    except FarmError as e:
        _err(str(e))
        return 1
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        # `aoti-farm cache ls | head`: the reader went away; not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


def _err(msg: str) -> None:
    print(f"{PROG}: error: {' '.join(msg.split())}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
