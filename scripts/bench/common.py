"""Shared helpers for the benchmarks: machine description, statistics, subprocess
isolation, and cheap construction of caches (real kernels, fake entries, upstream layout).

Nothing here asserts on time; the runner compares measurements with targets and prints
them.  Every measurement that touches a kernel runs in its own subprocess
(:func:`run_worker`) so that one benchmark's loaded libraries, caches and registrations
cannot leak into another's numbers.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PY = sys.executable
MARK = "BENCH_JSON:"


# --- output -------------------------------------------------------------------------------
#
# A benchmark prints its tables.  It writes its raw JSON (and logs) only where the user
# names: ``--out DIR`` (the directory is created; files get the benchmark's name) or
# ``--json FILE``.  With neither it writes nothing, so a run from inside the checkout
# never leaves results in the source tree.  Scratch caches are another matter: they go to
# a fresh temporary directory unless ``--workdir`` names one.


def add_output_args(ap, name: str) -> None:
    """``--out DIR`` and ``--json FILE`` for a benchmark whose files are named ``name``."""
    ap.add_argument("--out", default=None, metavar="DIR",
                    help=f"write the raw results here ({name}.json, and logs); default: print only")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the JSON result to this file")
    ap.set_defaults(_out_name=name)


def output_path(ns, suffix: str = ".json") -> Path | None:
    """Where to write this run's ``suffix`` file: ``--json FILE`` (for ``.json``, or FILE
    with that suffix), else ``DIR/<name><suffix>`` under ``--out DIR``, else None."""
    if getattr(ns, "json", None):
        return Path(ns.json) if suffix == ".json" else Path(ns.json).with_suffix(suffix)
    if getattr(ns, "out", None):
        d = Path(ns.out)
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{ns._out_name}{suffix}"
    return None


def write_output(ns, obj, suffix: str = ".json") -> Path | None:
    """Write ``obj`` (JSON, or text when it is a str) where :func:`output_path` says; print
    where it went.  Returns the path, or None when the user named no output."""
    path = output_path(ns, suffix)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=1, default=str) + "\n")
    print(f"[bench] wrote {path}", flush=True)
    return path


# --- machine ------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_at_start": list(load) if load else None,
    }


# --- statistics ---------------------------------------------------------------------------

def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": statistics.median(xs), "p50": pct(xs, 50), "p99": pct(xs, 99),
            "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs)}


def time_per_call(fn, *, warmup: int, repeats: int, inner: int, sync=None) -> dict:
    """Median over ``repeats`` of (time of ``inner`` back-to-back calls) / ``inner``, in µs.
    ``sync`` (e.g. ``torch.cuda.synchronize``) runs after the warm-up and inside each
    timed batch, after its last call."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    per = []
    pc = time.perf_counter
    for _ in range(repeats):
        t0 = pc()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        per.append((pc() - t0) / inner * 1e6)
    return {"us_median": statistics.median(per), "us_min": min(per), "repeats": repeats, "inner": inner}


# --- subprocesses -------------------------------------------------------------------------

def bench_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("AOTI_FARM_SIGNING_KEY", None)
    env.pop("AOTI_FARM_SIGNING_KEY_FILE", None)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


class WorkerError(RuntimeError):
    pass


def run_worker(func: str, args: dict, *, env: dict | None = None, timeout: float = 600) -> dict:
    """Run ``worker.<func>(**args)`` in a fresh interpreter; return its JSON result."""
    cmd = [PY, str(HERE / "worker.py"), func, json.dumps(args)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=bench_env(env), capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            out = json.loads(line[len(MARK):])
            out.setdefault("_process_wall_s", wall)
            return out
    tail = (p.stderr or "")[-3000:] + (p.stdout or "")[-1000:]
    raise WorkerError(f"worker {func} exited {p.returncode} without a result:\n{tail}")


def emit(obj: dict) -> None:
    """Called inside a worker: print the result line the parent looks for."""
    sys.stdout.write(MARK + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


# --- CPU accounting of process trees -----------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def system_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat: all but idle and iowait).
    A delta over a run is an honest total on a quiet machine (includes Ray's own daemons)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / CLK_TCK


def _proc_table() -> dict[int, tuple[int, float, float, str]]:
    """pid -> (ppid, user+system seconds of the process itself, of its reaped children, name)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        out[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK_TCK,
                       (int(rest[13]) + int(rest[14])) / CLK_TCK, st[st.find("(") + 1:st.rfind(")")])
    return out


def _label(pid: int, name: str) -> str:
    """A short name for a process: its comm, and for Python what it runs."""
    if not name.startswith("python"):
        return name
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return name
    rest = [a for a in argv[1:] if not a.startswith("-")] or argv[1:]
    if "-c" in argv:
        return "python -c (probe)"
    return "python " + (os.path.basename(rest[0]) if rest else "?")


class TreeCPU:
    """CPU time of every process descending from ``root`` (Ray's raylet and workers, the
    compilers they start), sampled from /proc every ``interval`` seconds.

    Each process's own time is kept at its last sample, and so is the time of the
    children it reaped (``cutime``): a compiler that lives less than one interval, or
    the last interval of one that lived longer, is in its parent's ``cutime`` as soon as
    the parent waits for it.  To count nothing twice, a parent's ``cutime`` counts only
    beyond the sampled time of the subtrees of the children it reaped (those that vanished
    before its last sample; an unreaped child stays visible as a zombie).  A lower bound,
    exact but for the last interval of processes nobody in the tree reaps (Ray's workers,
    killed with their raylet)."""

    def __init__(self, root: int, interval: float = 0.2):
        import threading
        self.root, self.interval = root, interval
        self.rec: dict[int, dict] = {}   # pid -> {ppid, self, kids, last, name}
        self.by_name: dict[str, float] = {}   # after stop(): CPU s per process name (comm)
        self.n = 0
        self.seen_pids = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _sample(self) -> None:
        tab = _proc_table()
        kids: dict[int, list[int]] = {}
        for pid, (pp, *_) in tab.items():
            kids.setdefault(pp, []).append(pid)
        todo, tree = [self.root], []
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(kids.get(p, []))
        self.n += 1
        for p in tree:
            if p in tab:
                pp, own, ch, name = tab[p]
                r = self.rec.get(p)
                if r is None:
                    r = self.rec[p] = {"ppid": pp, "self": 0.0, "kids": 0.0, "last": 0, "name": _label(p, name)}
                r["self"], r["kids"], r["last"] = max(r["self"], own), max(r["kids"], ch), self.n
                r["ppid"] = pp   # the latest: an orphan re-parented away is nobody's here

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def stop(self) -> float:
        """Total CPU seconds of the tree; ``by_name`` splits it by process (name)."""
        self._stop.set()
        self._t.join()
        self.seen_pids = len(self.rec)
        children: dict[int, list[int]] = {}
        for pid, r in self.rec.items():
            children.setdefault(r["ppid"], []).append(pid)
        by_name: dict[str, float] = {}

        def subtree(pid: int) -> float:
            # each process counts its own time, plus the part of its children's time
            # (cutime) that the sampled subtrees of the children it reaped (those that
            # vanished before its last sample) do not already explain
            r = self.rec[pid]
            kids = [(c, subtree(c)) for c in children.get(pid, [])]
            reaped = sum(t for c, t in kids if self.rec[c]["last"] < r["last"])
            own = r["self"] + max(0.0, r["kids"] - reaped)
            by_name[r["name"]] = by_name.get(r["name"], 0.0) + own
            return own + sum(t for _, t in kids)

        total = sum(subtree(pid) for pid, r in self.rec.items() if r["ppid"] not in self.rec)
        self.by_name = dict(sorted(by_name.items(), key=lambda kv: -kv[1]))
        return total


# --- caches -------------------------------------------------------------------------------

@contextmanager
def no_fsync():
    """Building throw-away benchmark caches: skip fsync (10,000 fsyncs cost minutes)."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        yield
    finally:
        os.fsync = real


def add_sig(n: int, m: int = 1):
    """aten::add.Tensor on two float32 (m, n) tensors."""
    import torch
    from aoti_farm import signature as S

    a = torch.empty((m, n))
    return S.from_call(torch.ops.aten.add.Tensor, (a, a), {})


def sig_from_spec(spec: dict):
    """{"op": "aten::add.Tensor", "shapes": [[64,128],[64,128]], "kwargs": {}} -> Signature."""
    import torch
    from aoti_farm import signature as S

    op = S.resolve_op(spec["op"])
    args = tuple(torch.empty(s, dtype=getattr(torch, spec.get("dtype", "float32"))) for s in spec["shapes"])
    return S.from_call(op, args, dict(spec.get("kwargs", {})))


def compile_into(cache_dir: str, sigs: list) -> list[dict]:
    """Real compiles (in this process) of ``sigs`` into an aoti-farm cache; skips present ones."""
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish

    cache, fp, comp = Cache(cache_dir, signing_key=None), fingerprint("cpu"), AOTICompiler()
    return [compile_and_publish(cache, comp, fp, s, owner="bench").to_dict() for s in sigs]


def find_kernel(cache_dir: str, op: str | None = None) -> tuple[str, object] | None:
    """(kernel path, signature) of some entry in an aoti-farm cache (of ``op`` if given)."""
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    cache = Cache(cache_dir, signing_key=None)
    fp = fingerprint("cpu")
    for key in sorted(cache.list_keys(fp.id)):
        try:
            e = cache.open_entry(fp, key)
        except Exception:  # noqa: BLE001 -- a bad entry is just not a source
            continue
        if op is None or e.signature.op == op:
            return e.kernel_path, e.signature
    return None


def small_kernel(kernel_path: str, workdir: str) -> str:
    """A stripped copy of a real kernel (1.4 MB -> ~0.3 MB; still loads: the dynamic
    symbol table is kept), so 10,000 fake entries fit on disk.  Falls back to the original."""
    out = os.path.join(workdir, "fake-kernel.so")
    if not os.path.exists(out):
        try:
            subprocess.run(["strip", "--strip-unneeded", "-o", out, kernel_path], check=True,
                           capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return kernel_path
    return out


def fake_cache(cache_dir: str, kernel_path: str, n: int, start: int = 1) -> list:
    """Publish copies of one real kernel under ``n`` distinct add.Tensor (1, k) signatures.

    Fine for planning/start-up benchmarks (warm checks presence; the hook lists keys;
    upstream's holder loads each copy at registration); never call these kernels.
    Returns the signatures.
    """
    from aoti_farm.cache.store import Cache
    from aoti_farm.fingerprint import fingerprint

    cache, fp = Cache(cache_dir, signing_key=None), fingerprint("cpu")
    kernel_path = small_kernel(kernel_path, str(Path(cache_dir).parent))
    sigs = [add_sig(k) for k in range(start, start + n)]
    have = cache.list_keys(fp.id)
    with no_fsync():
        for s in sigs:
            if s.key not in have:
                cache.publish(fp, s, {"kernel.so": kernel_path}, {"compile_seconds": 0.0, "bench_fake": True})
    return sigs


def write_trace(path: str, sigs: list) -> None:
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    save_trace(Trace([TraceEntry(s, 1, i) for i, s in enumerate(sigs)]), path)


# --- upstream layout ----------------------------------------------------------------------

def upstream_in_place(inductor_cache_dir: str, sigs_and_kernels: list[tuple]) -> None:
    """Upstream JSON that points at the kernels where they are (absolute paths; nothing
    copied) -- for the 10,000-entry start-up benchmark, where ``export_upstream``'s copy of
    every kernel would cost minutes.  The metadata and file names are the package's
    (``aoti_farm.interop.upstream.meta_info``, ``op_file_names``), as ``export_upstream`` writes them."""
    from aoti_farm.interop.upstream import meta_info, op_file_names

    files: dict[tuple, list] = {}
    for sig, kp in sigs_and_kernels:
        item = {"meta_info": meta_info(sig), "kernel_path": str(Path(kp).absolute())}
        ns, stems = op_file_names(sig.op)
        for stem in stems:
            files.setdefault((ns, sig.device, stem), []).append(item)
    for (ns, device, stem), items in files.items():
        d = Path(inductor_cache_dir) / "aoti_eager" / ns / device
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.json").write_text(json.dumps(items))


def export_to_upstream(cache_dir: str, inductor_cache_dir: str) -> str:
    """Put the cache's kernels in upstream's layout with ``aoti_farm.interop.upstream.export_upstream``
    (what ``aoti-farm cache export-upstream`` does).  Returns how, for the report."""
    from aoti_farm.cache.store import Cache
    from aoti_farm.interop.upstream import export_upstream

    rep = export_upstream(Cache(cache_dir, signing_key=None), inductor_cache_dir)
    if not rep["exported"]:
        raise RuntimeError(f"export_upstream exported nothing: {rep}")
    return "aoti_farm.interop.upstream.export_upstream"


def rmtree(p) -> None:
    shutil.rmtree(p, ignore_errors=True)
