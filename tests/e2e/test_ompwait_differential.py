"""The differential test of the compile processes' OpenMP wait policy (aoti_farm/startup/ompwait.py):
a real AOTI kernel and eager, at 1, 2 and 3 intra-op threads, return the same bits under
libgomp's default policy (spin, then sleep) and under ``OMP_WAIT_POLICY=PASSIVE``; only how
a waiting thread waits differs (libgomp's own account of its spin count says which policy
each process ran with).  Each side is a fresh process: libgomp reads the variable once,
when it is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from aoti_farm import signature as S
from aoti_farm.compile.compiler import AOTICompiler

THREADS = (1, 2, 3)

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    from aoti_farm import signature as S
    from aoti_farm.compile.compiler import load_runner
    from aoti_farm.compile.runner import flat_tensors

    sig, kernel, out = S.parse_signature(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
    runner = load_runner(kernel, "cpu")
    args, kwargs = S.materialize(sig, seed=1234)
    g = torch.Generator().manual_seed(5)
    a, b, c = (torch.randn(s, generator=g) for s in ((96, 72), (96, 200), (200, 72)))
    x = torch.randn(48, 999, generator=g)
    results = {}
    for t in THREADS:
        torch.set_num_threads(t)
        results[f"kernel@{t}"] = list(runner.run(flat_tensors(sig, args, kwargs)))
        results[f"eager sum@{t}"] = [torch.ops.aten.sum.default(*args)]
        results[f"eager addmm@{t}"] = [torch.addmm(a, b, c)]                 # MKL's GNU-OpenMP threads
        results[f"eager softmax@{t}"] = [torch.softmax(x, 1)]
        results[f"eager layer_norm@{t}"] = [torch.nn.functional.layer_norm(x, (999,))]
    torch.save(results, out)
""").replace("THREADS", repr(THREADS))


def _run(tmp_path: Path, name: str, sig: S.Signature, kernel: str, policy: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"   # libgomp prints its settings at load (stderr)
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = tmp_path / f"{name}.pt"
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(sig.to_obj()), kernel, str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    spin = [line.split("=", 1)[1].strip() for line in r.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    return torch.load(out), spin[0] if spin else ""


def test_the_passive_wait_policy_changes_no_result(tmp_path):
    # a full reduction: each thread sums its own part, so the split (thread count) shows in the bits
    sig = S.from_call(torch.ops.aten.sum.default, (torch.empty(1 << 18),), {})
    res = AOTICompiler({}, measure_speed=False).compile(sig, str(tmp_path / "work"))
    kernel = res.files["kernel.so"]
    default, spin_default = _run(tmp_path, "default", sig, kernel, None)
    passive, spin_passive = _run(tmp_path, "passive", sig, kernel, "PASSIVE")
    # the two processes did wait differently: libgomp's default spins 300,000 times, passive not at all
    assert spin_default.strip("'") == "300000" and spin_passive.strip("'") == "0", (spin_default, spin_passive)
    assert default.keys() == passive.keys() and len(default) == 5 * len(THREADS)
    for name in default:
        assert len(default[name]) == len(passive[name]) >= 1, name
        for x, y in zip(default[name], passive[name]):
            assert (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride()), name
            # bitwise: the same bytes, signed zeros included
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), name
