"""CUDA index ops served with eager's error behaviour (issue 48): ``embedding``,
``index_select`` and ``gather`` are compiled with each negative index mapped out of range
in the graph, their generated Triton code is read for a device assert before every
indirect address (aoti_farm/build/tritonscan.py), and they are published.  On valid indices a
kernel returns eager's values; on a negative or an out-of-range index it fails a device
assert as eager does -- run in child processes, since a device assert leaves a process's
CUDA context unusable.  Skipped where no GPU is present (CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from aoti_farm.startup import loadenv
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")]


def _calls():
    d, L = "cuda", torch.long
    w, x, y = torch.randn(1000, 128, device=d), torch.randn(1000, 128, device=d), torch.randn(64, 64, device=d)
    return {
        "embedding": (torch.ops.aten.embedding.default, (w, torch.randint(0, 1000, (2, 8), device=d, dtype=L)), 1, 1000),
        "index_select": (torch.ops.aten.index_select.default, (x, 0, torch.randint(0, 1000, (16,), device=d, dtype=L)),
                         1, 1000),
        "gather": (torch.ops.aten.gather.default, (y, 1, torch.randint(0, 64, (64, 8), device=d, dtype=L)), 1, 64),
    }


CHILD = textwrap.dedent("""
    import json, sys, torch
    from aoti_farm import signature as S
    from aoti_farm.compile.compiler import load_runner
    from aoti_farm.compile.runner import flat_tensors
    path, which, op_name, value, pos = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    sig = S.parse_signature(json.loads(sys.stdin.read()))
    args, kwargs = S.materialize(sig, seed=3)
    ts = flat_tensors(sig, args, kwargs)
    ts[pos].view(-1)[0] = value
    try:
        if which == "kernel":
            out = load_runner(path, "cuda")
            r = out.run(ts)
        else:
            r = [S.resolve_op(op_name)(*args, **kwargs)]
        torch.cuda.synchronize()
        print("RETURNED")
    except Exception as e:
        print("RAISED", type(e).__name__, " ".join(str(e).split())[:200])
""")


def _child(path, which, sig, value, pos):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", CHILD, path, which, sig.op, str(value), str(pos)],
                       input=json.dumps(sig.to_obj()), capture_output=True, text=True, timeout=300, env=env)
    lines = [x for x in p.stdout.splitlines() if x.startswith(("RETURNED", "RAISED"))]
    return lines[-1] if lines else f"DIED rc={p.returncode}: {p.stderr[-300:]}"


def test_cuda_index_ops_are_served_and_assert_where_eager_asserts(tmp_path):
    if not loadenv.load_safe():
        pytest.skip("kernels cannot be loaded in this process (libstdc++ preload needed)")
    fp = fingerprint("cuda:0")
    cache = Cache(tmp_path / "c", signing_key=None)
    for name, (op, args, pos, bound) in _calls().items():
        sig = S.from_call(op, args, {})
        out = compile_and_publish(cache, AOTICompiler(), fp, sig, owner="pytest")
        assert out.status == "compiled", (name, out.error, out.evidence)
        entry = cache.open_entry(fp, sig.key)
        assert entry.manifest["verification"]["index_asserts"] == [[pos, bound]], entry.manifest["verification"]
        from aoti_farm.compile.runner import flat_tensors
        from aoti_farm.compile.compiler import load_runner

        a, kw = S.materialize(sig, seed=5)
        got = load_runner(entry.kernel_path, "cuda").run(flat_tensors(sig, a, kw))[0]
        assert torch.equal(got, op(*a, **kw)), name
        # eager and the kernel alike: a valid index returns, a negative one and one at the
        # bound fail (a device assert), each in a child of its own
        for value, want in ((bound - 1, "RETURNED"), (-1, "RAISED"), (bound, "RAISED")):
            for which in ("eager", "kernel"):
                seen = _child(entry.kernel_path, which, sig, value, pos)
                assert seen.startswith(want), (name, which, value, seen)
