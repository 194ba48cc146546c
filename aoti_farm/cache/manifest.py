"""An entry's manifest: its decoding and shape checks, its HMAC, the hashes of its files,
and :class:`Entry` (an entry that passed verification) / :class:`BadEntry` (one that did
not, by kind).  :class:`aoti_farm.cache.store.Cache` publishes and opens entries with these."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from aoti_farm.security import safeio
from aoti_farm.errors import FarmError
from aoti_farm.cache.layout import CACHE_FORMAT, KERNEL, MANIFEST
from aoti_farm.security.safeio import PrivateCopy, UnsafeFile
from aoti_farm.signature import Signature, parse_signature

#: A file name an entry may hold.
FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def signing_payload(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    return msgpack.packb(body, use_bin_type=True)


def sign(manifest: dict, key: bytes) -> str:
    return hmac.new(key, signing_payload(manifest), hashlib.sha256).hexdigest()




@dataclass(frozen=True)
class Entry:
    """A verified entry.

    ``kernel`` (when opened with ``private=True``) is a :class:`~aoti_farm.security.safeio.PrivateCopy`
    of ``kernel.so`` holding exactly the bytes whose sha256 was checked: load
    ``kernel.path``, then ``close()`` the entry.  ``kernel_path`` is the shared file, for
    tools that copy it (with a hash check); never load it."""

    fp_id: str
    key: str
    path: Path
    manifest: dict
    kernel: PrivateCopy | None = None

    @property
    def kernel_path(self) -> str:
        return str(self.path / KERNEL)

    @property
    def load_path(self) -> str:
        """The private copy's name for ``dlopen`` (``private=True`` entries only)."""
        if self.kernel is None or self.kernel.fd < 0:
            raise FarmError(f"entry {self.key[:12]}: no private copy to load (open it with private=True)")
        return self.kernel.path

    @property
    def verified_threads(self) -> list[int] | None:
        """The intra-op thread counts this CPU kernel was verified at against eager (sorted;
        the manifest's ``verified_threads``).  A manifest written before the field was
        verified at 1 thread only: ``[1]``.  None for a CUDA kernel."""
        v = self.manifest.get("verified_threads")
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in v):
            return sorted(set(v))
        try:
            cuda = self.signature.device == "cuda"
        except Exception:  # noqa: BLE001 -- an undecodable signature: the narrowest answer
            cuda = False
        return None if cuda else [1]

    @property
    def signature(self) -> Signature:
        return parse_signature(self.manifest["signature"])

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()


#: The manifest ``compiler`` of a library that an earlier aoti-farm adopted from an upstream
#: cache without building it (its constructors ran in a child that computed its own verdict).
#: Such an entry is refused whatever its HMAC says (``BadEntry`` kind ``unbuilt``).
UNBUILT = ("upstream-import",)


#: The manifest format of an entry whose kernel may serve a call only where every index
#: lies in its guard's range (:func:`index_guards`).  A reader that knows no guards (an
#: aoti-farm before them, upstream's holder through export-upstream) refuses the format,
#: so no process serves such a kernel unguarded.
GUARDED_FORMAT = CACHE_FORMAT + 1


def index_guards(manifest: dict, d: Path | str = "") -> list[tuple[int, int, int]]:
    """The index guards of an entry: ``(runner input position, lo, hi)`` (a call is served
    only where every index of input ``position`` lies in ``[lo, hi)``); [] for an entry of
    the plain format.  A guarded entry whose guards do not read is a BadEntry (corrupt):
    it is never served unguarded."""
    if manifest.get("format") != GUARDED_FORMAT:
        return []
    v = manifest.get("verification")
    g = v.get("index_guards") if isinstance(v, dict) else None
    ok = isinstance(g, list) and g and all(
        isinstance(x, list) and len(x) == 3 and all(type(n) is int for n in x) and x[0] >= 0 and x[1] < x[2]
        for x in g)
    if not ok:
        raise BadEntry("corrupt", f"{d}: a guarded entry whose index guards do not read")
    return [tuple(x) for x in g]


def edge_notes(manifest) -> tuple:
    """The classes of an entry's edge notes (its verification's ``edge_notes``:
    differences from eager the finite contract does not call differences, docs/verification.md),
    in order, each once; anything malformed reads as one note ("malformed edge notes"), so
    a strict serving process never serves what it cannot read."""
    v = manifest.get("verification") if isinstance(manifest, dict) else None
    notes = v.get("edge_notes") if isinstance(v, dict) else None
    if notes is None:
        return ()
    if not isinstance(notes, list) or not all(isinstance(n, dict) and isinstance(n.get("class"), str) for n in notes):
        return ("malformed edge notes",)
    return tuple(dict.fromkeys(n["class"] for n in notes))


class BadEntry(FarmError):
    """An entry that failed verification.  ``kind`` is one of: missing, corrupt, foreign,
    unsigned, forged, insecure, unbuilt (a library the farm did not build: :data:`UNBUILT`)."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


#: safeio's kinds of unsafe file -> BadEntry kinds
BAD_KIND = {"missing": "missing", "insecure": "insecure", "not_regular": "corrupt", "too_large": "corrupt",
             "unreadable": "corrupt"}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: Most files one manifest may list.
_MAX_FILES = 16


def decode_manifest(raw: bytes, d: Path) -> dict:
    """Decode and check the manifest's shape (types of the fields read before the HMAC)."""
    try:
        m = msgpack.unpackb(raw, raw=False, strict_map_key=False, max_str_len=1 << 20, max_bin_len=1 << 20,
                            max_array_len=1 << 16, max_map_len=1 << 16)
    except Exception as e:  # noqa: BLE001 -- msgpack raises several types for garbage
        raise BadEntry("corrupt", f"{d}: manifest is not msgpack ({type(e).__name__})") from None
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict) or m.get("format") not in (CACHE_FORMAT,
                                                                                                GUARDED_FORMAT):
        raise BadEntry("corrupt", f"{d}: manifest lacks format/files")
    files = m["files"]
    if KERNEL not in files:
        raise BadEntry("corrupt", f"{d}: manifest lists no {KERNEL}")
    if len(files) > _MAX_FILES:
        raise BadEntry("corrupt", f"{d}: manifest lists {len(files)} files")
    for name, digest in files.items():
        if not isinstance(name, str) or not FILE_RE.match(name) or name == MANIFEST:
            raise BadEntry("corrupt", f"{d}: manifest names a path outside the entry: {name!r}")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise BadEntry("corrupt", f"{d}: manifest digest of {name!r} is not a sha256")
    if not isinstance(m.get("signature"), dict) or not isinstance(m.get("key"), str):
        raise BadEntry("corrupt", f"{d}: manifest lacks key/signature")
    return m


def sha256_fd(fd: int, what: str) -> str:
    h = hashlib.sha256()
    n = 0
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return h.hexdigest()
        n += len(b)
        if n > safeio.KERNEL_MAX:
            raise UnsafeFile("too_large", f"{what}: grew past the {safeio.KERNEL_MAX}-byte cap")
        h.update(b)


def plain(x: Any) -> Any:
    """Tuples -> lists, as msgpack round-trips them."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x
