"""Opening a cache directory for a command or the farm: an unusable directory (missing,
not a directory, unreadable, read-only when it must be written, not a cache at all) is a
one-line :class:`~aoti_farm.errors.UserError` naming it and the fix."""

from __future__ import annotations

import os
import re
from pathlib import Path

from aoti_farm.cache.store import Cache
from aoti_farm.errors import UserError

_FP_NAME = re.compile(r"^[0-9a-f]{24}$")


def open_cache(cache_dir: str | None, *, create: bool = False, signing_key: bytes | None = None,
               write: bool = False) -> Cache:
    """A Cache for a command, or UserError (one line) if the directory is unusable
    (``write``/``create``: also if it exists but cannot be written, e.g. a read-only mount)."""
    if not cache_dir:   # resolved by config.resolve, which applies the default
        raise ValueError("open_cache: cache_dir is the resolved cache directory (aoti_farm.config.cache_dir)")
    root = Path(cache_dir)
    fix = "pass another --cache-dir or fix the directory"
    if root.exists() and not root.is_dir():
        raise UserError(f"cache {root}: is not a directory; {fix}")
    if not root.exists():
        if not create:
            raise UserError(f"cache {root}: no such directory; pass the --cache-dir of an existing cache "
                            f"(or fill one with `aoti-farm warm`)")
    else:
        if not os.access(root, os.R_OK | os.X_OK):
            raise UserError(f"cache {root}: unreadable (permission denied); fix its permissions or {fix}")
        try:
            names = os.listdir(root)
        except OSError as e:
            raise UserError(f"cache {root}: unreadable ({e.strerror}); {fix}") from None
        if names and not any(n in ("VERSION", "CACHEDIR.TAG", "tmp") or _FP_NAME.match(n) for n in names):
            # A non-empty directory with nothing of a cache in it: a wrong --cache-dir.
            raise UserError(f"cache {root}: has files but none of an aoti-farm cache (no VERSION); {fix}")
        if (root / "VERSION").exists() and not (root / "VERSION").is_file():
            raise UserError(f"cache {root}: VERSION is not a file, the cache is corrupt; {fix}")
        if (write or create) and not os.access(root, os.W_OK | os.X_OK):
            why = "read-only file system" if _read_only_fs(root) else "permission denied"
            raise UserError(f"cache {root}: not writable ({why}); fix its mount or permissions or {fix}")
    cache = Cache(root, signing_key=signing_key)
    cache.check_version()
    return cache


def _read_only_fs(root: Path) -> bool:
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False
