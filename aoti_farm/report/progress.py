"""Progress display and reports for `aoti-farm warm` / `serve`.

* On a TTY: one line rewritten in place -- compiled / cached / failed / in flight / ETA.
* Otherwise: one plain log line per finished signature, retry and worker event.
* At the end: a summary table (:meth:`Progress.summary`), and with ``--report`` a JSON
  file with one record per signature: key, op, status, seconds, worker, attempts, error
  (:func:`write_report`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import TextIO

from aoti_farm.metrics.counters import Counters
from aoti_farm.security.fsutil import atomic_write
from aoti_farm.errors import UserError


def process_start_time() -> float | None:
    """Wall-clock time this process started (Linux /proc), for the report's timeline: now
    minus the process's age, both read from the boot clock (``/proc/uptime`` and the start
    time in ``/proc/self/stat``), so no whole-second rounding of ``btime``."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


#: Seconds an interpreter can take from its exec to importing aoti_farm (a command's
#: entry point imports it first thing).
EXEC_SLACK_S = 5.0


def command_start_time(imported: float | None = None) -> float | None:
    """When this command's process started, for the warm report's timeline zero.

    :func:`process_start_time` is the process's *fork*: where a shell runs ``a && b`` with
    ``bash -c`` (or a script's last line), it execs ``b`` in its own process, so that start
    is the shell's, before ``a`` ran (a README command's ``pip install``: "Ray up at 54 s"
    in a 35 s warm).  The interpreter imports aoti_farm within moments of its exec
    (``imported``, default ``aoti_farm.IMPORTED_AT``), so a fork more than
    :data:`EXEC_SLACK_S` before that is not this command's start: the import time is."""
    if imported is None:
        from aoti_farm import IMPORTED_AT as imported
    started = process_start_time()
    if started is None or imported - started > EXEC_SLACK_S:
        return imported
    return started


class Tally:
    """The display's numbers: gauges ``total`` (signatures to do) and ``in_flight`` (set by
    the events), and the counters ``counts`` (compiled, cached, failed, retried), read as
    attributes."""

    def __init__(self, total: int = 0):
        self.total = total
        self.in_flight = 0
        self.counts = Counters("compiled", "cached", "failed", "retried")

    compiled = property(lambda self: self.counts.get("compiled"))
    cached = property(lambda self: self.counts.get("cached"))
    failed = property(lambda self: self.counts.get("failed"))
    retried = property(lambda self: self.counts.get("retried"))

    @property
    def finished(self) -> int:
        return self.compiled + self.cached + self.failed


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.tally = Tally(total=total)
        self.t0 = time.monotonic()
        self.compile_seconds = 0.0
        self._last_draw = 0.0

    # -- events from the scheduler -----------------------------------------------------------
    def event(self, kind: str, data: dict) -> None:
        t = self.tally
        if kind == "dispatch":
            t.in_flight += 1
        elif kind == "done":
            r = data["result"]
            if r.attempts and t.in_flight:
                t.in_flight -= 1
            t.counts.inc(r.status)
            if r.status == "compiled":
                self.compile_seconds += r.seconds
            if not self.tty or r.status == "failed":
                self._log(f"{r.status:8} {r.key[:16]} {r.op} {r.seconds:.1f}s"
                          + (f" [{r.worker}]" if r.worker else "") + (f": {r.error}" if r.error else ""))
        elif kind in ("retry", "busy"):
            if t.in_flight:
                t.in_flight -= 1
            if kind == "retry":
                t.counts.inc("retried")
                self._log(f"retry    {data['key'][:16]} ({data['reason']})")
        elif kind == "worker_lost":
            self._log(f"worker lost ({data['reason']}); Ray restarts it")
        elif kind == "worker_replaced":
            self._log(f"worker replaced ({data['reason']})")
        self.draw()

    def eta(self) -> float | None:
        t = self.tally
        done = t.compiled + t.failed
        left = t.total - t.finished
        if not done or not left:
            return None
        return (time.monotonic() - self.t0) / max(1, t.finished) * left

    def line(self) -> str:
        t = self.tally
        width = 24
        fill = int(width * t.finished / t.total) if t.total else width
        eta = self.eta()
        return (f"[{'#' * fill}{'.' * (width - fill)}] {t.finished}/{t.total}  compiled {t.compiled}  "
                f"cached {t.cached}  failed {t.failed}  in flight {t.in_flight}  "
                f"ETA {_fmt_secs(eta) if eta is not None else '--'}")

    def draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        self.stream.write("\r\x1b[2K" + self.line())
        self.stream.flush()

    def _log(self, msg: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K")
        self.stream.write(f"aoti-farm: {msg}\n")
        self.stream.flush()

    def summary(self, results: list[dict]) -> str:
        """A table: one row per status, then one per failure with its reason."""
        t = self.tally
        wall = time.monotonic() - self.t0
        rows = [("compiled", t.compiled), ("cached", t.cached), ("failed", t.failed), ("total", t.total)]
        out = ["", f"{'status':10} {'signatures':>10}"]
        out += [f"{k:10} {v:>10}" for k, v in rows]
        out.append(f"wall {wall:.1f}s, compile time {self.compile_seconds:.1f}s, retries {t.retried}")
        speed = _speed_lines(results)
        out += speed
        refused = [r for r in results if r["status"] == "failed" and r.get("refused")]
        failed = [r for r in results if r["status"] == "failed" and not r.get("refused")]
        from aoti_farm.cache.failures import counts_text, tally

        refused_by, notes_by = tally(results)
        noted = [r for r in results if r["status"] == "compiled" and (r.get("evidence") or {}).get("edge_notes")]
        if noted:
            out.append(f"edge notes on {len(noted)} published kernel(s), served under contract='finite' (the default), "
                       f"not under 'strict': " + counts_text(notes_by))
        if refused:
            out.append(f"refused by verification ({len(refused)}: " + counts_text(refused_by)
                       + "; recorded, eager serves them; `aoti-farm cache ls --failed` lists them):")
            out += [f"  {r['key'][:16]} {r.get('description') or r['op']}: {r.get('error')}" for r in refused]
        if failed:
            out.append("failed signatures:")
            out += [f"  {r['key'][:16]} {r.get('description') or r['op']}: {r.get('error')}" for r in failed]
        out += bug_lines(results)
        return "\n".join(out)

    def finish(self, results: list[dict]) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line() + "\n")
        self.stream.write(self.summary(results) + "\n")
        self.stream.flush()


def bug_lines(results: list[dict]) -> list[str]:
    """The summary of compiles that failed on a bug of aoti-farm's own code (their evidence
    says ``bug``: :func:`aoti_farm.compile.faults.own_code_error`): a count, then one line per
    signature with the exception and where it was raised.  Tracebacks are in the failure
    records (``aoti-farm cache ls --failed``) and the warm report."""
    bugs = [r for r in results if r.get("status") == "failed" and (r.get("evidence") or {}).get("bug")]
    if not bugs:
        return []
    out = [f"BUGS in aoti-farm: {len(bugs)} signature(s) failed on aoti-farm's own code "
           f"(please report them with the tracebacks in the failure records):"]
    for r in bugs:
        ev = r["evidence"]
        out.append(f"  {r['key'][:16]} {r.get('description') or r.get('op')}: {ev.get('exception')} "
                   f"at {ev.get('where')}")
    return out


def attach_speed(rows: list[dict], cache, inductor_options: dict | None) -> None:
    """Give each published row its kernel's measured speed (the manifest's ``speed``,
    runtime/gate.py): ``speed`` (the dict) and ``speedup`` (eager / kernel).  Bounded,
    verified-free reads of the manifests; an unreadable one leaves the row without."""
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.speedgate.speed import compile_ratio

    fps: dict = {}
    for r in rows:
        if r.get("status") not in ("compiled", "cached"):
            continue
        try:
            dev = r.get("device") or "cpu"
            if dev not in fps:
                fps[dev] = fingerprint(dev, inductor_options).id
            m = cache.read_manifest(cache.entry_dir(fps[dev], r["key"]))
        except Exception:  # noqa: BLE001 -- a report line without a speed, never a failed warm
            continue
        sp = m.get("speed") if isinstance(m, dict) else None
        ratio = compile_ratio(sp)
        if ratio is not None:
            r["speed"] = sp
            r["speedup"] = 1.0 / ratio


def _speed_lines(results: list[dict]) -> list[str]:
    from aoti_farm.speedgate.speed import GATE_RATIO, speed_summary, speedup_text

    done = [r for r in results if r.get("status") in ("compiled", "cached")]
    if not done:
        return []
    sm = speed_summary([1.0 / r["speedup"] if r.get("speedup") else None for r in done])
    med = "-" if sm["median_ratio"] is None else f"{sm['median_ratio']:.2f}x eager"
    out = [f"speed (kernel/eager on the compiling host): {sm['faster']} faster than eager "
           f"(<= {GATE_RATIO}x, served under serve=faster), {sm['not_faster']} not, "
           f"{sm['unmeasured']} unmeasured; median {med}"]
    measured = sorted((r for r in done if r.get("speedup")), key=lambda r: -r["speedup"])
    for r in measured[:10]:
        out.append(f"  {speedup_text(r['speed']):>26}  {r['key'][:16]} {r.get('description') or r.get('op')}")
    if len(measured) > 10:
        out.append(f"  ... {len(measured) - 10} more (aoti-farm cache ls)")
    return out


def strict_json(x):
    """``x`` with every non-finite float as the string ``"inf"``, ``"-inf"`` or ``"nan"``:
    JSON has no such numbers (``Infinity`` is Python's extension, and the report reader
    refuses it, since a hostile report would draw to infinity), while a refusal's evidence
    may hold them (eager's value where the kernel's was finite)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    return x


def write_report(path: str, results: list[dict], extra: dict | None = None) -> None:
    """JSON: ``{"signatures": [{key, op, status, seconds, worker, attempts, error, ...}], ...extra}``,
    strict (:func:`strict_json`), so ``aoti-farm report`` reads every report warm writes."""
    doc = {"format": "aoti-farm-warm-report", "version": 1, **(extra or {}), "signatures": results}
    try:
        atomic_write(path, json.dumps(strict_json(json.loads(json.dumps(doc, default=str))), indent=1,
                                      allow_nan=False).encode())
    except OSError as e:
        raise UserError(f"report {path}: cannot write ({e.strerror}); pass a writable --report path") from None


def startup_line(timeline: dict) -> str | None:
    """One line on where a warm's start-up went (from its report timeline, seconds since
    the process started), so that a regression in the actors' start is visible without
    the report: Ray up, actors ready (first, last, and how long after Ray's start), the
    first compile, and the slowest actor's longest warm-up phase."""
    t0 = timeline.get("process_start")
    t0 = timeline.get("warm_start") if t0 is None else t0
    ws = [w for w in timeline.get("workers") or [] if w.get("ready_seen")]
    ray_up = timeline.get("ray_started")
    if t0 is None or not ws or ray_up is None:
        return None
    ready = sorted(w["ready_seen"] for w in ws)
    last = max(ws, key=lambda w: w["ready_seen"])
    phases = last.get("phases") or {}
    slow = max(phases.items(), key=lambda kv: kv[1][1] - kv[1][0], default=None)
    out = (f"start-up: Ray up at {ray_up - t0:.1f}s; {len(ws)} actor(s) ready {ready[0] - t0:.1f}-{ready[-1] - t0:.1f}s "
           f"({ready[-1] - ray_up:.1f}s after Ray's start)")
    if timeline.get("first_dispatch"):
        out += f"; first compile at {timeline['first_dispatch'] - t0:.1f}s"
    if slow:
        out += f"; slowest actor's longest phase: {slow[0]} {slow[1][1] - slow[1][0]:.1f}s"
    return out


def _fmt_secs(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
