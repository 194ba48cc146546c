"""The recorder (runtime/recorder.py) and `aoti-farm record`, end to end.

The MLP test records a real model, warms the cache from the trace with real compiles
(three signatures: index_select, addmm, relu), installs the hook and replays: every
call is a hit -- the embedding's index_select too, published behind its index guard
(docs/verification.md: a call with an index out of range would run eager) -- and every
output equals eager.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_recorder.py.
"""

from __future__ import annotations

import sys

import pytest
import torch

import aoti_farm
from aoti_farm.errors import UserError
from aoti_farm.runtime import install, launch
from aoti_farm.trace import load_trace

from _runtime_helpers import same
from unit.test_launch import _ns   # argv parsed by a launcher's arguments


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.l1 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(16, 16)

    def forward(self, idx):
        return self.l2(torch.relu(self.l1(self.emb(idx))))


def test_record_mlp_warm_then_serve_all_hits(kernels, tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    batches = [torch.randint(0, 50, (8,), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with torch.no_grad():
        expected = [model(b) for b in batches]
        path = tmp_path / "mlp.json"
        with aoti_farm.record(path):
            model(batches[0])
    trace = load_trace(path)
    assert sorted(e.sig.op for e in trace) == ["aten::addmm", "aten::index_select", "aten::relu"]
    refused: set = set()   # index_select is served behind its index guard
    for e in trace:                                         # warm: real compiles, fleet rules
        out = kernels.ensure(e.sig)
        assert out.status in ("compiled", "cached"), (e.sig.op, out.error, out.evidence)
    with install(cache_dir=str(kernels.cache.root), on_miss="ignore", route="all") as hook, torch.no_grad():
        got = [model(b) for b in batches]
        st = hook.stats()
    served = {e.sig.op for e in trace} - refused
    per_op = {op: c for op, c in st["per_op"].items() if op in served}
    assert set(per_op) == served, st["per_op"]
    assert all(c["misses"] == 0 and c["fallbacks"] == 0 and c["hits"] > 0 for c in per_op.values()), per_op
    assert sum(c["hits"] for c in per_op.values()) == 3 * sum(e.count for e in trace if e.sig.op in served)
    for op in refused:                                      # eager on every call: never a hit, never queued
        c = st["per_op"][op]
        assert c.get("hits", 0) == 0 and c.get("misses", 0) == 0, c
        assert c["fallbacks"] == 3 * sum(e.count for e in trace if e.sig.op == op), c
    for g, e in zip(got, expected):
        assert same(g, e), (g - e).abs().max()
    print(f"MLP replay: {sum(c['hits'] for c in per_op.values())} hits, 0 misses on served ops; "
          f"outputs equal eager")


def test_record_command_merges_processes(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import subprocess, sys, torch\n"
        "x = torch.randn(4, 4)\n"
        "torch.neg(x); torch.neg(x)\n"
        "if len(sys.argv) == 1:\n"
        "    subprocess.run([sys.executable, __file__, 'child'], check=True)\n"
        "else:\n"
        "    torch.sigmoid(x)\n")
    out = tmp_path / "trace.json"
    rc = launch.record_command(_ns(launch.add_record_args, ["--out", str(out), "--", sys.executable, str(script)]))
    assert rc == 0
    t = load_trace(out)
    counts = {e.sig.op: e.count for e in t}
    assert counts.get("aten::neg") == 4 and counts.get("aten::sigmoid") == 1, counts
    with pytest.raises(UserError, match="does not exist"):
        launch.record_command(_ns(launch.add_record_args, ["--out", str(tmp_path / "no" / "t.json"), "--",
                                                           sys.executable, "-c", "pass"]))
