"""No kernel library asks a loading process for an executable stack
(:mod:`aoti_farm.cache.elfstack`): the compiler clears the request AOTInductor's constants
object makes, and the cache's reader refuses a library that still makes it.

The libraries here are copies of torch's own ``libc10.so`` (a real shared object, which asks
for no executable stack), edited by this file's own minimal ELF reader, not the module's."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache import elfstack
from aoti_farm.cache.manifest import BadEntry
from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import Fingerprint

LIBC10 = Path(torch.__file__).parent / "lib" / "libc10.so"


def _stack_phdr(data: bytes) -> int:
    """Offset of PT_GNU_STACK's program header (independent of the module under test)."""
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phnum, = struct.unpack_from("<H", data, 0x38)
    for i in range(phnum):
        if struct.unpack_from("<I", data, phoff + 56 * i)[0] == 0x6474E551:
            return phoff + 56 * i
    raise AssertionError("no PT_GNU_STACK in libc10.so")


def _copy(tmp_path, name, *, flags=None, p_type=None, header=None) -> Path:
    data = bytearray(LIBC10.read_bytes())
    ph = _stack_phdr(data)
    if flags is not None:
        struct.pack_into("<I", data, ph + 4, flags)
    if p_type is not None:
        struct.pack_into("<I", data, ph, p_type)
    for off, fmt, value in header or ():
        struct.pack_into(fmt, data, off, value)
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def _request(path) -> str | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        return elfstack.exec_stack_request(fd)
    finally:
        os.close(fd)


def test_a_request_for_an_executable_stack_is_named_and_cleared(tmp_path):
    plain = _copy(tmp_path, "plain.so")
    original = struct.unpack_from("<I", plain.read_bytes(), _stack_phdr(plain.read_bytes()) + 4)[0]
    assert original == 0x6 and _request(plain) is None            # RW, as every library should be
    rwe = _copy(tmp_path, "rwe.so", flags=0x7)                    # what AOTI's link gives today
    assert "executable stack" in _request(rwe)
    assert elfstack.clear_exec_stack(str(rwe)) is True
    assert _request(rwe) is None
    assert rwe.read_bytes() == plain.read_bytes()                  # one bit of one header, nothing else
    assert elfstack.clear_exec_stack(str(rwe)) is False           # nothing left to clear


def test_missing_or_malformed_headers_are_refused_and_other_files_left_to_dlopen(tmp_path):
    missing = _copy(tmp_path, "missing.so", p_type=0)            # PT_NULL where PT_GNU_STACK was
    assert "no PT_GNU_STACK" in _request(missing)
    with pytest.raises(ValueError, match="no PT_GNU_STACK"):
        elfstack.clear_exec_stack(str(missing))
    huge = _copy(tmp_path, "huge.so", header=[(0x38, "<H", 60000)])
    assert "malformed" in _request(huge)
    outside = _copy(tmp_path, "outside.so", header=[(0x20, "<Q", 1 << 40)])
    assert "outside the file" in _request(outside)
    with pytest.raises(ValueError):
        elfstack.clear_exec_stack(str(outside))
    text = tmp_path / "text.so"
    text.write_bytes(b"not an ELF object at all, but long enough to hold a 64-byte header......")
    assert _request(text) is None
    fd = os.open(_copy(tmp_path, "offset.so", flags=0x7), os.O_RDONLY)
    try:
        os.lseek(fd, 123, os.SEEK_SET)
        assert elfstack.exec_stack_request(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 123                 # the reader's offset is kept
    finally:
        os.close(fd)


def test_the_cache_refuses_to_load_a_library_that_asks(tmp_path):
    fp = Fingerprint((("device_type", "cpu"), ("test", "elfstack")))   # a namespace; nothing is built
    cache = Cache(tmp_path / "c", signing_key=None)
    sig_bad = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(3, 4), torch.empty(4)), {})
    sig_ok = S.from_call(torch.ops.aten.add.Tensor, (torch.empty(5, 4), torch.empty(4)), {})
    cache.publish(fp, sig_bad, {"kernel.so": str(_copy(tmp_path, "rwe.so", flags=0x7))}, {})
    cache.publish(fp, sig_ok, {"kernel.so": str(_copy(tmp_path, "rw.so"))}, {})
    for private in (True, False):
        with pytest.raises(BadEntry, match="executable") as e:
            cache.open_entry(fp, sig_bad.key, private=private)
        assert e.value.kind == "insecure"
        entry = cache.open_entry(fp, sig_ok.key, private=private)
        entry.close()
    shutil.rmtree(tmp_path / "c")
