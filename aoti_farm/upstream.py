"""Interop with torch's own AOTI-eager cache (``torch._inductor.aoti_eager``): the cache
directory, both ways.  ``export_upstream`` writes upstream's layout from verified entries;
``import_upstream`` adopts an upstream cache, re-verifying every kernel against eager
before publishing it.  The metadata upstream's holder matches (and its reading back into a
signature) is :mod:`aoti_farm.upstream_meta`; its names are re-exported here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from aoti_farm import sandbox
from aoti_farm import signature as S
from aoti_farm.cache.store import KERNEL, BadEntry, Cache, sha256_file
from aoti_farm.fsutil import atomic_write
from aoti_farm.errors import CompileRefused, FarmError, Ineligible, UserError
from aoti_farm.fingerprint import Fingerprint, fingerprint
from aoti_farm.upstream_meta import (  # noqa: F401 -- re-exported: the format's names
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
                entry = cache.open_entry(f, key)
                sig = entry.signature
            except BadEntry as e:
                report["bad"].append({"key": key, "kind": e.kind, "reason": str(e)})
                continue
            if "shape_class" in entry.manifest:   # aoti_farm/shapes.py
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


def import_upstream(cache: Cache, from_dir: str | os.PathLike, *, inductor_options: dict | None = None,
                    compiler: Any = None) -> dict:
    """Adopt the kernels of an upstream aoti_eager cache (a ``TORCHINDUCTOR_CACHE_DIR``).

    Every item is rebuilt into a Signature, its library is copied, run against eager on
    fresh random inputs in a sandboxed child (:mod:`aoti_farm.sandbox`: the library is
    foreign code until then) and, if it agrees, published under this
    host's fingerprint.  Returns a report: ``adopted``, ``present`` (already cached),
    ``rejected`` (disagrees with eager or does not load: reason, evidence), ``skipped``
    (malformed or unsupported items: where, reason)."""
    from aoti_farm.compiler import AOTICompiler, fixed_thread_options

    src = Path(from_dir).absolute()
    base = src / "aoti_eager"
    if not base.is_dir():
        raise UserError(f"--from {src}: has no aoti_eager/ directory; pass the TORCHINDUCTOR_CACHE_DIR "
                        "that upstream's _impl_with_aoti_compile filled")
    compiler = compiler or AOTICompiler(inductor_options)
    report: dict[str, Any] = {"from": str(src), "adopted": [], "present": [], "rejected": [], "skipped": []}
    seen: set[str] = set()
    for ns_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        for dev_dir in sorted(p for p in ns_dir.iterdir() if p.is_dir()):
            device = dev_dir.name
            if device not in DEVICES:
                report["skipped"].append({"where": str(dev_dir), "reason": f"device {device!r} is not cpu or cuda"})
                continue
            if device == "cuda" and not torch.cuda.is_available():
                report["skipped"].append({"where": str(dev_dir), "reason": "CUDA kernels need a GPU to be verified"})
                continue
            # upstream built its CPU kernels with its process's thread count baked in: they go
            # to the namespace of kernels built that way, never served as if they scaled
            fp = fingerprint("cpu" if device == "cpu" else "cuda:0",
                             fixed_thread_options(compiler.options()) if device == "cpu" else compiler.options())
            for jf in sorted(dev_dir.glob("*.json")):
                _import_file(cache, compiler, fp, ns_dir.name, dev_dir, jf, report, seen)
    return report


def _import_file(cache: Cache, compiler: Any, fp: Fingerprint, ns: str, dev_dir: Path, jf: Path,
                 report: dict, seen: set[str]) -> None:
    device = dev_dir.name
    stem = jf.name[:-len(".json")]
    op = f"{ns}::{stem[:-len('.default')] if stem.endswith('.default') else stem}"
    try:
        S.resolve_op(op)
        data = json.loads(jf.read_text())
        if not isinstance(data, list):
            raise ValueError("must be a list of {meta_info, kernel_path} objects")
    except (ValueError, OSError) as e:
        report["skipped"].append({"where": str(jf), "reason": str(e)})
        return
    root = dev_dir.resolve()
    for idx, item in enumerate(data):
        where = f"{jf}[{idx}]"
        try:
            if not isinstance(item, dict) or not isinstance(item.get("kernel_path"), str):
                raise ValueError("must be an object with a string kernel_path")
            sig = signature_from_meta(op, item.get("meta_info"), device, "meta_info")
            lib = (dev_dir / item["kernel_path"]).resolve()
            if root not in lib.parents:
                raise ValueError(f"kernel_path {item['kernel_path']!r} leaves {dev_dir}")
            if not lib.is_file():
                raise ValueError(f"kernel_path {item['kernel_path']!r}: no such file")
        except ValueError as e:
            report["skipped"].append({"where": where, "reason": str(e)})
            continue
        rec = {"where": where, "key": sig.key, "signature": S.describe(sig)}
        if sig.key in seen:
            continue
        seen.add(sig.key)
        if cache.has_entry(fp.id, sig.key):
            try:
                cache.open_entry(fp, sig.key)
                report["present"].append(rec)
                continue
            except BadEntry:
                cache.remove(fp.id, sig.key)  # a broken entry: replaced below
        work = tempfile.mkdtemp(prefix="aoti-farm-import-")
        try:
            copy = os.path.join(work, KERNEL)
            shutil.copyfile(lib, copy)
            try:
                # a foreign library: its constructors run only in a sandboxed child (no
                # signing key, memory limit, timeout), never in this process
                verification = sandbox.verify_in_child(sig, copy)
            except CompileRefused as e:
                report["rejected"].append({**rec, "reason": e.reason, "evidence": e.evidence})
                continue
            except Exception as e:  # a library that does not load or run
                report["rejected"].append({**rec, "reason": f"kernel does not run: {type(e).__name__}: "
                                                            f"{_first_line(e)}", "evidence": {}})
                continue
            cache.publish(fp, sig, {KERNEL: copy}, {
                "compiler": "upstream-import", "imported_from": str(lib), "verification": verification,
                "sha256_source": sha256_file(copy),
            })
            report["adopted"].append(rec)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


__all__ = ["export_upstream", "import_upstream", "meta_info",
           "signature_from_meta", "op_file_names"]
