"""Interop with torch's own AOTI-eager cache (``torch._inductor.aoti_eager``): the cache
directory, both ways.  ``export_upstream`` writes upstream's layout from verified entries;
``import_upstream`` adopts an upstream cache's signatures and compiles them here (its
libraries are never loaded: the farm signs only what it built).  The metadata upstream's holder matches (and its reading back into a
signature) is :mod:`aoti_farm.interop.upstream_meta`; its names are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import KERNEL, BadEntry, Cache, sha256_file
from aoti_farm.security.fsutil import atomic_write
from aoti_farm.errors import FarmError, Ineligible, UserError
from aoti_farm.fingerprint import Fingerprint, fingerprint
from aoti_farm.interop.upstream_meta import (  # noqa: F401 -- re-exported: the format's names
    DEVICES, LIB_SUBDIR, meta_info, op_file_names, signature_from_meta)

#: where kernel libraries go inside ``<DIR>/aoti_eager/<ns>/<device>/``


# --- which fingerprints are "current" ----------------------------------------------------------


def _current_fps(cache: Cache, fp: Fingerprint | None) -> list[Fingerprint]:
    """``fp`` alone, or every fingerprint namespace of the cache that this host's torch
    would compute itself (CPU; CUDA when a GPU is present), whatever its Inductor options."""
    if fp is not None:
        return [fp]
    out = []
    for fp_id in cache.fingerprint_ids():
        try:
            from aoti_farm.cache.records import read_fingerprint   # bounded, schema-checked

            d = read_fingerprint(cache, fp_id)
            opts = dict(tuple(kv) for kv in d.get("inductor_options") or [])
            dev = d.get("device_type")
        except (OSError, FarmError, ValueError, TypeError):
            continue
        if dev == "cuda" and not torch.cuda.is_available():
            continue
        if dev not in DEVICES:
            continue
        mine = fingerprint("cpu" if dev == "cpu" else "cuda:0", opts)
        if mine.id == fp_id:
            out.append(mine)
    return out


# --- export --------------------------------------------------------------------------------------


def _copy_checked(src: str, dst: Path, digest: str) -> None:
    """Copy ``src`` to ``dst`` atomically and check the copy's sha256 against ``digest``.
    The temporary file is ``mkstemp``'s (``O_EXCL | O_NOFOLLOW``, an unpredictable name):
    the export directory may be shared, and a link planted there is never written through."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=str(dst.parent))
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
        if sha256_file(tmp) != digest:
            raise BadEntry("corrupt", f"{src}: changed while being exported (sha256 mismatch)")
        os.chmod(tmp, 0o755)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def export_upstream(cache: Cache, to_dir: str | os.PathLike, fp: Fingerprint | None = None) -> dict:
    """Write every verified entry of the current fingerprint(s) as upstream's aoti_eager
    cache under ``to_dir`` (use it as ``TORCHINDUCTOR_CACHE_DIR``).

    Items already in an op's JSON are kept, except those with the same metadata as an
    exported entry (ours replace them).  Returns a report: ``exported`` (key, op, file),
    ``skipped`` (key, op, reason: not servable by upstream's holder), ``bad`` (key, kind,
    reason: failed verification), ``files`` (JSON files written)."""
    to = Path(to_dir).absolute()
    if to.exists() and not to.is_dir():
        raise UserError(f"--to {to}: is not a directory; pass a directory (it is created if missing)")
    report: dict[str, Any] = {"to": str(to), "fingerprints": [], "exported": [], "skipped": [], "bad": [],
                              "files": []}
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for f in _current_fps(cache, fp):
        report["fingerprints"].append(f.id)
        for key in sorted(cache.list_keys(f.id)):
            try:
                entry = cache.open_entry(f, key, guards=False)   # upstream's holder has no index guards
                sig = entry.signature
            except BadEntry as e:
                if e.kind == "guarded":
                    report["skipped"].append({"key": key, "op": "?", "signature": key[:16],
                                              "reason": "served only behind index guards, which upstream's holder "
                                                        "does not have"})
                else:
                    report["bad"].append({"key": key, "kind": e.kind, "reason": str(e)})
                continue
            if "shape_class" in entry.manifest:   # aoti_farm/dynamic/shapes.py
                report["skipped"].append({"key": key, "op": sig.op, "signature": S.describe(sig),
                                          "reason": "shape-general kernel (symbolic sizes): upstream's Python side "
                                                    "loads static-shape kernels only"})
                continue
            try:
                meta = meta_info(sig)
            except Ineligible as e:
                report["skipped"].append({"key": key, "op": sig.op, "signature": S.describe(sig), "reason": str(e)})
                continue
            ns, stems = op_file_names(sig.op)
            device = sig.device
            dev_dir = to / "aoti_eager" / ns / device
            rel = f"{LIB_SUBDIR}/{key}.so"
            try:
                _copy_checked(entry.kernel_path, dev_dir / rel, entry.manifest["files"][KERNEL])
            except BadEntry as e:
                report["bad"].append({"key": key, "kind": e.kind, "reason": str(e)})
                continue
            except OSError as e:
                raise UserError(f"--to {to}: cannot write {dev_dir / rel} ({e.strerror}); "
                                "fix its permissions or pass another directory") from None
            for stem in stems:
                lst = groups.setdefault((ns, device, stem), [])
                if any(it["meta_info"] == meta for it in lst):
                    report["skipped"].append({"key": key, "op": sig.op, "signature": S.describe(sig),
                                              "reason": "same upstream metadata as another exported entry"})
                    break
                lst.append({"meta_info": meta, "kernel_path": rel})
            else:
                report["exported"].append({"key": key, "op": sig.op, "signature": S.describe(sig),
                                           "kernel_path": str(dev_dir / rel)})
    for (ns, device, stem), items in sorted(groups.items()):
        path = to / "aoti_eager" / ns / device / f"{stem}.json"
        old: list = []
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError):
                old = []
            if not isinstance(old, list):
                old = []
        ours = [it["meta_info"] for it in items]
        merged = [it for it in old if not (isinstance(it, dict) and it.get("meta_info") in ours)] + items
        try:
            atomic_write(path, json.dumps(merged, indent=4).encode())
        except OSError as e:
            raise UserError(f"--to {to}: cannot write {path} ({e.strerror}); "
                            "fix its permissions or pass another directory") from None
        report["files"].append(str(path))
    return report


# --- import --------------------------------------------------------------------------------------

#: Largest ``<op>.json`` of an upstream cache read (upstream writes a few hundred bytes an item).
META_MAX = 16 << 20


def import_upstream(cache: Cache, from_dir: str | os.PathLike, *, inductor_options: dict | None = None,
                    compiler: Any = None) -> dict:
    """Adopt the *signatures* of an upstream aoti_eager cache (a ``TORCHINDUCTOR_CACHE_DIR``)
    and compile each one here.

    An upstream cache's libraries are someone else's binaries: loading one runs its
    constructors before any check, and a verdict computed by a process that loaded it is
    the library's to forge.  So they are never opened, loaded or copied.  Only each op's
    JSON is read (bounded, no link followed): every item's ``meta_info`` is rebuilt into a
    Signature, which this farm compiles, verifies against eager and publishes like any warm
    (:func:`aoti_farm.compile.job.compile_and_publish`), so the cache signs only what the farm built.

    Returns a report: ``adopted`` (compiled and published here), ``present`` (already
    cached), ``rejected`` (the farm's own compile refused it: reason, evidence),
    ``skipped`` (malformed or unsupported items: where, reason)."""
    from aoti_farm.cache.leases import new_owner
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.compile.job import COMPILED, CACHED, compile_and_publish

    src = Path(from_dir).absolute()
    base = src / "aoti_eager"
    if not base.is_dir():
        raise UserError(f"--from {src}: has no aoti_eager/ directory; pass the TORCHINDUCTOR_CACHE_DIR "
                        "that upstream's _impl_with_aoti_compile filled")
    compiler = compiler or AOTICompiler(inductor_options)
    owner = new_owner("import-upstream")
    report: dict[str, Any] = {"from": str(src), "adopted": [], "present": [], "rejected": [], "skipped": []}
    seen: set[str] = set()
    fps: dict[str, Fingerprint] = {}
    for sig, rec in _upstream_signatures(base, report):
        if sig.key in seen:
            continue
        seen.add(sig.key)
        if sig.device not in fps:   # one fingerprint per device, as a warm's actor has
            fps[sig.device] = fingerprint("cpu" if sig.device == "cpu" else "cuda:0", compiler.options())
        fp = fps[sig.device]
        if cache.has_entry(fp.id, sig.key):
            try:
                cache.open_entry(fp, sig.key).close()
                report["present"].append(rec)
                continue
            except BadEntry:
                cache.remove(fp.id, sig.key)  # a broken entry: compiled again below
        try:
            out = compile_and_publish(cache, compiler, fp, sig, owner=owner)
        except Exception as e:  # noqa: BLE001 -- the host's failure on one signature: reported, the rest go on
            report["rejected"].append({**rec, "reason": f"compile failed on this host: {type(e).__name__}: "
                                                        f"{_first_line(e)}", "evidence": {}})
            continue
        if out.status == COMPILED:
            report["adopted"].append(rec)
        elif out.status == CACHED:
            report["present"].append(rec)
        else:   # failed (refused, over the memory budget) or busy (another process compiles it now)
            report["rejected"].append({**rec, "reason": out.error or out.status, "evidence": out.evidence})
    return report


def _upstream_signatures(base: Path, report: dict):
    """``(Signature, report record)`` for every well-formed item under ``base``
    (``<DIR>/aoti_eager``); what cannot be read or rebuilt goes to ``report["skipped"]``.
    Nothing but the JSON files is opened, each bounded and without following a link."""
    from aoti_farm.security.safeio import UnsafeFile, read_bounded

    for ns_dir in sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink()):
        for dev_dir in sorted(p for p in ns_dir.iterdir() if p.is_dir() and not p.is_symlink()):
            device = dev_dir.name
            if device not in DEVICES:
                report["skipped"].append({"where": str(dev_dir), "reason": f"device {device!r} is not cpu or cuda"})
                continue
            if device == "cuda" and not torch.cuda.is_available():
                report["skipped"].append({"where": str(dev_dir), "reason": "CUDA signatures need a GPU to be compiled"})
                continue
            for jf in sorted(dev_dir.glob("*.json")):
                stem = jf.name[:-len(".json")]
                op = f"{ns_dir.name}::{stem[:-len('.default')] if stem.endswith('.default') else stem}"
                try:
                    S.resolve_op(op)
                    data = json.loads(read_bounded(jf, max_bytes=META_MAX, uids=None))
                    if not isinstance(data, list):
                        raise ValueError("must be a list of {meta_info, kernel_path} objects")
                except (ValueError, OSError, UnsafeFile) as e:
                    report["skipped"].append({"where": str(jf), "reason": str(e)})
                    continue
                for idx, item in enumerate(data):
                    where = f"{jf}[{idx}]"
                    try:
                        if not isinstance(item, dict):
                            raise ValueError("must be an object with a meta_info list")
                        sig = signature_from_meta(op, item.get("meta_info"), device, "meta_info")
                    except ValueError as e:
                        report["skipped"].append({"where": where, "reason": str(e)})
                        continue
                    yield sig, {"where": where, "key": sig.key, "signature": S.describe(sig)}


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


__all__ = ["export_upstream", "import_upstream", "meta_info",
           "signature_from_meta", "op_file_names"]
