"""`aoti-farm explain`: what a serving process on this host would do with each signature of
a trace, and why.

Outcomes (one per signature):

* ``hit`` -- an entry is published under this host's fingerprint; the hook serves it
  (an exact entry, or a shape-class entry whose range covers the signature: "covered by
  class ...", ``category`` "class"); a hit is the compile host's speed record, and the
  hook confirms an exact entry on this host at its first call;
* ``gated here`` -- a hit on the compile host that this host's speed gate declined: the
  hook's on-host trial, kept in this host's memo (``aoti_farm/speedgate/hostgate.py``), found it
  slower than eager here ("gated here (1.31 of eager on this host, 2 threads) ... slower
  than eager on this host"), or faster by less than a served call must save inside a model
  (the reason then names both times and the saving; a kernel is called slower only when it
  is); eager runs.  A hit confirmed here says so in its details;
* ``gated`` -- published, but under the hook's default policy ``serve="faster"`` its
  manifest's ``speed`` record says the kernel is not faster than eager (``ratio >
  GATE_RATIO``; both times are named) or it has no such record, or a class covers it
  outside the range where the class beat eager (``serve_range``): the hook runs eager and
  queues nothing;
* ``failed`` -- a failure record exists (its reason and evidence are named);
* ``ineligible`` -- the hook never serves it (the op's or the argument's reason);
* ``refused`` -- an entry is there but its manifest is unreadable or unsafe (the hook
  refuses it and counts an integrity failure);
* ``missing`` -- nothing published: the nearest entry of the same op under this
  fingerprint is named with the fields that differ (``self.sizes [2,17,64] vs
  [2,16,64]``, ``alpha 2 vs 1``); an entry of the very key under another fingerprint is
  named with the fingerprint fields that differ (``cpu_isa avx2 vs avx512``).

Speed: the cache is indexed once (:class:`aoti_farm.cache.index.CacheIndex`): every namespace's entry and
failure keys are listed, and manifests are read (bounded, never hashed) only for hits and,
when something is missing, once per entry of this host's namespace to group them by op.
A signature's key is the hash of its signature, so what is read about a key is memoised
for as long as the object lives (the serving hook keeps one, see ``Hook``).
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field, fields
from typing import Iterable

from aoti_farm.cache.manifest import edge_notes
from aoti_farm.cache.store import Cache
from aoti_farm.errors import UserError
from aoti_farm.cache.index import CacheIndex, Namespace, category, field_diff, fingerprint_diff, flatten_args
from aoti_farm.signature import Signature, describe, op_info, resolve_op

OUTCOMES = ("hit", "gated here", "gated", "failed", "ineligible", "refused", "missing")
#: Fallback for the speed gate's threshold until ``aoti_farm.GATE_RATIO`` exists.
DEFAULT_GATE_RATIO = 0.95
_WRAPPED = ("float64", "int64", "bool", "complex128")


def serving_conditions(m: dict, device: str | None = None) -> list[str]:
    """What the hook checks before it serves an entry, besides its key: the globals it was
    verified under (default dtype, TF32 and cuDNN flags, deterministic mode:
    ``aoti_farm.signature.conditions``) and, for a CPU kernel, the intra-op thread counts
    it was verified at (another count is checked against eager here first)."""
    from aoti_farm import signature as S

    out = []
    try:
        conds = S.conditions.as_dict(S.conditions.from_dict(m.get("conditions")))
    except Exception:   # an unreadable field: the hook declines the entry, so say so
        return ["served only under the conditions it was verified under: unreadable, so never"]
    if device and not str(device).startswith("cuda"):
        conds = {k: v for k, v in conds.items() if not any(w in k for w in ("tf32", "cudnn", "cublas", "matmul"))}
    if conds:
        out.append("served only while " + ", ".join(f"{k}={v}" for k, v in conds.items())
                   + (" (as verified)" if "conditions" in m else " (torch's defaults: the manifest names none)"))
    threads = m.get("verified_threads")
    if isinstance(threads, list) and threads:
        out.append("verified at " + ", ".join(map(str, threads)) + " intra-op threads; at another count the hook "
                   "first checks it against eager here")
    return out


def gate_ratio() -> float:
    """The speed gate's threshold (runtime/gate.py's GATE_RATIO)."""
    try:
        from aoti_farm.speedgate.speed import GATE_RATIO

        return float(GATE_RATIO)
    except ImportError:   # a build without the gate
        return DEFAULT_GATE_RATIO


def serve_policy(explicit: str | None = None) -> str:
    """``faster`` (the hook's default: only kernels faster than eager) or ``always``."""
    if explicit:
        return explicit
    try:
        from aoti_farm.config import policy_from_env

        return policy_from_env()
    except ImportError:
        return "always"


def _ratio(speed) -> float | None:
    try:
        from aoti_farm.speedgate.speed import compile_ratio

        return compile_ratio(speed)
    except ImportError:
        r = speed.get("ratio") if isinstance(speed, dict) else None
        return float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 else None


#: The note on a hit that this host has not timed (no decision kept in its memo).
NOT_TIMED_HERE = ("not yet timed on this host: the hook times it against eager here first and serves it "
                  "only where it wins (a trial on an overloaded host is not kept)")


@dataclass
class Explanation:
    index: int
    key: str
    op: str
    description: str
    device: str
    outcome: str
    reason: str                                       # one line
    details: list[str] = field(default_factory=list)  # field by field
    category: str = ""                                # missing: what kind of difference
    data: dict = field(default_factory=dict)          # structured: nearest key, diff, speed, record

    def to_dict(self) -> dict:
        """The fields as a dict for JSON (shallow: ``asdict``'s deep copy cost 0.1 s per 1,000)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --- explaining ---------------------------------------------------------------------------------


class Explainer:
    """Explains signatures against one cache for a set of device fingerprints
    (``{"cpu": fp, "cuda": fp}``).  ``explain(sig)`` never raises for what the cache holds."""

    def __init__(self, cache: Cache, fps: dict, *, index: CacheIndex | None = None,
                 unserved: dict[str, str] | None = None, serve: str | None = None, contract: str = "finite"):
        self.cache, self.fps = cache, fps
        self.serve = serve_policy(serve)
        self.contract = contract   # config.CONTRACTS: "strict" runs eager for a kernel with an edge note
        self.index = index or CacheIndex(cache)
        self.unserved = unserved or {}   # device type -> why it is not served here
        self._here: dict[str, dict] = {}   # fp id -> this host's kept gate decisions (hostgate)

    def refresh(self, max_age: float = 0.0) -> None:
        """List the cache again (what was read about keys stays memoised)."""
        if time.monotonic() - self.index.built_at < max_age:
            return
        old = self.index
        new = CacheIndex(self.cache)
        new._sigs = {k: v for k, v in old._sigs.items() if k[0] in new.namespaces and k[1] in new.namespaces[k[0]].keys}
        self.index = new
        self._here.clear()

    def host_notes(self) -> list[str]:
        """Namespace-level notes: this host's fingerprint has no namespace but others do."""
        notes = []
        for dev, fp in self.fps.items():
            if fp.id in self.index.namespaces or not self.index.namespaces:
                continue
            near = self._nearest_namespaces(fp)
            if near:
                ns, diff = near[0]
                notes.append(f"{dev}: this host's fingerprint {fp.id} has no namespace in {self.cache.root}; "
                             f"the nearest, {ns.fp_id} ({len(ns.keys)} entries), differs in "
                             + "; ".join(f"{k} {a} vs {b}" for k, a, b in diff))
        return notes

    def _nearest_namespaces(self, fp) -> list[tuple[Namespace, list]]:
        out = []
        for ns in self.index.namespaces.values():
            if ns.fp_id == fp.id or ns.fields is None:
                continue
            if ns.fields.get("device_type") not in (None, fp.as_dict().get("device_type")):
                continue
            out.append((ns, fingerprint_diff(fp.as_dict(), ns.fields)))
        out.sort(key=lambda t: (len(t[1]), -len(t[0].keys), t[0].fp_id))
        return out

    def explain(self, sig: Signature, index: int = 0) -> Explanation:
        ex = Explanation(index, sig.key, sig.op, _describe(sig), sig.device, "missing", "")
        why = self._ineligible(sig)
        if why:
            ex.outcome, ex.reason = "ineligible", why
            return ex
        fp = self.fps[sig.device]
        ns = self.index.namespaces.get(fp.id)
        if ns is not None and sig.key in ns.keys:
            return self._published(ex, fp.id)
        covered = self._class_cover(ex, sig, fp.id, ns) if ns is not None else None
        if covered is not None:
            return covered
        if ns is not None and sig.key in ns.failed:
            rec = self.cache.failure(fp.id, sig.key) or {"reason": "failure record vanished"}
            ex.outcome = "failed"
            ev = rec.get("evidence") or {}
            from aoti_farm.cache.failures import refusal_class

            ex.category = refusal_class(rec.get("reason"), ev if isinstance(ev, dict) else {})
            ex.reason = f"compile failed ({ex.category}): {' '.join(str(rec.get('reason')).split())[:300]}"
            ex.details = [f"{k}: {' '.join(str(v).split())[:200]}" for k, v in (ev.items() if isinstance(ev, dict) else ())]
            ex.details.append(f"attempts {rec.get('attempts')}; `aoti-farm cache rm --failed` retries it")
            ex.data = {"failure": {k: rec.get(k) for k in ("reason", "evidence", "attempts", "host", "time")}}
            return ex
        return self._missing(ex, sig, fp, ns)

    def _class_cover(self, ex: Explanation, sig: Signature, fp_id: str, ns: Namespace) -> Explanation | None:
        """A shape-class entry published here whose range covers ``sig`` (the hook's
        ``runtime/shapeserve.py`` match: hinted for the signature's group, hashing to its
        key, every symbol in range), or None."""
        from aoti_farm.dynamic import shapes as SH
        from aoti_farm.dynamic.dyncompile import hinted_keys

        try:
            g = SH.group_of(sig.op, sig.args)
        except Exception:  # noqa: BLE001
            return None
        if g is None:
            return None
        found = []
        for k in hinted_keys(self.cache, fp_id, SH.group_key(g)):
            if k not in ns.keys:
                continue
            try:
                m = self.index.manifest(fp_id, k)
                cls = SH.parse_class(m.get("shape_class"))
            except Exception:  # noqa: BLE001 -- the hook skips it too
                continue
            env = cls.bind(sig.args) if cls.key == k else None
            if env is not None:
                found.append((sum(hi - lo for _, lo, hi in cls.ranges), k, cls, env, m))
        if not found:
            return None
        found.sort(key=lambda t: (t[0], t[1]))   # the narrowest range first, as the hook
        sp = found[0][4].get("speed")
        serve = sp.get("serve_range") if isinstance(sp, dict) else None
        inside = [t for t in found if _inside(t[3], (t[4].get("speed") or {}).get("serve_range")
                                          if isinstance(t[4].get("speed"), dict) else None)]
        pick = found[0] if self.serve == "always" or not inside else inside[0]
        _, k, cls, env, m = pick
        ranges = ", ".join(f"{n} in [{lo}, {hi}]" for n, lo, hi in cls.ranges)
        at = ", ".join(f"{n}={v}" for n, v in sorted(env.items()))
        ex.category = "class"
        ex.data = {"class": k, "ranges": [list(r) for r in cls.ranges], "at": env,
                   "serve_range": (m.get("speed") or {}).get("serve_range") if isinstance(m.get("speed"), dict) else None}
        if self.serve == "always" or inside:
            ex.outcome = "hit"
            ex.reason = f"covered by class {k[:16]} ({ranges}) at {at}"
            if self.serve != "always":
                ex.details.append(f"the class beat eager on the compile host at {at} (serve_range {ex.data['serve_range']})")
            return self._on_this_host(ex, fp_id, k)
        ex.outcome = "gated"
        ex.reason = (f"covered by class {k[:16]} ({ranges}) at {at}, where it did not beat eager "
                     f"(serve_range {serve}): eager runs, nothing is queued")
        ex.details.append("serve='always' (AOTI_FARM_SERVE=always) serves it")
        return ex

    def _on_this_host(self, ex: Explanation, fp_id: str, key: str) -> Explanation:
        """A hit as this host's gate decided it (``aoti_farm/speedgate/hostgate.py``): "gated here"
        where its on-host trial lost, a note where it won, and where no decision is kept
        (never tried here, or tried while the host was overloaded) a note that the hook
        will time it here first."""
        if self.serve == "always":
            return ex
        if fp_id not in self._here:
            from aoti_farm.speedgate import hostgate

            self._here[fp_id] = hostgate.load(fp_id, self.cache.root)
        rec = self._here[fp_id].get(key)
        if rec is None:   # the compile host's record is a guess until this host has timed it
            ex.details.append(NOT_TIMED_HERE)
            return ex
        here = (f"{rec['host_ratio']:.2f} of eager on this host, {rec['threads']} threads, "
                f"decided {time.strftime('%Y-%m-%d %H:%M', time.localtime(rec['at']))}")
        ex.data["here"] = rec
        from aoti_farm.speedgate.hostgate import kept_ok
        from aoti_farm.speedgate.speed import GATE_RATIO, min_saving_us

        if kept_ok(rec):
            ex.details.append(f"faster here too ({here})")
            return ex
        ex.outcome = "gated here"

        if rec["host_ratio"] > GATE_RATIO:
            why = "slower than eager on this host"
        else:   # faster, by less than what a routed call costs inside a model (runtime/gate.py)
            why = (f"faster than eager on this host by {rec['eager_us'] - rec['kernel_us']:.1f} µs a call "
                   f"({rec['kernel_us']:.1f} against {rec['eager_us']:.1f} µs), less than the "
                   f"{min_saving_us():g} µs a served call must save to pay inside a model")
        ex.reason = f"gated here ({here}): a hit on the compile host, {why}; eager runs, nothing is queued"
        return ex

    def _ineligible(self, sig: Signature) -> str | None:
        if sig.device in self.unserved:
            return self.unserved[sig.device]
        if sig.device not in self.fps:
            return f"device {sig.device} is not served here"
        try:
            info = op_info(resolve_op(sig.op))
        except ValueError as e:
            return str(e)
        if info.ineligible:
            return info.ineligible
        for name, a in zip(info.arg_names, sig.args):
            for t in (a[1] if a[0] == "TL" else (a,)):
                if t[0] == "T" and len(t[2]) == 0 and t[1] in _WRAPPED and t[4] == "cpu":
                    return f"{name}: 0-dim CPU double/long/bool tensor (maybe a wrapped Python number)"
        return None

    def _published(self, ex: Explanation, fp_id: str) -> Explanation:
        try:
            m = self.index.manifest(fp_id, ex.key)
        except (OSError, ValueError) as e:
            ex.outcome, ex.reason = "refused", f"the entry's manifest would be refused: {e}"
            ex.category = getattr(e, "kind", "corrupt")
            return ex
        speed = m.get("speed")
        ratio, limit = _ratio(speed), gate_ratio()
        times = (f"kernel {_us(speed, 'kernel_us')} us vs eager {_us(speed, 'eager_us')} us (ratio {ratio:.3f})"
                 if ratio is not None else "")
        ex.data = {"speed": speed} if isinstance(speed, dict) else {}
        if self.serve != "always" and ratio is None:
            ex.outcome, ex.category = "gated", "no speed record"
            ex.reason = ("the manifest has no speed record (built before the speed gate): eager runs; "
                         "serve='always' (AOTI_FARM_SERVE=always) serves it")
            return ex
        if self.serve != "always" and ratio > limit:
            ex.outcome, ex.category = "gated", "slower"
            ex.reason = f"{times} > {limit}: not faster than eager by the gate's margin, eager runs"
            ex.details.append("serve='always' (AOTI_FARM_SERVE=always) serves it")
            return ex
        notes = edge_notes(m)
        if notes and self.contract == "strict":
            ex.outcome, ex.category = "ineligible", "contract"
            ex.reason = (f"contract='strict': the kernel has edge notes ({', '.join(notes)}), eager runs")
            ex.details.append("contract='finite' (the default; AOTI_FARM_CONTRACT=finite) serves it; "
                              "docs/verification.md, \"The contract\"")
            return ex
        ex.outcome = "hit"
        ex.reason = "exact entry published under this host's fingerprint"
        if times:
            ex.details.append(times + ("" if self.serve == "always" else f" <= {limit}"))
        if notes:
            ex.details.append(f"edge notes: {', '.join(notes)} (served under contract='finite'; "
                              "contract='strict' runs eager)")
        ex.details += serving_conditions(m, ex.device)
        return self._on_this_host(ex, fp_id, ex.key)

    def _missing(self, ex: Explanation, sig: Signature, fp, ns: Namespace | None) -> Explanation:
        # the very key under another fingerprint: name the fingerprint fields that differ
        foreign = [o for o in self.index.namespaces.values() if o.fp_id != fp.id and sig.key in o.keys]
        if foreign:
            diffs = sorted(((o, fingerprint_diff(fp.as_dict(), o.fields or {})) for o in foreign),
                           key=lambda t: len(t[1]))
            o, diff = diffs[0]
            ex.category = "fingerprint"
            ex.reason = f"published only under another fingerprint ({o.fp_id}), built for another toolchain"
            ex.details = [f"{k} {a} vs {b}" for k, a, b in diff] or ["fingerprint.json unreadable"]
            ex.data = {"foreign_fp": o.fp_id, "fingerprint_diff": [list(d) for d in diff]}
            return ex
        if ns is None:
            ex.category = "fingerprint"
            near = self._nearest_namespaces(fp)
            if near:
                o, diff = near[0]
                ex.reason = f"this host's fingerprint {fp.id} has no namespace; nearest is {o.fp_id}"
                ex.details = [f"{k} {a} vs {b}" for k, a, b in diff]
                ex.data = {"foreign_fp": o.fp_id, "fingerprint_diff": [list(d) for d in diff]}
            else:
                ex.reason = f"the cache has nothing for fingerprint {fp.id} (nor any other)"
            return ex
        state = ("queued for compile (the miss queue holds it)" if sig.key in ns.queued else "")
        cands = ns.by_op().get(sig.op)
        if not cands:
            ex.category = "op"
            ex.reason = f"no entry of {sig.op} under this fingerprint ({len(ns.keys)} entries of other ops)"
            if state:
                ex.details.append(state)
            return ex
        q = flatten_args(sig.to_obj()["args"])
        best = cands.nearest(q)
        diff = field_diff(q, best[1])
        ex.category = category(diff)
        ex.reason = f"not published; nearest entry {best[0][:16]} differs in {ex.category}"
        ex.details = [f"{k} {a} vs {b}" for k, a, b in diff]
        if state:
            ex.details.append(state)
        ex.data = {"nearest": best[0], "diff": [list(d) for d in diff], "same_op_entries": len(cands)}
        return ex


def _inside(env: dict, serve) -> bool:
    """Whether symbol values ``env`` lie in a class's ``serve_range`` (as the hook decides)."""
    if not isinstance(serve, dict):
        return False
    try:
        return all(serve[n][0] <= v <= serve[n][1] for n, v in env.items())
    except (KeyError, TypeError, IndexError):
        return False


def _us(speed: dict, k: str) -> str:
    v = speed.get(k) if isinstance(speed, dict) else None
    return f"{float(v):.2f}" if isinstance(v, (int, float)) else "?"


def _describe(sig: Signature) -> str:
    try:
        return describe(sig)
    except Exception:  # noqa: BLE001
        return sig.op


# --- the command ------------------------------------------------------------------------------


def add_explain_args(p) -> None:
    p.add_argument("--trace", required=True, help="trace file (see `aoti-farm trace show`)")
    p.add_argument("--index", type=int, default=None, help="explain only this entry")
    p.add_argument("--device", action="append", default=None, metavar="DEVICE",
                   help="devices a serving process here serves: cpu, cuda or cuda:N (repeatable; "
                        "default: cpu, and cuda:0 when torch sees a GPU)")
    p.add_argument("--cache-dir", default=None,
                   help="cache directory (default: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm)")
    p.add_argument("--config", default=None, help="TOML config file (default: $AOTI_FARM_CONFIG)")
    p.add_argument("--serve", choices=("faster", "always"), default=None,
                   help="the hook's policy (default: $AOTI_FARM_SERVE, [hook] serve, else faster: only kernels faster "
                        "than eager)")
    p.add_argument("--contract", choices=("finite", "strict"), default=None,
                   help="the hook's contract (default: $AOTI_FARM_CONTRACT, [hook] contract, else finite: kernels "
                        "with edge notes are served)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(freeze_at_exit=True)   # nothing to finalise at exit (see cli.main)


def host_fingerprints(devices: Iterable[str] | None, inductor_options: dict) -> tuple[dict, dict]:
    """({device type: Fingerprint}, {device type: why not served}) for this host."""
    import torch

    from aoti_farm.fingerprint import fingerprint

    fps, unserved = {}, {}
    explicit = devices is not None
    for d in (devices or ("cpu", "cuda:0")):
        if d == "cuda":
            d = "cuda:0"
        if d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit()):
            raise UserError(f"--device {d!r}: use cpu, cuda or cuda:N")
        kind = d.split(":")[0]
        if kind == "cuda" and not torch.cuda.is_available():
            if explicit:
                raise UserError(f"--device {d}: torch sees no CUDA device on this host; explain it on a GPU host")
            unserved["cuda"] = "a CUDA signature, and torch sees no CUDA device here (the hook serves CPU only)"
            continue
        fps[kind] = fingerprint(d, inductor_options)
    if explicit:
        for kind in ("cpu", "cuda"):
            if kind not in fps:
                unserved.setdefault(kind, f"device {kind} is not among --device")
    return fps, unserved


def explain_command(ns) -> int:
    # The index allocates ~10 small objects per cache entry, all alive until the end, and
    # creates no cyclic garbage: with the collector on, each of its passes re-scans them
    # and torch's ~165,000 objects (0.1-0.3 s over 10,000 entries on 2 cores).
    was = gc.isenabled()
    gc.disable()
    try:
        return _explain_command(ns)
    finally:
        if was:
            gc.enable()


def _explain_command(ns) -> int:
    from aoti_farm.config import FarmConfig, HookConfig, resolve
    from aoti_farm.trace import load_trace

    cfg = resolve(FarmConfig, cli={"cache_dir": ns.cache_dir}, config_path=ns.config)
    trace = load_trace(ns.trace)
    entries = list(enumerate(trace))
    if ns.index is not None:
        if not 0 <= ns.index < len(trace):
            raise UserError(f"--index {ns.index}: trace {ns.trace} has {len(trace)} entries (0..{len(trace) - 1}); "
                            f"see `aoti-farm trace show {ns.trace}`")
        entries = [entries[ns.index]]
    cache = Cache(cfg.cache_dir, signing_key=None)
    fps, unserved = host_fingerprints(ns.device, cfg.inductor_options)
    t0 = time.perf_counter()
    hook = resolve(HookConfig, cli={"serve": ns.serve, "contract": getattr(ns, "contract", None)}, config_path=ns.config)
    ex = Explainer(cache, fps, unserved=unserved, serve=hook.serve, contract=hook.contract)
    rows = [ex.explain(e.sig, i) for i, e in entries]
    seconds = time.perf_counter() - t0
    counts = {o: sum(r.outcome == o for r in rows) for o in OUTCOMES}
    notes = ex.host_notes()
    if ns.json:
        print(json.dumps({"cache_dir": str(cache.root), "fingerprints": {d: fp.id for d, fp in fps.items()},
                          "notes": notes, "counts": counts, "seconds": seconds,
                          "signatures": [r.to_dict() for r in rows]}, indent=1, default=str))
        return 0
    for n in notes:
        print(f"note: {n}")
    for r in rows:
        print(f"[{r.index}] {r.outcome:10} {r.key[:16]}  {r.description}")
        print(f"     {r.reason}")
        for d in r.details:
            print(f"       {d}")
    print(", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" ({len(rows)} signatures, "
          f"cache {cache.root}, {seconds:.2f}s)")
    return 0
