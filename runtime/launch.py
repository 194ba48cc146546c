"""``aoti-farm run`` and ``aoti-farm record``: the hook and the recorder for unmodified programs.

Both run the command as a child whose PYTHONPATH starts with ``runtime/_site``, whose
``sitecustomize.py`` calls :func:`boot` in every Python process of the program (children
included) that sees the variables below:

* ``aoti-farm run [--cache-dir D] [--on-miss M] [--config F] -- python serve.py ARGS``:
  the hook configuration is resolved once here (``config.resolve(HookConfig, ...)``: CLI >
  environment > TOML) and handed to the child as ``AOTI_FARM_HOOK=1`` plus
  ``AOTI_FARM_<FIELD>`` variables.  ``AOTI_FARM_HOOK_STATS=DIR`` makes each process write
  its ``hook.stats()`` to ``DIR/stats-<pid>.json`` at exit.
* ``aoti-farm record --out trace.json -- python script.py ARGS``: ``AOTI_FARM_RECORD_DIR``
  names a temporary directory; each process writes ``trace-<pid>.json`` at exit and this
  process merges them (``aoti_farm.trace.merge``) into ``--out``.

The exit status is the program's (128+N when killed by signal N); a command that cannot
be started is a UserError (exit 2).

This module is a command layer (of ``aoti-farm run`` and of the child's side, :func:`boot`),
so it reads the environment: the variables above, and the hook's settings through
``config.resolve(HookConfig)``, which it passes to ``install`` explicitly.
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

from aoti_farm import loadenv
from aoti_farm.errors import UserError

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
_CHILD_VARS = ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD_DIR", "AOTI_FARM_HOOK_STATS")


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


def _env_value(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (tuple, list)):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        return json.dumps(v)
    return str(v)


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="kernel cache (default: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm)")
    p.add_argument("--on-miss", choices=("compile", "queue", "ignore"),
                   help="compile misses in a background worker (default), only queue them, or ignore them")
    p.add_argument("--serve", choices=("faster", "always"),
                   help="serve a cached kernel only where it is faster than eager (default), or always")
    p.add_argument("--config", help="TOML file with a [hook] table")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its arguments")


def run_command(ns) -> int:
    from aoti_farm.config import HookConfig, resolve

    cmd = _command(ns)
    cfg = resolve(HookConfig, cli={"cache_dir": ns.cache_dir, "on_miss": ns.on_miss,
                                     "serve": getattr(ns, "serve", None)},
                  config_path=getattr(ns, "config", None))
    extra = {"AOTI_FARM_HOOK": "1"}
    for f in dataclasses.fields(cfg):
        v = _env_value(getattr(cfg, f.name))
        name = f"AOTI_FARM_{f.name.upper()}"
        if v is not None:
            extra[name] = v
    env = _child_env(extra)
    env.pop("AOTI_FARM_CONFIG", None)  # resolved already; the child reads the environment only
    for f in dataclasses.fields(cfg):
        if getattr(cfg, f.name) is None:
            env.pop(f"AOTI_FARM_{f.name.upper()}", None)
    stats = os.environ.get("AOTI_FARM_HOOK_STATS")
    if stats:
        if not os.path.isdir(stats):
            raise UserError(f"AOTI_FARM_HOOK_STATS={stats}: no such directory; create it or unset the variable")
        env["AOTI_FARM_HOOK_STATS"] = stats
    return _run(cmd, env)


def add_record_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the trace to write (JSON)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its arguments")


def record_command(ns) -> int:
    from aoti_farm.trace import Trace, load_trace, merge, save_trace

    cmd = _command(ns)
    out = ns.out
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise UserError(f"--out {out}: directory {parent} does not exist; create it or pass another path")
    tmp = tempfile.mkdtemp(prefix="aoti-farm-record-")
    try:
        rc = _run(cmd, _child_env({"AOTI_FARM_RECORD_DIR": tmp}))
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


# --- the child side (called by sitecustomize) ----------------------------------------------------


def boot() -> None:
    """Install the hook and/or the recorder in this process, as the environment says."""
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    rec_dir = os.environ.get("AOTI_FARM_RECORD_DIR")
    if rec_dir:
        from aoti_farm.runtime.recorder import Recorder
        from aoti_farm.trace import save_trace

        rec = Recorder()

        def _write() -> None:
            rec.stop()
            save_trace(rec.trace(), os.path.join(rec_dir, f"trace-{os.getpid()}.json"))

        atexit.register(_write)
    if os.environ.get("AOTI_FARM_HOOK") == "1":
        from aoti_farm.cache import load_signing_key
        from aoti_farm.config import HookConfig, resolve
        from aoti_farm.runtime.hook import install

        cfg = resolve(HookConfig)
        key = load_signing_key(path=cfg.signing_key_file) if cfg.signing_key_file else None
        hook = install(cache_dir=cfg.cache_dir, ops=cfg.ops, devices=cfg.devices, on_miss=cfg.on_miss,
                       poll_interval=cfg.poll_interval, allow_insecure=cfg.allow_insecure,
                       inductor_options=cfg.inductor_options, yield_core=cfg.yield_core, serve=cfg.serve,
                       explain_misses=cfg.explain_misses, memory_budget=cfg.memory_budget, signing_key=key,
                       widen=cfg.widen, install_trial=cfg.install_trial)
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
