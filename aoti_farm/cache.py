"""The shared kernel cache: a plain directory, safe on local disks and on NFS.

Layout (``<root>`` is ``--cache-dir``, ``$AOTI_FARM_CACHE_DIR`` or ``~/.cache/aoti-farm``)::

    <root>/CACHEDIR.TAG, VERSION
    <root>/tmp/                                 staging + trash (same filesystem)
    <root>/<fp>/fingerprint.json                the fingerprint's fields, for humans
    <root>/<fp>/entries/<k[:2]>/<key>/          one published kernel
        manifest.msgpack                        signature, fingerprint, sha256 of files, ...
        kernel.so                               the AOTInductor model-container library
        used                                    touched when a process loads it (LRU for gc)
    <root>/<fp>/failed/<k[:2]>/<key>.msgpack    a failure record (reason, evidence, attempts)
    <root>/<fp>/leases/<key>.lease              who compiles it now (see leases.py)
    <root>/<fp>/queue/<key>.msgpack             the runtime's miss queue (see missq.py)

``<fp>`` is the fingerprint id, ``<key>`` the signature key (64 hex digits).

Publishing is atomic: the entry is built in ``<root>/tmp/``, every file and the directory
are fsync'ed, then the directory is renamed into place.  A reader sees no entry or a whole
one; a crash leaves at most an orphan in ``tmp/`` (removed by ``cache verify --repair``).
Removal renames the entry into ``tmp/`` first, so it disappears atomically too.

Reading checks, before any library is loaded: the manifest decodes, names only plain
files, the fingerprint recorded in it is the namespace's, the key is the signature's, the
sha256 of every file matches, the HMAC matches when a signing key is configured, and the
directory is neither world-writable nor owned by someone else (unless allowed).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import msgpack

from aoti_farm.errors import FarmError, UserError
from aoti_farm.fingerprint import Fingerprint
from aoti_farm.signature import Signature, parse_signature

CACHE_FORMAT = 1
MANIFEST = "manifest.msgpack"
KERNEL = "kernel.so"
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_FP_RE = re.compile(r"^[0-9a-f]{24}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def default_cache_dir() -> str:
    return os.environ.get("AOTI_FARM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "aoti-farm")


def check_key(key: str) -> str:
    """Keys come from traces, manifests and queue files: never let one name a path."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise FarmError(f"invalid signature key {key!r}")
    return key


def check_fp(fp_id: str) -> str:
    if not isinstance(fp_id, str) or not _FP_RE.match(fp_id):
        raise FarmError(f"invalid fingerprint id {fp_id!r}")
    return fp_id


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


# --- manifests and signing ----------------------------------------------------------------


def _signing_payload(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    return msgpack.packb(body, use_bin_type=True)


def sign(manifest: dict, key: bytes) -> str:
    return hmac.new(key, _signing_payload(manifest), hashlib.sha256).hexdigest()


def load_signing_key(explicit: str | bytes | None = None) -> bytes | None:
    """``AOTI_FARM_SIGNING_KEY`` (the key itself) or ``AOTI_FARM_SIGNING_KEY_FILE``."""
    if explicit:
        return explicit.encode() if isinstance(explicit, str) else explicit
    if os.environ.get("AOTI_FARM_SIGNING_KEY"):
        return os.environ["AOTI_FARM_SIGNING_KEY"].encode()
    path = os.environ.get("AOTI_FARM_SIGNING_KEY_FILE")
    if path:
        try:
            with open(path, "rb") as f:
                return f.read().strip()
        except OSError as e:
            raise UserError(f"signing key file {path}: {e.strerror}; fix AOTI_FARM_SIGNING_KEY_FILE") from None
    return None


_FROM_ENV = object()


@dataclass(frozen=True)
class Entry:
    """A verified entry: safe to dlopen ``kernel_path``."""

    fp_id: str
    key: str
    path: Path
    manifest: dict

    @property
    def kernel_path(self) -> str:
        return str(self.path / KERNEL)

    @property
    def signature(self) -> Signature:
        return parse_signature(self.manifest["signature"])


class BadEntry(FarmError):
    """An entry that failed verification.  ``kind`` is one of: missing, corrupt, foreign,
    unsigned, forged, insecure."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


class Cache:
    """One cache directory.  Cheap to construct; creates nothing until written to."""

    def __init__(self, root: str | os.PathLike | None = None, *, signing_key: bytes | None | object = _FROM_ENV,
                 allow_insecure: bool = False):
        """``signing_key`` defaults to the configured one (``load_signing_key()``); pass
        None to sign and check nothing, or bytes to use that key."""
        self.root = Path(root or default_cache_dir()).absolute()
        self.signing_key = load_signing_key() if signing_key is _FROM_ENV else signing_key
        self.allow_insecure = allow_insecure
        self._uid = os.getuid()

    # -- layout ----------------------------------------------------------------------------
    def ns(self, fp_id: str) -> Path:
        return self.root / check_fp(fp_id)

    def entry_dir(self, fp_id: str, key: str) -> Path:
        check_key(key)
        return self.ns(fp_id) / "entries" / key[:2] / key

    def failure_path(self, fp_id: str, key: str) -> Path:
        check_key(key)
        return self.ns(fp_id) / "failed" / key[:2] / f"{key}.msgpack"

    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def fingerprint_ids(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if _FP_RE.match(p.name) and p.is_dir())
        except FileNotFoundError:
            return []
        except OSError as e:
            raise FarmError(f"cache {self.root}: {e.strerror}") from None

    def ensure(self, fp: Fingerprint | None = None) -> None:
        """Create the top-level layout (and a namespace for ``fp``)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "tmp").mkdir(exist_ok=True)
            tag = self.root / "CACHEDIR.TAG"
            if not tag.exists():
                atomic_write(tag, b"Signature: 8a477f597d28d172789f06886806bc55\n# aoti-farm kernel cache\n")
            ver = self.root / "VERSION"
            if not ver.exists():
                atomic_write(ver, f"aoti-farm-cache {CACHE_FORMAT}\n".encode())
            if fp is not None:
                ns = self.ns(fp.id)
                ns.mkdir(exist_ok=True)
                fj = ns / "fingerprint.json"
                if not fj.exists():
                    atomic_write(fj, json.dumps(fp.as_dict(), indent=1, default=list).encode())
        except OSError as e:
            raise FarmError(f"cache {self.root}: cannot create layout: {e.strerror}") from None

    def check_version(self) -> None:
        ver = self.root / "VERSION"
        try:
            text = ver.read_text()
        except FileNotFoundError:
            return
        except OSError as e:
            raise UserError(f"cache {self.root}: unreadable ({e.strerror}); fix its permissions or pass another --cache-dir") from None
        if text.strip() != f"aoti-farm-cache {CACHE_FORMAT}":
            raise UserError(f"cache {self.root}: VERSION says {text.strip()!r}, expected 'aoti-farm-cache {CACHE_FORMAT}'; use another --cache-dir")

    # -- publish ---------------------------------------------------------------------------
    def publish(self, fp: Fingerprint, sig: Signature, files: dict[str, str | os.PathLike],
                meta: dict[str, Any]) -> Path:
        """Atomically publish ``files`` (name -> source path) as the entry for ``sig``.

        Returns the entry directory.  If an entry already exists, the existing one wins
        and the new files are discarded (both were verified against eager).
        """
        key = sig.key
        final = self.entry_dir(fp.id, key)
        self.ensure(fp)
        stage = self.tmp_dir() / f"stage-{uuid.uuid4().hex}"
        try:
            stage.mkdir()
            digests = {}
            for name, src in files.items():
                if not _FILE_RE.match(name) or name == MANIFEST:
                    raise FarmError(f"refusing to publish file name {name!r}")
                dst = stage / name
                shutil.copyfile(src, dst)
                with open(dst, "rb+") as f:
                    os.fsync(f.fileno())
                digests[name] = sha256_file(dst)
            manifest = {
                "format": CACHE_FORMAT, "key": key, "signature": sig.to_obj(),
                "fingerprint_id": fp.id, "fingerprint": fp.as_dict(), "files": digests,
                "created": time.time(), "host": socket.gethostname(), **meta,
            }
            if self.signing_key:
                manifest["hmac"] = sign(manifest, self.signing_key)
            with open(stage / MANIFEST, "wb") as f:
                f.write(msgpack.packb(manifest, use_bin_type=True, default=_default))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(stage, 0o755)
            fsync_dir(stage)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(stage, final)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return final  # someone else published first
                raise
            fsync_dir(final.parent)
            # a stale failure record for this key is now obsolete
            try:
                self.failure_path(fp.id, key).unlink()
            except FileNotFoundError:
                pass
            return final
        except OSError as e:
            raise FarmError(f"cache {self.root}: publish of {key[:12]} failed: {e.strerror or e}") from None
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)

    def remove(self, fp_id: str, key: str) -> bool:
        """Atomically remove an entry (rename into tmp/, then delete)."""
        d = self.entry_dir(fp_id, key)
        trash = self.tmp_dir() / f"trash-{uuid.uuid4().hex}"
        try:
            self.tmp_dir().mkdir(parents=True, exist_ok=True)
            os.rename(d, trash)
        except FileNotFoundError:
            return False
        except OSError as e:  # read-only or vanished cache: a FarmError, never a raw OSError
            raise FarmError(f"cache {self.root}: cannot remove entry {key[:12]}: {e.strerror}") from None
        shutil.rmtree(trash, ignore_errors=True)
        return True

    # -- read ------------------------------------------------------------------------------
    def has_entry(self, fp_id: str, key: str) -> bool:
        return (self.entry_dir(fp_id, key) / MANIFEST).exists()

    def read_manifest(self, d: Path) -> dict:
        try:
            with open(d / MANIFEST, "rb") as f:
                raw = f.read(16 << 20)
        except FileNotFoundError:
            raise BadEntry("missing", f"{d}: no manifest") from None
        except OSError as e:
            raise BadEntry("corrupt", f"{d}: manifest unreadable: {e.strerror}") from None
        try:
            m = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several types for garbage
            raise BadEntry("corrupt", f"{d}: manifest is not msgpack ({type(e).__name__})") from None
        if not isinstance(m, dict) or not isinstance(m.get("files"), dict) or m.get("format") != CACHE_FORMAT:
            raise BadEntry("corrupt", f"{d}: manifest lacks format/files")
        return m

    def _check_secure(self, p: Path) -> None:
        if self.allow_insecure:
            return
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            raise BadEntry("insecure", f"{p}: is a symbolic link")
        if st.st_uid != self._uid and st.st_uid != 0:
            raise BadEntry("insecure", f"{p}: owned by uid {st.st_uid}, not {self._uid}")
        if st.st_mode & stat.S_IWOTH:
            raise BadEntry("insecure", f"{p}: is world-writable")

    def open_entry(self, fp: Fingerprint | str, key: str, *, check_hashes: bool = True) -> Entry:
        """Verify an entry completely and return it; raises :class:`BadEntry`."""
        fp_id = fp if isinstance(fp, str) else fp.id
        d = self.entry_dir(fp_id, key)
        if not d.exists():
            raise BadEntry("missing", f"{d}: no such entry")
        try:
            for p in (self.root, self.ns(fp_id), d):
                self._check_secure(p)
        except OSError as e:
            raise BadEntry("missing", f"{d}: {e.strerror}") from None
        m = self.read_manifest(d)
        if m.get("fingerprint_id") != fp_id or (not isinstance(fp, str) and m.get("fingerprint") != _plain(fp.as_dict())):
            raise BadEntry("foreign", f"{d}: built under fingerprint {m.get('fingerprint_id')!r}, not {fp_id}")
        if m.get("key") != key:
            raise BadEntry("corrupt", f"{d}: manifest key {m.get('key')!r} != directory name")
        try:
            sig = parse_signature(m["signature"])
        except (ValueError, KeyError, TypeError) as e:
            raise BadEntry("corrupt", f"{d}: bad signature in manifest: {e}") from None
        if sig.key != key:
            raise BadEntry("corrupt", f"{d}: signature hashes to {sig.key[:12]}, not {key[:12]}")
        if self.signing_key:
            mac = m.get("hmac")
            if not mac:
                raise BadEntry("unsigned", f"{d}: manifest is not signed and a signing key is configured")
            if not hmac.compare_digest(str(mac), sign(m, self.signing_key)):
                raise BadEntry("forged", f"{d}: manifest HMAC does not match")
        if KERNEL not in m["files"]:
            raise BadEntry("corrupt", f"{d}: manifest lists no {KERNEL}")
        for name, digest in m["files"].items():
            if not isinstance(name, str) or not _FILE_RE.match(name) or name == MANIFEST:
                raise BadEntry("corrupt", f"{d}: manifest names a path outside the entry: {name!r}")
            p = d / name
            try:
                self._check_secure(p)
                if check_hashes and sha256_file(p) != digest:
                    raise BadEntry("corrupt", f"{p}: sha256 mismatch")
            except FileNotFoundError:
                raise BadEntry("missing", f"{p}: missing") from None
            except OSError as e:
                raise BadEntry("corrupt", f"{p}: unreadable: {e.strerror}") from None
        return Entry(fp_id, key, d, m)

    def touch_used(self, entry: Entry) -> None:
        try:
            (entry.path / "used").touch()
        except OSError:
            pass  # read-only caches still serve

    def list_keys(self, fp_id: str) -> set[str]:
        base = self.ns(fp_id) / "entries"
        out: set[str] = set()
        try:
            shards = list(os.scandir(base))
        except FileNotFoundError:
            return out
        for sh in shards:
            try:
                out.update(e.name for e in os.scandir(sh.path) if _KEY_RE.match(e.name))
            except (NotADirectoryError, FileNotFoundError):
                continue
        return out

    def iter_entry_dirs(self, fp_id: str | None = None) -> Iterator[tuple[str, str, Path]]:
        for f in ([fp_id] if fp_id else self.fingerprint_ids()):
            for k in sorted(self.list_keys(f)):
                yield f, k, self.entry_dir(f, k)

    # -- failures --------------------------------------------------------------------------
    def record_failure(self, fp: Fingerprint, sig: Signature, reason: str, *,
                       evidence: dict | None = None, attempts: int = 1) -> None:
        self.ensure(fp)
        p = self.failure_path(fp.id, sig.key)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            rec = {"format": CACHE_FORMAT, "key": sig.key, "signature": sig.to_obj(),
                   "reason": reason, "evidence": evidence or {}, "attempts": attempts,
                   "time": time.time(), "host": socket.gethostname()}
            atomic_write(p, msgpack.packb(rec, use_bin_type=True, default=_default), tmp_dir=self.tmp_dir())
        except OSError as e:
            raise FarmError(f"cache {self.root}: cannot write failure record: {e.strerror}") from None

    def failure(self, fp_id: str, key: str) -> dict | None:
        try:
            with open(self.failure_path(fp_id, key), "rb") as f:
                rec = msgpack.unpackb(f.read(), raw=False)
            return rec if isinstance(rec, dict) else {"reason": "unreadable failure record"}
        except FileNotFoundError:
            return None
        except Exception:
            return {"reason": "unreadable failure record"}

    def failed_keys(self, fp_id: str) -> set[str]:
        base = self.ns(fp_id) / "failed"
        out: set[str] = set()
        try:
            for sh in os.scandir(base):
                for e in os.scandir(sh.path):
                    if e.name.endswith(".msgpack") and _KEY_RE.match(e.name[:-8]):
                        out.add(e.name[:-8])
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def remove_failures(self, fp_id: str | None = None) -> int:
        n = 0
        for f in ([fp_id] if fp_id else self.fingerprint_ids()):
            for k in self.failed_keys(f):
                try:
                    self.failure_path(f, k).unlink()
                    n += 1
                except FileNotFoundError:
                    pass
        return n


def _plain(x: Any) -> Any:
    """Tuples -> lists, as msgpack round-trips them."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _default(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)
