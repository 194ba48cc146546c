"""The small shared records: queue items, leases, failure records, ``fingerprint.json``.

Anyone with write access to a part of the cache can put anything under these names: a
FIFO, a link to ``/dev/zero``, a directory, a sparse 40 GB file, garbage, or a well-formed
record with hostile values (``"ttl": Infinity``, another key).  So every read here:

* walks from the cache root with directory descriptors, each directory below the root
  opened without following a link (``O_NOFOLLOW | O_DIRECTORY``) and checked for owner
  and mode (:func:`open_subdir`); writers use the same walk, so a symlinked ``queue/``,
  ``leases/`` or ``failed/`` directory never makes anyone write outside the cache;
* reads the file through :func:`aoti_farm.security.safeio.read_bounded`: regular files only,
  opened non-blocking, at most :data:`RECORD_MAX` bytes, before anything is parsed;
* checks the decoded structure against a schema (types of each field, the key equals the
  file name, numbers finite) before any field is used.

Errors: ``FileNotFoundError`` when the record (or its directory) is simply not there --
a normal race with its remover -- and :class:`BadRecord` (a ``FarmError``, with a
``kind``) for anything else.  A bad record is counted (:func:`bad_counts`) and skipped by
its reader; ``aoti-farm cache verify`` reports it and ``--repair`` removes it
(:func:`remove_name`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import stat
from typing import Any, Callable, Iterable

import msgpack

from aoti_farm.security import safeio
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import FarmError

RECORD_MAX = safeio.RECORD_MAX
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_DIR_MODE = 0o755
_FILE_MODE = 0o644


class BadRecord(FarmError):
    """A shared record or directory that must not be used.  ``kind``: not_regular,
    too_large, insecure, unreadable or corrupt (decodes wrong or breaks the schema)."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


_counts = Counters()   # names "<what>/<kind>", created on their first increment


def count_bad(what: str, kind: str) -> None:
    """Count one bad record seen by this process (``what``: queue-item, lease, ...)."""
    _counts.inc(f"{what}/{kind}")


def bad_counts() -> dict[str, int]:
    """``{"<what>/<kind>": n}`` of the bad records this process has seen."""
    return _counts.snapshot()


def _uids(cache) -> frozenset[int] | None:
    return None if getattr(cache, "allow_insecure", False) else safeio.allowed_uids()


def _convert(e: safeio.UnsafeFile) -> OSError | BadRecord:
    if e.kind == "missing":
        return FileNotFoundError(errno.ENOENT, str(e))
    return BadRecord(e.kind, str(e))


def is_key(x: Any) -> bool:
    """A signature key: 64 lowercase hex digits (never a path)."""
    return isinstance(x, str) and bool(_KEY_RE.match(x))


# --- directories ----------------------------------------------------------------------------


def open_subdir(cache, fp_id: str, *parts: str, create: bool = False) -> int:
    """The fd of ``<root>/<fp_id>/<parts...>``.  Every directory below the root is opened
    without following a link and must be owned by this user (or root) and not writable by
    others (unless the cache allows insecure files).  ``create``: make missing ones (0755).
    The caller closes the fd.  Raises FileNotFoundError or :class:`BadRecord`."""
    from aoti_farm.cache.layout import check_fp

    uids = _uids(cache)
    where = str(cache.root)
    try:
        fd = os.open(cache.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{where}: missing") from None
    except OSError as e:
        raise BadRecord("unreadable", f"{where}: {e.strerror}") from None
    try:
        for part in (check_fp(fp_id), *parts):
            where = f"{where}/{part}"
            if create:
                try:
                    os.mkdir(part, _DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = safeio.open_dir(part, fd, uids=uids, what=where)
            os.close(fd)
            fd = nxt
    except safeio.UnsafeFile as e:
        os.close(fd)
        raise _convert(e) from None
    except OSError as e:
        os.close(fd)
        raise BadRecord("unreadable", f"{where}: {e.strerror or e}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class Listing:
    """The names in one record directory, split into well-named records (``keys``, with
    their mtimes) and ``junk`` (names of the record's form that no record may have)."""

    def __init__(self) -> None:
        self.keys: dict[str, float] = {}
        self.junk: list[str] = []


def list_dir(dir_fd: int, suffix: str, is_key: Callable[[str], bool]) -> Listing:
    """Names ``<key><suffix>`` in an open directory (dot-files -- writers' temporaries --
    are skipped).  Nothing is followed or opened: the entries' own types are not looked at."""
    out = Listing()
    with os.scandir(dir_fd) as it:
        for e in it:
            if e.name.startswith(".") or not e.name.endswith(suffix):
                continue
            stem = e.name[: -len(suffix)]
            if is_key(stem):
                try:
                    out.keys[stem] = e.stat(follow_symlinks=False).st_mtime
                except FileNotFoundError:
                    continue
            else:
                out.junk.append(e.name)
    return out


def remove_name(dir_fd: int, name: str) -> bool:
    """Remove whatever ``name`` is in the open directory (file, FIFO, link -- never its
    target -- or a whole directory tree, walked without following links)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_in(cache, fp_id: str, sub: str, name: str, what: str) -> bool:
    """Remove the entry ``name`` (a junk name too) of the namespace's ``sub`` directory,
    reached by descriptor; never follows a link.  True if removed."""
    if not name or "/" in name or name in (".", ".."):
        raise FarmError(f"invalid {what} name {name!r}")
    try:
        fd = open_subdir(cache, fp_id, sub)
    except FileNotFoundError:
        return False
    try:
        return remove_name(fd, name)
    finally:
        os.close(fd)


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``data`` to a new file ``name`` (exclusive create, no link followed, 0644 --
    never writable by others, whatever the umask), fsync'ed."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE,
                 dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


# --- reads ----------------------------------------------------------------------------------


def read(cache, dir_fd: int, name: str, what: str) -> bytes:
    """The bytes of the record ``name`` (bounded; see the module docstring)."""
    try:
        return safeio.read_bounded(name, dir_fd, max_bytes=RECORD_MAX, uids=_uids(cache), what=what)
    except safeio.UnsafeFile as e:
        raise _convert(e) from None


def decode_msgpack(raw: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # noqa: BLE001 -- msgpack raises several types for garbage
        raise BadRecord("corrupt", f"{what}: not msgpack ({type(e).__name__})") from None


def decode_json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadRecord("corrupt", f"{what}: not JSON ({type(e).__name__})") from None


# --- schemas --------------------------------------------------------------------------------


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_schema(obj: Any, fields: dict[str, Callable[[Any], bool]], what: str, *,
                 optional: Iterable[str] = ()) -> dict:
    """``obj`` is a dict with string keys holding every field of ``fields`` (except those in
    ``optional``, which may be absent) and each present field passes its check."""
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise BadRecord("corrupt", f"{what}: not a table of named fields")
    opt = set(optional)
    for name, ok in fields.items():
        if name not in obj:
            if name in opt:
                continue
            raise BadRecord("corrupt", f"{what}: lacks the field {name!r}")
        if not ok(obj[name]):
            raise BadRecord("corrupt", f"{what}: field {name!r} has a bad value {_short(obj[name])}")
    return obj


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def short_str(limit: int = 4096) -> Callable[[Any], bool]:
    return lambda x: isinstance(x, str) and len(x) <= limit


def nonneg_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < (1 << 63)


def _option_pairs(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str)
                                       for kv in x)


_FP_FIELDS = {"device_type": short_str(64), "torch": short_str(256), "inductor_options": _option_pairs}


def read_fingerprint(cache, fp_id: str) -> dict:
    """``<root>/<fp_id>/fingerprint.json`` (written for humans and for import-upstream's
    namespace discovery), bounded and schema-checked."""
    what = f"{cache.root}/{fp_id}/fingerprint.json"
    fd = open_subdir(cache, fp_id)
    try:
        obj = decode_json(read(cache, fd, "fingerprint.json", what), what)
    finally:
        os.close(fd)
    return check_schema(obj, _FP_FIELDS, what)
