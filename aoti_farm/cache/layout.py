"""Names in the cache directory (see :mod:`aoti_farm.cache.store` for the layout): the format
version, the entry's file names, and the checks that keep a key or fingerprint id read
from a trace, manifest or queue file from ever naming a path.  Shared by the cache, its
small records (:mod:`aoti_farm.cache.records`) and the failure records (:mod:`aoti_farm.cache.failures`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aoti_farm.errors import FarmError

CACHE_FORMAT = 1
MANIFEST = "manifest.msgpack"
KERNEL = "kernel.so"
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
FP_RE = re.compile(r"^[0-9a-f]{24}$")


def check_key(key: str) -> str:
    """Keys come from traces, manifests and queue files: never let one name a path."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise FarmError(f"invalid signature key {key!r}")
    return key


def check_fp(fp_id: str) -> str:
    if not isinstance(fp_id, str) or not FP_RE.match(fp_id):
        raise FarmError(f"invalid fingerprint id {fp_id!r}")
    return fp_id


def msgpack_default(o: Any) -> Any:
    """msgpack's ``default`` for manifests and records: tuples as lists, anything else as text."""
    if isinstance(o, tuple):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)
