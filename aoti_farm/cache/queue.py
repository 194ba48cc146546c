"""The miss queue: signatures that serving processes missed, waiting to be compiled.

One file per signature, ``<root>/<fp>/queue/<key>.msgpack``, holding the signature.  It is
created with an exclusive create, so every process and machine that misses the same
signature enqueues it once (the others see ``FileExistsError`` and count a dedup).  The
queue survives restarts of serving processes.  A drainer (``aoti-farm serve``, or a
serving process's own background compile worker) removes a file once the signature is
published or recorded as failing.

Anyone who can write the queue directory can put anything there, so (see
:mod:`aoti_farm.cache.records`): the directory is walked without following links, for reading
and for writing; an item is read bounded (a regular file of at most 1 MiB, opened
non-blocking) and checked against its schema (``signature``: a table that hashes to the
file's key, ``key``: the file's key, ``time``: a finite number).  A bad item is a
:class:`~aoti_farm.cache.records.BadRecord`: its drainer counts and skips it, ``cache verify``
reports it and ``--repair`` removes it (:func:`done`).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import msgpack

from aoti_farm.cache import records
from aoti_farm.cache.store import Cache, check_key
from aoti_farm.cache.records import BadRecord, is_key
from aoti_farm.signature import Signature, parse_signature

SUFFIX = ".msgpack"
MAX_ITEM_BYTES = records.RECORD_MAX
_SCHEMA = {"signature": lambda x: isinstance(x, dict), "key": is_key, "time": records.is_number}


def queue_dir(cache: Cache, fp_id: str) -> Path:
    return cache.ns(fp_id) / "queue"


def enqueue(cache: Cache, fp_id: str, sig: Signature, widen: dict | None = None) -> bool:
    """True if this call added it, False if it was already queued.  ``widen``: a shape
    class (``ShapeClass.to_obj()``) to compile instead, when it covers ``sig`` (the miss
    policy of :mod:`aoti_farm.compile.widen`; an optional field: drainers that ignore it compile
    the exact signature)."""
    key = check_key(sig.key)
    name = f"{key}{SUFFIX}"
    item = {"signature": sig.to_obj(), "key": key, "time": time.time()}
    if widen is not None:
        item["widen"] = widen
    data = msgpack.packb(item, use_bin_type=True)
    fd = records.open_subdir(cache, fp_id, "queue", create=True)
    try:
        try:
            os.stat(name, dir_fd=fd, follow_symlinks=False)
            return False
        except FileNotFoundError:
            pass
        tmp = f".{key}.{uuid.uuid4().hex[:8]}.tmp"
        records.write_new(fd, tmp, data)
        try:
            # atomic, fails if present: whole file or nothing, exactly once
            os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp, dir_fd=fd)
    finally:
        os.close(fd)


def scan(cache: Cache, fp_id: str) -> records.Listing:
    """The queue's listing: well-named items (``keys``) and ``junk`` names.  An empty
    listing when there is no queue; :class:`BadRecord` when the queue directory is unsafe
    (a link, not a directory, writable by others)."""
    try:
        fd = records.open_subdir(cache, fp_id, "queue")
    except FileNotFoundError:
        return records.Listing()
    try:
        return records.list_dir(fd, SUFFIX, is_key)
    finally:
        os.close(fd)


def pending(cache: Cache, fp_id: str) -> list[str]:
    """Queued keys, oldest first (names that are no key are never listed: see :func:`scan`)."""
    items = scan(cache, fp_id).keys
    return sorted(items, key=lambda k: (items[k], k))


def read(cache: Cache, fp_id: str, key: str) -> Signature:
    """The queued signature; FileNotFoundError if it is gone, :class:`BadRecord` if the
    item is unsafe or breaks the schema, FarmError for a name that is no key."""
    return read_item(cache, fp_id, key)[0]


def read_item(cache: Cache, fp_id: str, key: str) -> tuple[Signature, dict | None]:
    """(the queued signature, its ``widen`` request or None), as :func:`read`; the request
    is not checked here (:func:`aoti_farm.compile.widen.parse_request` does, and ignores a bad one)."""
    check_key(key)
    what = f"queue item {queue_dir(cache, fp_id) / (key + SUFFIX)}"
    fd = records.open_subdir(cache, fp_id, "queue")
    try:
        raw = records.read(cache, fd, key + SUFFIX, what)
    finally:
        os.close(fd)
    obj = records.check_schema(records.decode_msgpack(raw, what), _SCHEMA, what)
    if obj["key"] != key:
        raise BadRecord("corrupt", f"{what}: names the key {obj['key'][:16]}, not its own")
    try:
        sig = parse_signature(obj["signature"])
    except Exception as e:  # noqa: BLE001 -- any malformed signature
        raise BadRecord("corrupt", f"{what}: bad signature ({type(e).__name__}: {e})") from None
    if sig.key != key:
        raise BadRecord("corrupt", f"{what}: holds another signature")
    w = obj.get("widen")
    return sig, (w if isinstance(w, dict) else None)


def done(cache: Cache, fp_id: str, key: str) -> bool:
    """Remove the item ``key`` (whatever it is: a bad one too).  True if removed."""
    return remove(cache, fp_id, f"{check_key(key)}{SUFFIX}")


def remove(cache: Cache, fp_id: str, name: str) -> bool:
    """Remove the queue entry ``name`` (a junk name too), never following a link."""
    return records.remove_in(cache, fp_id, "queue", name, "queue item")
