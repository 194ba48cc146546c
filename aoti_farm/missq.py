"""The miss queue: signatures that serving processes missed, waiting to be compiled.

One file per signature, ``<root>/<fp>/queue/<key>.msgpack``, holding the signature.  It is
created with an exclusive create, so every process and machine that misses the same
signature enqueues it once (the others see ``FileExistsError`` and count a dedup).  The
queue survives restarts of serving processes.  A drainer (``aoti-farm serve``, or a
serving process's own background compile worker) removes a file once the signature is
published or recorded as failing.
"""

from __future__ import annotations

import os
import stat
import time
import uuid
from pathlib import Path

import msgpack

from aoti_farm.cache import Cache, check_key
from aoti_farm.errors import FarmError
from aoti_farm.signature import Signature, parse_signature


def queue_dir(cache: Cache, fp_id: str) -> Path:
    return cache.ns(fp_id) / "queue"


def enqueue(cache: Cache, fp_id: str, sig: Signature) -> bool:
    """True if this call added it, False if it was already queued."""
    key = check_key(sig.key)
    d = queue_dir(cache, fp_id)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"{key}.msgpack"
    if final.exists():
        return False
    data = msgpack.packb({"signature": sig.to_obj(), "key": key, "time": time.time()}, use_bin_type=True)
    tmp = d / f".{key}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, final)  # atomic, fails if present: whole file or nothing, exactly once
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def pending(cache: Cache, fp_id: str) -> list[str]:
    try:
        items = [(e.stat().st_mtime, e.name[:-8]) for e in os.scandir(queue_dir(cache, fp_id))
                 if e.name.endswith(".msgpack") and not e.name.startswith(".")]
    except FileNotFoundError:
        return []
    return [k for _, k in sorted(items)]


def read(cache: Cache, fp_id: str, key: str) -> Signature:
    p = queue_dir(cache, fp_id) / f"{check_key(key)}.msgpack"
    try:
        obj = msgpack.unpackb(_read_plain(p), raw=False)
        sig = parse_signature(obj["signature"])
    except FileNotFoundError:
        raise
    except Exception as e:
        raise FarmError(f"queue item {p}: unreadable ({e})") from None
    if sig.key != key:
        raise FarmError(f"queue item {p}: holds another signature")
    return sig


MAX_ITEM_BYTES = 1 << 20


def _read_plain(p: Path) -> bytes:
    """A queue item is a small regular file: never follow a symlink out of the cache, never
    block on a FIFO or read an endless device."""
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ITEM_BYTES:
            raise FarmError(f"queue item {p}: not a small regular file")
        return os.read(fd, MAX_ITEM_BYTES + 1)
    finally:
        os.close(fd)


def done(cache: Cache, fp_id: str, key: str) -> None:
    try:
        (queue_dir(cache, fp_id) / f"{check_key(key)}.msgpack").unlink()
    except FileNotFoundError:
        pass
