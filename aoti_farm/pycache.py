"""Compiled bytecode for the farm's own processes where Python would cache none.

Many container images set ``PYTHONDONTWRITEBYTECODE=1`` and ship packages without their
``__pycache__`` (seen on the lent 16-core GPU host, 2026-11-26: torch 2.11, sympy and
``torch._dynamo`` had no ``.pyc`` at all).  Then every Python process compiles every
module it imports from source: there, importing torch and the compile path took
11.7 s in one process (``docs/bench/2026-11-26-gpu-11-scaling-diag.log``), and a
``warm`` starts dozens of such processes (one per actor, their verification children,
the loader probe's and the ISA checks' loaders, the host preparation).

:func:`apply` gives the farm's child processes a bytecode cache of their own instead:
``PYTHONPYCACHEPREFIX=<memo dir>/pycache`` and no ``PYTHONDONTWRITEBYTECODE`` in this
process's environment, which every child it starts (Ray's workers, through the raylet)
inherits.  Python then writes and reads ``.pyc`` files only under that private
directory, never next to the sources, so the user's wish not to litter their packages
is kept.  Python validates each ``.pyc`` against its source (mtime and size) and writes
them atomically, so concurrent processes and changed sources are safe.

Only when it helps: bytecode writing is off (the flag or the variable), no prefix is set
already, and torch's own compile path has no cached bytecode where Python would look
(an image whose packages were byte-compiled at install keeps using those).  Setting
``PYTHONPYCACHEPREFIX`` yourself keeps it off.  The directory is created private (0700)
and used only if it is this user's and nobody else can write to it.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import sys

#: A module of the compile path whose cached bytecode tells whether the installed
#: packages were byte-compiled (looked up without importing it).
PROBE_MODULE = "torch._dynamo.convert_frame"

_applied: str | None = None


def wanted() -> bool:
    """Whether the farm's processes should get a bytecode cache (see the module doc).
    Read from this process's own flags, which Python set from its environment at start."""
    if sys.pycache_prefix or not sys.flags.dont_write_bytecode:
        return False
    return not _has_bytecode(PROBE_MODULE)


def _has_bytecode(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
        src = spec.origin if spec is not None else None
        if not src or not src.endswith(".py"):
            return True   # nothing to tell: leave Python's setting alone
        pyc = os.path.join(os.path.dirname(src), "__pycache__",
                           f"{os.path.basename(src)[:-3]}.{sys.implementation.cache_tag}.pyc")
        return os.path.exists(pyc)
    except (ImportError, ValueError, AttributeError):
        return True


def _private_dir(path: str) -> bool:
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
                and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        return False


def apply() -> str | None:
    """Set up the bytecode cache for the children this process starts from now on (see
    the module doc); returns its directory, or None when it is not wanted or not usable.
    Never raises."""
    global _applied
    try:
        if not wanted():
            return None
        from aoti_farm.fsutil import memo_dir

        d = os.path.join(memo_dir(), "pycache")
        if not _private_dir(d):
            return None
        os.environ["PYTHONPYCACHEPREFIX"] = d
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        _applied = d
        _compile_in_background()
        return d
    except Exception:  # noqa: BLE001 -- a speed-up only: Python's own setting stays
        return None


#: The packages the farm's processes import (torch, Inductor's dependencies, Ray), byte-
#: compiled into the cache at once by :func:`_compile_in_background`; absent ones are skipped.
#: In this order (compileall takes one folder after another): what every process needs first.
PACKAGES = ("torch", "ray", "sympy", "networkx", "mpmath", "jinja2", "triton", "numpy", "filelock", "msgpack",
            "aoti_farm")
#: Not compiled ahead (nothing the farm imports): test folders, torch's test helpers.
EXCLUDE = r"[/\\](tests?|testing[/\\]_internal)[/\\]"

_bg = None


def _compile_in_background() -> None:
    """Byte-compile :data:`PACKAGES` into the cache with one process per core, at low
    priority, without waiting: a fresh cache is filled on cores that are idle while Ray
    starts, instead of by each importing process one module after another (an import is
    serial; compiling files is not).  Processes that import a module before it is done
    compile it themselves, as without this; Python's atomic writes make the race
    harmless.  Ended by :func:`stop_background` when the command ends."""
    global _bg
    import shutil
    import subprocess

    dirs = []
    for name in PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        locs = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
        dirs += [x for x in locs if os.path.isdir(x)]
    if not dirs or (_bg is not None and _bg.poll() is None):
        return
    cmd = [sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", EXCLUDE, *dirs]
    nice = shutil.which("nice")
    if nice:
        cmd = [nice, "-n", "10", *cmd]
    _bg = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_background() -> None:
    """End the background compile of :func:`apply` if it still runs (the command ends)."""
    global _bg
    p, _bg = _bg, None
    if p is not None and p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            p.kill()


def applied() -> str | None:
    """The directory :func:`apply` set up in this process, if any (for the warm report)."""
    return _applied
