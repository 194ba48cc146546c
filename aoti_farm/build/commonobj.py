"""The split build's per-host products (:mod:`aoti_farm.build.splitbuild` says why and how):
the **common object** (the wrapper's model-independent half, ``<key>.o`` with its sha256,
built once per host and toolchain under a file lock, the model half compiling alongside)
and the model half's **precompiled prefix** (``<key>.pch.h`` and its ``.gch``, built once
per host and key after the compile that missed it, at the lowest CPU priority), both in
this user's private Inductor cache (``aoti_farm_common/``, :func:`common_dir`); and the
compiler processes that build them (:func:`_start`, :func:`_wait`, :func:`_run`).

The split build's counters and per-thread state live here too: :func:`splitbuild.stats`
reads them, and the patch in :mod:`aoti_farm.build.splitbuild` shares this thread's state
(``_tls``: the last build, the prefix left to build).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import select
import subprocess
import threading
import time
from pathlib import Path

import torch

from aoti_farm.config import dev as _dev   # AOTI_FARM_DEV, parsed in one place
from aoti_farm.metrics.counters import Counters
from aoti_farm.startup import spawn

EXPLICIT = "template class torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>;"
EXTERN = "extern " + EXPLICIT
PCH_DEV = "model_pch"   # 0: the model half includes Inductor's precompiled device header only

_tls = threading.local()
_lock = threading.Lock()
_counters = Counters("split", "whole", "common_built", "common_reused", "common_waited", "common_busy",
                     "fallback_no_interface", "fallback_common_failed", "fallback_model_failed",
                     "fallback_join_failed", "fallback_unsupported", "common_damaged", "common_unsafe",
                     "pch_built", "pch_failed", "gold_link", "gold_failed")
_failed_keys: set[str] = set()
_pch_started: set[str] = set()
_pch_threads: list[threading.Thread] = []
#: The precompiled prefix is built at the lowest CPU priority (compiles and serving go
#: first); :mod:`aoti_farm.compile.hostprep`, a child that exists to build such things before the
#: actors need them, sets this False.
PCH_IDLE = True
#: How long a compile waits for another process's build of the common object (its own
#: model half compiles meanwhile) before it builds its wrapper whole.
COMMON_WAIT_S = 300.0


def _count(name: str) -> None:
    _counters.inc(name)


@functools.lru_cache(maxsize=1)
def _toolchain_digest() -> str:
    """torch's version and the AOTI runtime headers the common object is built from."""
    h = hashlib.sha256(f"{torch.__version__}|{torch.version.git_version}".encode())
    inc = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor"
    for sub in ("aoti_runtime", "aoti_include"):
        d = inc / sub
        if d.is_dir():
            for f in sorted(d.iterdir()):
                if f.is_file():
                    h.update(f.name.encode())
                    h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=4)
def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def common_dir() -> str:
    """``<private Inductor cache>/aoti_farm_common``, created 0700 or checked (raises
    :class:`aoti_farm.security.safeio.UnsafeFile` for an unsafe one)."""
    from aoti_farm.security import private

    return private.ensure_dir(os.path.join(private.use_inductor_cache(), "aoti_farm_common"))


def _start(argv: list[str], cwd: str, idle: bool = False) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=spawn.lowest_priority if idle else None)
    except OSError:
        return None


def _wait(p: subprocess.Popen | None, timeout: float = 1800.0) -> bool:
    """Whether ``p`` exits 0 within ``timeout`` (killed if not).  Waits on a pidfd where
    there is one: ``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which every
    compile's critical path would pay at each of its waits."""
    if p is None:
        return False
    if p.returncode is not None:   # reaped already: its pid may be another process's now
        return p.returncode == 0
    try:
        if hasattr(os, "pidfd_open"):
            try:
                fd = os.pidfd_open(p.pid)
            except OSError:   # already reaped, or no pidfd here: Popen's own wait
                fd = -1
            if fd >= 0:
                try:
                    if not select.select([fd], [], [], timeout)[0]:
                        raise subprocess.TimeoutExpired(p.args, timeout)
                finally:
                    os.close(fd)
        return p.wait(timeout=timeout) == 0
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return False


def _run(argv: list[str], cwd: str) -> bool:
    return _wait(_start(argv, cwd))


def _intact(obj: str) -> bool:
    """The object is the one that was published: its bytes match its ``.sha256``, and
    both are this user's files, writable by no one else, in a private directory."""
    from aoti_farm.security import private

    try:
        private.check_file(obj)
        private.check_file(obj + ".sha256")
        want = Path(obj + ".sha256").read_text().strip()
        return hashlib.sha256(Path(obj).read_bytes()).hexdigest() == want
    except OSError:
        return False


def _remove_orphans(d: str, age_s: float = 3600.0) -> None:
    """Sources and half-written objects of builds that died (kill -9) an hour ago or more."""
    now = time.time()
    with contextlib.suppress(OSError):
        for f in os.scandir(d):
            if f.name.endswith((".cpp", ".tmp")) or ".o.tmp" in f.name:
                with contextlib.suppress(OSError):
                    if now - f.stat().st_mtime > age_s:
                        os.unlink(f.path)


def _common_key(common: str, argv: list[str], src_i: int, out_i: int) -> str:
    """The common object's key: its text, the exact compile command, the compiler's version,
    torch's and the AOTI runtime headers'.  The model half's precompiled prefix, a function
    of the same text and command, shares it."""
    norm = list(argv)
    norm[src_i], norm[out_i] = "<src>", "<obj>"
    return hashlib.sha256("\0".join([common, " ".join(norm), _compiler_version(argv[0]),
                                     _toolchain_digest()]).encode()).hexdigest()[:40]


def _model_prefix(model: str) -> str:
    """The model half's signature-independent prefix (its includes and the ``extern
    template`` line, :func:`split_wrapper`)."""
    return model[:model.index(EXTERN) + len(EXTERN)] + "\n"


def _pch_header(key: str) -> str | None:
    """The header ``<key>.pch.h`` (the model half's prefix) where its precompiled form
    ``<key>.pch.h.gch`` is ready, for the model half's ``-include``; else None (and
    :func:`start_pch_build` builds it for the compiles after this one).

    Inductor precompiles only the device include (``aoti_include/<device>.h``); the model
    half also parses AOTI's interface and container headers, a fifth of its compile.  The
    precompiled file is only this user's, in the private directory of the common object,
    published by rename; g++ checks it against the command itself and parses the header
    text instead where it does not match."""
    if _dev(PCH_DEV) == "0":
        return None
    try:
        d = common_dir()
    except OSError:
        return None
    header = os.path.join(d, f"{key}.pch.h")
    from aoti_farm.security import private

    try:
        private.check_file(header)
        private.check_file(header + ".gch")
        return header
    except OSError:
        return None


def _pch_command(model_argv: list[str], src_i: int, out_i: int) -> list[str]:
    """The model half's own command, compiling its prefix as a header into a ``.gch``
    (placeholders ``<header>`` and ``<gch>``)."""
    src, out = model_argv[src_i], model_argv[out_i]
    a = list(model_argv)
    i = a.index("-include")
    del a[i:i + 2]                      # the prefix includes the device header itself
    return [a[0], "-x", "c++-header", *("<header>" if x == src else "<gch>" if x == out else x
                                        for x in a[1:] if x != "-c")]


def start_pch_build() -> None:
    """Start building the precompiled prefix this thread's last compile went without (once
    per process and key, where no other process builds it), in a thread at the lowest CPU
    priority.  The compiler calls it when a compile is done, verification included: a
    host's first compiles (and a serving host's first miss) do not share their cores with
    it; :mod:`aoti_farm.compile.hostprep` builds it ahead of a warm's compiles."""
    todo, _tls.pch_todo = getattr(_tls, "pch_todo", None), None
    if todo is None:
        return
    key, header, prefix, argv = todo
    with _lock:
        if key in _pch_started:
            return
        _pch_started.add(key)
    try:
        t = threading.Thread(target=_build_pch, args=(header, prefix, argv), name="aoti-farm-pch", daemon=True)
        t.start()
        _pch_threads.append(t)
    except RuntimeError:   # no thread to be had: a later compile here does without it too
        _count("pch_failed")


def wait_pch(timeout: float = 120.0) -> None:
    """Wait for this process's precompiled-prefix builds (a process that exits right after
    its compile, :mod:`aoti_farm.compile.hostprep`'s, would otherwise leave them half done)."""
    deadline = time.monotonic() + timeout
    for t in list(_pch_threads):
        t.join(max(0.0, deadline - time.monotonic()))


def _build_pch(header: str, prefix: str, argv: list[str]) -> None:
    cwd = os.path.dirname(header)   # the compile's own build directory is gone by now
    from filelock import FileLock, Timeout

    lock = FileLock(header + ".lock", timeout=0)
    try:
        lock.acquire()
    except Timeout:      # another process builds it
        return
    tmp_h = f"{header}.{os.getpid()}.tmp"
    tmp_gch = f"{header}.{os.getpid()}.gch.tmp"
    try:
        Path(tmp_h).write_text(prefix)
        os.replace(tmp_h, header)       # the same text for every writer of this key
        if _wait(_start([header if x == "<header>" else tmp_gch if x == "<gch>" else x for x in argv], cwd,
                        idle=PCH_IDLE)) and os.path.getsize(tmp_gch) > 0:
            os.replace(tmp_gch, header + ".gch")
            _count("pch_built")
        else:
            _count("pch_failed")
    except OSError:
        _count("pch_failed")
    finally:
        for f in (tmp_h, tmp_gch):
            with contextlib.suppress(OSError):
                os.unlink(f)
        lock.release()


def _common_object(common: str, argv: list[str], src_i: int, out_i: int, cwd: str,
                   meanwhile=None) -> tuple[str | None, str]:
    """The common object's path (building it if this process may), or None and why not.
    ``meanwhile()`` is called just before a build of the common object starts (the
    caller starts its model half then, so the two compile side by side)."""
    key = _common_key(common, argv, src_i, out_i)
    if key in _failed_keys:
        return None, "common_failed"
    try:
        d = common_dir()
    except OSError:   # an unsafe directory: nothing in it is linked
        _count("common_unsafe")
        return None, "common_unsafe"
    obj = os.path.join(d, f"{key}.o")
    if _intact(obj):
        _count("common_reused")
        return obj, "reused"
    os.makedirs(d, exist_ok=True)
    from filelock import FileLock, Timeout

    lock = FileLock(obj + ".lock", timeout=0)
    waited = False
    try:
        lock.acquire()
    except Timeout:
        # another process builds it right now (on a fresh host, every actor's first
        # compile): compile this model half meanwhile and wait for that object, rather
        # than compile the whole wrapper (the common half again, and then some)
        if meanwhile is not None:
            meanwhile()
            meanwhile = None
        try:
            lock.acquire(timeout=COMMON_WAIT_S)
        except Timeout:
            _count("common_busy")
            return None, "common_busy"
        waited = True
    try:
        if _intact(obj):
            _count("common_waited" if waited else "common_reused")
            return obj, "waited" if waited else "reused"
        _remove_orphans(d)
        how = "built"
        if os.path.exists(obj):   # damaged or half-replaced by hand: never linked, rebuilt
            _count("common_damaged")
            how = "rebuilt (the cached one was damaged)"
            for p in (obj, obj + ".sha256"):
                with contextlib.suppress(OSError):
                    os.unlink(p)
        src = os.path.join(d, f"{key}.{os.getpid()}.cpp")
        tmp = os.path.join(d, f"{key}.{os.getpid()}.o.tmp")
        Path(src).write_text(common)
        a = list(argv)
        a[src_i], a[out_i] = src, tmp
        proc = _start(a, cwd)
        if meanwhile is not None:
            meanwhile()
        ok = _wait(proc)
        try:
            if not ok:
                _failed_keys.add(key)   # not retried in this process; a new one tries again
                return None, "common_failed"
            digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            Path(tmp + ".sha256").write_text(digest + "\n")
            os.replace(tmp + ".sha256", obj + ".sha256")
            os.replace(tmp, obj)
            _count("common_built")
            return obj, how
        finally:
            for p in (src, tmp, tmp + ".sha256"):
                with contextlib.suppress(OSError):
                    os.unlink(p)
    finally:
        lock.release()
