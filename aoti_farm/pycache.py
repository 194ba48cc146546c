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
#: packages were byte-compiled: (package, file in it).  Looked up by path: finding a
#: submodule's spec would import its parent (torch._dynamo: 6 s from source on the GPU host).
PROBE = ("torch", "_dynamo/convert_frame.py")

_applied: str | None = None


def wanted() -> bool:
    """Whether the farm's processes should get a bytecode cache (see the module doc).
    Read from this process's own flags, which Python set from its environment at start."""
    if sys.pycache_prefix or not sys.flags.dont_write_bytecode:
        return False
    return not _has_bytecode()


def _has_bytecode(probe: tuple = None) -> bool:
    """Whether ``probe``'s file (default :data:`PROBE`) has cached bytecode where Python
    would look without a prefix.  Imports nothing (a top-level package's spec only)."""
    package, rel = probe or PROBE
    try:
        spec = importlib.util.find_spec(package)
        locs = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
        if not locs:
            return True   # nothing to tell: leave Python's setting alone
        src = os.path.join(locs[0], rel)
        if not os.path.exists(src):
            return True
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
        return d
    except Exception:  # noqa: BLE001 -- a speed-up only: Python's own setting stays
        return None


# --- filling a fresh cache ahead of the imports -----------------------------------------------

#: The packages a compile actor imports (2,523 modules on the 2-core VM with torch 2.13:
#: sympy 420, networkx 285, torch's Inductor, Dynamo, nn, fx, distributed, ...), byte-
#: compiled into a fresh cache by :func:`precompile_start`; absent ones are skipped.
PRECOMPILE = ("torch", "sympy", "networkx", "mpmath", "jinja2", "triton", "numpy", "filelock", "msgpack",
              "aoti_farm")
#: Not compiled ahead (nothing the farm imports): test folders, torch's test helpers.
EXCLUDE = ("/test/", "/tests/", "/testing/_internal/")
#: Below this many cores the imports themselves keep the cores busy: nothing ahead.
PRECOMPILE_MIN_CORES = 4
#: ``AOTI_FARM_PYC_PRECOMPILE=0``: no filling ahead (A/B).
PRECOMPILE_ENV = "AOTI_FARM_PYC_PRECOMPILE"

_bg = None


def precompile_enabled() -> bool:
    return os.environ.get(PRECOMPILE_ENV, "1") != "0"


def precompile_start() -> int | None:
    """Right after :func:`apply` set a cache up (a fresh one fills as processes import),
    byte-compile :data:`PRECOMPILE` into it at once, with one process per core but four
    (``python -m aoti_farm.pycache --precompile N``), without waiting for it.

    Why: importing is serial, compiling files is not.  On the 16-core GPU host the 16
    Ray workers started at about 8 s and each compiled the same modules from source
    while importing (7-11 s each with 16 at once, run 12), and so did the host
    preparation and the ISA probe.  Here the files are compiled in parallel from the
    command's start (about 2,500 modules: 6.4 s on 2 cores here; importing the actors'
    modules took 8.8 s from source and 3.0 s with the cache filled).  A process that
    imports a module before it is done compiles it itself, as before; Python writes
    ``.pyc`` files atomically, so the race is harmless.  Returns the number of processes,
    or None (not applied, fewer than :data:`PRECOMPILE_MIN_CORES` cores, turned off)."""
    global _bg
    cores = os.cpu_count() or 1
    if _applied is None or cores < PRECOMPILE_MIN_CORES or not precompile_enabled() or _bg is not None:
        return None
    import subprocess

    n = max(1, cores - 4)
    try:
        _bg = subprocess.Popen([sys.executable, "-m", "aoti_farm.pycache", "--precompile", str(n), *PRECOMPILE],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return n


def precompile_stop() -> bool | None:
    """End :func:`precompile_start`'s process if it still runs (the command ends); True
    if it had finished by itself, None if none was started."""
    global _bg
    p, _bg = _bg, None
    if p is None:
        return None
    done = p.poll() is not None
    if not done:
        p.terminate()
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            p.kill()
    return done


def _sources(packages: list[str]) -> list[str]:
    """The ``.py`` files of ``packages`` (found without importing them) that have no
    cached bytecode under this process's prefix yet, package by package."""
    out = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in list(getattr(spec, "submodule_search_locations", None) or []) if spec else []:
            for root, dirs, files in os.walk(loc):
                dirs[:] = sorted(x for x in dirs if x != "__pycache__")
                if any(e in root.replace(os.sep, "/") + "/" for e in EXCLUDE):
                    continue
                for f in sorted(files):
                    if f.endswith(".py"):
                        path = os.path.join(root, f)
                        if not os.path.exists(importlib.util.cache_from_source(path)):
                            out.append(path)
    return out


def _compile_one(path: str) -> bool:
    import py_compile

    try:
        py_compile.compile(path, doraise=True, quiet=2)
        return True
    except Exception:  # noqa: BLE001 -- a file Python cannot compile: its importer says so
        return False


def _precompile_main(argv: list[str]) -> int:
    n, packages = int(argv[0]), argv[1:]
    if not sys.pycache_prefix:
        return 2   # never next to the sources
    files = _sources(packages)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max(1, n)) as ex:
        list(ex.map(_compile_one, files, chunksize=16))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--precompile"]:
        sys.exit(_precompile_main(sys.argv[2:]))
