"""A kernel library's stack request: no library the farm publishes or loads asks for an
executable stack.

An ELF object's ``PT_GNU_STACK`` program header says whether the code needs an executable
stack.  When ``dlopen`` loads a library whose header asks for one (or that has no such
header, which x86-64 reads as asking), glibc makes the stack of *every thread of the
process* executable (``_dl_make_stack_executable``); glibc 2.41 and later refuse the load
instead.  Either way a kernel must not ask: in a serving process it would turn any
stack-overflow bug of anyone's code into code execution, and on a newer distribution it
would not load at all.

Why a farm-built library asks: AOTInductor's constants object is assembled from a
generated ``weights.S`` that lacks a ``.note.GNU-stack`` section, and GNU ld then marks the
whole library ``RWE`` (torch 2.13.0 and 2.11.0, CPU and CUDA; Inductor's own cubin objects
are linked with ``-z noexecstack``, the constants are not).  No code of a kernel library
runs on the stack, so the request is cleared in the built file before it is verified
(:func:`clear_exec_stack`: one flag bit of one program header, ``execstack -c``'s edit),
and the cache's reader refuses a library that still asks (:func:`exec_stack_request`),
whoever wrote it.  The clearing can go when Inductor's constants assembly carries the
note (then every built library already reads ``RW``, and the clearing changes nothing).

Only 64-bit little-endian ELF (the only kind the farm builds) is parsed; every read is
bounded by the file's size and a cap on the program-header count.  A file that is not
such an ELF object is left to ``dlopen``, which refuses it on its own.
"""

from __future__ import annotations

import os
import struct

PT_GNU_STACK = 0x6474E551
PF_X = 0x1
_EHDR = 64            # ELF64 header size
_PHDR = 56            # ELF64 program header size
_MAX_PHNUM = 512      # far above any linker's output; a crafted count is refused


def _phdrs(fd: int) -> tuple[int, int] | None:
    """``(offset of the program-header table, count)`` of a 64-bit little-endian ELF object
    open at ``fd``, or None where it is not one.  Raises ValueError for a malformed table."""
    head = os.pread(fd, _EHDR, 0)
    if len(head) < _EHDR or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    if phnum == 0:
        return phoff, 0
    if phentsize != _PHDR or phnum > _MAX_PHNUM:
        raise ValueError(f"program-header table of {phnum} entries of {phentsize} bytes")
    size = os.fstat(fd).st_size
    if phoff < _EHDR or phoff + phnum * _PHDR > size:
        raise ValueError("program-header table outside the file")
    return phoff, phnum


def _find_stack(fd: int) -> tuple[int, int] | None | str:
    """``(file offset of PT_GNU_STACK's p_flags, p_flags)``; ``"missing"`` where the object has
    no such header; None where it is not a 64-bit little-endian ELF object."""
    t = _phdrs(fd)
    if t is None:
        return None
    phoff, phnum = t
    table = os.pread(fd, phnum * _PHDR, phoff)
    if len(table) != phnum * _PHDR:
        raise ValueError("program-header table shorter than its count")
    for i in range(phnum):
        p_type, p_flags = struct.unpack_from("<II", table, i * _PHDR)
        if p_type == PT_GNU_STACK:
            return phoff + i * _PHDR + 4, p_flags
    return "missing"


def exec_stack_request(fd: int) -> str | None:
    """Why the ELF object open at ``fd`` would make a loading process's stack executable
    (a one-line reason), or None where it would not (or is no 64-bit ELF object, which
    ``dlopen`` refuses by itself).  Reads with ``pread``: the descriptor's offset is kept."""
    try:
        found = _find_stack(fd)
    except (ValueError, struct.error) as e:
        return f"malformed ELF header: {e}"
    if found is None:
        return None
    if found == "missing":
        return "no PT_GNU_STACK header (read as a request for an executable stack)"
    _, flags = found
    if flags & PF_X:
        return "its PT_GNU_STACK header asks for an executable stack"
    return None


def clear_exec_stack(path: str) -> bool:
    """Clear the executable-stack request of the library at ``path`` (a file this process
    just built, in its private work directory).  Returns True where a flag was cleared.
    Raises ValueError where the object cannot be made to load without one (no
    ``PT_GNU_STACK`` header, a malformed table)."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        found = _find_stack(fd)
        if found is None:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF object")
        if found == "missing":
            raise ValueError(f"{path}: no PT_GNU_STACK program header")
        where, flags = found
        if not flags & PF_X:
            return False
        if os.pwrite(fd, struct.pack("<I", flags & ~PF_X), where) != 4:
            raise ValueError(f"{path}: short write")
        return True
    finally:
        os.close(fd)
