"""Small file-system utilities every layer shares: atomic writes, and where aoti-farm keeps
its files on a host.

* :func:`atomic_write`: a temporary file in the target's directory, fsync'ed, renamed into
  place: a reader sees the old file or the whole new one.
* :func:`memo_dir`: host-local memos (the CPU's ISA, the libstdc++ loader probe, the op
  list, the native hit path): this user's private directory (:func:`aoti_farm.security.private.root`,
  ``$XDG_CACHE_HOME/aoti-farm-private``, else ``~/.cache/aoti-farm-private``; 0700 and
  checked), apart from the shared cache: a process trusts its memos, so no other user may
  write them.
"""

from __future__ import annotations

import os


def memo_dir() -> str:
    """The directory of this host's memos: private, created 0700 or checked (an unsafe one
    raises :class:`aoti_farm.security.safeio.UnsafeFile`; see :mod:`aoti_farm.security.private`)."""
    from aoti_farm.security import private

    return private.root()


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes, *, tmp_dir: str | os.PathLike | None = None) -> None:
    """Write ``data`` to ``path`` via a ``mkstemp`` file in the same directory + rename
    (:func:`aoti_farm.security.private.atomic_write`: ``O_EXCL | O_NOFOLLOW``, never a link)."""
    from aoti_farm.security import private

    private.atomic_write(path, data, tmp_dir=tmp_dir)
