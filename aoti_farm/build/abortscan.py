"""Refuse before its C++ build a CPU kernel whose verification would end the verifying process.

Where eager raises on an index out of range, Inductor's CPU kernel checks that index
itself. ``gather``, ``embedding`` and ``index_select`` are examples (a recorded BERT calls
the first and the last); :mod:`aoti_farm.compile.adversarial` supplies the bad indices. The check
is ``AOTI_TORCH_CHECK(<in bounds>, "index out of bounds: ...")`` in the generated kernel.
Under ``cpp.dynamic_threads`` (the farm's default: :mod:`aoti_farm.fingerprint`), a CPU
kernel's loops run inside a ``#pragma omp parallel`` region. An exception cannot leave
an OpenMP region, so the failed check calls ``std::terminate`` (SIGABRT). Such a kernel is
never published: its verification, in the verification child, refuses it as "kernel
aborts the process where eager raises". A kernel that wraps a negative index first
fails as "does not raise where eager raises".

Most of such a compile is spent after the point where this is already known:

* Inductor's export, lowering and codegen run first.
* Then come g++ on the wrapper (about 2 s with the split build), on the kernel (0.5 s),
  and the link (0.3 s).
* Then the verification child, whose ``import torch`` alone is more than a CPU-second.

So the compiler passes :func:`check_before_build` to the split build's hook on the
wrapper's build (:func:`aoti_farm.build.splitbuild.active`). It runs only for a signature on
which eager raises at an adversarial index. It reads the generated kernel source; where an
index check lies inside an OpenMP parallel region, it raises :class:`PredictedAbort`, and
the compiler refuses the signature with the reason verification would give.

A region that catches exceptions (``catch (``) is not counted: a kernel that rethrows a
failed check after its region raises as eager does, and its verification decides.
pytorch/pytorch#195482 (open) does that in Inductor; once it lands, torch's kernels stop
matching here and this module can go.

Read from the sources Inductor generates in torch 2.13.0 (CPU); on another torch,
what does not match is left to verification.  It only ever refuses, so it cannot make a
wrong result servable: a wrong prediction would cost a kernel, not a result.  The
end-to-end differential test compiles each such op both ways and checks that
verification refuses it too. Anything it does not
recognise (no kernel source found, a check outside any parallel region, no check) leaves
the compile to run and be verified as before. ``AOTI_FARM_DEV=abort_scan=0`` turns it
off (the A/B in docs/benchmarks.md).
"""

from __future__ import annotations

import os
import re

from aoti_farm.config import dev as _dev

DEV = "abort_scan"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)

#: The first line Inductor writes into a kernel source: it names the wrapper it belongs to
#: (``AotCodeCompiler.compile``).
KERNEL_HEADER = "// Triton kernels are embedded as comments in "

#: The message of Inductor's index check in generated C++ (``indirect_assert``:
#: ``AOTI_TORCH_CHECK(cond, "index out of bounds: ...")`` in AOT mode); where it stands is
#: where the check is.
_CHECK = re.compile(r'"(index out of bounds: [^"\n]*)"')
_PARALLEL = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+omp[ \t]+parallel\b[^\n]*$", re.M)
_CATCH = re.compile(r"\bcatch\s*\(")

#: Bytes of a kernel source read at most (a single op's kernel is a few KB).
MAX_SOURCE = 4 << 20


class PredictedAbort(Exception):
    """A kernel whose index check lies inside an OpenMP region (message: the check's)."""


def enabled() -> bool:
    return _dev(DEV) != "0"


def _block_end(text: str, i: int) -> int:
    """The index just past the ``}`` that closes the ``{`` at ``i`` (string and character
    literals and comments skipped), or len(text) where it is never closed."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 1
        i += 1
    return n


def parallel_regions(source: str) -> list[tuple[int, int]]:
    """(start, end) of each ``#pragma omp parallel`` region: the pragma's line through the
    end of the braced block that follows it, directly or after a ``for (...)`` header (a
    ``parallel for``'s loop body).  A pragma followed by anything else is not counted."""
    out = []
    for m in _PARALLEL.finditer(source):
        brace = source.find("{", m.end())
        between = source[m.end():brace].strip() if brace >= 0 else ";"
        if not between or (re.match(r"for\s*\(", between) and between.endswith(")")):
            out.append((m.start(), _block_end(source, brace)))
    return out


def index_check_in_parallel_region(source: str) -> str | None:
    """The message of the first index check that lies inside an OpenMP parallel region of
    ``source`` (generated kernel C++) that catches no exception, or None."""
    regions = [(a, b) for a, b in parallel_regions(source) if not _CATCH.search(source, a, b)]
    for m in _CHECK.finditer(source):
        if any(a <= m.start() < b for a, b in regions):
            return m.group(1)
    return None


def kernel_source(wrapper_path: str) -> str | None:
    """The generated kernel source that belongs to the wrapper at ``wrapper_path``: the
    ``*.kernel.cpp`` beside it whose first line names it (None if there is none, or more
    than one, or it is larger than :data:`MAX_SOURCE`)."""
    d = os.path.dirname(wrapper_path)
    want = KERNEL_HEADER + wrapper_path
    found = []
    try:
        names = [e.name for e in os.scandir(d) if e.name.endswith(".kernel.cpp")]
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(d, name), "rb") as f:
                text = f.read(MAX_SOURCE + 1)
        except OSError:
            continue
        if len(text) > MAX_SOURCE:
            return None
        src = text.decode("utf-8", "replace")
        if src.split("\n", 1)[0].rstrip() == want:
            found.append(src)
    return found[0] if len(found) == 1 else None


def check_before_build(wrapper_path: str) -> None:
    """The split build's hook before the wrapper's build: raises :class:`PredictedAbort`
    where the kernel source beside ``wrapper_path`` checks an index inside an OpenMP region."""
    src = kernel_source(wrapper_path)
    why = None if src is None else index_check_in_parallel_region(src)
    if why is not None:
        raise PredictedAbort(why)


def find(e: BaseException | None) -> PredictedAbort | None:
    """The PredictedAbort that ``e`` is or wraps (Inductor wraps what a build raises in an
    ``InductorError``, with it as ``inner_exception`` and context), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PredictedAbort):
            return e
        seen.add(id(e))
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return None


def refusal(message: str) -> str:
    """The refusal's reason: verification's own words, and why it is known before the build."""
    return (f"kernel aborts the process where eager raises (its generated code checks an index inside an "
            f"OpenMP region; refused before its C++ build): {message}")
