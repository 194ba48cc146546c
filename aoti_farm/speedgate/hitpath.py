"""Building and loading the native hit path's extension (``runtime/fastpath.cpp``).

The serving hook's per-call work is C++ when this extension is available (the hook's side
is :mod:`aoti_farm.runtime.native`); the compiler times a kernel through it too
(:func:`aoti_farm.speedgate.speed.time_served_call`), so that the speed ``warm`` prints, the gate's
compile-time record and the hook's on-host trial measure one thing: a call as the hook
serves it.  This module is the core's part: where the extension lives, how it is built,
and loading it; it imports nothing of the runtime.

The extension is compiled on the host that uses it, against the torch that is installed
(it includes torch's C++ headers, so it must match the torch build exactly), with the C++
compiler AOTInductor itself uses.  It is built once per (source, torch build, Python,
compiler) into ``$AOTI_FARM_NATIVE_DIR`` (default ``<private dir>/native``, the private
per-user directory of :mod:`aoti_farm.security.private`, apart from the shared kernel cache):
compiled into a temporary file and renamed into place, under a ``filelock`` so that
processes starting together build it once.  A build takes about 30 s on 2 cores.

A library this process loads runs as this process, so before any load the path is walked
with :func:`aoti_farm.security.private.check_tree` (each directory from the native directory down
this user's, writable by no one else, no links; the library too), whether the directory
is the default or ``AOTI_FARM_NATIVE_DIR``.  A refused one is not loaded (:func:`error`
says why) and never rebuilt over.

* ``python -m aoti_farm.runtime.native build`` builds it (``aoti-farm warm`` starts this
  in the background too); ``status`` prints where it is.
* :func:`load` imports it if built, never builds and never raises.
* ``AOTI_FARM_NATIVE=0`` turns the native path off everywhere (pure-Python hook).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from aoti_farm.security.fsutil import memo_dir

def _runtime_dir() -> Path:
    """The ``aoti_farm.runtime`` package's folder (``runtime/`` in a checkout), found
    without importing it."""
    import importlib.util as iu

    try:
        spec = iu.find_spec("aoti_farm.runtime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "runtime"   # a checkout not installed


SOURCE = _runtime_dir() / "fastpath.cpp"
MODULE = "_aoti_farm_native"
#: Seconds a build may take before it is abandoned.
BUILD_TIMEOUT = 900

_lock = threading.Lock()
_loaded = None
_load_error: str | None = None


def disabled() -> bool:
    return os.environ.get("AOTI_FARM_NATIVE", "").strip().lower() in ("0", "off", "false", "no")


def typed_entry() -> bool:
    """Whether the extension registers a served op unboxed where its C++ signature allows
    (``fastpath.cpp``: the typed entry); ``AOTI_FARM_DEV=typed_entry=0`` registers all
    boxed.  The hook and the compile-time speed measurement read the same switch, so both
    time the call the hook makes."""
    from aoti_farm.config import dev

    return dev("typed_entry") != "0"


def compiler() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def build_id() -> str:
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    for part in (torch.__version__, torch.version.git_version, str(torch.compiled_with_cxx11_abi()),
                 sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "", _compiler_version(compiler())):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


def native_dir() -> Path:
    d = os.environ.get("AOTI_FARM_NATIVE_DIR")   # a documented low-level switch (runtime/settings.py)
    if d:
        return Path(os.path.abspath(d))
    return Path(memo_dir()) / "native"


def library_path() -> Path:
    return native_dir() / build_id() / (MODULE + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def command(out: str) -> list[str]:
    tdir = Path(torch.__file__).parent
    inc = tdir / "include"
    lib = tdir / "lib"
    return [
        compiler(), "-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-I{inc}", f"-I{inc / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{sysconfig.get_paths()['include']}",
        str(SOURCE), "-o", out, f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
        f"-Wl,-rpath,{lib}",
    ]


def build(verbose: bool = False) -> Path:
    """Build the extension if it is not built yet; returns its path.  Raises RuntimeError
    with the compiler's message on failure."""
    from filelock import FileLock

    from aoti_farm.security import private

    path = library_path()
    private.ensure_dir(native_dir())
    private.ensure_dir(path.parent)
    if path.exists():
        private.check_tree(path, native_dir())
        return path
    with FileLock(str(path.parent / ".build.lock"), timeout=BUILD_TIMEOUT):
        if path.exists():
            return path
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            cmd = command(tmp)
            if verbose:
                print(" ".join(cmd), file=sys.stderr)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
            if r.returncode != 0:
                msg = "\n".join(line for line in r.stderr.splitlines() if "error" in line)[:2000]
                raise RuntimeError(f"building {SOURCE.name} failed (exit {r.returncode}): {msg or r.stderr[-2000:]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def load():
    """The extension module if it is built and loads here, else None (see :func:`error`)."""
    global _loaded, _load_error
    with _lock:
        if _loaded is not None:
            return _loaded
        if disabled():
            _load_error = "disabled by AOTI_FARM_NATIVE=0"
            return None
        from aoti_farm.startup import loadenv

        if not loadenv.load_safe():
            _load_error = "this process cannot load native libraries safely (libstdc++ preload needed)"
            return None
        from aoti_farm.security import private

        path = library_path()
        if not path.exists():
            _load_error = f"not built ({path})"
            return None
        try:
            private.check_tree(path, native_dir())
        except OSError as e:   # someone else's directory or library: never loaded
            _load_error = f"refused {path}: {e}"
            return None
        try:
            spec = importlib.util.spec_from_file_location(MODULE, str(path))
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001 -- a stale or broken build: the Python path serves
            _load_error = f"cannot load {path}: {type(e).__name__}: {e}"
            return None
        _loaded, _load_error = mod, None
        return mod


def error() -> str | None:
    """Why :func:`load` returned None last time."""
    return _load_error
