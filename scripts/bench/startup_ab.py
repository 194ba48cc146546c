"""A/B of the start-up mechanisms of ``warm``: each one off against all on, in pairs.

    python scripts/bench/startup_ab.py --trace trace.json --workers 16 --pairs 3 --json FILE
    python scripts/bench/startup_ab.py --combine A.json B.json ... --json FILE

Each pair is one ``warm`` with every mechanism on (the defaults) and one ``warm`` per
mechanism with only that one off (its ``AOTI_FARM_DEV`` switch), in an order that rotates
from pair to pair, so that drift in the host's state spreads over both sides.  Every warm
is a fresh process with a fresh cache, Inductor cache (its precompiled headers included),
host memos and Ray temp tree (:func:`scaling.run_warm`): a fresh host each time, which is
what the mechanisms are for.  A mechanism's ratio is on / off per pair (below 1: it
saves); ``docs/benchmarks.md`` keeps a mechanism only where the median ratio is at most
0.95.

The bytecode cache (``pycache.py``) acts only where Python writes no bytecode and the
packages ship none; both of its sides run with ``PYTHONDONTWRITEBYTECODE=1``, and "off"
points ``PYTHONPYCACHEPREFIX`` at an empty directory (which turns it off, as a user's own
prefix does).  ``--combine`` merges runs of separate invocations (one host, one trace) into
one table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: mechanism -> the environment of its "off" side (``{}`` sides get the defaults).
MECHANISMS = {
    "fork_server": {"AOTI_FARM_DEV": "fork_server=0"},
    "isa_replay": {"AOTI_FARM_DEV": "isa_replay=0"},
    "fresh_isa": {"AOTI_FARM_DEV": "fresh_isa=0"},
    "split_build": {"AOTI_FARM_DEV": "split_build=0"},
    "precompile": {"AOTI_FARM_DEV": "precompile=0"},
    "pycache": {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "<empty dir>"},
}


def sides(mechanisms: list[str]) -> list[tuple[str, dict]]:
    """The runs of one pair: ``("on", {})`` and ``("<m>-off", env)`` per mechanism."""
    out = [("on", {})]
    for m in mechanisms:
        out.append((f"{m}-off", dict(MECHANISMS[m])))
    return out


def order(runs: list, pair: int) -> list:
    """Rotate the pair's runs by ``pair`` so that no side always goes first."""
    k = pair % len(runs)
    return runs[k:] + runs[:k]


def summary(runs: list[dict], mechanisms: list[str]) -> dict:
    """Per mechanism: the on and off walls, on/off per pair and its median."""
    by_pair: dict[int, dict[str, float]] = {}
    for r in runs:
        if r.get("rc") in (0, 1):   # 1: verification refusals only (warm's own contract)
            by_pair.setdefault(r["pair"], {})[r["side"]] = r["wall_s"]
    out = {}
    for m in mechanisms:
        pairs = [(p[("on")], p[f"{m}-off"]) for p in by_pair.values() if "on" in p and f"{m}-off" in p]
        if not pairs:
            out[m] = {"pairs": 0}
            continue
        ratios = [on / off for on, off in pairs]
        out[m] = {"pairs": len(pairs), "on_median_s": round(st.median(a for a, _ in pairs), 2),
                  "off_median_s": round(st.median(b for _, b in pairs), 2),
                  "on_off_per_pair": [round(x, 3) for x in ratios], "on_off_median": round(st.median(ratios), 3),
                  "keep": st.median(ratios) <= 0.95}
    return out


def table(summ: dict) -> str:
    rows = ["| mechanism | pairs | on (median) | off (median) | on / off per pair | median | keep (≤ 0.95) |",
            "|---|---|---|---|---|---|---|"]
    for m, s in summ.items():
        if not s.get("pairs"):
            rows.append(f"| {m} | 0 | | | | | |")
            continue
        rows.append(f"| {m} | {s['pairs']} | {s['on_median_s']} s | {s['off_median_s']} s | "
                    f"{', '.join(map(str, s['on_off_per_pair']))} | {s['on_off_median']} | "
                    f"{'yes' if s['keep'] else 'no'} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", help="the warm's trace (the scaling benchmark's trace of record)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--first-pair", type=int, default=0, help="number of the first pair (for runs split over calls)")
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS),
                    help=f"comma-separated, of: {', '.join(MECHANISMS)}")
    ap.add_argument("--run-timeout", type=float, default=900)
    ap.add_argument("--workdir", default=None, help="scratch (default: a fresh temporary directory)")
    ap.add_argument("--combine", nargs="+", metavar="JSON", help="merge the --json files of separate invocations")
    import common as C

    C.add_output_args(ap, "startup_ab")
    a = ap.parse_args(argv)
    out_path = C.output_path(a)
    mechs = [m.strip() for m in a.mechanisms.split(",") if m.strip()]
    bad = [m for m in mechs if m not in MECHANISMS]
    if bad:
        raise SystemExit(f"startup_ab: --mechanisms: unknown {', '.join(bad)}; use some of {', '.join(MECHANISMS)}")
    if a.combine:
        parts = [json.loads(Path(p).read_text()) for p in a.combine]
        if len({json.dumps([d["machine"].get(k) for k in ("platform", "cpu_count", "cpu_model", "torch")])
                for d in parts}) != 1 or len({d["trace_sha256"] for d in parts}) != 1:
            raise SystemExit("startup_ab: --combine: the runs differ in host or trace; combine runs of one host and trace")
        res = {**parts[0], "runs": [r for d in parts for r in d["runs"]], "combined_from": a.combine}
        seen = {m for d in parts for m in d["mechanisms"]}
        gone = sorted(seen - set(MECHANISMS))   # removed since: their "off" runs are not summarised
        res["mechanisms"] = sorted(seen & set(MECHANISMS), key=list(MECHANISMS).index)
        if gone:
            res["removed_mechanisms"] = gone
            print(f"[startup_ab] --combine: no longer mechanisms here, not summarised: {', '.join(gone)}")
    else:
        if not a.trace or not Path(a.trace).is_file():
            raise SystemExit(f"startup_ab: --trace {a.trace}: no such file; name a trace file (see the module doc)")
        from scaling import run_warm

        work = Path(a.workdir or tempfile.mkdtemp(prefix="sab-")).absolute()
        res = {"machine": C.machine(), "workers": a.workers, "trace": a.trace, "mechanisms": mechs,
               "trace_sha256": hashlib.sha256(Path(a.trace).read_bytes()).hexdigest(),
               "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}
        print(f"[startup_ab] {res['date_utc']}, {os.cpu_count()} cores, W={a.workers}, trace {a.trace}, "
              f"{a.pairs} pair(s) of: on, {', '.join(m + ' off' for m in mechs)}", flush=True)
        for p in range(a.first_pair, a.first_pair + a.pairs):
            for side, env in order(sides(mechs), p):
                env = dict(env)
                label = f"p{p}-{side}"
                if env.get("PYTHONPYCACHEPREFIX"):
                    env["PYTHONPYCACHEPREFIX"] = str(work / f"{label}-empty-prefix")
                elif side == "on" and "pycache" in mechs:
                    env["PYTHONDONTWRITEBYTECODE"] = "1"   # the pycache pair's "on": same image state
                r = run_warm(a.trace, a.workers, work, label, env or None, timeout=a.run_timeout)
                row = {"pair": p, "side": side, "rc": r.get("rc"), "wall_s": round(r["wall_s"], 2),
                       "env": env, "pycache": r.get("pycache"), "host_prep": r.get("host_prep"),
                       "all_actors_ready_s": r.get("all_actors_ready_s"),
                       "first_compile_start_s": r.get("first_compile_start_s"),
                       "last_lines": (r.get("stderr_tail") or "").strip().splitlines()[-3:]}
                if r.get("rc") not in (0, 1):
                    row["stderr_tail"] = r.get("stderr_tail", "")[-3000:]
                res["runs"].append(row)
                print(f"[startup_ab] pair {p} {side}: rc {row['rc']}, wall {row['wall_s']} s, "
                      f"actors ready {row['all_actors_ready_s']}, first compile {row['first_compile_start_s']}; "
                      f"{' | '.join(row['last_lines'])[:300]}",
                      flush=True)
                if out_path:
                    out_path.write_text(json.dumps(res, indent=1, default=str))
    res["summary"] = summary(res["runs"], res["mechanisms"])
    print(table(res["summary"]))
    if out_path:
        out_path.write_text(json.dumps(res, indent=1, default=str))
        print(f"[startup_ab] wrote {out_path}")
    return 0 if all(r.get("rc") in (0, 1) for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
