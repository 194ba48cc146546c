"""What OpenMP's wait policy costs a kernel's verification: the wall and the CPU of
``AOTICompiler.verify`` under libgomp's default policy and under ``OMP_WAIT_POLICY=PASSIVE``
(what the farm's compile processes get: ``aoti_farm/startup/ompwait.py``).

Verification runs each CPU kernel and eager at 1, 2 and the host's cores
(``verify.verify_thread_counts``).  In a warm every other core is compiling, and a
region's threads then wait for each other to be scheduled; ``--busy N`` puts N spinning
processes beside the verifying one to stand in for the compiles (``--busy 0``: an idle
host, as at W=1).  The CPU column is the verifying process's own (all its threads): what
the compiles beside it lose.

Real kernels, compiled once here; each measurement is a fresh process (``worker.py
verify_checks``: libgomp reads the variable when it is loaded), the two policies
alternating which goes first.

    python scripts/bench/ompwait.py --busy 0,15 --rounds 2 [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

from common import PY, WorkerError, add_output_args, machine, rmtree, run_worker, write_output  # noqa: E402

POLICIES = ("default", "PASSIVE")


def _sigs():
    import torch

    from aoti_farm import signature as S

    e = torch.empty
    return {"addmm 32x64x128": S.from_call(torch.ops.aten.addmm.default, (e(128), e(32, 64), e(64, 128)), {}),
            "add 64x1024": S.from_call(torch.ops.aten.add.Tensor, (e(64, 1024), e(64, 1024)), {}),
            "sum 2^18": S.from_call(torch.ops.aten.sum.default, (e(1 << 18),), {}),
            "tanh 64x1024": S.from_call(torch.ops.aten.tanh.default, (e(64, 1024),), {})}


def _measure(spec_path: str, policy: str, busy: int, timeout: float) -> dict:
    env = {k: None for k in os.environ if k.startswith(("OMP_", "GOMP_", "KMP_"))}
    env["OMP_WAIT_POLICY"] = None if policy == "default" else policy
    spinners = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0)
        return run_worker("verify_checks", {"spec": spec_path}, env=env, timeout=timeout)
    except WorkerError as e:
        raise SystemExit(f"ompwait: the {policy} measurement failed: {str(e)[-2000:]}") from None
    finally:
        for s in spinners:
            s.kill()
            s.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0", help="comma-separated numbers of spinning processes beside the check")
    ap.add_argument("--rounds", type=int, default=2, help="pairs per --busy value, alternating the order")
    ap.add_argument("--repeats", type=int, default=7, help="verifications of each kernel per process")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one measuring process may take")
    add_output_args(ap, "ompwait")
    ns = ap.parse_args(argv)
    try:
        busy = [int(b) for b in ns.busy.split(",") if b.strip()]
        if any(b < 0 for b in busy) or not busy:
            raise ValueError
    except ValueError:
        raise SystemExit(f"ompwait: --busy {ns.busy!r}: give non-negative integers, e.g. --busy 0,15") from None
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.compile.verify import verify_thread_counts

    work = tempfile.mkdtemp(prefix="aoti-ompwait-")
    try:
        compiler = AOTICompiler({}, measure_speed=False)
        kernels = {}
        for name, sig in _sigs().items():
            res = compiler.compile(sig, os.path.join(work, name.split()[0]))
            kernels[name] = {"sig": sig.to_obj(), "path": res.files["kernel.so"]}
        spec = os.path.join(work, "spec.json")
        Path(spec).write_text(json.dumps({"kernels": kernels, "repeats": ns.repeats}))
        rows = []
        for b in busy:
            for r in range(ns.rounds):
                order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                got = {pol: _measure(spec, pol, b, ns.timeout) for pol in order}
                rows.append({"busy": b, "round": r, "first": order[0], **got})
                for name in kernels:
                    d, p = got["default"]["kernels"][name], got["PASSIVE"]["kernels"][name]
                    print(f"busy {b:2d} round {r} {name:16s} wall ms default {d['wall_ms']:8.2f} passive "
                          f"{p['wall_ms']:8.2f} ({p['wall_ms'] / d['wall_ms']:.2f})  cpu ms default {d['cpu_ms']:8.2f} "
                          f"passive {p['cpu_ms']:8.2f} ({p['cpu_ms'] / max(d['cpu_ms'], 1e-9):.2f})", flush=True)
        write_output(ns, {"machine": machine(), "threads_verified": verify_thread_counts("cpu"), "repeats": ns.repeats, "rows": rows})
    finally:
        rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
