"""The ``aoti-farm`` command (also ``python -m aoti_farm``).

Subcommands import what they implement lazily, so ``aoti-farm --help`` starts fast and
imports neither torch nor Ray.  Bad input of any kind ends in one line
``aoti-farm: error: ...`` and exit 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import warnings

# torch warns once per process when NumPy is absent; it is not needed here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from aoti_farm import __version__  # noqa: E402
from aoti_farm.cli import flags  # noqa: E402
from aoti_farm.cli.flags import PROG, farm_config as _farm_config, signing_key as _signing_key  # noqa: E402
from aoti_farm.cli.trace_cmds import (  # noqa: E402
    cmd_compile_one, cmd_key, cmd_trace_merge, cmd_trace_show, cmd_trace_validate)
from aoti_farm.errors import FarmError, UserError  # noqa: E402



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
    "explain": ("aoti_farm.report.explain", "add_explain_args", "explain_command",
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

#: What ``aoti-farm --help`` lists, in two groups.  A user's workflow needs only the first
#: (record -> warm -> run -> cache stats -> explain); the second looks inside one signature
#: or the build.  Every command of the parser is in exactly one group (tests/unit/test_cli.py).
USER_COMMANDS = ("record", "warm", "run", "serve", "explain", "report", "cache", "trace")
DEVELOPER_COMMANDS = ("key", "compile-one", "native", "bench")

_HELP = {
    **{name: spec[3] for name, spec in EXTERNAL.items()},
    "cache": "inspect and maintain a cache directory (stats, ls, verify, gc, rm, export/import-upstream)",
    "trace": "validate, show or merge trace files",
    "key": "show the fields hashed into a trace entry's key and its fingerprint",
    "compile-one": "compile, verify and publish one trace entry in this process",
    "native": "build the serving hook's native hit path, or show its status",
    "bench": "the benchmark suite of a source checkout (`aoti-farm bench --help`)",
}


def _command_list() -> str:
    width = max(map(len, USER_COMMANDS + DEVELOPER_COMMANDS)) + 2

    def block(title, names):
        return "\n".join([f"{title}:"] + [f"  {n:<{width}}{_HELP[n]}" for n in names])

    return (block("commands", USER_COMMANDS) + "\n\n" + block("developer tools", DEVELOPER_COMMANDS) +
            "\n\n`aoti-farm COMMAND --help` gives a command's flags; docs/cli.md has the reference.")


_common, _memory_budget_arg = flags.common, flags.memory_budget


def build_parser(command: str | None = None) -> Parser:
    """The parser; ``command`` names the subcommand whose external arguments to load
    (only that module is imported)."""
    p = Parser(prog=PROG, description="A compile farm for PyTorch AOTInductor eager kernels: parallel warm-up "
                                      "on Ray, a shared verified kernel cache, a non-blocking runtime hook.",
               epilog=_command_list(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    # The commands are listed by the epilog, in their two groups; argparse's own list
    # would mix them.
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser,
                           help="one of the commands below")
    sub.required = True

    for name, (modname, add, _, help_) in EXTERNAL.items():
        sp = sub.add_parser(name, description=help_)
        if command == name:
            getattr(_module(modname, name), add)(sp)
        sp.set_defaults(func=_external(name))

    tr = sub.add_parser("trace", description=_HELP["trace"])
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

    k = sub.add_parser("key", description=_HELP["key"])
    k.add_argument("--trace", required=True)
    k.add_argument("--index", type=int, required=True, help="entry index (see `trace show`)")
    _common(k)
    k.set_defaults(func=cmd_key)

    c1 = sub.add_parser("compile-one", description=_HELP["compile-one"])
    c1.add_argument("--trace", required=True)
    c1.add_argument("--index", type=int, required=True, help="entry index (see `trace show`)")
    _memory_budget_arg(c1)
    _common(c1)
    c1.set_defaults(func=cmd_compile_one)

    ca = sub.add_parser("cache", description=_HELP["cache"])
    csub = ca.add_subparsers(dest="cache_command", metavar="ACTION", parser_class=Parser)
    csub.required = True
    x = csub.add_parser("stats", help="entries, bytes, failures, queue, leases per fingerprint")
    _common(x)
    x.set_defaults(func=_cache_cmd("stats"))
    x = csub.add_parser("ls", help="list entries: key, size, compile time, signature")
    x.add_argument("--failed", action="store_true", help="list failure records only")
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

    nat = sub.add_parser("native", description=_HELP["native"])
    nat.add_argument("action", choices=("build", "status"), help="build: compile it for this torch (about 30 s); "
                     "status: where it is and whether it is built")
    nat.set_defaults(func=cmd_native)

    sub.add_parser("bench", description=_HELP["bench"], add_help=False)
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
        if command in PRIVATE_INDUCTOR:
            _private_inductor(command)
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


#: The commands that compile (here, in their Ray actors or in their children): each sets up
#: this user's private Inductor cache first, so that every process it starts inherits it.
PRIVATE_INDUCTOR = ("warm", "serve", "compile-one")


def _private_inductor(command: str) -> None:
    """:func:`aoti_farm.security.private.use_inductor_cache` without importing torch (each place
    that builds patches torch itself); an unsafe directory is a one-line error."""
    from aoti_farm.security import private

    try:
        private.use_inductor_cache(patch_torch=False)
    except OSError as e:
        raise UserError(f"{command}: refusing an unsafe private directory: {e}") from None


def printable(text: str) -> str:
    """``text`` with every non-printable character (ESC, BEL, other controls) written as
    its escape: a message may quote names from a hostile input file, and the operator's
    terminal must never receive their control sequences."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _err(msg: str) -> None:
    print(f"{PROG}: error: {printable(' '.join(msg.split()))}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
