"""The compile path's bytecode, compiled in parallel before the farm's processes import it.

Where :mod:`aoti_farm.pycache` gives the farm's processes a bytecode cache of their own
(an image that ships its packages without bytecode), that cache starts empty on a fresh
host, and every process of a ``warm`` compiles the same ~2,500 modules from source at
once: the ISA probe's child, the host preparation, the driver's loader thread and 16
actors.  On the 2-core VM importing the compile path took 10.2-11.5 s from source and
3.0 s from bytecode (torch 2.13, 2026-11-27).  On the 16-core GPU host the actors'
imports took 6-7 s each and ended together at about 14 s, while the ISA probe's child
imported torch from source too (run 13, ``docs/bench/2026-11-27-gpu-13-scaling.md``).

:func:`start` compiles the modules those processes import, in the order they import
them, in ``K`` short-lived children that each take every ``K``-th file, so together they
run ahead of any one importing process.  A process that reaches a module before its
bytecode is written compiles it itself, as it would without this module; Python writes
and validates each ``.pyc`` atomically (source mtime and size), so the race only decides
who compiles a module, never what is imported.  The children compile exactly what
Python's import would: the same source files, the same ``.pyc`` paths under the prefix,
timestamp-validated.

Which modules: :data:`LIST`, module names in import order, recorded by
:func:`record` from a real compile of the farm's (``python -m aoti_farm.pyprecompile
--write``).  A name the installed packages lack is skipped, and a module the list lacks
is compiled by its importer, so a list recorded on another torch only costs time.
``tests/test_pyprecompile.py`` fails when the list no longer covers what the compile
path imports here.

Only where it helps: the farm's bytecode cache is in use (:func:`aoti_farm.pycache.apply`),
the host has at least :data:`MIN_CORES` cores, and the cache does not hold the list's
bytecode already.  ``AOTI_FARM_PRECOMPILE=0`` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ENV = "AOTI_FARM_PRECOMPILE"
LIST = Path(__file__).with_name("import_path.txt")
#: Below this many cores the children would take the CPU from the imports they serve.
MIN_CORES = 4
#: At most this many children.
MAX_WORKERS = 16

_CHILD = r"""
import py_compile, sys, time
from importlib.util import MAGIC_NUMBER, cache_from_source
files = [f for f in sys.stdin.read().split("\0") if f]
done = skipped = failed = 0
for src in files:
    try:
        st = __import__("os").stat(src)
        with open(cache_from_source(src), "rb") as f:
            h = f.read(16)
        if (len(h) == 16 and h[:4] == MAGIC_NUMBER and h[4:8] == b"\0\0\0\0"
                and int.from_bytes(h[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(h[12:16], "little") == st.st_size & 0xFFFFFFFF):
            skipped += 1
            continue
    except OSError:
        pass
    try:
        py_compile.compile(src, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        done += 1
    except Exception:
        failed += 1
print(done, skipped, failed, time.time())
"""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def module_names(path: Path | None = None) -> list[str]:
    """The list's module names (default :data:`LIST`), in its order."""
    try:
        lines = (line.strip() for line in (path or LIST).read_text(encoding="utf-8").splitlines())
        return [n for n in lines if n and not n.startswith("#")]
    except OSError:
        return []


def source_files(names: list[str], search: list[str] | None = None) -> list[str]:
    """The source file of each named module, found the way Python's path finder would,
    without importing anything; names not found (builtins, extensions, another torch's
    modules) are left out.  Order kept, duplicates dropped."""
    from importlib.machinery import PathFinder

    search = list(sys.path if search is None else search)
    tops: dict[str, list[str] | str | None] = {}
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        parts = name.split(".")
        top = parts[0]
        if top not in tops:
            loc = None
            if top not in sys.builtin_module_names:
                try:
                    spec = PathFinder.find_spec(top, search)
                except (ImportError, ValueError):
                    spec = None
                if spec is not None:
                    if spec.submodule_search_locations:
                        loc = list(spec.submodule_search_locations)
                    elif spec.origin and spec.origin.endswith(".py"):
                        loc = spec.origin
            tops[top] = loc
        loc = tops[top]
        f = None
        if isinstance(loc, str):
            f = loc if len(parts) == 1 else None
        elif loc:
            f = _in_package(loc, parts[1:])
        if f and f not in seen:
            seen.add(f)
            out.append(f)
    return out


def _in_package(dirs: list[str], rest: list[str]) -> str | None:
    """The source of submodule ``rest`` of the package at ``dirs`` (``[]``: its own
    ``__init__.py``), as Python's path finder resolves it."""
    if not rest:
        f = os.path.join(dirs[0], "__init__.py") if dirs else ""
        return f if f and os.path.isfile(f) else None
    for i, part in enumerate(rest):
        last = i == len(rest) - 1
        nxt: list[str] = []
        for d in dirs:
            sub = os.path.join(d, part)
            if os.path.isfile(os.path.join(sub, "__init__.py")):   # a regular package
                if last:
                    return os.path.join(sub, "__init__.py")
                nxt = [sub]
                break
            if os.path.isfile(sub + ".py"):
                return sub + ".py" if last else None
            if os.path.isdir(sub):   # a namespace package's portion
                nxt.append(sub)
        if not nxt:
            return None
        dirs = nxt
    return None


def _fresh(src: str, prefix: str) -> bool:
    """Whether ``src`` has bytecode under ``prefix`` that Python would use as it is."""
    try:
        st = os.stat(src)
        pyc = os.path.join(prefix, os.path.abspath(src).lstrip(os.sep))
        pyc = os.path.join(os.path.dirname(pyc), f"{os.path.basename(src)[:-3]}.{sys.implementation.cache_tag}.pyc")
        with open(pyc, "rb") as f:
            h = f.read(16)
        from importlib.util import MAGIC_NUMBER

        return (len(h) == 16 and h[:4] == MAGIC_NUMBER and h[4:8] == b"\0\0\0\0"
                and int.from_bytes(h[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(h[12:16], "little") == st.st_size & 0xFFFFFFFF)
    except OSError:
        return False


class Precompile:
    """The running children: :meth:`result` reaps them (never raises)."""

    def __init__(self, procs: list, n_files: int, t0: float):
        self.procs, self.n_files, self.t0 = procs, n_files, t0
        self._result: dict | None = None

    def result(self, timeout: float = 60.0) -> dict:
        """``{"files", "workers", "compiled", "skipped", "failed", "span"}``: what the
        children did and when the last one ended."""
        if self._result is not None:
            return self._result
        done = skipped = failed = 0
        end = self.t0
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=timeout)
                d, s, f, t = out.split()
                done, skipped, failed = done + int(d), skipped + int(s), failed + int(f)
                end = max(end, float(t))
            except (subprocess.TimeoutExpired, ValueError, OSError):
                failed += 1
                p.kill()
                p.wait()
        self._result = {"files": self.n_files, "workers": len(self.procs), "compiled": done, "skipped": skipped,
                        "failed": failed, "span": [self.t0, end]}
        return self._result


def start(prefix: str | None, n_cpu: int | None = None) -> Precompile | None:
    """Start compiling the list's bytecode into ``prefix`` (the farm's bytecode cache, or
    None: nothing to do); None where it does not apply (see the module doc).  Starts only
    processes, no thread, so a ``fork`` afterwards is safe, and writes no file of its own
    (each child reads its share of the list from its standard input).  Never raises."""
    try:
        n_cpu = n_cpu or len(os.sched_getaffinity(0))
        if not prefix or not enabled() or n_cpu < MIN_CORES:
            return None
        t0 = time.time()
        files = source_files(module_names())
        if not files or all(_fresh(f, prefix) for f in (files[0], files[len(files) // 2], files[-1])):
            return None
        k = max(1, min(MAX_WORKERS, n_cpu - 2, len(files)))
        env = {key: v for key, v in os.environ.items() if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        argv = [sys.executable, "-S", "-X", f"pycache_prefix={prefix}", "-c", _CHILD]
        procs = []
        for i in range(k):
            # the child reads its whole share first thing (on 16 cores ~20 KB, under a pipe's buffer)
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 env=env, text=True)
            procs.append(p)
            try:
                p.stdin.write("\0".join(files[i::k]))
                p.stdin.close()
            except OSError:
                pass
            p.stdin = None   # written and closed: communicate() must not flush it
        return Precompile(procs, len(files), t0)
    except Exception:  # noqa: BLE001 -- a speed-up only: the importers compile what they need
        return None


# --- the list -------------------------------------------------------------------------

_RECORD = r"""
import os, sys, tempfile
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="aoti-farm-rec-ind-")
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="aoti-farm-rec-xdg-")
import ray, ray.actor  # the driver's and Ray workers' imports
import aoti_farm.workers.actor_preload  # the actors' warm-up imports
import aoti_farm.workers.compile_actor, aoti_farm.verifyserver, aoti_farm.hostprep
out = aoti_farm.hostprep.prepare()  # the ISA probe and a real compile (lazy imports of lowering and codegen)
if out.get("status") not in ("prepared", "done"):
    sys.exit("the trivial compile did not run: %r" % (out,))
print("\n".join(sys.modules))
"""


def record() -> list[str]:
    """Module names in the order a fresh process imports them on the farm's compile path
    (Ray, the actors' warm-up, the ISA probe, one real compile), from a child."""
    out = subprocess.run([sys.executable, "-c", _RECORD], capture_output=True, text=True, timeout=900, check=True)
    names = [n for n in out.stdout.split() if n and n != "__main__"]
    return [n for n in names if n.split(".")[0] not in sys.builtin_module_names]


def _main(argv: list[str]) -> int:
    if argv[:1] != ["--write"]:
        print("usage: python -m aoti_farm.pyprecompile --write   (records the compile path's modules into "
              f"{LIST.name})", file=sys.stderr)
        return 2
    names = record()
    import torch

    LIST.write_text(f"# the compile path's modules in import order, recorded by `python -m aoti_farm.pyprecompile "
                    f"--write` (torch {torch.__version__}, Python {sys.version.split()[0]})\n" + "\n".join(names) + "\n",
                    encoding="utf-8")
    print(f"{LIST}: {len(names)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
