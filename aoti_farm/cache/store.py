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
    <root>/<fp>/leases/<key>.lease              who compiles it now (see cache/leases.py)
    <root>/<fp>/queue/<key>.msgpack             the runtime's miss queue (see cache/queue.py)

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
from pathlib import Path
from typing import Any, Iterator

import msgpack

from aoti_farm.config import load_signing_key  # noqa: F401 -- checks an explicit key; re-exported
from aoti_farm.errors import FarmError, UserError
from aoti_farm.security import safeio
from aoti_farm.fingerprint import Fingerprint
from aoti_farm.security.fsutil import atomic_write, fsync_dir  # noqa: F401 -- used by importers too
from aoti_farm.cache.layout import (  # noqa: F401 -- the cache's names, used by importers too
    CACHE_FORMAT, FP_RE, KERNEL, KEY_RE, MANIFEST, check_fp, check_key, msgpack_default)
from aoti_farm.cache.manifest import (  # noqa: F401 -- Entry, BadEntry, sign, sha256_file: used by importers too
    BAD_KIND, FILE_RE, UNBUILT, BadEntry, index_guards, Entry, decode_manifest, plain, sha256_fd, sha256_file, sign)
from aoti_farm.cache import elfstack
from aoti_farm.security.safeio import PrivateCopy, UnsafeFile
from aoti_farm.signature import Signature, parse_signature

_KEY_RE, _FP_RE = KEY_RE, FP_RE
_SHARD_NAME = re.compile(r"^[0-9a-f]{2}$")
_SHARDED = {"entries": "entries", "failed": "failed"}   # Cache.shard_stamps / shard_keys kinds


class Cache:
    """One cache directory.  Cheap to construct; creates nothing until written to."""

    def __init__(self, root: str | os.PathLike | None, *, signing_key: bytes | str | None = None,
                 allow_insecure: bool = False):
        """``root``: the cache directory, resolved by the caller (``aoti_farm.config.cache_dir``
        resolves ``--cache-dir`` / ``AOTI_FARM_CACHE_DIR`` and applies the default, in one
        place; never the environment here).  ``signing_key``:
        the key's bytes (``aoti_farm.config.signing_key`` resolves the configured one), or
        None to sign and check nothing."""
        if not root:
            raise ValueError("Cache: root is the resolved cache directory (aoti_farm.config.cache_dir)")
        self.root = Path(root).absolute()
        # an empty key is an error (UserError), never "no signing"
        self.signing_key = None if signing_key is None else load_signing_key(signing_key)
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
            stage.mkdir(mode=0o700)
            digests = {}
            for name, src in files.items():
                if not FILE_RE.match(name) or name == MANIFEST:
                    raise FarmError(f"refusing to publish file name {name!r}")
                # the digest is of the bytes read from ``src`` (this process's verified
                # build), never of the staged file, which another writer of tmp/ could swap
                digests[name] = _copy_hashed(src, stage / name)
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
                from aoti_farm.cache import failures as failrec

                failrec.remove_key(self, fp.id, key)
            except (OSError, FarmError):
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

    def _uids(self):
        return None if self.allow_insecure else safeio.allowed_uids()

    def _open_entry_dir(self, fp_id: str, key: str) -> int:
        """The entry directory's descriptor, reached from the root one component at a time
        (no link followed; each directory owned by this user or root and not writable by
        others, unless ``allow_insecure``).  Raises :class:`BadEntry`."""
        d = self.entry_dir(fp_id, key)
        uids = self._uids()
        try:
            root = os.path.realpath(self.root)   # a link *to* the root is the user's choice
            if not self.allow_insecure:
                safeio.check_ancestors(root)
            root_fd = safeio.open_dir(root, uids=uids)
            try:
                return safeio.walk(root_fd, (fp_id, "entries", key[:2], key), uids=uids, base=str(self.root))
            finally:
                os.close(root_fd)
        except UnsafeFile as e:
            raise BadEntry(BAD_KIND[e.kind], str(e)) from None

    def _read_manifest_at(self, dfd: int, d: Path) -> dict:
        try:
            raw = safeio.read_bounded(MANIFEST, dfd, max_bytes=safeio.MANIFEST_MAX, uids=self._uids(),
                                      what=str(d / MANIFEST))
        except UnsafeFile as e:
            kind = "missing" if e.kind == "missing" else BAD_KIND[e.kind]
            raise BadEntry(kind, str(e)) from None
        return decode_manifest(raw, d)

    def read_manifest(self, d: Path) -> dict:
        """The decoded manifest of the entry directory ``d`` (bounded, no link followed;
        no other check: see :meth:`open_entry`)."""
        try:
            dfd = safeio.open_dir(d, uids=self._uids())
        except UnsafeFile as e:
            raise BadEntry(BAD_KIND[e.kind], f"{d}: {e}") from None
        try:
            return self._read_manifest_at(dfd, d)
        finally:
            os.close(dfd)

    def open_entry(self, fp: Fingerprint | str, key: str, *, check_hashes: bool = True,
                   private: bool = False, guards: bool = True) -> Entry:
        """Verify an entry completely and return it; raises :class:`BadEntry`.

        Every directory from the root down and every file is opened without following
        links and checked on its descriptor; the manifest is read bounded and checked
        (fingerprint, key, HMAC) before anything else.  With ``private=True`` the kernel is
        copied into a sealed private copy while it is hashed (``Entry.kernel``): load that,
        never the shared path, and ``close()`` the entry afterwards.  ``guards=False``: the
        caller cannot enforce index guards (upstream's holder), so a guarded entry
        (``manifest.GUARDED_FORMAT``) is refused (``guarded``); with guards it must have
        guards that read (``manifest.index_guards``)."""
        fp_id = fp if isinstance(fp, str) else fp.id
        d = self.entry_dir(fp_id, key)
        dfd = self._open_entry_dir(fp_id, key)
        copy: PrivateCopy | None = None
        try:
            m = self._read_manifest_at(dfd, d)
            if m.get("fingerprint_id") != fp_id or (not isinstance(fp, str) and m.get("fingerprint") != plain(fp.as_dict())):
                raise BadEntry("foreign", f"{d}: built under fingerprint {m.get('fingerprint_id')!r}, not {fp_id}")
            if m.get("key") != key:
                raise BadEntry("corrupt", f"{d}: manifest key {m.get('key')!r} != directory name")
            if index_guards(m, d) and not guards:
                raise BadEntry("guarded", f"{d}: a kernel served only behind index guards, which this reader "
                                          "cannot enforce")
            if m.get("compiler") in UNBUILT or "imported_from" in m:
                # signed by an earlier import-upstream, whatever its HMAC says: not ours
                raise BadEntry("unbuilt", f"{d}: a library the farm did not build (adopted from an upstream "
                                          "cache by an earlier aoti-farm); `aoti-farm cache verify --repair` "
                                          "removes it and `cache import-upstream` compiles its signature here")
            if self.signing_key:
                mac = m.get("hmac")
                if not mac:
                    raise BadEntry("unsigned", f"{d}: manifest is not signed and a signing key is configured")
                if not isinstance(mac, str) or not hmac.compare_digest(mac, sign(m, self.signing_key)):
                    raise BadEntry("forged", f"{d}: manifest HMAC does not match")
            try:
                sig = parse_signature(m["signature"])
                sig_key = sig.key
                if "shape_class" in m:   # a shape-general entry: keyed by its class (aoti_farm/dynamic/shapes.py)
                    from aoti_farm.dynamic.shapes import parse_class

                    cls = parse_class(m["shape_class"])
                    if cls.example != sig:
                        raise ValueError("the signature is not the class's example")
                    sig_key = cls.key
            except Exception as e:  # noqa: BLE001 -- a crafted signature is a bad entry, whatever it raises
                raise BadEntry("corrupt", f"{d}: bad signature in manifest: {type(e).__name__}: {e}") from None
            if sig_key != key:
                raise BadEntry("corrupt", f"{d}: signature hashes to {sig_key[:12]}, not {key[:12]}")
            for name, digest in m["files"].items():
                if not check_hashes and not (private and name == KERNEL):
                    continue
                what = str(d / name)
                try:
                    fd, _ = safeio.open_regular(name, dfd, max_bytes=safeio.KERNEL_MAX, uids=self._uids(), what=what)
                except UnsafeFile as e:
                    raise BadEntry(BAD_KIND[e.kind], str(e)) from None
                try:
                    if name == KERNEL and (why := elfstack.exec_stack_request(fd)):
                        raise BadEntry("insecure", f"{what}: {why}; loading it would make this process's stack "
                                                   "executable (`aoti-farm cache verify --repair` removes it)")
                    if private and name == KERNEL:
                        copy = safeio.private_copy(fd, max_bytes=safeio.KERNEL_MAX, name=key[:16], what=what)
                        got = copy.sha256
                    else:
                        got = sha256_fd(fd, what)
                except UnsafeFile as e:
                    raise BadEntry(BAD_KIND[e.kind], str(e)) from None
                except OSError as e:
                    raise BadEntry("corrupt", f"{what}: unreadable: {e.strerror}") from None
                finally:
                    os.close(fd)
                if got != digest:
                    raise BadEntry("corrupt", f"{what}: sha256 mismatch")
            entry = Entry(fp_id, key, d, m, copy)
            copy = None
            return entry
        finally:
            os.close(dfd)
            if copy is not None:
                copy.close()

    def touch_used(self, entry: Entry) -> None:
        """Mark the entry used (for gc's LRU): ``used`` is created or touched through the
        entry's descriptor, never through a link."""
        try:
            dfd = self._open_entry_dir(entry.fp_id, entry.key)
        except BadEntry:
            return
        try:
            fd = os.open("used", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         0o644, dir_fd=dfd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.utime(fd)
            finally:
                os.close(fd)
        except OSError:
            pass  # read-only caches still serve
        finally:
            os.close(dfd)

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

    # -- listing by shard (for pollers: the serving hook's index) ------------------------------
    def shard_stamps(self, fp_id: str, kind: str, shards=None) -> dict[str, tuple[int, int]]:
        """Change stamps ``(mtime_ns, nlink)`` of the shard directories (``key[:2]``) of
        ``kind``: "entries" (published kernels) or "failed" (failure records); ``shards``:
        only these names (absent ones are left out).  A shard whose stamp did not change
        lists the same keys, so a poller lists again (:meth:`shard_keys`) only the others."""
        base = self.ns(fp_id) / _SHARDED[kind]
        if shards is None:
            try:
                with os.scandir(base) as it:
                    shards = [e.name for e in it if _SHARD_NAME.match(e.name)]
            except (FileNotFoundError, NotADirectoryError):
                return {}
        out: dict[str, tuple[int, int]] = {}
        for name in shards:
            try:
                st = os.stat(base / name)
            except OSError:
                continue
            out[name] = (st.st_mtime_ns, st.st_nlink)
        return out

    def shard_keys(self, fp_id: str, kind: str, shard: str) -> set[str]:
        """The keys in one shard of ``kind`` (see :meth:`shard_stamps`): published entries,
        or failure records (read none).  OSError when the shard cannot be listed."""
        names = os.listdir(self.ns(fp_id) / _SHARDED[kind] / shard)
        if kind == "entries":
            return {n for n in names if _KEY_RE.match(n) and n[:2] == shard}
        sfx = ".msgpack"
        return {n[: -len(sfx)] for n in names if n.endswith(sfx) and _KEY_RE.match(n[: -len(sfx)])}

    def iter_entry_dirs(self, fp_id: str | None = None) -> Iterator[tuple[str, str, Path]]:
        for f in ([fp_id] if fp_id else self.fingerprint_ids()):
            for k in sorted(self.list_keys(f)):
                yield f, k, self.entry_dir(f, k)

    # -- failures --------------------------------------------------------------------------
    def record_failure(self, fp: Fingerprint, sig: Signature, reason: str, *,
                       evidence: dict | None = None, attempts: int = 1) -> None:
        """Record (or replace) a deterministic failure (see :mod:`aoti_farm.cache.failures`)."""
        from aoti_farm.cache import failures as failrec

        failrec.write(self, fp, sig, reason, evidence=evidence, attempts=attempts)

    def failure(self, fp_id: str, key: str) -> dict | None:
        """The failure record of ``key``, or None: none, or a bad one (unsafe, oversized,
        garbage, wrong schema -- counted, and skipped: the signature is not failed)."""
        from aoti_farm.cache import failures as failrec, records

        try:
            return failrec.read(self, fp_id, key)
        except FileNotFoundError:
            return None
        except FarmError as e:
            records.count_bad("failure-record", getattr(e, "kind", "corrupt"))
            return None

    def failed_keys(self, fp_id: str) -> set[str]:
        """Keys with a failure record file (read none: see :meth:`failure`)."""
        from aoti_farm.cache import failures as failrec

        return failrec.scan(self, fp_id).keys

    def remove_failures(self, fp_id: str | None = None) -> int:
        from aoti_farm.cache import failures as failrec

        n = 0
        for f in ([fp_id] if fp_id else self.fingerprint_ids()):
            for k in self.failed_keys(f):
                n += failrec.remove_key(self, f, k)
        return n


def _copy_hashed(src: str | os.PathLike, dst: Path) -> str:
    """Copy ``src`` to a new file ``dst`` (fsync'ed); the sha256 of the bytes copied."""
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        for chunk in iter(lambda: fi.read(1 << 20), b""):
            h.update(chunk)
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    return h.hexdigest()


_default = msgpack_default
