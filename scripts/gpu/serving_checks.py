"""Serving-side GPU checks (run by checks.py in a child that has the libstdc++
preload when the host needs it).  Steps 2-4 of the GPU validation: differential hook vs eager on
CUDA, CUDA hit/miss per-call benchmarks against upstream's C++ holder, warm throughput of
upstream's sequential compile, and the GPU-arch fingerprint check."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from aoti_farm import signature as S  # noqa: E402
from aoti_farm.cache.store import Cache  # noqa: E402
from aoti_farm.fingerprint import fingerprint  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from checks import cuda_sigs  # noqa: E402
import common as C  # noqa: E402  -- scripts/bench/common.py

R: dict = {}


def log(*a):
    print("[gpu-serving]", *a, flush=True)


def per_call_us(fn) -> float:
    return C.time_per_call(fn, warmup=200, repeats=5, inner=2000, sync=torch.cuda.synchronize)["us_median"]


NATIVE = "auto"   # "require" once the native hit path is built on this host


def step_differential(cache_dir):
    from aoti_farm.runtime import Settings, install

    out = {"checked": 0, "mismatches": []}
    sigs = cuda_sigs()
    calls = [(s, S.materialize(s, seed=7)) for s in sigs]
    expected = [S.resolve_op(s.op)(*a, **k) for s, (a, k) in calls]
    x, y = torch.randn(3, 5, device="cuda"), torch.randn(3, 5, device="cuda")
    miss_expected = torch.add(x, y, alpha=3)
    with install(cache_dir=cache_dir, on_miss="ignore", route="all", settings=Settings(native=NATIVE)) as hook:
        for (s, (a, k)), e in zip(calls, expected):
            got = S.resolve_op(s.op)(*a, **k)
            out["checked"] += 1
            ok = got.dtype == e.dtype and got.shape == e.shape and torch.allclose(got.double(), e.double(), rtol=1e-4, atol=1e-5)
            if not ok:
                out["mismatches"].append(S.describe(s))
        # a miss on CUDA falls back to eager
        miss_ok = torch.equal(torch.add(x, y, alpha=3), miss_expected)
        out["miss_equal_eager"] = bool(miss_ok)
        out["stats"] = hook.stats()
    log("differential:", {k: v for k, v in out.items() if k != "stats"}, "hits:", out["stats"].get("hits"))
    R["differential"] = out
    return not out["mismatches"] and out["stats"].get("hits", 0) >= len(sigs) - 1 and miss_ok


def step_bench(cache_dir, shapes=((64, 128), (1024, 1024))):
    from aoti_farm.runtime import Settings, install
    from aoti_farm.interop.upstream import export_upstream

    rows = []
    up_dir = tempfile.mkdtemp(prefix="upstream-")
    export_upstream(Cache(cache_dir), up_dir)
    for shape in shapes:
        a, b = torch.randn(*shape, device="cuda"), torch.randn(*shape, device="cuda")
        alpha = 2 if shape == (64, 128) else 1
        f = (lambda: torch.add(a, b, alpha=2)) if alpha == 2 else (lambda: torch.add(a, b))
        eager = per_call_us(f)
        with install(cache_dir=cache_dir, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                     settings=Settings(native=NATIVE)) as hook:
            hit = per_call_us(f)
            st = hook.stats()
        with install(cache_dir=cache_dir, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                     settings=Settings(native="off")) as hook:
            hit_py = per_call_us(f)
        # a miss: a shape not in the cache
        c, d = torch.randn(shape[0] + 1, shape[1], device="cuda"), torch.randn(shape[0] + 1, shape[1], device="cuda")
        with install(cache_dir=cache_dir, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                     settings=Settings(native=NATIVE)):
            miss = per_call_us(lambda: torch.add(c, d))
        eager_miss = per_call_us(lambda: torch.add(c, d))
        # upstream's C++ holder over the exported cache (no compile: it is warm)
        code = (
            "import torch,time,statistics,sys\n"
            f"a,b=torch.randn({shape[0]},{shape[1]},device='cuda'),torch.randn({shape[0]},{shape[1]},device='cuda')\n"
            "lib=torch.library.Library('aten','IMPL'); lib._impl_with_aoti_compile('add.Tensor','CUDA')\n"
            f"f=(lambda: torch.add(a,b,alpha=2)) if {alpha}==2 else (lambda: torch.add(a,b))\n"
            "for _ in range(200): f()\n"
            "torch.cuda.synchronize(); s=[]\n"
            "for _ in range(5):\n"
            " t=time.perf_counter()\n"
            " for _ in range(2000): f()\n"
            " torch.cuda.synchronize(); s.append((time.perf_counter()-t)/2000*1e6)\n"
            "print('US', statistics.median(s))\n")
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=up_dir)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        up = float(r.stdout.split("US")[-1]) if "US" in r.stdout else None
        if up is None:
            log("upstream holder failed:", r.stderr[-1500:])
        row = {"shape": list(shape), "eager_us": eager, "hook_hit_us": hit, "hook_hit_python_path_us": hit_py,
               "native": st.get("native"), "upstream_holder_us": up,
               "hook_miss_us": miss, "eager_miss_shape_us": eager_miss, "hits": st.get("hits"),
               "hit_ratio_vs_upstream": (hit / up) if up else None}
        log("bench:", row)
        rows.append(row)
    R["bench_cuda"] = rows


def step_upstream_sequential(n):
    """Upstream's aoti_compile_with_persistent_cache, one signature after another, in
    one process (its first compile pays the cold cost, as one GPU actor's does)."""
    code = (
        "import sys,time,json,torch,warnings; warnings.filterwarnings('ignore')\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from checks import cuda_sigs\n"
        "from aoti_farm import signature as S\n"
        "from torch._inductor.aoti_eager import aoti_compile_with_persistent_cache as C\n"
        f"out=[]\nfor s in cuda_sigs()[:{n}]:\n"
        "  a,k=S.materialize(s,0); op=S.resolve_op(s.op); name=s.op.split('::')[1]\n"
        "  t=time.perf_counter()\n"
        "  try: p=C('aten', name if '.' in name else name+'.default', 'cuda', False, op, a, k)\n"
        "  except Exception as e: p=''\n"
        "  out.append([s.op, time.perf_counter()-t, bool(p)])\n"
        "print('SEQ', json.dumps(out))\n")
    d = tempfile.mkdtemp(prefix="upstream-seq-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=900)
    wall = time.perf_counter() - t0
    per = json.loads(r.stdout.split("SEQ")[-1]) if "SEQ" in r.stdout else None
    if per is None:
        log("upstream sequential failed:", r.stderr[-2000:])
    R["upstream_sequential_cuda"] = {"n": n, "wall_s": wall, "per_signature_s": per}
    log("upstream sequential:", R["upstream_sequential_cuda"])
    shutil.rmtree(d, ignore_errors=True)


def step_fingerprint(cache_dir):
    """An entry built for another GPU arch is never served: the same kernel published
    under a fingerprint that differs only in gpu_cc lives in another namespace, and a
    manifest claiming another arch inside ours is refused as foreign."""
    from aoti_farm.cache.store import MANIFEST
    from aoti_farm.fingerprint import Fingerprint
    from aoti_farm.runtime import install
    import msgpack

    fp = fingerprint("cuda:0")
    fields = fp.as_dict()
    R["fingerprint_cuda"] = {k: fields.get(k) for k in ("gpu", "gpu_cc", "cuda", "torch", "triton")}
    assert fields["gpu_cc"] and fields["gpu"] and fields["cuda"], fields
    sig = cuda_sigs()[0]
    work = tempfile.mkdtemp(prefix="fp-")
    cache = Cache(cache_dir)
    src = cache.open_entry(fp, sig.key)
    # 1) a foreign-arch namespace holding the kernel; ours lacks it -> not served
    foreign = Fingerprint(tuple(sorted({**fields, "gpu_cc": "8.0"}.items())))
    other = Cache(os.path.join(work, "c"))
    other.publish(foreign, sig, {"kernel.so": src.kernel_path}, {})
    a, k = S.materialize(sig, seed=3)
    with install(cache_dir=other.root, on_miss="ignore", route="all") as hook:
        S.resolve_op(sig.op)(*a, **k)
        st1 = hook.stats()
    # 2) inside our namespace, a manifest that says another arch -> refused as foreign
    ours = Cache(os.path.join(work, "d"))
    d = ours.publish(fp, sig, {"kernel.so": src.kernel_path}, {})
    m = msgpack.unpackb((d / MANIFEST).read_bytes(), raw=False)
    m["fingerprint"]["gpu_cc"] = "8.0"
    (d / MANIFEST).write_bytes(msgpack.packb(m, use_bin_type=True))
    with install(cache_dir=ours.root, on_miss="ignore", route="all") as hook:
        S.resolve_op(sig.op)(*a, **k)
        st2 = hook.stats()
    R["fingerprint_check"] = {"other_arch_namespace_hits": st1.get("hits"), "foreign_manifest_hits": st2.get("hits"),
                              "foreign_counted": st2.get("foreign"), "integrity": st2.get("integrity_failures")}
    log("fingerprint:", R["fingerprint_cuda"], R["fingerprint_check"])
    return st1.get("hits") == 0 and st2.get("hits") == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-upstream-seq", action="store_true")
    ns = ap.parse_args()
    R["LD_PRELOAD"] = os.environ.get("LD_PRELOAD")
    ok = True
    global NATIVE
    from aoti_farm.runtime import native
    t0 = time.perf_counter()
    try:
        R["native_build"] = {"path": str(native.build()), "seconds": time.perf_counter() - t0}
        NATIVE = "require"
    except Exception as e:  # the hook then serves from Python; say so
        R["native_build"] = {"error": str(e)[-2000:], "seconds": time.perf_counter() - t0}
        ok = False
    log("native build:", R["native_build"])
    for name, fn in (("differential", lambda: step_differential(ns.cache_dir)),
                     ("bench", lambda: step_bench(ns.cache_dir)),
                     ("fingerprint", lambda: step_fingerprint(ns.cache_dir)),
                     ("upstream_seq", lambda: None if ns.skip_upstream_seq else step_upstream_sequential(len(cuda_sigs())))):
        try:
            res = fn()
            if res is False:
                ok = False
                log(f"step {name}: FAILED")
        except Exception as e:  # keep going: one device call must bring back every figure it can
            import traceback

            traceback.print_exc()
            R[f"{name}_error"] = f"{type(e).__name__}: {e}"
            ok = False
    with open(os.path.join(ns.out, "gpu-serving.json"), "w") as f:
        json.dump(R, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
