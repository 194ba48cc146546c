"""`aoti-farm cache stats | ls | verify | gc | rm`: looking after a cache directory.

Every command works on :class:`aoti_farm.cache.store.Cache` and its layout (see cache/store.py) and
never bypasses it to write: removal goes through ``Cache.remove`` (an atomic rename into
``tmp/``), so a serving process sees an entry or no entry, never half of one.

Each command takes an argparse namespace (``cache_dir``, ``json``, ...), prints a table or
one JSON document, and returns the exit code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any


from aoti_farm.cache.store import CACHE_FORMAT, KERNEL, MANIFEST, BadEntry, Cache
from aoti_farm.cache.opening import open_cache
from aoti_farm.errors import FarmError, UserError

#: Things in tmp/ older than this are orphans of a crashed publish/removal.
ORPHAN_AGE = 3600.0


def _key(ns) -> bytes | None:
    """The resolved signing key the command layer put on ``ns`` (None: none configured)."""
    return getattr(ns, "signing_key", None)


def _fp_ids(cache: Cache) -> list[str]:
    try:
        return cache.fingerprint_ids()
    except FarmError as e:
        raise UserError(f"{e}; fix the cache directory's permissions or pass another --cache-dir") from None


# --- helpers ----------------------------------------------------------------------------


def dir_bytes(d: Path) -> int:
    total = 0
    try:
        for e in os.scandir(d):
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            total += dir_bytes(Path(e.path)) if stat.S_ISDIR(st.st_mode) else st.st_size
    except (FileNotFoundError, NotADirectoryError):
        pass
    return total


def human(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n}"


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """'500M', '2G', '1024K', '1.5G', '123' (bytes) -> bytes; powers of 1024."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UserError(f"--max-size {text!r}: not a size; write it like 500M, 2G or 1024K")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _manifest(cache: Cache, d: Path) -> dict | None:
    try:
        return cache.read_manifest(d)
    except BadEntry:
        return None


def _last_used(d: Path) -> float:
    for name in ("used", MANIFEST):
        try:
            return os.stat(d / name).st_mtime
        except OSError:
            continue
    try:
        return os.stat(d).st_mtime
    except OSError:
        return 0.0


def _emit(ns, obj: Any, lines: list[str]) -> None:
    if getattr(ns, "json", False):
        json.dump(obj, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        for line in lines:
            print(line)


def _tmp_items(cache: Cache) -> list[tuple[Path, float]]:
    try:
        return [(Path(e.path), e.stat(follow_symlinks=False).st_mtime) for e in os.scandir(cache.tmp_dir())]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _rm_path(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


# --- stats ------------------------------------------------------------------------------


def _classes(cache: Cache, fp_id: str, manifests: list[dict]) -> tuple[dict, dict]:
    """``({failure class: n}, {edge note class: n})``: the namespace's failure records by
    :func:`aoti_farm.cache.failures.refusal_class` (a bad record is not counted, as it is
    not a failure), its entries by the classes of their edge notes."""
    from aoti_farm.cache.failures import refusal_class
    from aoti_farm.cache.manifest import edge_notes

    failed: dict[str, int] = {}
    for k in sorted(cache.failed_keys(fp_id)):
        rec = cache.failure(fp_id, k)
        if rec is not None:
            c = refusal_class(rec.get("reason"), rec.get("evidence"))
            failed[c] = failed.get(c, 0) + 1
    notes: dict[str, int] = {}
    for m in manifests:
        for c in edge_notes(m):
            notes[c] = notes.get(c, 0) + 1
    return failed, notes


def stats(ns) -> int:
    from aoti_farm.cache import verify_records
    from aoti_farm.cache.failures import counts_text
    from aoti_farm.speedgate.speed import GATE_RATIO, compile_ratio, speed_summary

    cache = open_cache(ns.cache_dir, signing_key=_key(ns))
    per = {}
    for f in _fp_ids(cache):
        keys = cache.list_keys(f)
        manifests = [_manifest(cache, cache.entry_dir(f, k)) or {} for k in keys]
        failed_by, notes_by = _classes(cache, f, manifests)
        per[f] = {
            "entries": len(keys),
            "bytes": sum(dir_bytes(cache.entry_dir(f, k)) for k in keys),
            **verify_records.counts(cache, f),    # bounded reads; an unsafe directory counts 0
            "fingerprint": _fp_summary(cache, f),
            # measured speed-ups (manifest "speed", runtime/gate.py)
            "speed": speed_summary([compile_ratio(m.get("speed")) for m in manifests]),
            # the named classes (docs/verification.md): failure records, entries' edge notes
            "failure_classes": failed_by, "edge_notes": notes_by,
        }
    tot = {k: sum(v[k] for v in per.values()) for k in ("entries", "bytes", "failures", "queue", "leases")}
    tmp = _tmp_items(cache)
    obj = {"cache_dir": str(cache.root), **tot, "tmp_items": len(tmp), "fingerprints": per}
    lines = [f"cache {cache.root}",
             f"  entries {tot['entries']}  size {human(tot['bytes'])}  failures {tot['failures']}  "
             f"queue {tot['queue']}  leases {tot['leases']}  tmp/ items {len(tmp)}"]
    for f, v in per.items():
        lines.append(f"  fingerprint {f} ({v['fingerprint']}): entries {v['entries']}  size {human(v['bytes'])}  "
                     f"failures {v['failures']}  queue {v['queue']}  leases {v['leases']}")
        sp = v["speed"]
        med = "-" if sp["median_ratio"] is None else f"{sp['median_ratio']:.2f}x eager"
        lines.append(f"    speed: {sp['faster']} faster than eager (<= {GATE_RATIO}x), {sp['not_faster']} not, "
                     f"{sp['unmeasured']} unmeasured; median {med}")
        if v["failure_classes"]:
            lines.append(f"    failures by class: {counts_text(v['failure_classes'])}")
        if v["edge_notes"]:
            lines.append(f"    edge notes (served under contract 'finite', not 'strict'): {counts_text(v['edge_notes'])}")
    _emit(ns, obj, lines)
    return 0


def _fp_summary(cache: Cache, fp_id: str) -> str:
    from aoti_farm.cache.verify_records import fingerprint_summary

    return fingerprint_summary(cache, fp_id)


# --- ls ---------------------------------------------------------------------------------


def ls(ns) -> int:
    from aoti_farm.speedgate.speed import speedup_text
    from aoti_farm.signature import describe, parse_signature

    cache = open_cache(ns.cache_dir, signing_key=_key(ns))
    rows = []
    only_failed = bool(getattr(ns, "failed", False))   # --failed lists failure records only
    for f in _fp_ids(cache):
        for k in ([] if only_failed else sorted(cache.list_keys(f))):
            d = cache.entry_dir(f, k)
            m = _manifest(cache, d)
            op, desc, secs, speed, threads = "?", "(unreadable manifest)", None, None, None
            ranges = None
            if m is not None:
                speed, threads = m.get("speed"), m.get("threads")
                try:
                    sig = parse_signature(m.get("signature"))
                    op, desc = sig.op, describe(sig)
                    if "shape_class" in m:   # a shape-general entry: its pattern and ranges (aoti_farm/dynamic/shapes.py)
                        from aoti_farm.dynamic.shapes import parse_class

                        cls = parse_class(m["shape_class"])
                        desc, ranges = f"{cls.describe()} [shape-general]", {n: [lo, hi] for n, lo, hi in cls.ranges}
                except (ValueError, KeyError, TypeError) as e:
                    desc = f"(bad signature: {e})"
                secs = m.get("compile_seconds")
            rows.append({"fingerprint": f, "key": k, "op": op, "description": desc,
                         "bytes": dir_bytes(d), "compile_seconds": secs, "last_used": _last_used(d),
                         # kernel against eager on the compiling device (runtime/gate.py)
                         "speed": speed if isinstance(speed, dict) else None,
                         "threads": threads if isinstance(threads, str) else None,
                         **({"ranges": ranges} if ranges else {})})
        if only_failed:
            for k in sorted(cache.failed_keys(f)):
                rec = cache.failure(f, k) or {}   # a bad record reads as none: verify reports it
                rows.append({"fingerprint": f, "key": k, "failed": True,
                             "reason": rec.get("reason") or "unreadable failure record (see `aoti-farm cache verify`)",
                             "attempts": rec.get("attempts")})
    lines = []
    for r in rows:
        if r.get("failed"):
            lines.append(f"{r['key'][:16]}  FAILED  {r['reason']}")
        else:
            s = "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.1f}s"
            lines.append(f"{r['key'][:16]}  {human(r['bytes']):>7}  {s:>6}  {speedup_text(r['speed']):>26}  "
                         f"{r['description']}")
    if not rows:
        lines.append(f"(no {'failure records' if only_failed else 'entries'} in {cache.root})")
    _emit(ns, rows, lines)
    return 0


# --- verify -----------------------------------------------------------------------------


def verify(ns) -> int:
    """Verify every entry; with ``--repair`` remove what is bad.  Exit 1 if anything bad
    is left unrepaired."""
    from aoti_farm.cache import verify_records

    cache = open_cache(ns.cache_dir, signing_key=_key(ns), write=bool(getattr(ns, "repair", False)))
    repair = bool(getattr(ns, "repair", False))
    now = time.time()
    bad: list[dict] = []
    ok = 0
    # directories others can write (or links) let them swap entries under any check: not
    # repaired (the fix is the operator's: chmod o-w, chown, or another --cache-dir)
    for problem in verify_records.unsafe_dirs(cache):
        bad.append({"what": "directory", "kind": "insecure", "path": problem.split(":")[0],
                    "detail": f"{problem}; fix its owner/mode (chmod o-w) or use another --cache-dir"})
    for f in _fp_ids(cache):
        for k in sorted(cache.list_keys(f)):
            try:
                cache.open_entry(f, k)
                ok += 1
            except BadEntry as e:
                item = {"what": "entry", "fingerprint": f, "key": k, "kind": e.kind, "detail": str(e)}
                if repair:
                    item["repaired"] = cache.remove(f, k)
                bad.append(item)
        # queue items, leases, failure records, fingerprint.json: bounded reads, schema-checked
        bad.extend(verify_records.check(cache, f, repair=repair))
    for p, mtime in _tmp_items(cache):
        age = now - mtime
        if age > ORPHAN_AGE:
            item = {"what": "orphan", "path": str(p), "kind": "orphan", "age_s": round(age),
                    "detail": f"{p}: left in tmp/ by an interrupted publish or removal"}
            if repair:
                _rm_path(p)
                item["repaired"] = True
            bad.append(item)
    unrepaired = [b for b in bad if not b.get("repaired")]
    by_kind: dict[str, int] = {}
    for b in bad:
        by_kind[b["kind"]] = by_kind.get(b["kind"], 0) + 1
    obj = {"cache_dir": str(cache.root), "ok": ok, "bad": bad, "by_kind": by_kind,
           "repaired": len(bad) - len(unrepaired), "unrepaired": len(unrepaired)}
    lines = []
    for b in bad:
        where = b.get("key", b.get("path", ""))
        tag = " (removed)" if b.get("repaired") else ""
        lines.append(f"BAD {b['what']} {b['kind']}: {where[:16] if 'key' in b else where}{tag}: {b['detail']}")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(by_kind.items())) or "none bad"
    lines.append(f"verified {ok} good entries in {cache.root}; {summary}"
                 + (f"; repaired {obj['repaired']}" if repair else
                    ("; run `aoti-farm cache verify --repair` to remove them" if unrepaired else "")))
    _emit(ns, obj, lines)
    return 1 if unrepaired else 0


# --- gc ---------------------------------------------------------------------------------


def gc(ns) -> int:
    """Evict least-recently-used entries until the total entry size is <= --max-size."""
    limit = parse_size(ns.max_size)
    cache = open_cache(ns.cache_dir, signing_key=_key(ns), write=True)
    items = []
    for f in _fp_ids(cache):
        for k in cache.list_keys(f):
            d = cache.entry_dir(f, k)
            items.append((_last_used(d), f, k, dir_bytes(d)))
    items.sort()
    total = sum(i[3] for i in items)
    before = total
    evicted = []
    for used, f, k, size in items:
        if total <= limit:
            break
        if cache.remove(f, k):
            evicted.append({"fingerprint": f, "key": k, "bytes": size, "last_used": used})
        total -= size
    obj = {"cache_dir": str(cache.root), "max_bytes": limit, "bytes_before": before, "bytes_after": total,
           "evicted": evicted, "kept": len(items) - len(evicted)}
    lines = [f"evicted {k['key'][:16]} ({human(k['bytes'])})" for k in evicted]
    lines.append(f"gc {cache.root}: {human(before)} -> {human(total)} (limit {human(limit)}); "
                 f"evicted {len(evicted)}, kept {len(items) - len(evicted)}")
    _emit(ns, obj, lines)
    return 0


# --- rm ---------------------------------------------------------------------------------


def rm(ns) -> int:
    from aoti_farm.cache import failures as failrec

    keys = list(getattr(ns, "keys", None) or [])
    failed, every = bool(getattr(ns, "failed", False)), bool(getattr(ns, "all", False))
    if not keys and not failed and not every:
        raise UserError("cache rm: nothing to remove; name KEYs, or pass --failed or --all")
    cache = open_cache(ns.cache_dir, signing_key=_key(ns), write=True)
    fps = _fp_ids(cache)
    removed, failures = [], 0
    if every:
        for f in fps:
            for k in sorted(cache.list_keys(f)):
                if cache.remove(f, k):
                    removed.append(k)
            failures += cache.remove_failures(f)
    else:
        for want in keys:
            if not re.fullmatch(r"[0-9a-f]{6,64}", want):
                raise UserError(f"cache rm: {want!r} is not a key (6 to 64 lowercase hex digits); "
                                f"see `aoti-farm cache ls` for keys")
            hits = [(f, k) for f in fps for k in (cache.list_keys(f) | cache.failed_keys(f)) if k.startswith(want)]
            if not hits:
                raise UserError(f"cache rm: no entry or failure record with key {want!r} in {cache.root}; "
                                f"see `aoti-farm cache ls`")
            if len({k for _, k in hits}) > 1:
                raise UserError(f"cache rm: key prefix {want!r} is ambiguous ({len(hits)} matches); give more digits")
            for f, k in hits:
                if cache.remove(f, k):
                    removed.append(k)
                failures += failrec.remove_key(cache, f, k)   # whatever it is; no link followed
        if failed:
            failures += cache.remove_failures()
    obj = {"cache_dir": str(cache.root), "removed": removed, "failure_records_removed": failures}
    lines = [f"removed {k[:16]}" for k in removed]
    lines.append(f"removed {len(removed)} entries and {failures} failure records from {cache.root}")
    _emit(ns, obj, lines)
    return 0


COMMANDS = {"stats": stats, "ls": ls, "verify": verify, "gc": gc, "rm": rm}
__all__ = ["open_cache", "parse_size", "stats", "ls", "verify", "gc", "rm", "COMMANDS", "CACHE_FORMAT", "KERNEL"]
