#!/usr/bin/env python
"""Shape-general kernels: a transformer recorded at a few sequence lengths,
warmed exact vs ``--dynamic auto``, replayed at lengths never recorded.

    python scripts/bench/shapes.py [--workdir DIR] [--json out.json] [--device cuda --preload LIB]

1. Record ``BertModel`` (transformers, random weights from a small ``BertConfig``; a
   benchmark-only dependency) at ``--lengths`` (batch 2) into a trace.
2. ``aoti-farm warm --dynamic off`` and ``--dynamic auto`` of that trace into two fresh
   caches (subprocesses; same ``--cpu-workers``): entries, compile seconds, wall.
3. Replay (one subprocess per cache) at ``--unseen`` lengths inside the recorded range:
   the hook (``serve="always"``, ``on_miss="ignore"``) counts hits; each output is compared
   with eager's (computed first, in the same process).
4. Per-call time at a recorded length (both caches have a kernel there): single ops and
   the whole model, eager vs exact hit vs shape-general hit, interleaved rounds in one
   process (hooks installed in turn, both the same way: ``on_miss="ignore"``,
   ``serve="always"``, the default route); plus the model at an unseen length under both
   hooks (the exact cache misses there).  The model's row is split by op: every routed
   call one forward makes, timed one by one, and a profile of one forward per mode (each
   routed op's host time; on CUDA the runtime calls and the GPU kernels' time).  Each
   round's numbers and each hook's hits / misses / native slow-path calls per item go to
   the log as they are measured.  The ``(paired)`` rows time each item under the three
   modes back to back (a hook installed per block), ``PAIRED_REPS`` times a round, and
   give the median of the per-pair ratios: the numbers of record where the host's speed
   drifts between states over seconds (some GPU hosts do).
   ``--hybrid`` also times the model under the shape-general cache with one op's classes
   replaced by that op's exact kernels (which op's classes account for the model row).

Each warm compiles with a fresh Inductor cache (``--shared-inductor-cache``: the
environment's), so that neither warm reuses graphs an earlier run compiled.

``--device cuda`` runs the model, the trace, the kernels and the timing on the GPU (the warms
use GPU compile actors; ``--gpu-workers``).  ``--preload LIB`` (a host whose AOTI libraries
need libstdc++ preloaded, see docs) gives the replay and timing children ``LD_PRELOAD=LIB``
and the warms ``AOTI_FARM_PRELOAD_LIBSTDCXX=1`` (their actors get it).  The JSON is
rewritten after every step, so a run cut short keeps what it measured.

Nothing asserts on time; the targets are printed with the measured values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
from common import machine  # noqa: E402
import shapes_timing as T  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "aoti_farm"]
#: --device (children get it as an environment variable)
DEVICE = os.environ.get("AOTI_SHAPES_BENCH_DEVICE", "cpu")
CHILD_ENV: dict = {}
WARM_ENV: dict = {}
FRESH_INDUCTOR = True


def _model():
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                     vocab_size=1000, max_position_embeddings=256)
    return BertModel(cfg).eval().to(DEVICE)


def _ids(L: int, seed: int = 0):
    import torch

    return torch.randint(0, 1000, (2, L), generator=torch.Generator().manual_seed(seed + L)).to(DEVICE)


def _sync() -> None:
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


# --- child modes -------------------------------------------------------------------------------


def child_record(path: str, lengths: list[int]) -> dict:
    import torch

    import aoti_farm

    m = _model()
    with aoti_farm.record(path), torch.no_grad():
        for L in lengths:
            m(_ids(L))
    return {}


def child_replay(cache: str, unseen: list[int], serve: str = "always", passes: int = 1) -> dict:
    import torch

    from aoti_farm.runtime import install

    m = _model()
    with torch.no_grad():
        want = {L: m(_ids(L)).last_hidden_state for L in unseen}
        with install(cache, on_miss="ignore", serve=serve) as h:
            for _ in range(passes):
                got = {L: m(_ids(L)).last_hidden_state for L in unseen}
            st = h.stats()
    diffs = {L: float((got[L] - want[L]).abs().max()) for L in unseen}
    equal = {L: bool(torch.allclose(got[L], want[L], rtol=1e-4, atol=1e-4)) for L in unseen}
    served = st["hits"] + st["misses"] + st["failed_signatures"] + st["gated"]
    return {"hits": st["hits"], "misses": st["misses"], "failed": st["failed_signatures"], "gated": st["gated"],
            "calls": st["calls"], "fallbacks": st["fallbacks"], "eligible_calls": served,
            "hit_rate": st["hits"] / served if served else 0.0, "shape_classes": st.get("shape_classes"),
            "gate_pending": st.get("gate_pending", 0), "serve": serve, "passes": passes,
            "max_abs_diff": diffs, "equal_to_eager": equal}


def child_timing(*args) -> dict:
    """Per-call time: eager vs exact hit vs shape-general hit (shapes_timing.child_timing)."""
    return T.child_timing(_model, _ids, _sync, DEVICE, *args)


def _child(mode: str, *args) -> dict:
    r = subprocess.run([PY, __file__, "--child", mode, json.dumps(args)], capture_output=True, text=True,
                       env={**os.environ, **CHILD_ENV, "AOTI_SHAPES_BENCH_DEVICE": DEVICE})
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith("RESULT:")), None)
    if r.returncode != 0 or line is None:
        raise SystemExit(f"child {mode} failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(line[len("RESULT:"):])


def _warm(trace: str, cache: str, dynamic: str, workers: int, log, gpu_workers: int | None = None) -> dict:
    report = cache + ".report.json"
    t0 = time.perf_counter()
    extra = [] if gpu_workers is None else ["--gpu-workers", str(gpu_workers),
                                            "--gpus-per-worker", str(round(1.0 / gpu_workers, 4))]
    # a fresh Inductor cache per warm: a graph compiled by an earlier run (same lengths, same
    # classes) would otherwise come from Inductor's cache in seconds
    fresh = {"TORCHINDUCTOR_CACHE_DIR": cache + ".inductor"} if FRESH_INDUCTOR else {}
    r = subprocess.run(CLI + ["warm", "--model", trace, "--cache-dir", cache, "--dynamic", dynamic,
                              "--cpu-workers", str(workers), "--report", report] + extra, capture_output=True,
                       text=True, env={**os.environ, **WARM_ENV, **fresh})
    wall = time.perf_counter() - t0
    log.write(f"\n$ aoti-farm warm --dynamic {dynamic} (exit {r.returncode}, {wall:.1f}s)\n{r.stderr[-6000:]}\n")
    rows = json.loads(Path(report).read_text())["signatures"]
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    c = Cache(cache)
    fp = fingerprint("cuda:0" if DEVICE == "cuda" else "cpu")
    keys = c.list_keys(fp.id)
    classes = [r for r in rows if r.get("kind") == "shape_class"]
    return {"exit": r.returncode, "wall_s": round(wall, 1), "entries": len(keys),
            "compile_seconds": round(sum(r.get("seconds") or 0 for r in rows if r["status"] == "compiled"), 1),
            "signatures_exact": sum(1 for r in rows if r.get("kind") != "shape_class"),
            "statuses": {s: sum(1 for r in rows if r["status"] == s) for s in {r["status"] for r in rows}},
            "classes": [{"description": r["description"], "status": r["status"], "ranges": r["ranges"],
                         "members": len(r["members"]), "seconds": round(r.get("seconds") or 0, 1),
                         "error": r.get("error"), "speedup": r.get("speedup"),
                         "serve_range": r.get("serve_range")} for r in classes]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--lengths", default="16,40,64,96")
    ap.add_argument("--unseen", default="20,24,33,50,57,77,85,90")
    ap.add_argument("--cpu-workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads while timing (0: torch's default); 1 keeps a shared 2-core host's "
                         "scheduling noise out of eager's fork/join")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--gpu-workers", type=int, default=None, help="GPU compile actors (--device cuda)")
    ap.add_argument("--preload", default=None, help="a libstdc++ to preload where AOTI libraries need it")
    ap.add_argument("--shared-inductor-cache", action="store_true",
                    help="warm with the environment's Inductor cache (default: a fresh one per warm)")
    ap.add_argument("--hybrid", action="store_true",
                    help="also time the model under the shape-general cache with one op's classes replaced by its "
                         "exact kernels (per op; attribution of the model row)")
    ap.add_argument("--timing-only", action="store_true",
                    help="only the per-call timing, on the trace and caches an earlier run left in --workdir")
    common.add_output_args(ap, "shapes")
    ap.add_argument("--log", default=None, metavar="FILE", help="the run's log (default: DIR/shapes.log under --out, "
                                                                "else stderr)")
    ns = ap.parse_args()
    global DEVICE, FRESH_INDUCTOR
    FRESH_INDUCTOR = not ns.shared_inductor_cache
    if not ns.child:
        DEVICE = ns.device
        if ns.preload:
            CHILD_ENV["LD_PRELOAD"] = ns.preload
            WARM_ENV["AOTI_FARM_PRELOAD_LIBSTDCXX"] = "1"
    if ns.child:
        a = json.loads(ns.args)
        fn = {"record": child_record, "replay": child_replay, "timing": child_timing}[ns.child]
        print("RESULT:" + json.dumps(fn(*a)))
        return 0
    lengths = [int(x) for x in ns.lengths.split(",")]
    unseen = [int(x) for x in ns.unseen.split(",")]
    assert all(min(lengths) < L < max(lengths) and L not in lengths for L in unseen), "unseen lengths must be new and in range"
    wd = Path(ns.workdir or tempfile.mkdtemp(prefix="aoti-shapes-"))
    wd.mkdir(parents=True, exist_ok=True)
    log_path = ns.log or (common.output_path(ns, ".log") if ns.out else None)
    json_path = common.output_path(ns)
    if log_path:   # append mode: the timing child appends its rounds to the same file
        open(log_path, "w").close()
    log = open(log_path, "a") if log_path else sys.stderr
    if log_path:   # the timing child writes its rounds there as it goes
        CHILD_ENV["AOTI_SHAPES_BENCH_LOG"] = str(Path(log_path).resolve())
    out: dict = {"machine": machine(), "device": DEVICE, "lengths": lengths, "unseen": unseen, "batch": 2,
                 "inductor_cache": "fresh per warm" if FRESH_INDUCTOR else "shared (the environment's)",
                 "model": "BertModel(hidden 128, 2 layers, 2 heads, ffn 512, vocab 1000)"}
    if DEVICE == "cuda":
        import torch

        out["machine"]["gpu"] = torch.cuda.get_device_name(0)

    def step(name, fn, *a):
        t0 = time.perf_counter()
        out[name] = fn(*a)
        log.write(f"[shapes] {name} done in {time.perf_counter() - t0:.1f}s\n")
        log.flush()
        if json_path:
            json_path.write_text(json.dumps(out, indent=1) + "\n")

    trace = str(wd / "trace.json")
    mid = sorted(lengths)[len(lengths) // 2]
    ops = sorted({e["op"] for e in json.loads(Path(trace).read_text())["entries"]}) if ns.timing_only else None
    if ns.timing_only:
        step("timing", _child, "timing", str(wd / "exact"), str(wd / "dyn"), mid, unseen[len(unseen) // 2],
             ns.rounds, ns.threads, ops, ns.hybrid)
        print(json.dumps(out["timing"], indent=1))
        return 0
    _child("record", trace, lengths)
    out["trace_signatures"] = len(json.loads(Path(trace).read_text())["entries"])
    step("warm_exact", _warm, trace, str(wd / "exact"), "off", ns.cpu_workers, log, ns.gpu_workers)
    step("warm_dynamic", _warm, trace, str(wd / "dyn"), "auto", ns.cpu_workers, log, ns.gpu_workers)
    step("replay_exact", _child, "replay", str(wd / "exact"), unseen)
    step("replay_dynamic", _child, "replay", str(wd / "dyn"), unseen)
    ops = sorted({e["op"] for e in json.loads(Path(trace).read_text())["entries"]})
    step("timing", _child, "timing", str(wd / "exact"), str(wd / "dyn"), mid, unseen[len(unseen) // 2], ns.rounds,
         ns.threads, ops, ns.hybrid)
    step("replay_dynamic_gate", _child, "replay", str(wd / "dyn"), unseen, "faster", 3)
    e, d = out["warm_exact"], out["warm_dynamic"]
    rd = out["replay_dynamic"]
    t = out["timing"]["items"]
    out["targets"] = {
        "unseen_hit_rate >= 0.90": round(rd["hit_rate"], 3),
        "unseen outputs equal to eager": all(rd["equal_to_eager"].values()),
        "kernels exact/dynamic >= 3": round(e["entries"] / max(1, d["entries"]), 2),
        "shape-general hit / exact hit <= 1.1 (per op)": {k: v["dynamic_vs_exact"] for k, v in t.items()
                                                           if "dynamic_vs_exact" in v and "unseen" not in k
                                                           and not k.startswith("op ")},
        "shape-general hit / exact hit <= 1.1 (paired, median of pairs)": {
            k: v["dynamic_vs_exact"] for k, v in t.items() if k.endswith("(paired)") and "unseen" not in k},
    }
    text = json.dumps(out, indent=1)
    print(text)
    if json_path:
        json_path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
