"""`aoti-farm cache export-upstream` / `import-upstream`: the command lines of
:mod:`aoti_farm.interop.upstream` (torch's aoti_eager cache layout, both ways)."""

from __future__ import annotations

import json
import sys
from typing import Any

from aoti_farm.cache.store import Cache
from aoti_farm.cache.opening import open_cache
from aoti_farm.errors import FarmError, UserError
from aoti_farm.interop.upstream import export_upstream, import_upstream


def _open(ns: Any, create: bool) -> Cache:
    return open_cache(getattr(ns, "cache_dir", None), create=create, signing_key=getattr(ns, "signing_key", None))


def _print(ns: Any, report: dict, lines: list[str]) -> None:
    if getattr(ns, "json", False):
        json.dump(report, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(lines) + "\n")


def export_command(ns: Any) -> int:
    """``aoti-farm cache export-upstream --to DIR``: 0 if every verified entry was written or
    skipped as unservable by upstream; 1 if some entry failed verification."""
    to = getattr(ns, "to", None)
    if not to:
        raise UserError("cache export-upstream: missing --to DIR; pass the directory to use as TORCHINDUCTOR_CACHE_DIR")
    cache = _open(ns, create=False)
    try:
        rep = export_upstream(cache, to)
    except FarmError as e:
        raise UserError(f"cache {cache.root}: {e}; fix the cache directory or pass another --cache-dir") from None
    lines = [f"exported {len(rep['exported'])} kernel(s) to {rep['to']} (use TORCHINDUCTOR_CACHE_DIR={rep['to']})"]
    lines += [f"  skipped {s['key'][:12]} {s['signature']}: {s['reason']}" for s in rep["skipped"]]
    lines += [f"  BAD {b['key'][:12]} ({b['kind']}): {b['reason']}" for b in rep["bad"]]
    if not rep["fingerprints"]:
        lines.append("  (no fingerprint in the cache matches this host's torch; nothing to export)")
    _print(ns, rep, lines)
    return 1 if rep["bad"] else 0


def import_command(ns: Any) -> int:
    """``aoti-farm cache import-upstream --from DIR``: 0 if every kernel was adopted or already
    present; 1 if some were rejected or skipped."""
    src = getattr(ns, "from_", None) or getattr(ns, "src", None)
    if not src:
        raise UserError("cache import-upstream: missing --from DIR; pass the TORCHINDUCTOR_CACHE_DIR of an upstream cache")
    cache = _open(ns, create=True)
    try:
        rep = import_upstream(cache, src)
    except FarmError as e:
        raise UserError(f"cache {cache.root}: {e}; fix the cache directory or pass another --cache-dir") from None
    lines = [f"adopted {len(rep['adopted'])}, already present {len(rep['present'])}, "
             f"rejected {len(rep['rejected'])}, skipped {len(rep['skipped'])} from {rep['from']}"]
    lines += [f"  rejected {r['signature']}: {r['reason']}" for r in rep["rejected"]]
    lines += [f"  skipped {s['where']}: {s['reason']}" for s in rep["skipped"]]
    _print(ns, rep, lines)
    return 1 if rep["rejected"] or rep["skipped"] else 0
