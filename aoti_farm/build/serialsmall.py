"""Tiny CPU loop nests run serially: no OpenMP region where a kernel's loops hold too few
elements to share.

Under ``cpp.dynamic_threads`` (the farm's default: :data:`aoti_farm.fingerprint.DEFAULT_INDUCTOR_OPTIONS`)
Inductor gives every CPU kernel "at least one parallel scope and lets the OpenMP runtime
manage serial vs. parallel" (``CppKernel.decide_parallel_depth``, torch 2.11-2.13).  The
runtime does not manage it cheaply: a ``cat`` of 78 int64 elements opens
``#pragma omp parallel`` with two ``omp for`` barriers, and at the caller's 2 threads the
fork, the barriers and the join cost more than eager's whole call.  Eager's own kernels
run serially below ATen's grain size (32768 elements for elementwise ops).

So, while :func:`active` is in force (every compile of :class:`aoti_farm.compile.compiler.AOTICompiler`),
a loop nest of fewer than ``threshold`` elements (``size_hint()``, the product of its call
ranges, reduction ranges included) gets parallel depth 0 (plain serial loops, the code
Inductor writes at one thread), provided no parallel region of the same kernel is open at
that point.  Inside an open region a serial nest needs ``#pragma omp single``, which
Inductor writes only when it builds at more than one thread: the first version of this
patch ignored that, and a kernel built at 1 thread and run at 2 ran such a nest on every
thread (an in-place ``var_mean`` epilogue divided twice; ``var`` over [8, 4096] was wrong).
Such nests, and outer-loop fused kernels, keep Inductor's decision.

A serial nest computes each output as Inductor's does on one thread.  Where Inductor shares
a nest's outputs among threads (its choice for every small nest here) that is bitwise its
result at every thread count; a small reduction it would split among threads now rounds as
at one thread, as eager's own serial kernels do, and is verified as usual.

The threshold is the Inductor option :data:`OPTION` (0 turns it off), part of the
fingerprint, so kernels built either way never share a namespace (the option's name is new
with the region rule: entries of the first version live in another namespace).

A patch of a torch internal: ``torch._inductor.codegen.cpp.CppKernel.decide_parallel_depth``,
checked against torch 2.11 and 2.13 (:data:`TORCH_VERSIONS`; on another torch nothing is
patched and kernels are built as Inductor decides).  Upstream: Inductor's comment "let OMP
runtime to manage the serial vs. parallel" (pytorch/pytorch, ``torch/_inductor/codegen/cpp.py``);
it can go when Inductor skips the scope for small loops under dynamic threads.  The
differential test (``tests/e2e/test_serialsmall.py``) builds the same kernels at one thread
with and without it, reductions included, verifies both, and checks their results bitwise
equal at 1, 2 and all cores.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

#: The Inductor option holding the threshold (elements); in the fingerprint.
OPTION = "aoti_farm.serial_nests_below"
#: Its default: below this many elements a loop nest runs serially (ATen's
#: grain size is 32768 for elementwise ops; a kernel of a few thousand elements takes
#: about as long as a fork and join).
SERIAL_BELOW = 4096
#: The torch versions whose ``decide_parallel_depth`` this was read from.
TORCH_VERSIONS = ("2.11", "2.12", "2.13")

_local = threading.local()
_patched = False
_lock = threading.Lock()


def _supported() -> bool:
    import torch

    return torch.__version__.startswith(TORCH_VERSIONS)


def _patch() -> bool:
    """Install the wrapper once per process; False where this torch is not supported."""
    global _patched
    with _lock:
        if _patched:
            return True
        if not _supported():
            return False
        from torch._inductor import config as iconfig
        from torch._inductor.codegen import cpp as cpp_codegen

        orig = cpp_codegen.CppKernel.decide_parallel_depth

        def decide_parallel_depth(self, max_parallel_depth, threads):
            pd = orig(self, max_parallel_depth, threads)
            below = getattr(_local, "threshold", 0)
            if not below or not iconfig.cpp.dynamic_threads or pd.parallel_depth == 0:
                return pd
            if not isinstance(self, cpp_codegen.CppKernelProxy):
                return pd   # an outer-loop fused kernel's parts: Inductor decides
            ws = getattr(getattr(self, "kernel_group", None), "ws", None)
            if ws is None or ws.in_parallel:
                # inside an open region a serial nest needs ``#pragma omp single``, which
                # Inductor writes only when it builds at more than one thread: keep its decision
                return pd
            try:
                n = int(self.size_hint())
            except Exception:  # noqa: BLE001 -- symbolic sizes (a class kernel): Inductor decides
                return pd
            if n >= below:
                return pd
            _local.serialized = getattr(_local, "serialized", 0) + 1
            return type(pd)(parallel_depth=0, start_depth=max_parallel_depth.start_depth)

        decide_parallel_depth.__wrapped__ = orig   # type: ignore[attr-defined]
        cpp_codegen.CppKernel.decide_parallel_depth = decide_parallel_depth
        _patched = True
        return True


@contextlib.contextmanager
def active(threshold: int) -> Iterator[None]:
    """Within the block (one compile, in this thread), loop nests of fewer than
    ``threshold`` elements outside an open parallel region run serially; 0: Inductor
    decides as always."""
    threshold = int(threshold or 0)
    if threshold and not _patch():
        threshold = 0
    prev = getattr(_local, "threshold", 0)
    _local.threshold = threshold
    _local.serialized = 0
    try:
        yield
    finally:
        _local.threshold = prev


def serialized() -> int:
    """How many loop nests the last :func:`active` block in this thread made serial."""
    return getattr(_local, "serialized", 0)
