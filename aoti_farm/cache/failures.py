"""Failure records: ``<root>/<fp>/failed/<key[:2]>/<key>.msgpack``.

A signature that fails to compile or to verify deterministically gets a record (reason,
evidence, attempts) so that no worker compiles it again; ``aoti-farm cache rm --failed``
clears them.  :class:`aoti_farm.cache.store.Cache` keeps its ``record_failure`` / ``failure`` /
``failed_keys`` / ``remove_failures`` methods; they delegate here (``cache`` below is that
Cache; this module does not import it, so the two never import each other).

Like every shared record (see :mod:`aoti_farm.cache.records`), a record is written and read
through directory descriptors that never follow a link, read bounded (a regular file of
at most 1 MiB, opened non-blocking: a FIFO or a link to ``/dev/zero`` costs nothing) and
checked against its schema (``format``, ``key`` equal to the file's, ``reason`` a string,
``evidence`` a table, ``attempts`` a count, ``time`` a finite number, ``host`` a string).
A bad record is skipped by readers -- the signature counts as not failed -- counted, and
reported by ``cache verify``; ``--repair`` removes it.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
import uuid
from typing import TYPE_CHECKING

import msgpack

from aoti_farm.cache import records
from aoti_farm.cache.layout import CACHE_FORMAT, check_key
from aoti_farm.cache.layout import msgpack_default as _default
from aoti_farm.errors import FarmError
from aoti_farm.cache.records import BadRecord

if TYPE_CHECKING:   # torch-free at run time: ``cache stats`` and ``report`` count classes here
    from aoti_farm.fingerprint import Fingerprint
    from aoti_farm.signature import Signature

SUFFIX = ".msgpack"
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")
_SCHEMA = {"format": lambda x: x == CACHE_FORMAT and not isinstance(x, bool), "key": records.is_key,
           "signature": lambda x: isinstance(x, dict), "reason": records.short_str(1 << 16),
           "evidence": lambda x: isinstance(x, dict), "attempts": records.nonneg_int,
           "time": records.is_number, "host": records.short_str(256)}


def write(cache, fp: Fingerprint, sig: Signature, reason: str, *, evidence: dict | None = None,
          attempts: int = 1) -> None:
    """Record (or replace) the failure of ``sig``; FarmError when it cannot be written."""
    key = check_key(sig.key)
    name = f"{key}{SUFFIX}"
    rec = {"format": CACHE_FORMAT, "key": key, "signature": sig.to_obj(), "reason": reason,
           "evidence": evidence or {}, "attempts": attempts, "time": time.time(), "host": socket.gethostname()}
    data = msgpack.packb(rec, use_bin_type=True, default=_default)
    cache.ensure(fp)
    try:
        fd = records.open_subdir(cache, fp.id, "failed", key[:2], create=True)
        try:
            tmp = f".{key}.{uuid.uuid4().hex[:8]}.tmp"
            records.write_new(fd, tmp, data)
            try:
                try:
                    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                except OSError as e:   # a directory in the record's place: it goes
                    if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise
                    records.remove_name(fd, name)
                    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            finally:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)
    except (OSError, BadRecord) as e:
        raise FarmError(f"cache {cache.root}: cannot write failure record: {getattr(e, 'strerror', None) or e}") from None


def read(cache, fp_id: str, key: str) -> dict:
    """The failure record of ``key``: FileNotFoundError when there is none,
    :class:`BadRecord` when it is unsafe or breaks the schema."""
    check_key(key)
    what = f"failure record {cache.failure_path(fp_id, key)}"
    fd = records.open_subdir(cache, fp_id, "failed", key[:2])
    try:
        raw = records.read(cache, fd, f"{key}{SUFFIX}", what)
    finally:
        os.close(fd)
    rec = records.check_schema(records.decode_msgpack(raw, what), _SCHEMA, what)
    if rec["key"] != key:
        raise BadRecord("corrupt", f"{what}: names the key {rec['key'][:16]}, not its own")
    return rec


class Scan:
    """``keys``: keys with a record file (of any type); ``junk``: paths under ``failed/``
    that no record may have (a non-shard name, a linked shard, a non-key name, a key in
    the wrong shard); ``problem``: an unsafe ``failed/`` directory itself."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.junk: list[str] = []
        self.problem: BadRecord | None = None


def scan(cache, fp_id: str) -> Scan:
    out = Scan()
    try:
        base = records.open_subdir(cache, fp_id, "failed")
    except FileNotFoundError:
        return out
    except BadRecord as e:
        out.problem = e
        return out
    try:
        with os.scandir(base) as it:
            shards = [e.name for e in it]
        for sh in sorted(shards):
            if not _SHARD_RE.match(sh):
                if not sh.startswith("."):
                    out.junk.append(sh)
                continue
            try:
                fd = records.open_subdir(cache, fp_id, "failed", sh)
            except FileNotFoundError:
                continue
            except BadRecord:       # a link, a file, a shard writable by others
                out.junk.append(sh)
                continue
            try:
                lst = records.list_dir(fd, SUFFIX, records.is_key)
            finally:
                os.close(fd)
            for k in lst.keys:
                if k[:2] == sh:
                    out.keys.add(k)
                else:
                    out.junk.append(f"{sh}/{k}{SUFFIX}")
            out.junk.extend(f"{sh}/{n}" for n in lst.junk)
    finally:
        os.close(base)
    return out


def remove(cache, fp_id: str, rel: str) -> bool:
    """Remove ``failed/<rel>`` (``<shard>`` or ``<shard>/<name>``), whatever it is, never
    following a link."""
    parts = rel.split("/")
    if len(parts) > 2 or any(not p or p in (".", "..") for p in parts):
        raise FarmError(f"invalid failure record path {rel!r}")
    try:
        fd = records.open_subdir(cache, fp_id, "failed", *parts[:-1])
    except (FileNotFoundError, BadRecord):
        return False
    try:
        return records.remove_name(fd, parts[-1])
    finally:
        os.close(fd)


def remove_key(cache, fp_id: str, key: str) -> bool:
    check_key(key)
    return remove(cache, fp_id, f"{key[:2]}/{key}{SUFFIX}")


# --- classes --------------------------------------------------------------------------------

PROXY_EXECUTOR_REFUSAL = "unsupported: the kernel needs AOTInductor's proxy executor (an op without a C shim)"

#: The named classes of refusals (docs/verification.md): warm's summary, ``cache stats`` and
#: the HTML report count them; ``explain`` names a failure's.
REFUSAL_CLASSES = ("values", "layout", "precision", "errors", "aborts", "proxy executor", "unverifiable",
                   "ineligible", "compile error", "memory budget", "bug", "other")
_LAYOUT_PROBLEMS = ("strides", "memory format", "shape", "dtype", "device", "output count", "not a tensor")


def refusal_class(reason: str | None, evidence: dict | None = None) -> str:
    """The class of a refusal or failure, from its reason and evidence: ``values`` (a value,
    NaN, inf or zero sign differs on finite inputs at ordinary magnitudes), ``layout``
    (strides, memory format, shape, dtype), ``precision`` (less accurate than eager against
    float64), ``errors`` (raises where eager does not, or the reverse), ``aborts`` (ends or
    crashes its process), ``proxy executor``, ``unverifiable`` (an index bound on CUDA),
    ``ineligible``, ``compile error`` (Inductor's, or eager rejects the example),
    ``memory budget``, ``bug`` (aoti-farm's own), else ``other``."""
    r = str(reason or "")
    ev = evidence if isinstance(evidence, dict) else {}
    if r.startswith("kernel disagrees with eager"):
        return "layout" if ev.get("problem") in _LAYOUT_PROBLEMS else "values"
    if r.startswith("kernel less accurate than eager"):
        return "precision"
    if r.startswith(("kernel does not raise where eager raises", "kernel raises where eager does not")):
        return "errors"
    if r.startswith(("kernel aborts the process", "kernel crashed its loader")):
        return "aborts"
    if r.startswith(PROXY_EXECUTOR_REFUSAL):
        return "proxy executor"
    if r.startswith("unsupported on CUDA"):
        return "unverifiable"
    if r.startswith("ineligible"):
        return "ineligible"
    if r.startswith(("compile error", "eager rejects", "AOTInductor produced no library")):
        return "compile error"
    if ev.get("refused") == "memory_budget" or "memory budget" in r:
        return "memory budget"
    if r.startswith("bug in aoti-farm"):
        return "bug"
    return "other"


def tally(results) -> tuple[dict, dict]:
    """``({refusal class: n}, {edge note class: n})`` over warm results (dicts with
    ``status``, ``refused``, ``error``, ``evidence``): refused signatures by
    :func:`refusal_class`, published ones by the classes of their edge notes.  Warm's
    summary and the HTML report count with this."""
    refused: dict[str, int] = {}
    notes: dict[str, int] = {}
    for r in results:
        if not isinstance(r, dict):
            continue
        ev = r.get("evidence") if isinstance(r.get("evidence"), dict) else {}
        if r.get("status") == "failed" and r.get("refused"):
            c = refusal_class(r.get("error"), ev)
            refused[c] = refused.get(c, 0) + 1
        elif r.get("status") == "compiled":
            for c in ev.get("edge_notes") or ():
                notes[str(c)] = notes.get(str(c), 0) + 1
    return refused, notes


def counts_text(counts: dict) -> str:
    """``"layout 1, values 2"``: a class count, sorted by class."""
    return ", ".join(f"{c} {n}" for c, n in sorted(counts.items()))
