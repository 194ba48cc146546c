"""Index ops served on CPU behind index guards (docs/verification.md, "Index ops").

Inductor's CPU kernel for ``embedding``, ``index_select`` or ``gather`` checks each index
inside an OpenMP region, where a failed check ends the process; eager raises.  (``embedding``
is composite: at the CPU key it is ``index_select`` of the flattened ids, served as such.)  So such a
kernel is published with index guards (``adversarial.index_guards``: each index argument's
range ``[0, bound)``, in a manifest of the guarded format that readers without guards
refuse), verified on in-range indices, and served only where every index is in range:
any other call is eager's own call, which raises eager's error.  The serving runs in a
child process, so a guard that let a bad index through would end the child, not pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.manifest import GUARDED_FORMAT
from aoti_farm.cache.store import BadEntry, Cache
from aoti_farm.compile.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish

L = torch.long


def _sigs():
    a = torch.ops.aten
    out = {}
    for name, op, args, hints in (
            # what F.embedding(W[1000, 64], ids[2, 8]) runs at the CPU key (embedding is composite)
            ("embedding", a.index_select.default, (torch.empty(1000, 64), 0, torch.empty(16, dtype=L)),
             {"index": {"range": [0, 999]}}),
            ("index_select", a.index_select.default, (torch.empty(64, 32), 0, torch.empty(32, dtype=L)),
             {"index": {"range": [0, 63]}}),
            ("gather", a.gather.default, (torch.empty(8, 16), 1, torch.empty(8, 4, dtype=L)),
             {"index": {"range": [0, 15]}})):
        sig = S.from_call(op, args, {})
        out[name] = S.Signature(sig.op, sig.args, hints)
    return out


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    cache = Cache(tmp_path_factory.mktemp("guards") / "c")
    fp = fingerprint("cpu")
    outs = {n: compile_and_publish(cache, AOTICompiler(measure_speed=False), fp, s, owner="t")
            for n, s in _sigs().items()}
    return cache, fp, outs


def test_index_kernels_are_published_behind_guards(guarded):
    cache, fp, outs = guarded
    bounds = {"embedding": 1000, "index_select": 64, "gather": 16}
    for name, sig in _sigs().items():
        assert outs[name].status == "compiled", (name, outs[name].error, outs[name].evidence)
        m = cache.open_entry(fp, sig.key).manifest
        assert m["format"] == GUARDED_FORMAT
        assert m["verification"]["index_guards"] == [[1, 0, bounds[name]]], m["verification"]
        # a reader that cannot enforce guards (upstream's holder) refuses the entry
        with pytest.raises(BadEntry) as e:
            cache.open_entry(fp, sig.key, guards=False)
        assert e.value.kind == "guarded"


SERVE = textwrap.dedent("""
    import json, sys, torch
    from aoti_farm.runtime import Settings, install
    cache, native = sys.argv[1], sys.argv[2]
    W, X, G = torch.randn(1000, 64), torch.randn(64, 32), torch.randn(8, 16)
    a = torch.ops.aten
    def calls(bad):
        i8 = torch.randint(0, 1000, (2, 8)); i32 = torch.randint(0, 64, (32,)); g = torch.randint(0, 16, (8, 4))
        if bad is not None:
            i8[1, 3] = 1000 if bad == "high" else -1
            i32[5] = 64 if bad == "high" else -1
            g[2, 1] = 16 if bad == "high" else -1
        return [lambda: torch.nn.functional.embedding(i8, W), lambda: a.index_select.default(X, 0, i32),
                lambda: a.gather.default(G, 1, g)]
    def outcome(fn):
        try:
            return ("ok", fn())
        except Exception as e:
            return ("raised", type(e).__name__)
    res = {}
    with install(cache_dir=cache, serve="always", on_miss="ignore",
                 settings=Settings(install_trial=0, native=native)) as hook:
        torch.manual_seed(0)
        good = calls(None)
        want = []
        with hook._routes.bypassed():
            want = [fn() for fn in good]
        got = [fn() for fn in good]
        res["good_equal"] = [bool(torch.equal(x, y)) for x, y in zip(got, want)]
        res["served"] = hook.stats()["summary"]["served"]
        for bad in ("high", "negative"):
            served = [outcome(fn) for fn in calls(bad)]
            with hook._routes.bypassed():
                eager = [outcome(fn) for fn in calls(bad)]
            res[bad] = [s[0] == e[0] and (s[0] == "raised" and s[1] == e[1] or
                        s[0] == "ok" and bool(torch.equal(s[1], e[1]))) for s, e in zip(served, eager)]
            res[bad + "_kinds"] = [s[0] if s[0] == "ok" else s[1] for s in served]
        res["served_after"] = hook.stats()["summary"]["served"]
    print(json.dumps(res))
""")


@pytest.mark.parametrize("native", ["require", "off"])
def test_an_index_out_of_range_is_eagers_error_and_in_range_is_served(guarded, native):
    cache, fp, outs = guarded
    r = subprocess.run([sys.executable, "-c", SERVE, str(cache.root), native], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, f"the serving process ended ({r.returncode}): {r.stderr[-3000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["good_equal"] == [True, True, True] and res["served"] == 3, res
    assert res["high"] == [True, True, True], res   # eager's outcome, exactly
    assert all(k != "ok" for k in res["high_kinds"]), res   # eager raises on every one
    assert res["negative"] == [True, True, True], res
    assert res["served_after"] == 3, res   # the bad calls were eager's


# --- shape classes of index ops ------------------------------------------------------------------


def _members(op, make, lengths, hi):
    """Exact signatures of ``op`` at ``lengths`` (``make(n)``: its example arguments), each
    index argument hinted in ``[0, hi(n)]``, as the recorder writes them."""
    out = []
    for n in lengths:
        sig = S.from_call(op, make(n), {})
        out.append(S.Signature(sig.op, sig.args, {"index": {"range": [0, hi(n)]}}))
    return out


SERVE_CLASS = textwrap.dedent("""
    import json, sys, torch
    from aoti_farm.runtime import Settings, install
    cache = sys.argv[1]
    W = torch.randn(10, 32)     # a small table (BERT's token types: 2 rows)
    a = torch.ops.aten
    def outcome(fn):
        try:
            return ("ok", fn())
        except Exception as e:
            return ("raised", type(e).__name__)
    res = {"good": [], "bad": []}
    with install(cache_dir=cache, serve="always", on_miss="ignore", settings=Settings(install_trial=0)) as hook:
        for n in (12, 20, 24, 9):                       # unseen lengths inside the class's range
            i = torch.randint(0, 10, (n,))
            got = a.index_select.default(W, 0, i)
            with hook._routes.bypassed():
                want = a.index_select.default(W, 0, i)
            res["good"].append(bool(torch.equal(got, want)))
        res["hits"] = hook.stats()["hits"]
        for bad in (10, -1):                            # out of range at an unseen length: eager's error
            i = torch.randint(0, 10, (12,))
            i[5] = bad
            served = outcome(lambda: a.index_select.default(W, 0, i))
            with hook._routes.bypassed():
                eager = outcome(lambda: a.index_select.default(W, 0, i))
            res["bad"].append([served[0], served[1] if served[0] == "raised" else None,
                               eager[0], eager[1] if eager[0] == "raised" else None])
        st = hook.stats()
        res["hits_after"], res["matched"] = st["hits"], st["shape_classes"]["matched"]
    print(json.dumps(res))
""")


def test_an_index_class_with_a_fixed_bound_is_served_behind_its_guards(tmp_path):
    """A lookup in a small table recorded at three lengths (the table fixed, the ids' length
    varying) is one class kernel behind the table's index guard: unseen lengths are hits
    equal to eager, and an out-of-range id at an unseen length is eager's own error."""
    from aoti_farm.compile import dynwarm
    from aoti_farm.dynamic import shapes as SH

    sigs = _members(torch.ops.aten.index_select.default,
                    lambda n: (torch.empty(10, 32), 0, torch.empty(n, dtype=L)), (8, 16, 24), lambda n: 9)
    classes, rest = SH.classes(sigs)
    assert len(classes) == 1 and not rest
    cls = classes[0]
    cache = Cache(tmp_path / "c")
    comp = AOTICompiler(measure_speed=False)
    fp = fingerprint("cpu", comp.options())
    out = dynwarm.compile_class(cache, cls, comp, fp, None, owner="pytest")
    assert out["status"] == "compiled", out
    m = cache.open_entry(fp, cls.key).manifest
    assert m["format"] == GUARDED_FORMAT and m["verification"]["index_guards"] == [[1, 0, 10]], m["verification"]
    with pytest.raises(BadEntry) as e:   # upstream's holder cannot enforce guards
        cache.open_entry(fp, cls.key, guards=False)
    assert e.value.kind == "guarded"

    r = subprocess.run([sys.executable, "-c", SERVE_CLASS, str(cache.root)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, f"the serving process ended ({r.returncode}): {r.stderr[-3000:]}"
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["good"] == [True] * 4 and res["hits"] == 4 and res["matched"] >= 4, res
    for served_kind, served_err, eager_kind, eager_err in res["bad"]:
        assert served_kind == eager_kind == "raised" and served_err == eager_err, res
    assert res["hits_after"] == 4, res   # the bad calls were eager's

    # the speed gate's trial of a call the class covers (runtime/trial.py) runs eager and the
    # kernel on inputs of the call's shapes with the class's value ranges: in-range ids, where
    # the call's own signature (no ranges: ids up to 15) would give ids that eager rejects
    import contextlib
    from types import SimpleNamespace

    from aoti_farm.runtime import trial

    unseen = _members(torch.ops.aten.index_select.default,
                      lambda n: (torch.empty(10, 32), 0, torch.empty(n, dtype=L)), (12,), lambda n: 9)[0]
    call = SimpleNamespace(key=cls.key, sig=S.Signature(unseen.op, unseen.args), device="cpu")
    speed, run = trial._sides(cache, fp, call, SimpleNamespace(run=None), contextlib.nullcontext)
    speed()   # reads the entry (its signature and value ranges)
    _kernel, eager_side, device, _ctx = run()
    assert device == "cpu" and eager_side().shape == (12, 32)

