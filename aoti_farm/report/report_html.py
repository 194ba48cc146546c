"""`aoti-farm report REPORT.json --html OUT.html`: a warm report as one self-contained
HTML page (inline CSS and SVG, no script, nothing fetched from the network).

* a summary on top: signatures by outcome, wall time, Ray's start-up, the actors' warm-up,
  compile seconds, retries and the pool's counters;
* a timeline: one lane for the driver (process start, Ray's start-up, planning, the
  scheduler, Ray's shutdown), then one lane per actor with its warm-up and one bar per
  signature it compiled, coloured by outcome (hover for key, seconds, phases, error);
* a table of every signature (including those found in the cache while planning).

The report JSON is what `aoti-farm warm --report` writes (see :mod:`aoti_farm.report.progress`).
"""

from __future__ import annotations

import html
import json
import math
import os
from typing import Any

from aoti_farm.cache.failures import counts_text, tally
from aoti_farm.errors import UserError

COLOURS = {"compiled": "#2e9d4f", "cached": "#3d7fd6", "failed": "#d64541", "busy": "#e0a526",
           "error": "#8e44ad", "warmup": "#c9c9c9", "ray": "#f0b35a", "plan": "#9fc5e8", "sched": "#e3e3e3",
           "shutdown": "#d9a1a1", "startup": "#bbbbbb"}
WIDTH = 1100          # px of the time axis
LANE_H = 24
LABEL_W = 170
MAX_BYTES = 256 << 20
#: Bounds on a report's numbers: a wall-clock time (seconds since the epoch, before the
#: year 5138), one signature's seconds, and the whole timeline's span (30 days).  A number
#: outside them (or not finite, or not a number where one is due) is a one-line error: the
#: page's size and its axis ticks grow with the span, so a hostile ``"end": 1e300`` would
#: otherwise draw until memory runs out.
MAX_TIME = 1e11
MAX_SECONDS = 30 * 86400.0
MAX_TICKS = 13


def load_report(path: str) -> dict:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise UserError(f"report {path}: larger than {MAX_BYTES >> 20} MiB; pass a warm report")
        with open(path, "rb") as f:
            doc = json.loads(f.read(), parse_constant=_no_constant)
    except FileNotFoundError:
        raise UserError(f"report {path}: no such file; pass the file `aoti-farm warm --report` wrote") from None
    except IsADirectoryError:
        raise UserError(f"report {path}: is a directory; pass a report file") from None
    except OSError as e:
        raise UserError(f"report {path}: unreadable ({e.strerror}); fix its permissions") from None
    except ValueError as e:
        raise UserError(f"report {path}: not JSON ({str(e)[:80]}); pass a report `aoti-farm warm --report` wrote") from None
    if not isinstance(doc, dict) or doc.get("format") != "aoti-farm-warm-report":
        raise UserError(f"report {path}: field 'format' is not 'aoti-farm-warm-report'; pass a warm report")
    if not isinstance(doc.get("signatures"), list):
        raise UserError(f"report {path}: field 'signatures' is missing or not a list; pass a warm report")
    bad = check_numbers(doc)
    if bad:
        raise UserError(f"report {path}: {bad}; pass a report `aoti-farm warm --report` wrote")
    return doc


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a report may hold")


def _bad_num(x: Any, where: str, hi: float, *, required: bool = False) -> str | None:
    if x is None and not required:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return f"field {where} is not a number"
    if not math.isfinite(x) or x < 0 or x > hi:
        return f"field {where} is {x!r:.40}, outside 0..{hi:g}"
    return None


def check_numbers(doc: dict) -> str | None:
    """The first number of the report that is not one this page can draw (see
    :data:`MAX_TIME`), as the error's text; None when all are."""
    tl = doc.get("timeline") if isinstance(doc.get("timeline"), dict) else {}
    times: list[float] = []
    for k, v in tl.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            bad = _bad_num(v, f"timeline.{str(k)[:40]}", MAX_TIME)
            if bad:
                return bad
            times.append(float(v))
    for i, w in enumerate(tl.get("workers") or []):
        if not isinstance(w, dict):
            continue
        for f in ("created_at", "ready_seen"):
            bad = _bad_num(w.get(f), f"timeline.workers[{i}].{f}", MAX_TIME)
            if bad:
                return bad
            if w.get(f) is not None:
                times.append(float(w[f]))
        sp = w.get("warmup_span")
        if isinstance(sp, (list, tuple)):
            for j, t in enumerate(sp[:2]):
                bad = _bad_num(t, f"timeline.workers[{i}].warmup_span[{j}]", MAX_TIME, required=True)
                if bad:
                    return bad
                times.append(float(t))
    for i, sig in enumerate(doc["signatures"]):
        if not isinstance(sig, dict):
            continue
        bad = _bad_num(sig.get("seconds"), f"signatures[{i}].seconds", MAX_SECONDS)
        if bad:
            return bad
        sp = sig.get("span")
        if isinstance(sp, (list, tuple)):
            for j, t in enumerate(sp[:2]):
                bad = _bad_num(t, f"signatures[{i}].span[{j}]", MAX_TIME, required=True)
                if bad:
                    return bad
                times.append(float(t))
    if times and max(times) - min(times) > MAX_SECONDS:
        return f"its times span {max(times) - min(times):.3g} s, more than {MAX_SECONDS:g}"
    return None


def _num(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _span(x: Any) -> tuple[float, float] | None:
    if isinstance(x, (list, tuple)) and len(x) == 2 and _num(x[0]) is not None and _num(x[1]) is not None:
        return float(x[0]), float(x[1])
    return None


def _pid_of(worker: str) -> str:
    return worker.rsplit(":", 1)[-1] if isinstance(worker, str) and ":" in worker else str(worker or "")


class _Layout:
    """Wall-clock seconds -> x pixels."""

    def __init__(self, t0: float, t1: float):
        self.t0, self.t1 = t0, max(t1, t0 + 1e-3)

    def x(self, t: float) -> float:
        return LABEL_W + (t - self.t0) / (self.t1 - self.t0) * WIDTH

    def w(self, a: float, b: float, least: float = 1.5) -> float:
        return max(least, self.x(b) - self.x(a))


def _rect(lay: _Layout, y: float, a: float, b: float, colour: str, title: str, cls: str, h: float = LANE_H - 6,
          least: float = 1.5) -> str:
    return (f'<rect class="{cls}" x="{lay.x(a):.1f}" y="{y + 3:.1f}" width="{lay.w(a, b, least):.1f}" '
            f'height="{h:.1f}" fill="{colour}"><title>{html.escape(title)}</title></rect>')


def _tick_step(total: float) -> float:
    """Seconds between the axis's ticks: a round step, and never fewer seconds than spread
    MAX_TICKS ticks over the whole span (the first of the two bounds on the ticks; the
    drawing loop's count is the second)."""
    step = next((s for s in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600) if total / s <= 12), 7200)
    return max(step, total / (MAX_TICKS - 1))


def render(doc: dict, source: str = "") -> str:
    """The whole page as a string."""
    sigs = [s for s in doc["signatures"] if isinstance(s, dict)]
    tl = doc.get("timeline") if isinstance(doc.get("timeline"), dict) else {}
    marks = {k: _num(v) for k, v in tl.items() if _num(v) is not None}
    workers = [w for w in tl.get("workers") or [] if isinstance(w, dict)]
    spans = [(_span(s.get("span")), s) for s in sigs]
    times = [t for t in marks.values()] + [t for sp, _ in spans if sp for t in sp]
    for w in workers:
        times += [t for t in ([_num(w.get("created_at")), _num(w.get("ready_seen"))]
                              + list(_span(w.get("warmup_span")) or ())) if t is not None]
    t0 = marks.get("process_start") or marks.get("warm_start") or (min(times) if times else 0.0)
    t1 = max(times) if times else t0 + 1
    lay = _Layout(t0, t1)

    # lanes: the driver, then one per actor (by pid), in order of their first activity
    lanes: dict[str, dict] = {}
    for w in workers:
        pid = str(w.get("pid"))
        lanes.setdefault(pid, {"worker": w, "bars": []})
    for sp, s in spans:
        if sp is None:
            continue
        lanes.setdefault(_pid_of(s.get("worker", "")), {"worker": None, "bars": []})["bars"].append((sp, s))
    order = sorted(lanes, key=lambda p: min([b[0][0] for b in lanes[p]["bars"]] +
                                            [_num((lanes[p]["worker"] or {}).get("created_at")) or t1]))
    n_lanes = 1 + len(order)
    height = 40 + n_lanes * LANE_H + 30
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + WIDTH + 20}" height="{height}" '
           f'role="img" aria-label="warm timeline">']
    # axis
    total = t1 - t0
    step = _tick_step(total)
    k = 0
    while k * step <= total + 1e-9 and k < MAX_TICKS:   # the second bound: MAX_TICKS whatever the step
        x = lay.x(t0 + k * step)
        svg.append(f'<line x1="{x:.1f}" y1="30" x2="{x:.1f}" y2="{height - 20}" class="grid"/>'
                   f'<text x="{x:.1f}" y="22" class="tick">{k * step:g}s</text>')
        k += 1
    y = 36
    # the driver lane
    svg.append(f'<text x="4" y="{y + 16}" class="lane">driver (aoti-farm warm)</text>')
    phases = [("sched", "actors_requested", "scheduler_done", "scheduler: actors requested -> all done"),
              ("startup", "process_start", "warm_start", "process start-up (imports)"),
              ("ray", "warm_start", "ray_started", "Ray start-up"),
              ("plan", "warm_start", "planned", "planning (cache lookups, fingerprint)"),
              ("shutdown", "scheduler_done", "ray_shutdown", "actors and Ray shut down")]
    for cls, a, b, label in phases:
        if marks.get(a) is not None and marks.get(b) is not None and marks[b] >= marks[a]:
            h = (LANE_H - 6) / (2 if cls in ("ray", "plan") else 1)
            yy = y + (h if cls == "plan" else 0)
            svg.append(_rect(lay, yy, marks[a], marks[b], COLOURS[cls],
                             f"{label}: {marks[b] - marks[a]:.2f} s", f"phase {cls}", h))
    y += LANE_H
    for pid in order:
        lane = lanes[pid]
        w = lane["worker"] or {}
        host = next((str(s.get("worker")).rsplit(":", 1)[0] for _, s in lane["bars"] if s.get("worker")), "")
        name = f"{host}:{pid}" if host else f"pid {pid}"
        svg.append(f'<text x="4" y="{y + 16}" class="lane">actor {html.escape(name)}</text>')
        created, asked = _num(w.get("created_at")), marks.get("actors_requested")
        if created is not None and asked is not None and created > asked:
            svg.append(_rect(lay, y, asked, created, COLOURS["startup"], f"actor {pid} requested -> its process "
                             f"started: {created - asked:.2f} s", "actorstart", (LANE_H - 6) / 2))
        ws = _span(w.get("warmup_span"))
        if ws:
            svg.append(_rect(lay, y, ws[0], ws[1], COLOURS["warmup"], f"warm-up of actor {pid}: {ws[1] - ws[0]:.2f} s",
                             "warmup"))
        for (a, b), s in lane["bars"]:
            st = str(s.get("status"))
            ph = s.get("phases") if isinstance(s.get("phases"), dict) else {}
            title = (f"{st} {str(s.get('key'))[:16]} {s.get('description') or s.get('op')}\n"
                     f"{b - a:.2f} s wall, attempts {s.get('attempts')}"
                     + "".join(f"\n{k} {v:.2f} s" for k, v in ph.items() if _num(v) is not None)
                     + (f"\nerror: {s.get('error')}" if s.get("error") else ""))
            svg.append(_rect(lay, y, a, b, COLOURS.get(st, "#777777"), title, f"sig {html.escape(st)}", least=4.0))
        y += LANE_H
    svg.append("</svg>")
    return _page(doc, sigs, marks, workers, "\n".join(svg), source)


def _summary(doc: dict, sigs: list, marks: dict, workers: list) -> list[tuple[str, str]]:
    counts: dict[str, int] = {}
    for s in sigs:
        counts[str(s.get("status"))] = counts.get(str(s.get("status")), 0) + 1
    rows = [("signatures", f"{len(sigs)} (" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")")]
    refused_by, notes_by = tally(sigs)
    if refused_by:
        rows.append(("refused by verification", counts_text(refused_by)))
    if notes_by:
        rows.append(("edge notes (served under contract 'finite')", counts_text(notes_by)))
    start = next((marks[k] for k in ("process_start", "warm_start") if marks.get(k) is not None), None)
    if marks.get("end") is not None and start is not None:
        rows.append(("wall", f"{marks['end'] - start:.1f} s from process start"))
    if marks.get("ray_started") is not None and marks.get("warm_start") is not None:
        rows.append(("Ray start-up", f"{marks['ray_started'] - marks['warm_start']:.1f} s"))
    warm = [sp[1] - sp[0] for w in workers if (sp := _span(w.get("warmup_span")))]
    if warm:
        rows.append(("actor warm-up", f"{len(warm)} actor{'s' if len(warm) != 1 else ''}, "
                                      f"{min(warm):.1f}-{max(warm):.1f} s each"))
    comp = [(_num(s.get("seconds")) or 0.0) for s in sigs if s.get("status") == "compiled"]
    if comp:
        rows.append(("compile time", f"{sum(comp):.1f} s in all, {sum(comp) / len(comp):.1f} s per compiled signature"))
    pool = doc.get("pool") if isinstance(doc.get("pool"), dict) else None
    if pool:
        rows.append(("pool", ", ".join(f"{k} {v}" for k, v in pool.items())))
    return rows


def _page(doc: dict, sigs: list, marks: dict, workers: list, svg: str, source: str) -> str:
    e = html.escape
    summary = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary(doc, sigs, marks, workers))
    legend = "".join(f'<span class="key"><i style="background:{c}"></i>{e(k)}</span>'
                     for k, c in COLOURS.items() if k in ("compiled", "cached", "failed", "warmup", "ray", "plan",
                                                          "sched", "startup", "shutdown"))
    rows = []
    for s in sigs:
        st = str(s.get("status"))
        rows.append(f'<tr class="{e(st)}"><td><code>{e(str(s.get("key"))[:16])}</code></td>'
                    f'<td><b style="color:{COLOURS.get(st, "#777")}">{e(st)}</b></td>'
                    f'<td>{(_num(s.get("seconds")) or 0.0):.2f}</td><td>{e(str(s.get("worker") or "-"))}</td>'
                    f'<td>{e(str(s.get("description") or s.get("op")))}</td><td>{e(str(s.get("error") or ""))}</td></tr>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>aoti-farm warm report{(' - ' + e(source)) if source else ''}</title>
<style>
body {{ font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 8px; }}
table.summary th {{ text-align: left; padding-right: 12px; }}
table.sigs {{ border-collapse: collapse; margin-top: 12px; }}
table.sigs td, table.sigs th {{ border-bottom: 1px solid #eee; padding: 2px 8px; text-align: left; }}
.grid {{ stroke: #eee; }} .tick {{ font-size: 10px; fill: #777; text-anchor: middle; }}
.lane {{ font-size: 11px; fill: #333; }}
.key {{ margin-right: 12px; }} .key i {{ display: inline-block; width: 12px; height: 10px; margin-right: 4px; }}
rect.sig {{ stroke: #fff; stroke-width: 0.5; }}
</style></head><body>
<h1>aoti-farm warm report</h1>
<p>{e(source)} {e(' '.join(str(m) for m in doc.get('models') or []))}</p>
<table class="summary">{summary}</table>
<p class="legend">{legend}</p>
<div class="timeline">{svg}</div>
<table class="sigs"><tr><th>key</th><th>outcome</th><th>seconds</th><th>worker</th><th>signature</th><th>error</th></tr>
{''.join(rows)}
</table>
</body></html>
"""
