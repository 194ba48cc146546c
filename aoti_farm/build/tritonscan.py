"""Reading a CUDA kernel's generated Triton code for its index checks.

Eager's CUDA kernels of :data:`aoti_farm.compile.adversarial.CUDA_ASSERTING_OPS` meet an index
outside ``[0, bound)`` with a device-side assert.  A compile process cannot run such an
index (the assert leaves its CUDA context unusable), so whether a kernel behaves as eager
there is read from its code instead: every address of a ``tl.load``, ``tl.store`` or
atomic that uses a value the kernel computed (Inductor's ``tmpN``: an index read from a
tensor) must use only values a ``tl.device_assert(..., "index out of bounds: ...")``
checked before it.  Inductor writes such an assert for every indirect index it cannot
bound (``config.assert_indirect_indexing``, on by default); with it off, or for an
address it leaves unchecked, the kernel is refused.  (Negative indices are handled in the
graph before the kernel: :func:`aoti_farm.compile.adversarial.cuda_index_bounds`.)  A kernel with
no indirect address passes; so does an op Inductor leaves to eager's own kernel (an
extern call: nothing to read, eager's asserts run).

The sources are taken as Inductor defines each Triton kernel, while :func:`capture` is in
force in this thread: a wrapper of ``torch._inductor.codegen.triton.TritonScheduling.define_kernel``
that records its ``src_code`` and calls it unchanged (torch 2.11-2.13, :data:`TORCH_VERSIONS`;
on another torch nothing is captured, and :func:`check` refuses for want of sources when
the op has index inputs).  It can go when AOTInductor keeps its kernels' sources beside
the library it builds.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Iterator

#: The torch versions whose ``define_kernel`` this was read from.
TORCH_VERSIONS = ("2.11", "2.12", "2.13")

_local = threading.local()
_patched = False
_lock = threading.Lock()

_ACCESS = re.compile(r"\btl\.(load|store|atomic_[a-z_]+)\(")
_ASSERT = re.compile(r"\btl\.device_assert\(")
_TMP = re.compile(r"\btmp\d+\b")


def _supported() -> bool:
    import torch

    return torch.__version__.startswith(TORCH_VERSIONS)


def _patch() -> bool:
    global _patched
    with _lock:
        if _patched:
            return True
        if not _supported():
            return False
        from torch._inductor.codegen import triton as triton_codegen

        orig = triton_codegen.TritonScheduling.define_kernel

        def define_kernel(self, src_code, node_schedule, kernel):
            into = getattr(_local, "sources", None)
            if into is not None:
                into.append(str(src_code))
            return orig(self, src_code, node_schedule, kernel)

        define_kernel.__wrapped__ = orig   # type: ignore[attr-defined]
        triton_codegen.TritonScheduling.define_kernel = define_kernel
        _patched = True
        return True


@contextlib.contextmanager
def capture() -> Iterator[list | None]:
    """Within the block (one compile, in this thread), the Triton kernels Inductor defines
    are recorded in the list yielded (None where this torch is not supported)."""
    if not _patch():
        yield None
        return
    prev = getattr(_local, "sources", None)
    _local.sources = []
    try:
        yield _local.sources
    finally:
        _local.sources = prev


def _first_argument(text: str) -> str:
    """The text of a call's first argument: up to the first comma or closing parenthesis
    at depth 0 (``text`` starts just after the call's ``(``)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return text[:i]
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:i]
    return text


def unchecked_address(source: str) -> str | None:
    """The first memory access of one kernel's source whose address uses a computed value
    no earlier ``index out of bounds`` device assert checked (the line, stripped), or None."""
    checked: set[str] = set()
    for line in source.splitlines():
        if _ASSERT.search(line):
            if "index out of bounds" in line:
                checked.update(_TMP.findall(line))
            continue
        for m in _ACCESS.finditer(line):
            address = _first_argument(line[m.end():])
            if any(v not in checked for v in _TMP.findall(address)):
                return line.strip()
    return None


def check(sources: list | None) -> str | None:
    """None where every kernel's indirect addresses are asserted; else why not (for a
    refusal's reason)."""
    if sources is None:
        return "the generated kernels could not be read on this torch"
    for src in sources:
        bad = unchecked_address(src)
        if bad is not None:
            return f"an indirect index without a device assert: {bad[:160]}"
    return None
