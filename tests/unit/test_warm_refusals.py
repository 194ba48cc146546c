"""``warm``'s exit status: a kernel that verification refused (recorded, final; eager serves
the signature) does not fail the warm; an unrecorded failure or a bug of ours does."""

from __future__ import annotations

import io

import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import fingerprint
from aoti_farm.report.progress import Progress
from aoti_farm.workers.warm import mark_refusals


def _sig(n):
    return S.from_call(torch.ops.aten.relu.default, (torch.empty(n, 4),), {})


def test_recorded_refusals_do_not_fail_warm_but_other_failures_do(tmp_path):
    cache, fp = Cache(tmp_path / "c"), fingerprint("cpu")
    cache.ensure(fp)
    refused, lost, bug, rejected = _sig(3), _sig(5), _sig(7), _sig(11)
    cache.record_failure(fp, refused, "kernel disagrees with eager on adversarial inputs: magnitudes")
    cache.record_failure(fp, bug, "bug in aoti-farm: KeyError: 0 at x.py:1 in f", evidence={"bug": True})
    cache.record_failure(fp, rejected, "eager rejects the example inputs: RuntimeError: mat1 and mat2 shapes")
    rows = [
        {"key": refused.key, "op": refused.op, "status": "failed", "fp_id": fp.id, "evidence": {},
         "error": "kernel disagrees with eager on adversarial inputs: magnitudes"},
        {"key": _sig(9).key, "op": "aten::relu", "status": "compiled", "fp_id": fp.id, "evidence": {}},
    ]
    mark_refusals(rows, cache)
    assert rows[0]["refused"] is True and "refused" not in rows[1]
    assert not any(r["status"] == "failed" and not r.get("refused") for r in rows)   # warm exits 0
    out = io.StringIO()
    Progress(2, stream=out, tty=False).finish(rows)
    assert "refused by verification (1: values 1; recorded, eager serves them" in out.getvalue()
    assert "failed signatures:" not in out.getvalue()

    more = [{"key": lost.key, "op": lost.op, "status": "failed", "fp_id": fp.id, "evidence": {},
             "error": "timed out after 3 attempts"},
            {"key": bug.key, "op": bug.op, "status": "failed", "fp_id": fp.id, "evidence": {"bug": True},
             "error": "bug in aoti-farm: KeyError: 0 at x.py:1 in f"},
            {"key": rejected.key, "op": rejected.op, "status": "failed", "fp_id": fp.id, "evidence": {},
             "error": "eager rejects the example inputs: RuntimeError: mat1 and mat2 shapes"}]
    mark_refusals(more, cache)
    # not recorded; a bug of ours; a signature eager rejects (recorded, but the trace is wrong):
    # all three fail warm
    assert [r.get("refused") for r in more] == [False, None, False]
