"""Split build of AOTInductor's wrapper: compile the model-independent half once per host.

Where a CPU signature's compile goes (2-core VM, torch 2.13, g++ 12, one ``aten::addmm``):
about 5.5 s in all, of which 4.5 s is g++ on the generated ``<hash>.wrapper.cpp``,
0.4-0.6 s the kernel ``.cpp``, 0.3 s the link and 0.2 s Python (export, lowering,
codegen).  Parsing is cheap (Inductor precompiles the AOTI headers); the time is template
instantiation and code generation.  ``-ftime-report`` and a split of the file by hand
showed where:

* The first two thirds of every wrapper is the same text for every signature: the device
  include, then AOTI's runtime interface (``torch/_inductor/codegen/aoti_runtime/
  interface.cpp``: the ``AOTInductorModelContainer*`` C functions, which instantiate the
  model container and ``AOTInductorModelBase<AOTInductorModel>``).  Alone it costs 3-4.7 s.
* The rest (the model's constructor, ``run_impl``, input checks, kernel declarations) is
  about 1 s of its own, plus 1.8 s for ``std::regex`` that ``AOTInductorModelBase``'s
  inline constructor pulls in (``parse_device_str``).

So the wrapper is compiled as two translation units:

* the **common** one, ``<device include> + interface + template class
  AOTInductorModelBase<AOTInductorModel>;`` (an explicit instantiation), compiled once per
  host and toolchain into ``<inductor cache>/aoti_farm_common/<key>.o``, in this user's
  private Inductor cache (:func:`aoti_farm.security.private.use_inductor_cache`: 0700, owner
  checked; a digest beside an object proves nothing where another user could rewrite
  both, so neither is trusted unless both are this user's files in that directory).  The key hashes
  that text, the exact compile command (whose precompiled-header path already hashes the
  preprocessed AOTI headers and the compiler version), the compiler's version, torch's
  version and the AOTI runtime headers.  It is published atomically with its sha256 beside
  it, and linked only while the two agree (a damaged one is rebuilt).  The process that
  builds it holds a file lock and compiles its model half alongside (so a first compile
  on a host costs the common half's 3-5 s, not that plus the model's 2 s); a process that
  finds the lock held compiles its model half and then waits for that object
  (``common_waited``), building its wrapper whole only if the wait exceeds
  :data:`COMMON_WAIT_S` (``common_busy``).  ``aoti-farm warm`` builds it ahead of the
  actors' first compiles (:mod:`aoti_farm.compile.hostprep`).
* the **model** one, ``<device include> + the interface's #includes + extern template
  class AOTInductorModelBase<AOTInductorModel>; + the rest``, compiled per signature
  (about 2 s instead of 4.5 s), then ``ld -r`` joins both into the ``wrapper.o`` Inductor
  expects, and Inductor links the library as usual.

Two more cuts of the per-signature cost, each behind a developer switch for its A/B
(``scripts/bench/compile_cost.py``):

* the model half compiles **beside the kernel's own compile** (``split_overlap``):
  Inductor builds the wrapper, then the kernel, then links; the wrapper's build starts
  the model half and returns, and the link (the first build that reads the wrapper
  object) joins it first.  Where the model half failed, the wrapper is built whole there,
  before the link, as Inductor would have.
* the model half includes a **precompiled prefix** (``model_pch``): Inductor precompiles
  only the device header, and the model half parsed AOTI's interface and container headers
  every time.  ``<key>.pch.h`` (the prefix's text) and its ``.gch`` are built once per
  host and key, beside the common object and under the same trust rule: by the first
  process that misses them, once that compile is done, in a thread at the lowest CPU
  priority (the compiles meanwhile do without; :mod:`aoti_farm.compile.hostprep` builds it ahead
  of a warm's compiles); g++ checks a ``.gch`` against the command itself and parses the
  text instead where it does not fit.
  The model half's code is the same either way (``tests/e2e/test_splitbuild.py``
  compares the libraries' ``.text``).

This is the same program, cut into two translation units of one build: every definition
is seen identically by both, inline and template copies merge at link time like any two
objects of one library, and the finished library is verified against eager like any other.
Anything unexpected (a wrapper without the interface text, a compile error in either half,
a failed ``ld -r``, a missing CppBuilder attribute in another torch) falls back to
Inductor's own whole-file build, counted in :func:`stats`.  ``AOTI_FARM_DEV=split_build=0``
turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import select
import shlex
import subprocess
import threading
import time
from pathlib import Path

import torch

from aoti_farm.startup import spawn
from aoti_farm.metrics.counters import Counters

EXPLICIT = "template class torch::aot_inductor::AOTInductorModelBase<torch::aot_inductor::AOTInductorModel>;"
EXTERN = "extern " + EXPLICIT
DEV = "split_build"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
OVERLAP_DEV = "split_overlap"   # 0: the model half is joined at once, not at the link
PCH_DEV = "model_pch"   # 0: the model half includes Inductor's precompiled device header only
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place

_tls = threading.local()
_lock = threading.Lock()
_patched = 0
_orig_build = None
_counters = Counters("split", "whole", "common_built", "common_reused", "common_waited", "common_busy",
                     "fallback_no_interface", "fallback_common_failed", "fallback_model_failed",
                     "fallback_join_failed", "fallback_unsupported", "common_damaged", "common_unsafe",
                     "pch_built", "pch_failed")
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


def enabled() -> bool:
    return _dev(DEV) != "0"


def stats() -> dict:
    """Named counters of this process's wrapper builds."""
    return _counters.snapshot()


def _count(name: str) -> None:
    _counters.inc(name)


def last_build() -> dict:
    """How this thread's last wrapper was built: ``{"wrapper": "split"|"whole", ...}``."""
    return dict(getattr(_tls, "last", None) or {})


@functools.lru_cache(maxsize=1)
def interface_text() -> str | None:
    """AOTI's runtime interface source, as Inductor splices it into every wrapper."""
    try:
        import torch._inductor.codegen as codegen

        path = Path(codegen.__file__).parent / "aoti_runtime" / "interface.cpp"
        return _normalize(path.read_text()).strip("\n")
    except OSError:
        return None


def _normalize(text: str) -> str:
    # Inductor's IndentedBuffer.splice writes whitespace-only lines as empty ones
    return "\n".join(line.rstrip() for line in text.splitlines())


def split_wrapper(text: str) -> tuple[str, str] | None:
    """``(common, model)`` sources for a generated AOTI wrapper, or None where the
    wrapper is not ``<includes> + interface + <model>`` exactly.  Lines are matched with
    trailing whitespace ignored, and both halves are cut from the wrapper's own lines,
    unchanged (a raw string literal keeps its bytes)."""
    iface = interface_text()
    if not iface or EXPLICIT in text:
        return None
    want = iface.split("\n")
    lines = text.splitlines(keepends=True)
    norm = [line.rstrip() for line in lines]
    n = len(want)
    starts = [i for i in range(len(norm) - n + 1) if norm[i] == want[0] and norm[i:i + n] == want]
    if len(starts) != 1:
        return None
    i = starts[0]
    head, body, tail = "".join(lines[:i]), "".join(lines[i:i + n]), "".join(lines[i + n:])
    # the head must be preprocessor lines only (the device include and C-shim extensions)
    if any(line.strip() and not line.lstrip().startswith(("#", "//")) for line in norm[:i]):
        return None
    if not head.endswith("\n") and head:
        head += "\n"
    includes = "\n".join(line for line in want if line.startswith("#include"))
    common = f"{head}{body}\n\n{EXPLICIT}\n"
    model = f"{head}{includes}\n{EXTERN}\n{tail}"
    return common, model


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


class _Pending:
    """A wrapper whose model half is compiling in a child process while Inductor goes on
    to the kernel's own compile (:func:`start_wrapper`); :func:`finish_wrapper` joins it."""

    def __init__(self, target, argv, cwd, model_obj, obj, how, proc, t0, t1):
        self.target, self.argv, self.cwd, self.model_obj = target, argv, cwd, model_obj
        self.obj, self.how, self.proc, self.t0, self.t1 = obj, how, proc, t0, t1
        self.builder = None   # Inductor's CppBuilder of the wrapper (its whole build, if needed)
        self.pch = False      # the model half included the precompiled prefix
        self.pch_todo = None  # (key, header, prefix, command): the prefix to build after it

    def cancel(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_wrapper(argv: list[str], src: str, target: str, cwd: str) -> _Pending | None:
    """Start building ``target`` (Inductor's wrapper object) from ``src`` in two halves:
    the common object is found (or built, the model half compiling alongside), and the
    model half's compile is started and left running.  Returns it, or None where the caller
    must build the file whole."""
    try:
        src_i, out_i = argv.index(src), argv.index(target)
        text = Path(src).read_text()
    except (ValueError, OSError):
        return _fallback("fallback_unsupported")
    parts = split_wrapper(text)
    if parts is None:
        return _fallback("fallback_no_interface")
    common, model = parts
    base = target[:-2] if target.endswith(".o") else target
    model_src, model_obj = base + ".model.cpp", base + ".model.o"
    Path(model_src).write_text(model)
    a = list(argv)
    a[src_i], a[out_i] = model_src, model_obj
    key = _common_key(common, argv, src_i, out_i)
    pch = _pch_header(key) if "-include" in a else None
    if pch is not None:
        a[a.index("-include") + 1] = pch
    started: list = []
    t0 = time.perf_counter()
    # a first build on this host compiles the common half and this model half side by side
    obj, how = _common_object(common, argv, src_i, out_i, cwd, meanwhile=lambda: started.append(_start(a, cwd)))
    t1 = time.perf_counter()
    if obj is None:
        for p in started:
            if p is not None:
                p.kill()
                p.wait()
        return _fallback("fallback_common_failed" if how == "common_failed" else None, how)
    proc = started[0] if started else _start(a, cwd)
    if proc is None:
        return _fallback("fallback_model_failed")
    p = _Pending(target, argv, cwd, model_obj, obj, how, proc, t0, t1)
    p.pch = pch is not None
    if pch is None and "-include" in a and _dev(PCH_DEV) != "0":
        p.pch_todo = (key, os.path.join(os.path.dirname(obj), f"{key}.pch.h"), _model_prefix(model),
                      _pch_command(a, src_i, out_i))
    return p


def finish_wrapper(p: _Pending) -> dict | None:
    """Wait for ``p``'s model half and join both halves into its target.  Returns what was
    done, or None where the caller must build the file whole."""
    t2 = time.perf_counter()
    if not _wait(p.proc):
        return _fallback("fallback_model_failed")
    t3 = time.perf_counter()
    if p.pch_todo is not None:      # built once this compile is done (start_pch_build)
        _tls.pch_todo, p.pch_todo = p.pch_todo, None
    if not _run([p.argv[0], "-r", "-nostdlib", p.obj, p.model_obj, "-o", p.target], p.cwd):
        return _fallback("fallback_join_failed")
    _count("split")
    # common_s: building (or checking) the common object; model_s: the model half's compile
    # after that, until it was joined (the kernel's own compile ran meanwhile: model_wait_s
    # is what the link waited for it)
    return {"wrapper": "split", "common": p.how, "common_object": os.path.basename(p.obj),
            "common_s": round(p.t1 - p.t0, 3), "model_s": round(t3 - p.t1, 3), "model_wait_s": round(t3 - t2, 3),
            "join_s": round(time.perf_counter() - t3, 3), "model_pch": p.pch}


def build_wrapper(argv: list[str], src: str, target: str, cwd: str) -> dict | None:
    """:func:`start_wrapper` and :func:`finish_wrapper` at once."""
    p = start_wrapper(argv, src, target, cwd)
    return None if p is None else finish_wrapper(p)


def _fallback(counter: str | None, why: str | None = None) -> None:
    if counter:
        _count(counter)
    _tls.reason = why or (counter or "").removeprefix("fallback_")
    return None


def _is_wrapper_build(b) -> bool:
    srcs = getattr(b, "_sources_args", "")
    return (isinstance(srcs, str) and srcs.endswith(".wrapper.cpp") and " " not in srcs
            and os.path.isabs(srcs) and getattr(b, "_compile_only", False)
            and not getattr(b, "_precompiling", True) and not getattr(b, "_use_relative_path", True))


def _joins_pending(b) -> _Pending | None:
    """This thread's pending wrapper, where ``b`` is a build that reads its object (the
    library's link)."""
    p = getattr(_tls, "pending", None)
    srcs = getattr(b, "_sources_args", "")
    if p is not None and isinstance(srcs, str) and p.target in srcs.split():
        return p
    return None


def _finish_pending(p: _Pending) -> None:
    """Join the pending wrapper before the link that reads it; where its model half failed,
    build the wrapper whole, as Inductor would have."""
    _tls.pending = None
    _tls.reason = None
    try:
        info = finish_wrapper(p)
    except Exception as e:  # noqa: BLE001 -- anything odd: the whole build decides
        _count("fallback_unsupported")
        _tls.reason = f"{type(e).__name__}: {e}"[:200]
        info = None
    if info is not None:
        _tls.last = info
        return
    p.cancel()
    _tls.last = {"wrapper": "whole", "reason": _tls.reason}
    _count("whole")
    _orig_build(p.builder)


def _patched_build(self) -> None:
    if getattr(_tls, "depth", 0) > 0:
        pending = _joins_pending(self)
        if pending is not None:
            _finish_pending(pending)
            return _orig_build(self)
    if getattr(_tls, "depth", 0) > 0 and _is_wrapper_build(self):
        before = getattr(_tls, "before", None)
        if before is not None:
            before(self._sources_args)   # may raise: then nothing is built (the caller's refusal)
        pending = None
        if not enabled():
            _tls.last = {"wrapper": "whole", "reason": f"AOTI_FARM_DEV={DEV}=0"}
        else:
            try:
                target = self.get_target_file_path()
                argv = shlex.split(self.get_command_line())
                _tls.reason = None
                pending = start_wrapper(argv, self._sources_args, target, os.path.dirname(target) or ".")
                _tls.last = {"wrapper": "whole", "reason": _tls.reason}
            except Exception as e:  # noqa: BLE001 -- anything odd: Inductor's own build decides
                _count("fallback_unsupported")
                _tls.last = {"wrapper": "whole", "reason": f"{type(e).__name__}: {e}"[:200]}
                pending = None
        if pending is not None:
            # the model half compiles while Inductor compiles the kernel; the link joins it
            pending.builder = self
            if _dev(OVERLAP_DEV) == "0":
                _finish_pending(pending)
                return None
            _tls.pending = pending
            _tls.last = {"wrapper": "split", "pending": True}
            return None
        _count("whole")
    return _orig_build(self)


@contextlib.contextmanager
def active(before_wrapper=None):
    """Within this block (this thread only), AOTI wrapper builds are split, and
    ``before_wrapper(wrapper_source_path)``, where given, runs before each wrapper's build
    (whole or split); what it raises ends that build and leaves ``aot_compile`` wrapped in
    Inductor's error (:func:`aoti_farm.build.abortscan.check_before_build` reads the generated
    kernel there).

    Patch of a torch internal: ``torch._inductor.cpp_builder.CppBuilder.build`` is replaced
    while a block is active, and :func:`_is_wrapper_build` reads CppBuilder's private
    ``_sources_args``, ``_compile_only``, ``_precompiling``, ``_use_relative_path``.  Checked
    against torch 2.13.0 (CPU) and 2.11.0+cu130 (CUDA).
    Why: Inductor offers no hook to build its wrapper in two translation units.  Anything that
    does not match (another torch's attributes, an unexpected command) builds the file whole,
    as Inductor would.  It can go when Inductor compiles AOTI's model-independent interface
    once per host itself, or offers a hook for the wrapper's build."""
    global _patched, _orig_build
    from torch._inductor import cpp_builder

    with _lock:
        if _patched == 0:
            _orig_build = cpp_builder.CppBuilder.build
            cpp_builder.CppBuilder.build = _patched_build
        _patched += 1
    _tls.depth = getattr(_tls, "depth", 0) + 1
    _tls.last = None
    outer, _tls.before = getattr(_tls, "before", None), before_wrapper
    try:
        yield
    finally:
        _tls.before = outer
        _tls.depth -= 1
        pending, _tls.pending = getattr(_tls, "pending", None), None
        if pending is not None:   # Inductor stopped before its link: nothing joins it
            pending.cancel()
        with _lock:
            _patched -= 1
            if _patched == 0:
                cpp_builder.CppBuilder.build = _orig_build
