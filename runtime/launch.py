"""``aoti-farm run`` and ``aoti-farm record``: the hook and the recorder for unmodified programs.

Both run the command as a child whose PYTHONPATH starts with ``runtime/_site``, whose
``sitecustomize.py`` calls :func:`boot` in every Python process of the program (children
included) that sees the variables below, once it has imported torch (not in processes
that never do, nor in those torch starts for itself: see that module):

* ``aoti-farm run [--cache-dir D] [--on-miss M] [--serve S] [--contract C] [--config F] -- python serve.py ARGS``:
  the hook's settings are resolved once here by :func:`hook_config`, the resolver
  ``install()`` uses (``config.resolve(HookConfig)``: flag > environment > TOML file >
  default), and handed to the child as the fields of ``install()``'s ``Settings``, JSON in
  ``AOTI_FARM_HOOK`` (an internal variable; ``1`` there means "no arguments": the child
  resolves from its environment as ``install()`` would).  The signing key goes by its
  file's path, never itself.  ``AOTI_FARM_HOOK_STATS=DIR`` makes each process write its
  ``hook.stats()`` to ``DIR/stats-<pid>.json`` at exit.
* ``aoti-farm record [--ops OPS] --out trace.json -- python script.py ARGS``: ``AOTI_FARM_RECORD_DIR``
  names a temporary directory; each process writes ``trace-<pid>.json`` at exit and this
  process merges them (``aoti_farm.trace.merge``) into ``--out``.  ``--ops`` (checked here)
  reaches the recorders as ``AOTI_FARM_RECORD_OPS`` (internal): a trace of a few ops is
  warmed in a fraction of the time.

The exit status is the program's (128+N when killed by signal N); a command that cannot
be started is a UserError (exit 2).

This module is a command layer (of ``aoti-farm run`` and of the child's side, :func:`boot`),
so it reads the environment: the variables above, and the hook's settings through
``config.resolve(HookConfig)``, which it passes to ``install`` explicitly.  :data:`BOOTED`
holds what the child resolved (for tests and ``explain``-style introspection).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from aoti_farm.startup import loadenv
from aoti_farm.errors import UserError

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
_CHILD_VARS = ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD_DIR", "AOTI_FARM_RECORD_OPS", "AOTI_FARM_HOOK_STATS")


# --- the parent side ---------------------------------------------------------------------------


def _command(ns) -> list[str]:
    cmd = list(ns.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("no program given; put it after `--`, e.g. `aoti-farm run -- python serve.py`")
    return cmd


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CHILD_VARS}
    env["PYTHONPATH"] = SITE_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return loadenv.child_env(env)  # the libstdc++ preload, where this host needs it


def _run(cmd: list[str], env: dict[str, str]) -> int:
    try:
        p = subprocess.run(cmd, env=env)
    except FileNotFoundError:
        raise UserError(f"program {cmd[0]!r} not found; pass an executable (e.g. `-- python script.py`)") from None
    except PermissionError:
        raise UserError(f"program {cmd[0]!r} is not executable; fix its permissions") from None
    except KeyboardInterrupt:
        return 130
    return p.returncode if p.returncode >= 0 else 128 - p.returncode


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="kernel cache (default: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm)")
    p.add_argument("--on-miss", choices=("compile", "queue", "ignore"),
                   help="compile misses in a background worker (default), only queue them, or ignore them")
    p.add_argument("--serve", choices=("faster", "always"),
                   help="serve a cached kernel only where it is faster than eager (default), or always")
    p.add_argument("--contract", choices=("finite", "strict"),
                   help="serve kernels whose only differences from eager are edge notes (finite, the default), "
                        "or none of them (strict); docs/verification.md")
    p.add_argument("--config", help="TOML file with a [hook] table (default: $AOTI_FARM_CONFIG; docs/settings.md)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its arguments")


def hook_config(ns, env=None):
    """The hook's settings for ``aoti-farm run``'s flags ``ns``: the one resolver
    (``config.resolve(HookConfig)``), as ``install()`` calls it, with the flags as its
    arguments.  The signing key is checked here, so a bad one stops the run before the
    program starts."""
    from aoti_farm.config import HookConfig, resolve, signing_key

    cfg = resolve(HookConfig, cli={"cache_dir": ns.cache_dir, "on_miss": ns.on_miss,
                                     "serve": getattr(ns, "serve", None), "contract": getattr(ns, "contract", None)},
                  config_path=getattr(ns, "config", None), env=env)
    signing_key(cfg, env)   # fails closed (UserError) on an empty or unreadable key file
    return cfg


def install_arguments(cfg) -> dict:
    """``cfg`` as fields of ``install()``'s ``Settings`` (JSON: tuples become lists)."""
    return {f.name: (list(v) if isinstance(v, tuple) else v)
            for f in dataclasses.fields(cfg) if (v := getattr(cfg, f.name)) is not None}


def run_command(ns) -> int:
    cmd = _command(ns)
    cfg = hook_config(ns)
    env = _child_env({"AOTI_FARM_HOOK": json.dumps(install_arguments(cfg))})
    stats = os.environ.get("AOTI_FARM_HOOK_STATS")
    if stats:
        if not os.path.isdir(stats):
            raise UserError(f"AOTI_FARM_HOOK_STATS={stats}: no such directory; create it or unset the variable")
        env["AOTI_FARM_HOOK_STATS"] = stats
    return _run(cmd, env)


def add_record_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the trace to write (JSON)")
    p.add_argument("--ops", help="record only these ops, comma-separated (aten::addmm,aten::tanh); "
                                 "default: every op the hook can serve")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its arguments")


def record_command(ns) -> int:
    from aoti_farm.trace import Trace, load_trace, merge, save_trace

    cmd = _command(ns)
    out = ns.out
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UserError(f"--out {out}: directory {parent} does not exist; create it or pass another path")
    ops = record_ops(getattr(ns, "ops", None))
    tmp = tempfile.mkdtemp(prefix="aoti-farm-record-")
    try:
        extra = {"AOTI_FARM_RECORD_DIR": tmp}
        if ops:
            extra["AOTI_FARM_RECORD_OPS"] = ",".join(ops)
        rc = _run(cmd, _child_env(extra))
        parts = sorted(glob.glob(os.path.join(tmp, "trace-*.json")))
        trace = merge(load_trace(p) for p in parts) if parts else Trace([])
        save_trace(trace, out)
        calls = sum(e.count for e in trace)
        print(f"aoti-farm record: wrote {out}: {len(trace)} unique signatures, {calls} calls "
              f"from {len(parts)} process(es)", file=sys.stderr)
        if not parts:
            print("aoti-farm record: no Python process of the program recorded anything "
                  "(is it a Python program run with this interpreter's packages?)", file=sys.stderr)
        return rc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def record_ops(raw: str | None) -> list[str] | None:
    """``--ops``' names, each checked here (an op the recorder cannot record is a one-line
    UserError before the program starts); None: every op."""
    if raw is None:
        return None
    names = [x.strip() for x in raw.split(",") if x.strip()]
    if not names:
        raise UserError("--ops: no op named; pass names like aten::addmm,aten::tanh or leave --ops out")
    from .dispatch import resolve_ops

    for name in names:
        try:
            resolve_ops([name])
        except ValueError as e:
            raise UserError(f"--ops {name}: {e}; `aoti-farm trace show` of a full recording lists the ops called") \
                from None
    return names


# --- the child side (called by sitecustomize) ----------------------------------------------------


def boot() -> None:
    """Install the hook and/or the recorder in this process, as the environment says."""
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    rec_dir = os.environ.get("AOTI_FARM_RECORD_DIR")
    if rec_dir:
        from .recorder import Recorder
        from aoti_farm.trace import save_trace

        ops = os.environ.get("AOTI_FARM_RECORD_OPS")
        rec = Recorder(ops.split(",") if ops else None)

        def _write() -> None:
            rec.stop()
            save_trace(rec.trace(), os.path.join(rec_dir, f"trace-{os.getpid()}.json"))

        atexit.register(_write)
    raw = os.environ.get("AOTI_FARM_HOOK")
    if raw and raw != "0":
        from .hook import Settings, install

        global BOOTED
        args = {} if raw == "1" else child_arguments(raw)
        hook = install(settings=Settings(**args))
        BOOTED = hook.settings.config   # what this hook was installed with
        stats_dir = os.environ.get("AOTI_FARM_HOOK_STATS")

        def _stop() -> None:
            # at the program's exit: nothing here may raise into it (one line on stderr)
            try:
                hook.uninstall()
                if stats_dir:
                    _write_stats(stats_dir, hook.stats())
            except Exception as e:  # noqa: BLE001
                why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
                print(f"aoti-farm: hook stats not written to {stats_dir}: {why}", file=sys.stderr)

        atexit.register(_stop)


#: The hook settings this process's :func:`boot` resolved (None: no hook booted).
BOOTED = None


def child_arguments(raw: str) -> dict:
    """``AOTI_FARM_HOOK``'s JSON: fields of ``install()``'s ``Settings``, as :func:`run_command`
    wrote them."""
    try:
        args = json.loads(raw)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise UserError("AOTI_FARM_HOOK: not the JSON `aoti-farm run` writes; it is set by `aoti-farm run`, "
                        "unset it")
    return args


def _write_stats(stats_dir: str, stats: dict) -> None:
    """``stats_dir/stats-<pid>.json``, written whole or not at all."""
    path = os.path.join(stats_dir, f"stats-{os.getpid()}.json")
    fd, tmp = tempfile.mkstemp(prefix=".stats-", dir=stats_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
