"""Bounded, link-safe reads of files in the shared cache.

The shared cache is written by many hosts; a file in it may be swapped, replaced by a
FIFO, a device, a link, or grown to any size at any moment.  Every read of a shared file
goes through this module:

* :func:`open_regular` opens one name relative to a directory descriptor with
  ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks the opener, a link is never followed),
  then checks the *descriptor* (``fstat``): a regular file, within a size cap, owned by an
  allowed uid, not world-writable.
* :func:`read_bounded` reads such a file whole, failing when it has more bytes than the
  cap (it may grow after the ``fstat``).
* :func:`walk` opens a chain of directories one component at a time from a directory
  descriptor, each with ``O_NOFOLLOW | O_DIRECTORY``, checking owner and mode of each.  A
  link swapped in mid-walk is refused, never followed.
* :func:`private_copy` copies an open file into a sealed memfd (or, without memfd, a file
  in a 0700 directory this process owns) while hashing it: the caller loads that copy,
  exactly the bytes that were hashed.

Errors are :class:`UnsafeFile` with a ``kind``: ``missing``, ``not_regular``,
``too_large``, ``insecure`` (owner, mode, link) or ``unreadable``.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Iterable

#: Caps on what one read of a shared file may cost (bytes).
MANIFEST_MAX = 1 << 20          # manifests: signature + digests + a few numbers
RECORD_MAX = 1 << 20            # failure records, queue items, leases, fingerprint.json
KERNEL_MAX = 1 << 30            # one AOTInductor library (ours are 0.1-5 MB)

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class UnsafeFile(OSError):
    """A shared file or directory that must not be read or trusted; ``kind`` says why."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind

    def __str__(self) -> str:  # OSError's str() would show errno fields
        return self.args[0]


def allowed_uids() -> frozenset[int]:
    """Owners a cache file may have: this process's user, and root."""
    return frozenset({os.getuid(), 0})


def _check_owner_mode(st: os.stat_result, what: str, uids: Iterable[int] | None) -> None:
    """``uids`` None: no owner or mode check (the caller allows insecure caches)."""
    if uids is None:
        return
    if st.st_uid not in uids:
        raise UnsafeFile("insecure", f"{what}: owned by uid {st.st_uid}, not one of {sorted(uids)}")
    if st.st_mode & stat.S_IWOTH:
        raise UnsafeFile("insecure", f"{what}: is writable by others")


def _oserror(e: OSError, what: str) -> UnsafeFile:
    if e.errno == errno.ENOENT:
        return UnsafeFile("missing", f"{what}: missing")
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return UnsafeFile("insecure", f"{what}: is a symbolic link")
    if e.errno == errno.ENOTDIR:
        return UnsafeFile("not_regular", f"{what}: not a directory")
    return UnsafeFile("unreadable", f"{what}: {e.strerror or e}")


def _is_link(name, dir_fd) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def open_dir(name: str | os.PathLike, dir_fd: int | None = None, *, uids: Iterable[int] | None = None,
             what: str | None = None) -> int:
    """Open one directory (no link followed) and check its owner and mode; returns the fd."""
    what = what or str(name)
    try:
        fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOTDIR and _is_link(name, dir_fd):  # O_DIRECTORY|O_NOFOLLOW on a link
            raise UnsafeFile("insecure", f"{what}: is a symbolic link") from None
        raise _oserror(e, what) from None
    try:
        _check_owner_mode(os.fstat(fd), what, uids)
    except BaseException:
        os.close(fd)
        raise
    return fd


def walk(root_fd: int, parts: Iterable[str], *, uids: Iterable[int] | None, base: str = "") -> int:
    """Open ``root_fd/parts[0]/parts[1]/...`` one directory at a time (each checked); returns
    the last directory's fd (the caller closes it).  ``root_fd`` itself is not closed."""
    fd = os.dup(root_fd)
    where = base
    try:
        for part in parts:
            where = f"{where}/{part}" if where else part
            nxt = open_dir(part, fd, uids=uids, what=where)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_ancestors(path: str | os.PathLike) -> None:
    """The ssh StrictModes rule for the directories above a cache root: each is owned by
    root or this user and is not writable by others unless it is sticky (like /tmp)."""
    p = Path(os.path.abspath(path)).parent
    uids = allowed_uids()
    while True:
        try:
            st = os.stat(p)
        except OSError as e:
            raise _oserror(e, str(p)) from None
        if st.st_uid not in uids:
            raise UnsafeFile("insecure", f"{p}: above the cache, owned by uid {st.st_uid}")
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not st.st_mode & stat.S_ISVTX:
            raise UnsafeFile("insecure", f"{p}: above the cache, writable by others and not sticky")
        if p.parent == p:
            return
        p = p.parent


def open_regular(name: str | os.PathLike, dir_fd: int | None = None, *, max_bytes: int,
                 uids: Iterable[int] | None = None, what: str | None = None) -> tuple[int, os.stat_result]:
    """Open a regular file without following links or blocking; check the descriptor.
    Returns ``(fd, stat)``; the fd is blocking again for reads."""
    what = what or str(name)
    try:
        fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError as e:
        raise _oserror(e, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile("not_regular", f"{what}: not a regular file")
        _check_owner_mode(st, what, uids)
        if st.st_size > max_bytes:
            raise UnsafeFile("too_large", f"{what}: {st.st_size} bytes, more than the {max_bytes}-byte cap")
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int, max_bytes: int, what: str) -> bytes:
    chunks, n = [], 0
    while True:
        b = os.read(fd, min(1 << 20, max_bytes + 1 - n))
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        n += len(b)
        if n > max_bytes:
            raise UnsafeFile("too_large", f"{what}: grew past the {max_bytes}-byte cap")


def read_bounded(name: str | os.PathLike, dir_fd: int | None = None, *, max_bytes: int = RECORD_MAX,
                 uids: Iterable[int] | None = None, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (see :func:`open_regular`)."""
    what = what or str(name)
    fd, _ = open_regular(name, dir_fd, max_bytes=max_bytes, uids=uids, what=what)
    try:
        return _read_fd(fd, max_bytes, what)
    except OSError as e:
        if isinstance(e, UnsafeFile):
            raise
        raise UnsafeFile("unreadable", f"{what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


# --- private copies -------------------------------------------------------------------------

_private_dir: str | None = None
_private_lock = threading.Lock()


def _private_tmp_dir() -> str:
    """A 0700 directory this process owns (checked again on every use; removed at exit)."""
    global _private_dir
    with _private_lock:
        if _private_dir is not None:
            try:
                st = os.lstat(_private_dir)
            except FileNotFoundError:  # a tmp cleaner took it: make another
                _private_dir = None
            else:
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                    raise UnsafeFile("insecure", f"{_private_dir}: private directory changed owner or mode")
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix=f"aoti-farm-{os.getpid()}-")
            atexit.register(shutil.rmtree, _private_dir, True)
        return _private_dir


class PrivateCopy:
    """Bytes copied out of the shared cache into memory only this process can change.
    ``path`` names it for ``dlopen`` (a name used once); ``close()`` once the library is
    loaded (the mapping stays)."""

    def __init__(self, fd: int, path: str, sha256: str, size: int, unlink: str | None = None):
        self.fd, self.path, self.sha256, self.size, self._unlink = fd, path, sha256, size, unlink

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._unlink:
            try:
                os.unlink(self._unlink)
            except OSError:
                pass
            self._unlink = None

    def __enter__(self) -> "PrivateCopy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _seal(fd: int) -> None:
    seals = (getattr(fcntl, "F_SEAL_SEAL", 1) | getattr(fcntl, "F_SEAL_SHRINK", 2)
             | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(fcntl, "F_SEAL_WRITE", 8))
    fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), seals)


def private_copy(src_fd: int, *, max_bytes: int, name: str = "kernel", what: str = "file") -> PrivateCopy:
    """Copy the open file ``src_fd`` (from its current offset) into a private, sealed copy,
    hashing exactly the bytes copied.

    The copy is a sealed memfd (no one, this process included, can change it) named by a
    symbolic link with a fresh name in this process's 0700 directory: ``dlopen`` matches
    libraries by name, so every load gets a name never used before, and a reused
    ``/proc/self/fd/N`` can never stand for another library."""
    h = hashlib.sha256()
    d = _private_tmp_dir()
    fd = -1
    n = 0
    try:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(f"aoti-farm-{name}", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 2))
        else:  # pragma: no cover -- not Linux
            fd, tmp = tempfile.mkstemp(dir=d)
            os.unlink(tmp)
        while True:
            b = os.read(src_fd, min(1 << 20, max_bytes + 1 - n))
            if not b:
                break
            n += len(b)
            if n > max_bytes:
                raise UnsafeFile("too_large", f"{what}: grew past the {max_bytes}-byte cap")
            h.update(b)
            view = memoryview(b)
            while view:
                w = os.write(fd, view)
                view = view[w:]
        try:
            _seal(fd)
        except OSError:  # pragma: no cover -- no sealing: the fd is still ours alone
            pass
        link = os.path.join(d, f"{name}-{uuid.uuid4().hex}.so")
        os.symlink(f"/proc/{os.getpid()}/fd/{fd}", link)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return PrivateCopy(fd, link, h.hexdigest(), n, link)
