"""The bytecode of what a ``warm``'s processes import, compiled in parallel before they import it.

Where :mod:`aoti_farm.startup.pycache` gives the farm's processes a bytecode cache of their own
(an image that ships its packages without bytecode), that cache starts empty on a fresh
host, and every process of a ``warm`` compiles the same modules from source at once:
the driver, Ray's own processes and agents, the ISA probe's child, the host preparation,
the fork server and the actors.  Importing torch and the compile path from source takes
three to four times as long as from bytecode, and on a fresh many-core host those
imports are the start-up's critical path: the ISA probe's child imports torch and
Inductor before it can answer, and no actor compiles before that answer.

:func:`start` compiles those modules, in the order they are imported, in ``K``
short-lived children that each take every ``K``-th file, so together they run ahead of
any one importing process.  A process that reaches a module before its bytecode is
written compiles it itself, as it would without this module; Python writes and
validates each ``.pyc`` atomically (source mtime and size), so the race only decides who
compiles a module, never what is imported.  The children compile exactly what Python's
import would: the same source files into the same ``.pyc`` paths under the prefix,
timestamp-validated.

Which modules: :data:`LIST`, module names in import order, recorded by :func:`record`
(``python -m aoti_farm.startup.pyprecompile --write``): a real ``warm`` of one signature whose
processes all import through a fresh bytecode cache; the ``.pyc`` files it holds
afterwards, by the time each was written, are the list.  A new recording is added to
the list, not put in its place: environments differ (a CUDA build of torch imports
triton, Python builds freeze different modules).  A name the installed packages
lack is skipped, and a module the list lacks is compiled by its importer, so a list
recorded on another torch or Ray only costs time.  ``tests/e2e/test_pyprecompile.py`` fails
when the list no longer covers what the compile path imports here.

Only where it helps: the farm's bytecode cache is in use (:func:`aoti_farm.startup.pycache.apply`),
the host has at least :data:`MIN_CORES` cores, and the cache does not hold the list's
bytecode already.  ``AOTI_FARM_DEV=precompile=0`` turns it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from aoti_farm.startup import spawn
from aoti_farm.config import dev as _dev   # AOTI_FARM_DEV, parsed in one place

DEV = "precompile"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
LIST = Path(__file__).with_name("import_path.txt")
#: Below this many cores the children would take the CPU from the imports they serve.
MIN_CORES = 4
#: At most this many children.
MAX_WORKERS = 16

#: A child: compiles the files named on its standard input, skipping those whose bytecode
#: is current (the header test of :func:`_fresh`), and prints what it did and when it ended.
_CHILD = r"""
import os, py_compile, sys, time
from importlib.util import MAGIC_NUMBER, cache_from_source
files = [f for f in sys.stdin.read().split("\0") if f]
done = skipped = failed = 0
for src in files:
    try:
        st = os.stat(src)
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
    return _dev(DEV) != "0"


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

    search = list(_search_path() if search is None else search)
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
        children did and when the last one ended; a child still running after ``timeout``
        seconds in all is killed and counted as failed."""
        if self._result is not None:
            return self._result
        done = skipped = failed = 0
        end = self.t0
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
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

    def cancel(self) -> None:
        """Stop the children still running (the command failed before it needed them;
        a stopped compile leaves no ``.pyc``: Python writes each by rename).  Never raises."""
        for p in self.procs:
            try:
                if p.poll() is None:
                    p.kill()
                p.communicate(timeout=30)
            except Exception:  # noqa: BLE001 -- a child already gone
                pass


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
        k = max(1, min(MAX_WORKERS, n_cpu - 2, len(files)))   # two cores stay for the driver and Ray's start
        env = {key: v for key, v in os.environ.items() if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        argv = spawn.python("-S", "-X", f"pycache_prefix={prefix}", "-c", _CHILD)
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
import sys
from aoti_farm.workers import warm
warm.PREP_MIN_CORES = 1   # the many-core path (early Ray, forked ISA probe, host preparation) on any host
from aoti_farm.cli import main
sys.exit(main(["warm", "--model", sys.argv[1], "--cache-dir", sys.argv[2]]))
"""


def record() -> list[str]:
    """Module names in the order the processes of a real ``warm`` import them: the driver,
    Ray's own processes, an actor, the ISA probe, the host preparation and a
    verification, each through a fresh bytecode cache whose ``.pyc`` files, by the time
    they were written, give the modules and their order.  One real compile, in a child;
    run from a checkout (it warms ``configs/examples/mlp_trace.json``'s relu)."""
    import json
    import tempfile

    import importlib

    from aoti_farm.trace import FORMAT

    # this project's packages, wherever their directories are (an editable install maps them)
    import aoti_farm

    subpackages = [f"aoti_farm.{d.name}" for d in sorted(Path(aoti_farm.__file__).parent.iterdir())
                   if (d / "__init__.py").is_file()]
    roots = {os.path.dirname(importlib.import_module(m).__file__): m
             for m in ("aoti_farm", *subpackages, "aoti_farm.workers", "aoti_farm.runtime")}

    with tempfile.TemporaryDirectory(prefix="aoti-farm-record-") as tmp:
        entry = next(e for e in json.loads((Path(__file__).resolve().parents[2] / "configs" / "examples"
                                            / "mlp_trace.json").read_text())["entries"] if e["op"] == "aten::relu")
        trace = os.path.join(tmp, "relu.json")
        Path(trace).write_text(json.dumps({"format": FORMAT, "version": 1, "entries": [entry]}))
        prefix = os.path.join(tmp, "pycache")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "RAY_ADDRESS")}
        env.update(PYTHONPYCACHEPREFIX=prefix, XDG_CACHE_HOME=os.path.join(tmp, "xdg"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
        subprocess.run(spawn.python("-c", _RECORD, trace, os.path.join(tmp, "cache")), env=env, cwd=tmp,
                       capture_output=True, text=True, timeout=900, check=True)
        pycs = []
        for root, _, files in os.walk(prefix):
            for f in files:
                if f.endswith(f".{sys.implementation.cache_tag}.pyc"):
                    p = os.path.join(root, f)
                    pycs.append((os.stat(p).st_mtime_ns, p))
        names = []
        for _, p in sorted(pycs):
            src = os.sep + os.path.relpath(os.path.dirname(p), prefix)
            n = module_name(os.path.join(src, os.path.basename(p).split(".")[0] + ".py"), roots)
            if n and n not in names:
                names.append(n)
        return names


def _search_path() -> list[str]:
    """Where the farm's processes find modules: ``sys.path``, the directory this package
    is imported from (an editable install finds it through a meta-path finder, which the
    path finder used here does not consult), and the directory of third-party packages Ray
    adds to the path when imported (found without importing Ray)."""
    from importlib.machinery import PathFinder

    out = list(sys.path)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if here not in out:
        out.append(here)
    try:
        spec = PathFinder.find_spec("ray")
        for d in (spec.submodule_search_locations or []) if spec else []:
            out.append(os.path.join(d, "thirdparty_files"))
    except (ImportError, ValueError):
        pass
    return out


def module_name(src: str, roots: dict | None = None) -> str | None:
    """The dotted name under which ``src`` is imported: from a package directory of
    ``roots`` (``{directory: package}``), else from the search path; or None."""
    d = os.path.dirname(src)
    if roots and d in roots:
        base = os.path.basename(src)[:-3]
        return roots[d] if base == "__init__" else f"{roots[d]}.{base}"
    best = None
    for d in _search_path():
        d = os.path.abspath(d or ".")
        if src.startswith(d + os.sep) and (best is None or len(d) > len(best)):
            best = d
    if best is None:
        return None
    parts = os.path.relpath(src, best)[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def _exists(name: str) -> bool:
    """Whether ``name`` (``aoti_farm.``...) is a module or package of this checkout or
    install, read from the file tree (nothing imported)."""
    import aoti_farm

    pkg = Path(aoti_farm.__file__).parent
    parts = name.split(".")[1:]
    bases = [pkg.joinpath(*parts)]
    if parts and parts[0] in aoti_farm.SIBLINGS:   # a checkout's top-level folders, mapped at run time
        bases.append(pkg.parent.joinpath(*parts))
    return any(b.with_suffix(".py").is_file() or (b / "__init__.py").is_file() for b in bases)


def _main(argv: list[str]) -> int:
    if argv[:1] != ["--write"]:
        print("usage: python -m aoti_farm.startup.pyprecompile --write   (records the compile path's modules here and adds "
              f"them to {LIST.name})", file=sys.stderr)
        return 2
    names = record()
    # a union: what a warm imports differs between environments (a CUDA build of torch
    # imports triton; Python builds freeze different modules), and a listed module the
    # host lacks is skipped
    new = set(names)
    # ... but a module of this package that an earlier recording named and this checkout
    # no longer has is gone, not another environment's: dropped
    merged = names + [n for n in module_names() if n not in new and (n.split(".")[0] != "aoti_farm" or _exists(n))]
    import torch

    LIST.write_text("# the modules a warm's processes import, in import order: the union of recordings by "
                    "`python -m aoti_farm.startup.pyprecompile --write`\n"
                    f"# (the last: torch {torch.__version__}, Python {sys.version.split()[0]})\n"
                    + "\n".join(merged) + "\n", encoding="utf-8")
    print(f"{LIST}: {len(merged)} modules ({len(merged) - len(names)} from earlier recordings)")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
