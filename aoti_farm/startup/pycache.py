"""Compiled bytecode for the farm's own processes where Python would cache none.

Many container images set ``PYTHONDONTWRITEBYTECODE=1`` and ship packages without their
``__pycache__`` (seen on a 16-core GPU host: torch 2.11, sympy and
``torch._dynamo`` had no ``.pyc`` at all).  Then every Python process compiles every
module it imports from source: there, importing torch and the compile path took
11.7 s in one process, and a
``warm`` starts dozens of such processes (one per actor, their verification children,
the loader probe's and the ISA checks' loaders, the host preparation).

:func:`apply` gives the farm's child processes (and ``warm``'s driver) a bytecode cache of
their own instead, so that only the first process compiles each module from source (on
a fresh host :mod:`aoti_farm.startup.pyprecompile` fills it ahead of them):
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


def apply(here: bool = False) -> str | None:
    """Set up the bytecode cache for the children this process starts from now on (see
    the module doc); returns its directory, or None when it is not wanted or not usable.
    ``here``: this process imports through it too (``warm``'s driver, whose loader thread
    otherwise compiles torch from source beside ``ray.init``).  Never raises."""
    global _applied
    try:
        if not wanted():
            return None
        from aoti_farm.security.fsutil import memo_dir

        d = os.path.join(memo_dir(), "pycache")
        if not _private_dir(d):
            return None
        os.environ["PYTHONPYCACHEPREFIX"] = d
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        if here:   # Python reads both at each import
            sys.pycache_prefix = d
            sys.dont_write_bytecode = False
        _applied = d
        return d
    except Exception:  # noqa: BLE001 -- a speed-up only: Python's own setting stays
        return None
