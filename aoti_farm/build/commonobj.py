"""The split build's per-host product (:mod:`aoti_farm.build.splitbuild` says why and how):
the **common object** (the wrapper's model-independent half, ``<key>.o`` with its sha256,
built once per host and toolchain under a file lock, the model half compiling alongside),
in this user's private Inductor cache (``aoti_farm_common/``, :func:`common_dir`); the text
both halves add to the wrapper's (:data:`EXPLICIT`, :func:`regex_instantiations`); and the
compiler processes that build them (:func:`_start`, :func:`_wait`, :func:`_run`).

The split build's counters and per-thread state live here too: :func:`splitbuild.stats`
reads them, and the patch in :mod:`aoti_farm.build.splitbuild` shares this thread's state
(``_tls``: the last build).

The model half once included a precompiled prefix of its own (AOTI's interface and
container headers, a ``.gch`` per host).  Since the model half leaves std::regex and the
container's header out, that prefix saves nothing (1.229 against 1.246 s a signature on
the 2-core VM, CUDA 1.679 against 1.674 s on the 16-core host): removed, with its build.
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

EXPLICIT = "template class torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>;"
EXTERN = "extern " + EXPLICIT
#: std::regex as AOTI's ``parse_device_str`` (an inline function of ``model_base.h``)
#: instantiates it.  g++ instantiates every template a parsed inline body names at the end
#: of each translation unit, called or not: so every model half built the whole regex
#: compiler again (0.3 s of it; a precompiled header does not keep end-of-unit work).
#: The model half declares these extern (g++ then instantiates only what it inlines, so
#: ``run_impl``'s code is unchanged) and the common half, linked into every library,
#: instantiates them once, so an out-of-line call resolves there (g++ emits them weak, as
#: it does implicit instantiations: the library exports what it exported before).
#: libstdc++'s internals, hence the guard: elsewhere both halves leave them implicit, as
#: before.  The standard leaves explicit instantiation of its templates over its own types
#: to the implementation; libstdc++ itself declares ``basic_string<char>`` so, and a
#: library built this way is verified against eager like any other.
REGEX_CLASSES = ("std::basic_regex<char>", "std::regex_traits<char>",
                 "std::match_results<std::string::const_iterator>", "std::__detail::_Scanner<char>",
                 "std::__detail::_Compiler<std::regex_traits<char>>", "std::__detail::_NFA<std::regex_traits<char>>")


#: std::regex_match's out-of-line worker as ``parse_device_str`` calls it.  It is what
#: instantiates the matcher (``std::__detail::_Executor``, depth- and breadth-first), and
#: g++ instantiates and optimizes it in every model half that only calls the base's
#: constructor (inline: g++ analyzes its body for inlining, and with it all it reaches):
#: 0.17 s of a 0.94 s model half.  The matcher class itself cannot be instantiated
#: explicitly (both variants' members are built, and g++ rejects the one that does not
#: fit), this function can: it instantiates what its implicit instantiation did.  Its
#: signature is libstdc++'s internal one, checked for releases 12 and 13 (the CPU and the
#: GPU hosts' g++); elsewhere both halves leave it implicit, as before (a declaration that
#: matched nothing would fail both halves' compiles).
REGEX_MATCH = ("bool std::__detail::__regex_algo_impl<std::string::const_iterator, "
               "std::allocator<std::sub_match<std::string::const_iterator>>, char, std::regex_traits<char>>("
               "std::string::const_iterator, std::string::const_iterator, "
               "std::match_results<std::string::const_iterator>&, const std::basic_regex<char>&, "
               "std::regex_constants::match_flag_type, std::__detail::_RegexExecutorPolicy, bool)")
REGEX_MATCH_GUARD = "#if _GLIBCXX_RELEASE >= 12 && _GLIBCXX_RELEASE <= 13"


def regex_instantiations(extern: bool, match: bool = True) -> str:
    """The explicit instantiation declarations (``extern``) or definitions of
    :data:`REGEX_CLASSES` and, where ``match``, :data:`REGEX_MATCH`, under libstdc++ only."""
    kw = "extern template" if extern else "template"
    lines = "".join(f"{kw} class {c};\n" for c in REGEX_CLASSES)
    if match:
        lines += f"{REGEX_MATCH_GUARD}\n{kw} {REGEX_MATCH};\n#endif\n"
    return f"#include <regex>\n#include <string>\n#if defined(__GLIBCXX__)\n{lines}#endif\n"


_tls = threading.local()
_lock = threading.Lock()
_counters = Counters("split", "whole", "common_built", "common_reused", "common_waited", "common_busy",
                     "fallback_no_interface", "fallback_common_failed", "fallback_model_failed",
                     "fallback_join_failed", "fallback_unsupported", "common_damaged", "common_unsafe",
                     "gold_link", "gold_failed")
_failed_keys: set[str] = set()
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


@functools.lru_cache(maxsize=4)
def regex_match_declared(compiler: str) -> bool:
    """Whether :data:`REGEX_MATCH_GUARD` holds for ``compiler``'s C++ library (libstdc++
    12 or 13), so that the declaration takes effect: what the build record's
    ``lean_match`` says.  Preprocessed once per compiler and process."""
    probe = f"#include <cstddef>\n#if defined(__GLIBCXX__)\n{REGEX_MATCH_GUARD}\nyes\n#endif\n#endif\n"
    try:
        out = subprocess.run([compiler, "-x", "c++", "-E", "-P", "-"], input=probe, capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.split()[-1:] == ["yes"]


def common_dir() -> str:
    """``<private Inductor cache>/aoti_farm_common``, created 0700 or checked (raises
    :class:`aoti_farm.security.safeio.UnsafeFile` for an unsafe one)."""
    from aoti_farm.security import private

    return private.ensure_dir(os.path.join(private.use_inductor_cache(), "aoti_farm_common"))


def _start(argv: list[str], cwd: str) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    """Sources and half-written objects of builds that died (kill -9) an hour ago or more,
    and the model half's precompiled prefixes of earlier versions (``<key>.pch.h`` with its
    ``.gch``, about 145 MB each, and lock), unused an hour or more."""
    now = time.time()
    with contextlib.suppress(OSError):
        for f in os.scandir(d):
            if f.name.endswith((".cpp", ".tmp", ".pch.h", ".pch.h.gch", ".pch.h.lock")) or ".o.tmp" in f.name:
                with contextlib.suppress(OSError):
                    if now - f.stat().st_mtime > age_s:
                        os.unlink(f.path)


def _common_key(common: str, argv: list[str], src_i: int, out_i: int) -> str:
    """The common object's key: its text, the exact compile command, the compiler's version,
    torch's and the AOTI runtime headers'."""
    norm = list(argv)
    norm[src_i], norm[out_i] = "<src>", "<obj>"
    return hashlib.sha256("\0".join([common, " ".join(norm), _compiler_version(argv[0]),
                                     _toolchain_digest()]).encode()).hexdigest()[:40]


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
