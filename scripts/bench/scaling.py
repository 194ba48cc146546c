#!/usr/bin/env python
"""Farm scaling: `aoti-farm warm` of one job of >= ~80 CPU signatures at W=1 and W=all.

    python scripts/bench/scaling.py --out DIR                  # W=1 and W=os.cpu_count(); DIR/scaling.json
    python scripts/bench/scaling.py --workers 16 --isa-replay-off-too --unique 16
    python scripts/bench/run.py --only scaling                 # the same through the runner

The job: a tiny BERT (transformers, built from a config, no download) recorded at seven
sequence lengths when ``transformers`` is importable (85 signatures with transformers 5.24), else the
benchmark MLP recorded at batch sizes 1..21 (about 84); or ``--trace FILE``.  For a host
with many more cores, ``--lengths`` records more lengths: the 22 lengths 8, 12, ..., 92
gave 265 signatures (transformers 5.24, torch 2.13).

Each run is a fresh `aoti-farm warm` process with a fresh cache, a fresh Inductor cache
(TORCHINDUCTOR_CACHE_DIR) and fresh host memos (XDG_CACHE_HOME: the ISA and loader
memos): each pays the ISA probe, the split build's common object
and the loader probe once.  Inductor's precompiled headers (in the farm's private Inductor
cache, ``<TORCHINDUCTOR_CACHE_DIR>/precompiled_headers``: see ``aoti_farm/security/private.py``) are
built once before the runs and copied into each run's fresh Inductor cache, so every run
finds them, as every warm after a host's first does (``--fresh-headers``: each run builds
them too, as on a brand-new host).  Runs are sequential, W=all first.

Reported per run, from the CLI process's wall time and its --report timeline:
wall; time to Ray up; time until every actor is ready (from the process start and from
Ray up); time to the first compile; each actor's warm-up phases; per-signature compile
seconds (median, mean, p90, sum); busy CPUs every 5 s and CPU seconds per signature by
process kind; and across runs the speed-up W1/Wall and the farm's own scaling
W1 / (W x Wall).  Before the runs, the host's own ceiling (:func:`host_ceiling`): how much
one job slows among W copies of it.  Nothing here asserts on time.

    python scripts/bench/scaling.py --workers 64 --lengths 8,12,16,20,24,28,32,36,40,44,48,52,56,60 --json a.json
    python scripts/bench/scaling.py --workers 1 --trace <a's trace.json> --json b.json
    python scripts/bench/scaling.py --combine a.json b.json      # one comparison of the two
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))   # common.py; aoti_farm is the installed one

BERT_LENGTHS = (8, 16, 24, 32, 48, 64, 96)

_RECORD_BERT = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
import aoti_farm
from transformers import BertConfig, BertModel
torch.manual_seed(0)
cfg = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=128)
model = BertModel(cfg).eval()
lengths = [int(x) for x in sys.argv[2].split(",")]
inputs = [(torch.randint(0, 512, (1, n)), torch.ones(1, n, dtype=torch.long)) for n in lengths]
with torch.no_grad(), aoti_farm.record(sys.argv[1]):
    for ids, mask in inputs:
        model(input_ids=ids, attention_mask=mask)
"""


def _pct(xs: list, p: float):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def make_trace(work: Path, source: str, unique: int | None, lengths: tuple = BERT_LENGTHS) -> tuple[str, dict]:
    """(trace path, what it is) -- see the module doc."""
    from aoti_farm.trace import Trace, load_trace, save_trace

    raw = work / "trace-raw.json"
    info: dict = {}
    if source in ("auto", "bert"):
        try:
            import transformers  # noqa: F401

            have = True
            info["transformers"] = transformers.__version__
        except ImportError:
            have = False
        if have:
            ls = ",".join(map(str, lengths))
            subprocess.run([sys.executable, "-c", _RECORD_BERT, str(raw), ls], check=True, timeout=600)
            info.update(source=f"tiny BERT (2 layers, hidden 64), lengths {ls}")
        elif source == "bert":
            raise SystemExit("scaling: --source bert needs transformers; pip install transformers (benchmarks only)")
    if not info.get("source"):
        import common as C

        C.run_worker("record_trace", {"path": str(raw), "batches": list(range(1, 22))})
        info.update(source="benchmark MLP, batch sizes 1..21")
    tr = load_trace(str(raw))
    entries = [e for e in tr if e.sig.device == "cpu"]
    if unique:
        entries = entries[:unique]
    out = work / "trace.json"
    save_trace(Trace(entries), str(out))
    info["signatures"] = len(entries)
    return str(out), info


# One real compile of a small signature by the farm's compiler, recording the C++ compiles
# it runs: the wrapper's model half (aoti_farm.build.splitbuild) and the kernel, each with its
# source copied beside (Inductor deletes its build directory).  host_ceiling replays them.
_CAPTURE_FARM_COMPILE = r"""
import json, os, shlex, shutil, sys, tempfile
import torch
from torch._inductor import cpp_builder
from aoti_farm import signature as S
from aoti_farm.build import splitbuild
from aoti_farm.compile.compiler import AOTICompiler
out = sys.argv[1]
got = {}
def keep(name, argv, src_i, cwd):
    dst = os.path.join(out, name + ".cpp")
    shutil.copy(argv[src_i], dst)
    a = list(argv); a[src_i] = dst
    got[name] = {"argv": a, "cwd": cwd}
start = splitbuild._start
def _start(argv, cwd):
    if argv[1].endswith(".model.cpp"):
        keep("model_half", argv, 1, cwd)
    return start(argv, cwd)
splitbuild._start = _start
build = cpp_builder.CppBuilder.build
def _build(self):
    src = getattr(self, "_sources_args", "")
    if isinstance(src, str) and src.endswith(".kernel.cpp") and getattr(self, "_compile_only", False):
        argv = shlex.split(self.get_command_line())
        keep("kernel", argv, argv.index(src), os.path.dirname(src))
    return build(self)
cpp_builder.CppBuilder.build = _build
a, w, b = torch.randn(16, 128), torch.randn(128, 128), torch.randn(128)
r = AOTICompiler().compile(S.from_call(torch.ops.aten.addmm.default, (b, a, w), {}), tempfile.mkdtemp())
got["build"] = r.build
print(json.dumps(got))
"""


def prebuilt_headers(work: Path) -> Path:
    """Where :func:`prebuild_headers` leaves the headers (its Inductor cache's)."""
    return work / "headers" / "inductor" / "precompiled_headers"


def prebuild_headers(work: Path, extra_env: dict | None = None, name: str = "headers") -> dict:
    """Build Inductor's precompiled headers with one throwaway compile: throwaway Inductor
    cache, host memos and kernel.  The current code keeps them in its Inductor cache
    (:func:`prebuilt_headers`, copied into each run's); a code from before the private
    Inductor cache keeps them in Inductor's global directory, shared by all its runs, so
    an ``--also-env`` side that runs such a code gets this call too (``extra_env``, its own
    ``name``): otherwise that side's first warm of an invocation would also build them, and
    its pair would favour the current code.  Then, for the current code only, one real
    compile by the farm's compiler there, whose C++ compiles (the wrapper's model half, the
    kernel) are recorded for :func:`host_ceiling` (``farm_compile``)."""
    d = work / name
    for sub in ("xdg", "inductor", "captured"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(extra_env or {}), "XDG_CACHE_HOME": str(d / "xdg"),
           "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor")}
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", "import json; from aoti_farm.compile.hostprep import prepare; "
                        "print(json.dumps(prepare()['status']))"], env=env, capture_output=True, text=True,
                       timeout=1800)
    out = {"seconds": round(time.time() - t0, 1), "rc": p.returncode, "out": p.stdout.strip()[-200:]}
    if out["out"] != '"prepared"':
        out["stderr"] = p.stderr.strip()[-400:]
    if extra_env:
        return out
    hdr = prebuilt_headers(work)
    out["headers"] = str(hdr) if hdr.is_dir() else None
    c = subprocess.run([sys.executable, "-c", _CAPTURE_FARM_COMPILE, str(d / "captured")], env=env,
                       capture_output=True, text=True, timeout=1800)
    try:
        out["farm_compile"] = json.loads(c.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out["farm_compile"] = {"error": f"rc {c.returncode}: {c.stderr.strip()[-300:]}"}
    return out


def run_warm(trace: str, workers: int, work: Path, label: str, extra_env: dict | None = None,
             timeout: float = 3600, fresh_headers: bool = False) -> dict:
    """One fresh `aoti-farm warm` process (see the module doc)."""
    d = work / label
    d.mkdir(parents=True, exist_ok=False)
    for sub in ("tmp", "ray", "xdg", "inductor"):
        (d / sub).mkdir()
    report = d / "report.json"
    env = {**os.environ, "RAY_TMPDIR": str(d / "ray"), "XDG_CACHE_HOME": str(d / "xdg"),
           "TORCHINDUCTOR_CACHE_DIR": str(d / "inductor"), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    if fresh_headers:
        env["TMPDIR"] = str(d / "tmp")
    elif prebuilt_headers(work).is_dir():
        shutil.copytree(prebuilt_headers(work), d / "inductor" / "precompiled_headers")
    env.pop("AOTI_FARM_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "aoti_farm", "warm", "--model", trace, "--cache-dir", str(d / "cache"),
           "--cpu-workers", str(workers), "--report", str(report)]
    t0 = time.time()
    errlog = d / "stderr.log"   # the CLI's progress lines, readable while it runs
    with CpuSampler() as cpu, open(errlog, "w") as ef:
        try:
            rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=ef, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,time,wchan:24,args", "--sort=pid"],
                                capture_output=True, text=True).stdout
            ef.write("\n[scaling] timed out; processes:\n" + "\n".join(
                ln[:220] for ln in ps.splitlines() if "python" in ln or "PID" in ln or "ray" in ln))
    wall = time.time() - t0
    res = {"label": label, "workers": workers, "env": extra_env or {}, "rc": rc, "wall_s": wall,
           "stderr_tail": errlog.read_text()[-6000:], "cpu_busy": cpu.summary(t0),
           "cpu_by_kind": cpu.cpu_by_kind(), "processes_counted": cpu.tree, "heaviest_processes": cpu.heaviest()}
    try:
        rep = json.loads(report.read_text())
    except (OSError, ValueError):
        return res
    res.update(analyse(rep, t0))
    res["compile_phases"] = compile_phases(rep, d / "cache")
    return res


def _argv(pid: str) -> list[str] | None:
    """A process's command line (None: gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return None


def _proc_kind(pid: str, argv: list[str] | None = None) -> str | None:
    """Which part of a warm a process is, from its command line (None: not the farm's);
    ``argv``: that command line, already read (:func:`_argv`)."""
    argv = argv if argv is not None else _argv(pid)
    if argv is None:
        return None
    kind = kind_of(argv)
    if kind == "fork server":   # a forked copy names itself (workers/forkserver.py's COPY_NAME)
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "aoti-farm-copy":
                    return "actors"
        except OSError:
            pass
    return kind


def kind_of(argv: list[str]) -> str | None:
    """:func:`_proc_kind` of one command line."""
    exe = argv[0]
    if exe.startswith("ray::"):      # a process Ray named: a worker (IDLE, CompileActor) or an agent
        return "ray python" if exe.split()[0].endswith("Agent") else "actors"
    if os.path.basename(exe) in ("raylet", "gcs_server"):
        return "ray daemons"
    script = next((a for a in argv[1:] if not a.startswith("-")), "")
    if script.endswith("default_worker.py"):
        return "actors"              # a Ray worker before it names itself
    if "/ray/" in script:
        return "ray python"          # log monitor, dashboard, the autoscaler monitor
    if "aoti_farm.workers.forkserver" in argv[1:4]:
        return "fork server"         # and its children, the actors' compiling copies (CpuSampler._scan)
    if "aoti_farm.compile.compiler" in argv[1:4] and "--serve" in argv:
        return "verification children"   # an actor's long-lived one (aoti_farm/compile/verifyserver.py)
    if "aoti_farm" in argv[1:4]:
        return "driver and its children"   # python -m aoti_farm warm ...
    return None


class CpuSampler:
    """The host's busy CPUs (from /proc/stat, every second) while a run goes: how many
    of the cores the farm kept busy, by phase of the run (read against the timeline).
    Also where the CPU went: every second each process's own and waited-for children's
    CPU seconds (/proc/PID/stat), summed at the end by kind (:func:`_proc_kind`).  An
    actor's children are its compilers (g++ and what g++ runs), counted when reaped; a
    process's last second before it exits is lost.  :meth:`heaviest` names the processes
    that took the most CPU, whatever their kind: a warm whose breakdown shows hundreds of
    CPU-seconds in some process's reaped children says which process it was."""

    def __init__(self, every: float = 1.0):
        import threading

        self.every, self.samples, self._stop = every, [], threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._procs: dict = {}     # pid -> [kind, own s, children s]
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._before = {p for p in os.listdir("/proc") if p.isdigit()} if os.path.isdir("/proc") else set()
        self.tree: list = []        # [pid, ppid, kind, parent's kind] of each farm process as first seen
        self._seen: set = set()
        self._all: dict = {}       # pid -> [own s, ppid, command line] of every process started since

    _DAEMONS = ("ray daemons", "ray python")   # what the driver starts that is not its own work

    def _scan(self):
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid in self._before:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    v = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            try:   # own and waited-for children's CPU seconds
                own, kids = (int(v[11]) + int(v[12])) / self._tick, (int(v[13]) + int(v[14])) / self._tick
            except (ValueError, IndexError):
                own = kids = None
            argv = _argv(pid)
            self._note(pid, int(v[1]), own, argv)
            # classified every time: a process between fork and exec, or before Ray names a
            # worker, shows its parent's command line
            kind = _proc_kind(pid, argv)
            parent = self._procs.get(v[1])
            if kind is not None and len(self.tree) < 400 and pid not in self._seen:   # to check the breakdown
                self._seen.add(pid)
                self.tree.append([int(pid), int(v[1]), kind, parent[0] if parent else None])
            # the fork server (both its stages) and its copies are reaped unwaited
            # (workers/forkserver.py): each counts itself; a copy's compilers count in it.
            # An actor's verification child lives until the actor is killed at the end, so
            # nobody reaps it either: it counts itself.  One that a kernel ended (a kernel
            # that aborts where eager raises) is reaped by its actor, so its CPU counts in
            # the actor's children too: the `actors` row overstates by it
            if (parent and parent[0] in ("actors", "driver and its children") and kind not in self._DAEMONS
                    and kind not in ("fork server", "verification children") and parent[0] != "fork server"):
                self._procs.pop(pid, None)   # reaped by its parent: counted in the parent's children_s
                continue
            if kind is None:
                if pid not in self._procs:
                    continue
                # an exiting process (a zombie's command line is empty: Ray's shutdown kills
                # every actor at once) keeps its kind; its stat still has its CPU seconds
                kind = self._procs[pid][0]
            ent = self._procs.setdefault(pid, [kind, 0.0, 0.0])
            ent[0] = kind
            if own is not None:
                ent[1], ent[2] = own, kids

    def _note(self, pid: str, ppid: int, own: float | None, argv: list[str] | None) -> None:
        """Every process's own CPU seconds and its command line after its exec (taken each
        scan: a process between fork and exec shows its parent's)."""
        if argv is None or own is None:
            return
        cmd = " ".join(argv).strip()[:200]
        ent = self._all.setdefault(pid, [0.0, ppid, ""])
        ent[0] = max(ent[0], own)
        if cmd:
            ent[2] = cmd

    def heaviest(self, n: int = 15) -> list:
        """The ``n`` processes started since the sampler's start that took the most CPU
        of their own, heaviest first: ``{"pid", "ppid", "own_s", "cmd"}``."""
        top = sorted(self._all.items(), key=lambda kv: -kv[1][0])[:n]
        return [{"pid": int(pid), "ppid": ppid, "own_s": _r(own), "cmd": cmd} for pid, (own, ppid, cmd) in top]

    def cpu_by_kind(self) -> dict:
        out: dict = {}
        for kind, own, kids in self._procs.values():
            k = out.setdefault(kind, {"processes": 0, "own_s": 0.0, "children_s": 0.0})
            k["processes"] += 1
            k["own_s"] = round(k["own_s"] + own, 1)
            k["children_s"] = round(k["children_s"] + kids, 1)
        return out

    #: /proc/stat's first line, in order (the host's CPU time by state, in ticks)
    STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

    def _read(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            self._states = v[:len(self.STATES)]
            return sum(v[:len(self.STATES)]), v[3] + (v[4] if len(v) > 4 else 0)
        except (OSError, ValueError, IndexError):
            return None

    def _run(self):
        last = self._read()
        self._first_states = list(getattr(self, "_states", []))
        while not self._stop.wait(self.every):
            try:
                self._scan()
            except OSError:
                pass
            cur = self._read()
            if cur and last and cur[0] > last[0]:
                tot, idle = cur[0] - last[0], cur[1] - last[1]
                self.samples.append((time.time(), round((tot - idle) / tot * (os.cpu_count() or 1), 2)))
            last = cur

    def __enter__(self):
        self._th.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join(timeout=5)

    def summary(self, t0: float) -> dict:
        xs = [b for _, b in self.samples]
        a, b = getattr(self, "_first_states", []), getattr(self, "_states", [])
        # CPU seconds by state over the run, every core: "steal" is time the hypervisor
        # gave this VM's busy vCPUs to someone else (a host's neighbours), "system" the kernel's
        states = ({k: _r((y - x) / self._tick) for k, x, y in zip(self.STATES, a, b)}
                  if a and len(a) == len(b) else {})
        return {"mean": _r(statistics.mean(xs)) if xs else None, "max": max(xs) if xs else None, "states_s": states,
                "per_5s": [_r(statistics.mean([b for t, b in self.samples if i <= t - t0 < i + 5]))
                           for i in range(0, int(self.samples[-1][0] - t0) + 1, 5)
                           if any(i <= t - t0 < i + 5 for t, _ in self.samples)] if xs else []}


def compile_phases(rep: dict, cache_dir: Path) -> dict:
    """Where each compiled signature's seconds went: the report's compile phases (export,
    inductor, verify), the rest of ``seconds`` (lease, memory estimate, publish), and from
    each entry's manifest the verification's own timing (loader probe, a verification
    child, the checks, the speed gate).  Median, p90 and sum per part."""
    comp = [s for s in rep.get("signatures") or [] if s.get("status") == "compiled"]
    parts: dict = {}

    def add(k, v):
        if isinstance(v, (int, float)):
            parts.setdefault(k, []).append(float(v))

    for s in comp:
        ph = s.get("phases") or {}
        for k, v in ph.items():
            add(k, v)
        add("other", float(s.get("seconds") or 0) - sum(v for v in ph.values() if isinstance(v, (int, float))))
    by_worker: dict = {}
    for s in comp:
        if s.get("span"):
            by_worker.setdefault(s.get("worker"), []).append((s["span"][0], float(s.get("seconds") or 0)))
    for xs in by_worker.values():
        xs.sort()
        add("seconds.first_per_actor", xs[0][1])
        for _, x in xs[1:]:
            add("seconds.later", x)
    in_child = 0
    n_manifest = 0
    try:
        from aoti_farm.cache.store import Cache

        c = Cache(str(cache_dir))
        for _fp, _key, d in c.iter_entry_dirs():
            m = c.read_manifest(d)
            v = m.get("verification") or {}
            n_manifest += 1
            in_child += bool(v.get("in_child"))
            for k, x in (v.get("timing") or {}).items():
                add(f"verify.{k}", x)
            for k, x in (m.get("cpu") or {}).items():   # Inductor's CPU seconds (compiler.cpu_seconds)
                add(f"cpu.{k}", x)
    except Exception as e:  # noqa: BLE001 -- a benchmark detail, never the run's result
        parts.setdefault("_error", []).append(str(e)[:200])
    out = {k: {"n": len(v), "median": _r(statistics.median(v)), "p90": _r(_pct(v, 90)), "sum": _r(sum(v))}
           for k, v in parts.items() if k != "_error"}
    out["_manifests"] = n_manifest
    out["_verified_in_child"] = in_child
    if "_error" in parts:
        out["_error"] = parts["_error"][0]
    return out


def analyse(rep: dict, launch: float) -> dict:
    """Start-up and compile figures from a warm report (times from the process start)."""
    tl = rep.get("timeline") or {}
    t0 = tl.get("process_start") or launch
    rel = (lambda t: None if t is None else round(t - t0, 2))
    ws = tl.get("workers") or []
    ready = sorted(w["ready_seen"] for w in ws if w.get("ready_seen"))
    sigs = rep.get("signatures") or []
    comp = [s for s in sigs if s.get("status") == "compiled"]
    secs = [float(s["seconds"]) for s in comp]
    starts = sorted(s["span"][0] for s in comp if s.get("span"))
    ray_up = tl.get("ray_started")
    actors = []
    for w in sorted(ws, key=lambda w: w.get("ready_seen") or 0):
        ph = w.get("phases") or {}
        actors.append({"pid": w.get("pid"), "ready": rel(w.get("ready_seen")),
                       "phases": {k: [rel(a), round(b - a, 2)] for k, (a, b) in ph.items()},
                       "host_steps": w.get("host_steps")})
    status: dict = {}
    for s in sigs:
        status[s.get("status")] = status.get(s.get("status"), 0) + 1
    builds: dict = {}
    for s in comp:
        b = (s.get("build") or {})
        k = f"{b.get('wrapper')}/{b.get('common', b.get('reason'))}"
        builds[k] = builds.get(k, 0) + 1
    return {
        "status": status,
        "ray_up_s": rel(ray_up),
        "planned_s": rel(tl.get("planned")),
        "host_prep": {k: ([rel(x) for x in v] if k == "span" else v) for k, v in (tl.get("host_prep") or {}).items()},
        "isa_child": {k: ([rel(x) for x in v] if k == "span" else v) for k, v in (tl.get("isa_child") or {}).items()},
        "pycache": tl.get("pycache"),
        "precompile": {k: ([rel(x) for x in v] if k == "span" else v) for k, v in (tl.get("precompile") or {}).items()},
        "actors": len(ws),
        # a forked actor is two processes: Ray's and its compiling copy
        "actor_processes": len(ws) + sum(1 for w in ws if (w.get("fork") or {}).get("pid")),
        "first_actor_ready_s": rel(ready[0]) if ready else None,
        "all_actors_ready_s": rel(ready[-1]) if ready else None,
        "all_actors_ready_after_ray_s": round(ready[-1] - ray_up, 2) if ready and ray_up else None,
        "first_compile_start_s": rel(starts[0]) if starts else None,
        "compile_s": {"n": len(secs), "sum": round(sum(secs), 1), "median": _r(statistics.median(secs) if secs else None),
                      "mean": _r(statistics.mean(secs) if secs else None), "p90": _r(_pct(secs, 90)),
                      "max": _r(max(secs) if secs else None)},
        "builds": builds,
        "actor_timeline": actors,
        "timeline_marks": {k: rel(v) for k, v in tl.items() if isinstance(v, (int, float))},
    }


def _r(x):
    return None if x is None else round(x, 2)


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [["-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)) for v in r] for r in rows]
    w = [max(len(c[i]) for c in cells) for i in range(len(header))]
    out = ["  ".join(c[i].ljust(w[i]) for i in range(len(header))) for c in cells]
    out.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(out)


_CEILING_CPP = r"""
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <vector>
template <int N> struct Step {
  static long run(std::vector<long>& v, std::map<std::string, long>& m) {
    std::sort(v.begin(), v.end());
    std::ostringstream os; os << N << v[N % v.size()];
    m[os.str()] += N;
    return Step<N - 1>::run(v, m) + static_cast<long>(m.size());
  }
};
template <> struct Step<0> {
  static long run(std::vector<long>&, std::map<std::string, long>&) { return 0; }
};
long entry(std::vector<long>& v, std::map<std::string, long>& m) { return Step<%d>::run(v, m); }
"""

_CEILING_PY = "import sys; sum(i * i for i in range(int(sys.argv[1])))"


def _replay(rec: dict, i: int) -> list[str]:
    """A recorded C++ compile (``_CAPTURE_FARM_COMPILE``), writing copy ``i``'s object."""
    a = list(rec["argv"])
    src = next(x for x in a if x.endswith(".cpp"))
    a[a.index("-o") + 1] = f"{src[:-4]}.ceiling{i}.o"
    return a


def host_ceiling(copies: int, work: Path, log=print, farm_compile: dict | None = None, sustained: int = 4) -> dict:
    """What the host itself allows ``copies`` workers, before any farm: the seconds of one
    job run alone (median of 3) and as ``copies`` copies at once (median of the copies).
    The jobs: a C++ compile with the compiler Inductor uses, a Python loop, what each
    actor does first (``import torch`` and Inductor's compile path, from bytecode), and,
    given ``farm_compile`` (:func:`prebuild_headers`), the farm's own C++ compiles of one
    signature replayed exactly (the wrapper's model half with its precompiled header,
    and the kernel), and the model half ``sustained`` times in a row on every copy (the
    compile phase's load: a burst of one compile each can miss what heat, clocks or
    neighbours do over half a minute).  Where a job takes k times as long among ``copies``, no farm of that
    many workers can scale past about 1/k on it: the host's cores share clocks, caches,
    memory, hyper-threads and, in a sandbox, its file system."""
    import shutil
    import statistics as st
    from concurrent.futures import ThreadPoolExecutor

    d = work / "ceiling"
    d.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    (d / "job.cpp").write_text(_CEILING_CPP.replace("%d", "120"))
    jobs = {"python loop": lambda i: [sys.executable, "-S", "-c", _CEILING_PY, "12000000"]}
    if cxx:
        jobs["c++ compile"] = lambda i: [cxx, "-O2", "-c", str(d / "job.cpp"), "-o", str(d / f"job{i}.o")]
    # what each actor does first: import torch and Inductor's compile path, from bytecode
    # (a bytecode cache of its own, filled by one untimed import first)
    jobs["import torch"] = lambda i: [sys.executable, "-X", f"pycache_prefix={d / 'pyc'}", "-c",
                                      "import torch, torch._inductor.codecache"]
    for name in ("model_half", "kernel"):   # the farm's real C++ compiles, replayed
        rec = (farm_compile or {}).get(name)
        if isinstance(rec, dict) and rec.get("argv"):
            jobs[f"farm {name.replace('_', ' ')}"] = lambda i, rec=rec: _replay(rec, i)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}   # an image may set it
    subprocess.run(jobs["import torch"](0), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, env=env)

    def timed(argv):
        t0 = time.time()
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, env=env).returncode
        return time.time() - t0 if rc == 0 else None

    out: dict = {"copies": copies, "compiler": cxx}
    for name, argv in jobs.items():
        alone = [timed(argv(0)) for _ in range(3)]
        with ThreadPoolExecutor(copies) as ex:
            together = list(ex.map(timed, [argv(i) for i in range(copies)]))
        if None in alone or None in together:
            out[name] = {"error": "a job failed"}
            continue
        a, t = st.median(alone), st.median(together)
        out[name] = {"alone_s": _r(a), "together_median_s": _r(t), "together_max_s": _r(max(together)),
                     "slowdown": _r(t / a), "scaling_ceiling": _r(a / t)}
    m = out.get("farm model half")
    if isinstance(m, dict) and "alone_s" in m and sustained > 1:
        # the compile phase is many compiles back to back on every core, not one burst:
        # each copy replays the model half `sustained` times in a row
        def row(i):
            ts = [timed(_replay(farm_compile["model_half"], i)) for _ in range(sustained)]
            return None if None in ts else ts

        t0 = time.time()
        with CpuSampler() as cs, ThreadPoolExecutor(copies) as ex:
            rows = list(ex.map(row, range(copies)))
        name = f"farm model half, {sustained} in a row"
        out["sustained_cpu_states_s"] = cs.summary(t0).get("states_s")
        if None in rows:
            out[name] = {"error": "a job failed"}
        else:
            t = st.median([x for r in rows for x in r])
            out[name] = {"alone_s": m["alone_s"], "together_median_s": _r(t),
                         "together_max_s": _r(max(x for r in rows for x in r)),
                         "slowdown": _r(t / m["alone_s"]), "scaling_ceiling": _r(m["alone_s"] / t)}
    log(f"[scaling] the host's own ceiling at {copies} copies at once: " + "; ".join(
        f"{k}: alone {v['alone_s']} s, together {v['together_median_s']} s each (x{v['slowdown']}, "
        f"ceiling {v['scaling_ceiling']})" for k, v in out.items() if isinstance(v, dict) and "slowdown" in v))
    return out


def summarise(out: dict, workers: list[int], log=print) -> None:
    """The comparison across ``out["runs"]``: speed-up and the farm's own scaling into
    ``out``, and the tables and per-run detail into ``log``."""
    runs = out["runs"]
    by = {r["label"]: r for r in runs}
    w1 = by.get("w1")
    wmax = max(workers)
    top = by.get(f"w{wmax}")
    if w1 and top and wmax > 1 and w1.get("rc") == 0 and top.get("rc") == 0:
        out["speedup"] = w1["wall_s"] / top["wall_s"]
        out["farm_scaling"] = w1["wall_s"] / (wmax * top["wall_s"])
    rows = []
    for r in runs:
        cs = r.get("compile_s") or {}
        rows.append([r["label"], r["workers"], r.get("rc"), r["wall_s"], r.get("ray_up_s"), r.get("first_actor_ready_s"),
                     r.get("all_actors_ready_s"), r.get("all_actors_ready_after_ray_s"), r.get("first_compile_start_s"),
                     cs.get("median"), cs.get("mean"), cs.get("p90"), cs.get("sum"), json.dumps(r.get("builds"))])
    log("\n" + table(rows, ["run", "W", "rc", "wall s", "Ray up", "1st actor ready", "all ready", "all ready after Ray",
                            "1st compile", "compile s median", "mean", "p90", "sum", "wrapper builds"]))
    for r in runs:
        cp = r.get("compile_phases") or {}
        log(f"\n[scaling] {r['label']}: per-signature compile parts (s: median / p90 / sum over {cp.get('_manifests')} "
            f"manifests; verified in a child: {cp.get('_verified_in_child')}): "
            + "; ".join(f"{k} {v['median']}/{v['p90']}/{v['sum']}" for k, v in cp.items() if isinstance(v, dict)))
        cb = r.get("cpu_busy") or {}
        log(f"[scaling] {r['label']}: busy CPUs mean {cb.get('mean')}, max {cb.get('max')}, per 5 s: {cb.get('per_5s')}")
        if cb.get("states_s"):
            log(f"[scaling] {r['label']}: the host's CPU seconds by state over the run: "
                + ", ".join(f"{k} {v}" for k, v in cb["states_s"].items()))
        n = (r.get("compile_s") or {}).get("n") or 0
        if r.get("cpu_by_kind") and n:
            counted = (r["cpu_by_kind"].get("actors") or {}).get("processes", 0)
            want = r.get("actor_processes", r.get("actors"))
            if want is not None and counted != want:
                log(f"[scaling] {r['label']}: the breakdown below counted {counted} of {want} actor processes "
                    "(incomplete: see processes_counted in the JSON; the manifests' CPU seconds and the host's "
                    "states count everything)")
            log(f"[scaling] {r['label']}: CPU seconds per signature by process (own + children, {n} signatures): "
                + "; ".join(f"{k} x{v['processes']}: {v['own_s'] / n:.2f} + {v['children_s'] / n:.2f}"
                            for k, v in sorted(r["cpu_by_kind"].items())))
    if "speedup" in out:
        log(f"\n[scaling] speed-up W=1 / W={wmax}: {out['speedup']:.2f}x; farm's own scaling "
            f"W1 / ({wmax} x W{wmax}): {out['farm_scaling']:.3f}")
    for r in runs:
        log(f"\n[scaling] {r['label']}: actors' warm-up (s from process start: [start, end]); host prep "
            f"{r.get('host_prep')}; ISA probe in a child {r.get('isa_child') or '-'}; bytecode cache "
            f"{r.get('pycache') or '-'}; bytecode precompiled {r.get('precompile') or '-'}; "
            f"marks {r.get('timeline_marks')}")
        for a in r.get("actor_timeline") or []:
            hs = a.get("host_steps") or {}
            log(f"  pid {a['pid']}: ready {a['ready']}  " + " ".join(f"{k}={v}" for k, v in a["phases"].items())
                + f"  isa checks run/replayed {hs.get('isa_checks_run')}/{hs.get('isa_checks_replayed')}"
                + f" ({hs.get('isa_checks_s', 0):.1f}s), isa lock wait {hs.get('isa_lock_wait_s', 0):.1f}s")


def run_plan(workers: list[int], isa_replay_off_too: bool = False, also_env: list[str] | None = None,
             rounds: int = 1) -> list[tuple[int, str, dict | None]]:
    """The warms of one invocation, in order: ``(W, label, extra environment)``.  W
    values largest first; each ``--also-env`` is W=max again with those variables
    (``NAME=VALUE``, several joined by ``;``; its label a short directory name: its number
    and the values' end; the run's ``env`` names them in full); more rounds repeat them all, each
    round's order rotated by one so that no side always goes first (drift in the host's
    state spreads over both sides of an A/B)."""
    plan: list = [(w, f"w{w}", None) for w in sorted(set(workers), reverse=True)]
    wmax = max(workers)
    if isa_replay_off_too:
        plan.insert(0, (wmax, f"w{wmax}-isa-replay-off", {"AOTI_FARM_DEV": "isa_replay=0"}))
    for i, kv in enumerate(also_env or []):   # A/B: W=max again with these variables set
        env = dict(p.partition("=")[::2] for p in kv.split(";") if p.strip())
        # short: Ray's socket paths under the run's directory must stay within 107 bytes
        tag = re.sub(r"[^A-Za-z0-9.=-]+", "_", ";".join(env.values()))[-12:]
        plan.insert(i, (wmax, f"w{wmax}-{i}{tag}", env))
    return [(w, label + (f"-r{k}" if k else ""), env) for k in range(max(1, rounds))
            for w, label, env in plan[k % len(plan):] + plan[:k % len(plan)]]


def bench(workers: list[int], work: Path, source: str = "auto", trace: str | None = None, unique: int | None = None,
          isa_replay_off_too: bool = False, log=print, fresh_headers: bool = False, save=None,
          also_env: list[str] | None = None, run_timeout: float = 3600, lengths: tuple = BERT_LENGTHS,
          ceiling: bool = True, rounds: int = 1) -> dict:
    import common as C

    out: dict = {"machine": C.machine(), "fresh_headers": fresh_headers}
    if trace:
        out["job"] = {"source": f"--trace {trace}" + (f", its first {unique} CPU signatures" if unique else "")}
        if unique:
            from aoti_farm.trace import Trace, load_trace, save_trace

            cut = work / "trace-first.json"
            save_trace(Trace([e for e in load_trace(trace) if e.sig.device == "cpu"][:unique]), str(cut))
            trace = str(cut)
    else:
        trace, out["job"] = make_trace(work, source, unique, lengths)
    from aoti_farm.trace import load_trace

    out["job"]["signatures"] = len(load_trace(trace))
    out["job"]["trace_sha256"] = hashlib.sha256(Path(trace).read_bytes()).hexdigest()
    log(f"[scaling] job: {out['job']}; runs: W={workers}" + (" + W=max with AOTI_FARM_DEV=isa_replay=0" if isa_replay_off_too else ""))
    if not fresh_headers:
        out["headers_prebuilt"] = prebuild_headers(work)
        hp = out["headers_prebuilt"]
        fc = hp.get("farm_compile") or {}
        log(f"[scaling] precompiled headers built before the runs: {({k: v for k, v in hp.items() if k != 'farm_compile'})}; "
            f"the farm's C++ compiles recorded for the ceiling: {sorted(k for k in fc if k != 'build') or fc.get('error')}")
        sides = {json.dumps(env, sort_keys=True): env for _w, _l, env in run_plan(workers, False, also_env) if env}
        out["headers_prebuilt_also"] = [{"env": env, **prebuild_headers(work, env, f"headers-{i}")}
                                         for i, env in enumerate(sides.values())]
        for hb in out["headers_prebuilt_also"]:
            log(f"[scaling] precompiled headers built before the runs with {hb['env']}: "
                f"{({k: v for k, v in hb.items() if k != 'env'})}")
    if ceiling and max(workers) > 1:
        out["host_ceiling"] = host_ceiling(max(workers), work, log,
                                           (out.get("headers_prebuilt") or {}).get("farm_compile"))
    runs = []
    out["runs"] = runs
    plan = run_plan(workers, isa_replay_off_too, also_env, rounds)
    for w, label, env in plan:
        log(f"[scaling] warm W={w} ({label}) ...")
        r = run_warm(trace, w, work, label, env, fresh_headers=fresh_headers, timeout=run_timeout)
        runs.append(r)
        if save:
            save(out)
        log(f"[scaling]   rc={r['rc']} wall {r['wall_s']:.1f}s, all actors ready {r.get('all_actors_ready_s')}s "
            f"({r.get('all_actors_ready_after_ray_s')}s after Ray up), first compile {r.get('first_compile_start_s')}s, "
            f"compile s median {(r.get('compile_s') or {}).get('median')}")
        if r["rc"] not in (0, 1):
            log(r["stderr_tail"][-4000:])
    summarise(out, workers, log)
    return out


def bench_ctx(ctx) -> dict:
    """`scripts/bench/run.py --only scaling`: W=1 and W=all, targets into the summary."""
    n = os.cpu_count() or 1
    work = ctx.work / "scaling"
    work.mkdir(parents=True, exist_ok=True)
    if ctx.quick:
        return {"skipped": "compile-heavy; run without --quick"}
    res = bench(sorted({1, n}), work, unique=ctx.unique or None)
    if "farm_scaling" in res:
        ctx.target("scaling", f"farm's own scaling W1/({n} x W{n})", ">= 0.55 (16 cores)", res["farm_scaling"],
                   res["farm_scaling"] >= 0.55 if n >= 16 else None)
        ctx.target("scaling", f"speed-up W=1 / W={n}", ">= 9x (16 cores)", res["speedup"],
                   res["speedup"] >= 9 if n >= 16 else None)
    top = next((r for r in res["runs"] if r["workers"] == n), None)
    if top and top.get("all_actors_ready_after_ray_s") is not None:
        ctx.target("scaling", f"all {top['actors']} actors ready after Ray's start", "<= 20 s",
                   top["all_actors_ready_after_ray_s"], top["all_actors_ready_after_ray_s"] <= 20)
    return res


def combine(paths: list[str], log=print) -> dict:
    """One comparison from runs measured in separate processes (``--json`` files) of one
    job on one machine: where W=1 on a big job outlasts what one command may take."""
    parts = []
    for p in paths:
        try:
            parts.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as e:
            raise SystemExit(f"scaling: --combine {p}: not a readable --json output of this script ({e}); "
                             "pass the files --json wrote")
    jobs = {(d.get("job") or {}).get("trace_sha256") for d in parts}
    if len(jobs) != 1 or None in jobs:
        raise SystemExit(f"scaling: --combine {' '.join(paths)}: the runs warmed different traces (or a file "
                         "lacks job.trace_sha256); combine runs of one --trace file")
    same = ("platform", "cpu_count", "cpu_model", "python", "torch")   # not the date or the load
    hosts = {json.dumps({k: (d.get("machine") or {}).get(k) for k in same}, sort_keys=True) for d in parts}
    if len(hosts) != 1:
        raise SystemExit(f"scaling: --combine {' '.join(paths)}: the runs were measured on different machines; "
                         "combine runs of one host")
    out = {**parts[0], "runs": [r for d in parts for r in d.get("runs", [])], "combined_from": paths}
    out.pop("speedup", None), out.pop("farm_scaling", None)
    summarise(out, [r["workers"] for r in out["runs"]], log)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="", help="comma-separated W values (default: 1 and os.cpu_count())")
    ap.add_argument("--source", choices=("auto", "bert", "mlp"), default="auto")
    ap.add_argument("--trace", default=None, help="warm this trace instead of recording one")
    ap.add_argument("--unique", type=int, default=0, help="only the first N signatures")
    ap.add_argument("--lengths", default=",".join(map(str, BERT_LENGTHS)),
                    help="the tiny BERT's sequence lengths (more lengths, more signatures: a job for many cores)")
    ap.add_argument("--isa-replay-off-too", action="store_true",
                    help="also a W=max run with AOTI_FARM_DEV=isa_replay=0 (every actor runs Inductor's ISA checks)")
    ap.add_argument("--also-env", action="append", default=[], metavar="NAME=VALUE[;NAME=VALUE]",
                    help="also a W=max run with these variables in its environment (first; repeatable), an A/B")
    ap.add_argument("--fresh-headers", action="store_true",
                    help="a fresh temp dir per run, so each run also builds Inductor's precompiled headers")
    ap.add_argument("--run-timeout", type=float, default=3600, help="seconds one warm may take (then: ps)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every warm this many times, the order rotated per round (A/B pairs in one run)")
    import common as C

    C.add_output_args(ap, "scaling")
    ap.add_argument("--workdir", default=None,
                    help="scratch: caches, each warm's report and stderr log (default: a fresh temporary directory)")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip measuring the host's own ceiling (W copies of a CPU-bound job against one alone)")
    ap.add_argument("--ceiling-only", action="store_true", help="measure the host's ceiling at max(--workers), no warms")
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                    help="compare runs written by separate invocations (their --json files, one trace, one host)")
    a = ap.parse_args(argv)
    n = os.cpu_count() or 1
    workers = [int(x) for x in a.workers.split(",") if x.strip()] if a.workers else sorted({1, n})
    work = Path(a.workdir or tempfile.mkdtemp(prefix="aoti-scaling-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    out = C.output_path(a)

    def save(res):   # after every run, so a run cut short still leaves what it measured
        if out:
            out.write_text(json.dumps(res, indent=1, default=str))

    if a.ceiling_only:
        res = {"machine": C.machine(), "headers_prebuilt": prebuild_headers(work)}
        res["host_ceiling"] = host_ceiling(max(workers), work, farm_compile=res["headers_prebuilt"].get("farm_compile"))
        save(res)
        return 0
    if a.combine:
        res = combine(a.combine)
        save(res)
        return 0 if all(r.get("rc") == 0 for r in res["runs"]) else 1
    res = bench(workers, work, a.source, a.trace, a.unique or None, a.isa_replay_off_too,
                fresh_headers=a.fresh_headers, save=save, also_env=a.also_env, run_timeout=a.run_timeout,
                rounds=a.rounds,
                lengths=tuple(int(x) for x in a.lengths.split(",") if x.strip()), ceiling=not a.no_ceiling)
    save(res)
    if out:
        print(f"[scaling] wrote {out}")
    return 0 if all(r.get("rc") == 0 for r in res["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
