"""Small file-system utilities every layer shares: atomic writes, and where aoti-farm keeps
its files on a host.

* :func:`atomic_write`: a temporary file in the target's directory, fsync'ed, renamed into
  place: a reader sees the old file or the whole new one.
* :func:`memo_dir`: host-local memos (the CPU's ISA, the libstdc++ loader probe, the op
  list, the native hit path): ``$XDG_CACHE_HOME/aoti-farm``, else ``~/.cache/aoti-farm``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def memo_dir() -> str:
    """The directory of this host's memos (created by whoever writes one)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "aoti-farm")


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
    """Write ``data`` to ``path`` via a temporary file in the same directory + rename."""
    path = Path(path)
    tmp = Path(tmp_dir or path.parent) / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
