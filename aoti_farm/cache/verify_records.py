"""`aoti-farm cache verify` for the small shared records: queue items, leases, failure
records, ``fingerprint.json`` and the directories that hold them.

Each bad thing is one item of verify's report (``what``, ``kind``, ``detail``); with
``repair`` it is removed -- never followed: a linked directory loses the link, not its
target.  Every read is bounded (:mod:`aoti_farm.cache.records`), so a FIFO, a link to
``/dev/zero`` or a huge sparse file costs a ``fstat``, never a hang or the memory.
"""

from __future__ import annotations

import os
import stat

from aoti_farm.cache import failures as failrec, leases, queue as missq, records
from aoti_farm.security import safeio
from aoti_farm.cache.store import Cache
from aoti_farm.errors import FarmError
from aoti_farm.cache.records import BadRecord
from aoti_farm.security.safeio import UnsafeFile


def check(cache: Cache, fp_id: str, *, repair: bool) -> list[dict]:
    """The bad records of namespace ``fp_id`` (removed when ``repair``)."""
    out: list[dict] = []

    def bad(what: str, name: str, kind: str, detail: str, fix) -> None:
        item = {"what": what, "fingerprint": fp_id, "key": name, "kind": kind, "detail": detail}
        if repair:
            try:
                item["repaired"] = bool(fix())
            except (OSError, FarmError) as e:
                item["repaired"] = False
                item["detail"] += f" (not removed: {e})"
        out.append(item)

    # the queue
    try:
        q = missq.scan(cache, fp_id)
    except BadRecord as e:
        q = records.Listing()
        bad("queue-dir", "queue", e.kind, str(e), lambda: _remove_linked_dir(cache, fp_id, "queue"))
    for name in q.junk:
        bad("queue-item", name, "corrupt", f"{missq.queue_dir(cache, fp_id) / name}: not a queue item name",
            lambda n=name: missq.remove(cache, fp_id, n))
    for key in sorted(q.keys):
        try:
            missq.read(cache, fp_id, key)
        except FileNotFoundError:
            continue
        except FarmError as e:
            bad("queue-item", key, getattr(e, "kind", "corrupt"), str(e), lambda k=key: missq.done(cache, fp_id, k))

    # leases
    try:
        ls = leases.scan(cache, fp_id)
    except BadRecord as e:
        ls = records.Listing()
        bad("lease-dir", "leases", e.kind, str(e), lambda: _remove_linked_dir(cache, fp_id, "leases"))
    for name in ls.junk:
        bad("lease", name, "corrupt", f"{cache.ns(fp_id) / 'leases' / name}: not a lease name",
            lambda n=name: leases.remove(cache, fp_id, n))
    for key in sorted(ls.keys):
        try:
            st = leases.inspect(cache, fp_id, key)
        except FarmError as e:
            bad("lease", key, getattr(e, "kind", "corrupt"), str(e), lambda: False)
            continue
        if not st.exists or not (st.stale or st.problem):
            continue
        p = leases.lease_path(cache, fp_id, key)
        if st.problem is not None:
            kind, detail = st.problem.kind, f"{st.problem} (counts as expired)"
        else:
            kind, detail = "stale", f"{p}: holder {(st.info or {}).get('owner', '?')} stopped heartbeating"
        bad("lease", key, kind, detail, lambda k=key: leases.remove(cache, fp_id, f"{k}{leases.SUFFIX}"))

    # failure records
    fs = failrec.scan(cache, fp_id)
    if fs.problem is not None:
        bad("failed-dir", "failed", fs.problem.kind, str(fs.problem),
            lambda: _remove_linked_dir(cache, fp_id, "failed"))
    for rel in fs.junk:
        bad("failure-record", rel, "corrupt", f"{cache.ns(fp_id) / 'failed' / rel}: not a failure record",
            lambda r=rel: failrec.remove(cache, fp_id, r))
    for key in sorted(fs.keys):
        try:
            failrec.read(cache, fp_id, key)
        except FileNotFoundError:
            continue
        except FarmError as e:
            bad("failure-record", key, getattr(e, "kind", "corrupt"), str(e),
                lambda k=key: failrec.remove_key(cache, fp_id, k))

    # fingerprint.json (rewritten by the next publish into this namespace)
    try:
        records.read_fingerprint(cache, fp_id)
    except FileNotFoundError:
        pass
    except FarmError as e:
        bad("fingerprint-file", "fingerprint.json", getattr(e, "kind", "corrupt"), str(e),
            lambda: _remove_name(cache, fp_id, "fingerprint.json"))
    return out


def _remove_name(cache: Cache, fp_id: str, name: str) -> bool:
    fd = records.open_subdir(cache, fp_id)
    try:
        return records.remove_name(fd, name)
    finally:
        os.close(fd)


def _remove_linked_dir(cache: Cache, fp_id: str, name: str) -> bool:
    """Remove ``<fp>/<name>`` when it is a link or no directory at all (never what a link
    points to); a real directory with a bad owner or mode is left for its owner to fix."""
    fd = records.open_subdir(cache, fp_id)
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            return False
        os.unlink(name, dir_fd=fd)
        return True
    finally:
        os.close(fd)


def counts(cache: Cache, fp_id: str) -> dict:
    """Record counts for `cache stats` (an unsafe directory counts as empty)."""
    def n(fn) -> int:
        try:
            return len(fn())
        except (OSError, FarmError):
            return 0

    return {"failures": n(lambda: failrec.scan(cache, fp_id).keys), "queue": n(lambda: missq.pending(cache, fp_id)),
            "leases": n(lambda: leases.scan(cache, fp_id).keys)}


def fingerprint_summary(cache: Cache, fp_id: str) -> str:
    """One line about the namespace, from its ``fingerprint.json`` (bounded, checked)."""
    try:
        d = records.read_fingerprint(cache, fp_id)
    except (OSError, FarmError):
        return "fingerprint.json unreadable"
    parts = [f"torch {d.get('torch')}", d.get("device_type") or "?"]
    if d.get("gpu"):
        parts.append(str(d["gpu"]))
    elif d.get("cpu_isa") is not None:
        parts.append(str(d.get("cpu_isa") or "no-vec"))
    return ", ".join(parts)


def unsafe_dirs(cache) -> list[str]:
    """``cache verify``: problems with the directories of ``cache`` (a Cache) itself: the root's ancestors (the ssh
    StrictModes rule), the root, each namespace, ``entries/`` and its shards (owner,
    writable by others, links).  Empty when safe (or ``allow_insecure``)."""
    if cache.allow_insecure:
        return []
    out: list[str] = []
    uids = safeio.allowed_uids()
    root = os.path.realpath(cache.root)
    try:
        safeio.check_ancestors(root)
    except UnsafeFile as e:
        out.append(str(e))
    try:
        root_fd = safeio.open_dir(root, uids=uids)
    except UnsafeFile as e:
        return out + ([] if e.kind == "missing" else [str(e)])
    try:
        for fp_id in cache.fingerprint_ids():
            for parts in ((fp_id,), (fp_id, "entries")):
                try:
                    os.close(safeio.walk(root_fd, parts, uids=uids, base=str(cache.root)))
                except UnsafeFile as e:
                    if e.kind != "missing":
                        out.append(str(e))
            try:
                shards = sorted(os.listdir(cache.ns(fp_id) / "entries"))
            except OSError:
                continue
            for sh in shards:
                try:
                    os.close(safeio.walk(root_fd, (fp_id, "entries", sh), uids=uids, base=str(cache.root)))
                except UnsafeFile as e:
                    if e.kind != "missing":
                        out.append(str(e))
    finally:
        os.close(root_fd)
    return out
