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
  AOTInductorModelBase<AOTInductorModel>;`` (an explicit instantiation) + std::regex's
  explicit instantiations (the lean model half's, below), compiled once per
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
* the **model** one, ``<device include> + std::regex's extern declarations + the
  interface's #includes but the container's + extern template class
  AOTInductorModelBase<AOTInductorModel>; + the rest``, compiled per signature (about
  0.7 s instead of 4.5 s; the lean part below), then ``ld -r`` joins both into the
  ``wrapper.o`` Inductor expects, and Inductor links the library as usual.

Two more cuts of the per-signature cost, each behind a developer switch for its A/B
(``scripts/bench/compile_cost.py``):

* the model half compiles **beside the kernel's own compile** (``split_overlap``):
  Inductor builds the wrapper, then the kernel, then links; the wrapper's build starts
  the model half and returns, and the link (the first build that reads the wrapper
  object) joins it first.  Where the model half failed, the wrapper is built whole there,
  before the link, as Inductor would have.
* the model half is **lean** (``lean_model``): g++ instantiates every template that a
  parsed inline body names at the end of each translation unit, called or not, and no
  precompiled header keeps that work.  AOTI's ``parse_device_str`` (inline, in
  ``model_base.h``) names std::regex, so every model half instantiated the regex compiler
  again (0.3 s), and the container's header, which the model's code does not use, cost
  0.25 s more.  The model half declares the regex classes ``extern template`` and leaves
  that header out; the common half instantiates them once
  (:func:`~aoti_farm.build.commonobj.regex_instantiations`).  g++ still instantiates what
  it inlines, so ``run_impl``'s code is unchanged; the constructor now calls the base's
  out of line.  2-core VM: 2.08 -> 1.16 s a signature, a served call the same
  (``scripts/bench/compile_cost.py --switch lean_model --served 8``, docs/benchmarks.md).
  Within it (``lean_match``) regex_match's worker is declared extern too
  (:data:`~aoti_farm.build.commonobj.REGEX_MATCH`): g++ analyzes the base's inline
  constructor for inlining, and with it everything it reaches, the matcher included.
  1.24 -> 1.05 s a signature.

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
import os
import shlex
import time
from pathlib import Path

# the per-host product (the common object), the processes that build it
# and the state the patch shares with them: aoti_farm/build/commonobj.py
from aoti_farm.build.commonobj import (EXPLICIT, EXTERN, _common_object, _count, _counters, _dev, _lock, _run,
                                       REGEX_CLASSES, REGEX_MATCH, _start, _tls, _wait,
                                       regex_instantiations, regex_match_declared)

DEV = "split_build"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
OVERLAP_DEV = "split_overlap"   # 0: the model half is joined at once, not at the link
GOLD_DEV = "gold_link"   # 0: the library is linked by g++'s default linker (GNU ld)
LEAN_DEV = "lean_model"   # 0: the model half instantiates std::regex and includes the container header
MATCH_DEV = "lean_match"   # 0: the lean model half instantiates std::regex_match's matcher (commonobj.REGEX_MATCH)
#: Headers of AOTI's interface the model half does not need: the container's (its inline
#: members cost a model half 0.25 s of end-of-unit instantiation); the model's code uses
#: ``model.h``, which the device include brings.  A model half that did need it fails to
#: compile and its wrapper is built whole (``fallback_model_failed``).
MODEL_SKIPS = ("#include <torch/csrc/inductor/aoti_runtime/model_container.h>",)

#: Set once a link with gold failed in this process: the default linker from then on.
_gold_failed = False

_patched = 0
_orig_build = None


def enabled() -> bool:
    return _dev(DEV) != "0"


def stats() -> dict:
    """Named counters of this process's wrapper builds."""
    return _counters.snapshot()


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
    lean, match = _dev(LEAN_DEV) != "0", _dev(MATCH_DEV) != "0"
    includes = "\n".join(line for line in want if line.startswith("#include") and not (lean and line in MODEL_SKIPS))
    # the switch's two sides differ in the common text, hence in the common object's key
    common = f"{head}{body}\n\n{EXPLICIT}\n{regex_instantiations(False, match) if lean else ''}"
    model = f"{head}{regex_instantiations(True, match) if lean else ''}{includes}\n{EXTERN}\n{tail}"
    return common, model


class _Pending:
    """A wrapper whose model half is compiling in a child process while Inductor goes on
    to the kernel's own compile (:func:`start_wrapper`); :func:`finish_wrapper` joins it."""

    def __init__(self, target, argv, cwd, model_obj, obj, how, proc, t0, t1):
        self.target, self.argv, self.cwd, self.model_obj = target, argv, cwd, model_obj
        self.obj, self.how, self.proc, self.t0, self.t1 = obj, how, proc, t0, t1
        self.builder = None   # Inductor's CppBuilder of the wrapper (its whole build, if needed)
        self.lean = False     # the model half was lean (split_wrapper, LEAN_DEV)
        self.match = False    # ... and declared std::regex_match's worker extern, in effect (MATCH_DEV)

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
    p.lean = f"extern template class {REGEX_CLASSES[0]};" in model
    p.match = f"extern template {REGEX_MATCH};" in model and regex_match_declared(argv[0])
    return p


def finish_wrapper(p: _Pending) -> dict | None:
    """Wait for ``p``'s model half and join both halves into its target.  Returns what was
    done, or None where the caller must build the file whole."""
    t2 = time.perf_counter()
    if not _wait(p.proc):
        return _fallback("fallback_model_failed")
    t3 = time.perf_counter()
    if not _run([p.argv[0], "-r", "-nostdlib", p.obj, p.model_obj, "-o", p.target], p.cwd):
        return _fallback("fallback_join_failed")
    _count("split")
    # common_s: building (or checking) the common object; model_s: the model half's compile
    # after that, until it was joined (the kernel's own compile ran meanwhile: model_wait_s
    # is what the link waited for it)
    return {"wrapper": "split", "common": p.how, "common_object": os.path.basename(p.obj),
            "common_s": round(p.t1 - p.t0, 3), "model_s": round(t3 - p.t1, 3), "model_wait_s": round(t3 - t2, 3),
            "join_s": round(time.perf_counter() - t3, 3), "lean_model": p.lean, "lean_match": p.match}


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


def _link(builder) -> None:
    """The library's link (the build that reads the joined wrapper object), by gold where
    g++ has it.

    The link is on every compile's critical path, after the join: GNU ld takes 0.27 s for
    a kernel's library, mostly reading libtorch's symbol tables, and gold 0.13 s (2-core
    VM, g++ 12).  The objects are the same and so is their code; only the library's layout
    differs, and the library is verified against eager like any other.  Where the link
    with gold fails (no gold in this toolchain, an option it lacks), the default linker
    links it, as Inductor would, and this process does not try gold again.
    ``AOTI_FARM_DEV=gold_link=0``: the default linker always."""
    global _gold_failed
    last = getattr(_tls, "last", None)
    if isinstance(last, dict):
        last["linker"] = "default"   # the build record (manifest ``build``) says which linked it
    if _gold_failed or _dev(GOLD_DEV) == "0":
        return _orig_build(builder)
    try:
        cmd = builder.get_command_line()
        if "-fuse-ld=" in cmd or " -shared" not in f" {cmd}":
            return _orig_build(builder)
        builder.get_command_line = lambda: f"{cmd} -fuse-ld=gold"   # this build only (an instance attribute)
        try:
            _orig_build(builder)
        finally:
            del builder.get_command_line
        _count("gold_link")
        if isinstance(last, dict):
            last["linker"] = "gold"
    except Exception:  # noqa: BLE001 -- the default linker decides
        _gold_failed = True
        _count("gold_failed")
        _orig_build(builder)


def _patched_build(self) -> None:
    if getattr(_tls, "depth", 0) > 0:
        pending = _joins_pending(self)
        if pending is not None:
            _finish_pending(pending)
            return _link(self)
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
