"""This host's speed-gate decisions, kept between processes (a private per-user memo).

The on-host trial (``runtime/gate.py``) settles whether a cached kernel beats eager *here*.
Deciding again in every process costs each one seconds of trials (install-time ones, then
background ones beside the program), and a process whose trials stop at their budget
routes differently from the next, so a served model's speed varied by process.  So each
measured decision is kept per fingerprint and key, with the on-host ratio, the thread
count it was measured at and when: a later process at the same thread count takes it at
once (its ops are routed or unrouted from it before the program's first call, with no
trial), and ``aoti-farm explain`` names what this host gated ("gated here").

Per op, the memo also keeps whether every call of the op ran eager in the last process
that served it (no hit, no miss: only failed signatures, ineligible or gated calls):
``route="paying"`` leaves such an op unrouted in the next process unless it has an entry
that could now be served, so its calls stop paying the hook's lookup for nothing.

Only measured decisions are kept (a declined-without-trial signature, "trial budget spent",
is tried again by a later process), not those measured while the host was overloaded
(:func:`overloaded`: timings then are mostly waiting), and only for :data:`MAX_AGE_S` (a
host's load and clocks drift).  The memo is keyed by the cache directory as well: two caches can hold
different kernels for one signature key.

Where: ``memo_dir()/gate/<fp id>-<cache hash>.json``, in a directory this module creates
mode 0700 and checks (owned by this user, not a link, no access for others) before every
read and write: another user's file is never read (promise 2), and it is never in the
shared cache.  A bad or foreign memo reads as empty: decisions are then made by trial, as
without one.  Writes merge with the file's current content and replace it atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time

from aoti_farm.security import safeio
from aoti_farm.security.fsutil import atomic_write, memo_dir

VERSION = 1
#: Seconds a decision is trusted (then it is tried again).
MAX_AGE_S = 7 * 86400.0
#: Most decisions kept per file (the oldest go first).
MAX_ENTRIES = 20000
#: Largest memo file read.
MAX_BYTES = 8 << 20


def gate_dir(base: str | None = None) -> str:
    return os.path.join(base or memo_dir(), "gate")


def memo_path(fp_id: str, cache_root, base: str | None = None) -> str:
    tag = hashlib.sha256(os.path.realpath(str(cache_root)).encode()).hexdigest()[:16]
    return os.path.join(gate_dir(base), f"{fp_id}-{tag}.json")


def _private_dir(path: str, create: bool) -> bool:
    """Whether ``path`` is a directory of this user's that no one else can use (created
    mode 0700 with its parents when ``create``)."""
    if create:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO))


def _read_doc(path: str) -> tuple[dict, dict]:
    """(decisions, ops) in ``path``; empty when absent, unsafe or malformed."""
    if not _private_dir(os.path.dirname(path), create=False):
        return {}, {}
    try:
        raw = safeio.read_bounded(path, max_bytes=MAX_BYTES, uids=(os.getuid(),), what=path)
        doc = json.loads(raw)
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("decisions"), dict):
        return {}, {}
    ops = doc.get("ops") if isinstance(doc.get("ops"), dict) else {}
    return ({k: v for k, v in doc["decisions"].items() if isinstance(k, str) and _valid(v)},
            {k: v for k, v in ops.items() if isinstance(k, str) and _valid_op(v)})


def _read(path: str) -> dict:
    return _read_doc(path)[0]


def _valid_op(rec) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("eager_only"), bool) and isinstance(rec.get("threads"), int)
            and isinstance(rec.get("at"), (int, float)) and not isinstance(rec.get("at"), bool))


def _valid(rec) -> bool:
    if not isinstance(rec, dict) or not isinstance(rec.get("ok"), bool):
        return False
    r, n, at = rec.get("host_ratio"), rec.get("threads"), rec.get("at")
    return (isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 and isinstance(n, int)
            and not isinstance(n, bool) and isinstance(at, (int, float)) and not isinstance(at, bool))


def load(fp_id: str, cache_root, threads: int | None = None, *, now: float | None = None,
         base: str | None = None) -> dict:
    """This host's decisions for ``fp_id`` and the cache at ``cache_root``: key ->
    ``{"ok", "host_ratio", "threads", "at", ...}``, only those measured at ``threads``
    intra-op threads (None: any) within :data:`MAX_AGE_S`.  Never raises."""
    try:
        got = _read(memo_path(fp_id, cache_root, base))
    except Exception:  # noqa: BLE001 -- a memo is an optimisation: without it, trials decide
        return {}
    now = time.time() if now is None else now
    return {k: v for k, v in got.items()
            if (threads is None or v["threads"] == threads) and -60.0 <= now - v["at"] <= MAX_AGE_S}


def load_ops(fp_id: str, cache_root, threads: int | None = None, *, now: float | None = None,
             base: str | None = None) -> set[str]:
    """The ops whose every call ran eager in the last process that served them here (at
    ``threads``, within :data:`MAX_AGE_S`): no hit, no miss, only failed signatures,
    ineligible or gated calls.  Never raises."""
    try:
        ops = _read_doc(memo_path(fp_id, cache_root, base))[1]
    except Exception:  # noqa: BLE001
        return set()
    now = time.time() if now is None else now
    return {op for op, v in ops.items() if v["eager_only"] and (threads is None or v["threads"] == threads)
            and -60.0 <= now - v["at"] <= MAX_AGE_S}


def op_records(per_op: dict, threads: int, now: float | None = None) -> dict:
    """Memo records of ``stats()["per_op"]``: an op is eager-only when it had calls, none
    served and none missed."""
    at = round(time.time() if now is None else now, 1)
    out = {}
    for op, c in per_op.items():
        try:
            h, m, f = int(c.get("hits", 0)), int(c.get("misses", 0)), int(c.get("fallbacks", 0))
        except (AttributeError, TypeError, ValueError):
            continue
        if h + m + f:
            out[op] = {"eager_only": h == 0 and m == 0, "threads": int(threads), "at": at, "calls": h + m + f}
    return out


def save(fp_id: str, cache_root, decisions: dict, *, ops: dict | None = None, base: str | None = None) -> bool:
    """Merge ``decisions`` (key -> record) and ``ops`` (op -> record, :func:`op_records`)
    into the memo; True when written.  Never raises."""
    if not decisions and not ops:
        return False
    try:
        path = memo_path(fp_id, cache_root, base)
        d = os.path.dirname(path)
        if not _private_dir(d, create=True):
            return False
        merged, merged_ops = _read_doc(path)
        merged.update({k: v for k, v in decisions.items() if _valid(v)})
        merged_ops.update({k: v for k, v in (ops or {}).items() if _valid_op(v)})
        if len(merged) > MAX_ENTRIES:
            merged = dict(sorted(merged.items(), key=lambda kv: kv[1]["at"])[-MAX_ENTRIES:])
        data = json.dumps({"version": VERSION, "fp": fp_id, "cache": os.path.realpath(str(cache_root)),
                           "decisions": merged, "ops": merged_ops}, sort_keys=True).encode()
        atomic_write(path, data)
        os.chmod(path, 0o600)
        return True
    except Exception:  # noqa: BLE001 -- a read-only home: decided again next time
        return False


def overloaded() -> bool:
    """Whether this host's 1-minute load average exceeds its cores: a trial measured then
    is used by its process but not kept."""
    try:
        return os.getloadavg()[0] > (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    except OSError:
        return False


def kept_ok(rec: dict, ratio: float | None = None, floor_us: float | None = None) -> bool:
    """Whether a kept record serves under the rule in force (``ratio``: the gate's margin,
    default :data:`~aoti_farm.speedgate.speed.GATE_RATIO`; ``floor_us``: its least saving,
    default :func:`~aoti_farm.speedgate.speed.min_saving_us`), judged from the record's
    measurement: a changed margin or floor applies at once to what was measured before.
    A record without the two times keeps its own verdict."""
    from aoti_farm.speedgate.speed import GATE_RATIO, wins_here

    try:
        host_ratio, kernel_us, eager_us = float(rec["host_ratio"]), float(rec["kernel_us"]), float(rec["eager_us"])
    except (KeyError, TypeError, ValueError):
        return bool(rec.get("ok"))
    return wins_here(host_ratio, kernel_us, eager_us, GATE_RATIO if ratio is None else ratio, floor_us)


def record(ok: bool, measured: dict, now: float | None = None) -> dict | None:
    """A memo record from a trial's measurement (``time_against_eager``'s dict), or None
    when it has no usable ratio."""
    try:
        rec = {"ok": bool(ok), "host_ratio": round(float(measured["ratio"]), 4),
               "threads": int(measured["threads"]), "at": round(time.time() if now is None else now, 1),
               "kernel_us": round(float(measured["kernel_us"]), 3), "eager_us": round(float(measured["eager_us"]), 3)}
    except (KeyError, TypeError, ValueError):
        return None
    return rec if _valid(rec) else None
