"""Signature keys: stable across processes, sensitive to everything that changes the
generated code, blind to how a call was spelled.

The tests of this module that compile, start Ray or start processes are in tests/e2e/test_signature.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from aoti_farm import signature as S

from conftest import sig_add_alpha, sig_mul

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _add(a, b, **kw):
    return S.from_call(torch.ops.aten.add.Tensor, (a, b), kw)


def test_everything_that_changes_code_changes_the_key():
    a, b = torch.empty(8, 16), torch.empty(8, 16)
    base = _add(a, b, alpha=2)
    variants = {
        "strides": _add(torch.empty(16, 8).t(), b, alpha=2),
        "dtype": _add(a.double(), b.double(), alpha=2),
        "scalar value": _add(a, b, alpha=3),
        "scalar type": _add(a, b, alpha=2.0),
        "size": _add(torch.empty(8, 17), torch.empty(8, 17), alpha=2),
        "op": S.from_call(torch.ops.aten.sub.Tensor, (a, b), {"alpha": 2}),
    }
    # a different device: build the encoded form directly (no GPU needed to name one)
    cuda_args = tuple(("T", x[1], x[2], x[3], "cuda:0") if x[0] == "T" else x for x in base.args)
    variants["device"] = S.Signature(base.op, cuda_args)
    keys = {name: v.key for name, v in variants.items()}
    assert base.key not in keys.values()
    assert len(set(keys.values())) == len(keys), keys
    assert variants["device"].device == "cuda" and base.device == "cpu"


def test_defaults_explicit_or_omitted_and_kwargs_or_positional_agree():
    a, b = torch.empty(4, 4), torch.empty(4, 4)
    omitted = S.from_call(torch.ops.aten.add.Tensor, (a, b), {})
    explicit = S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 1})
    by_name = S.from_call(torch.ops.aten.add.Tensor, (a,), {"other": b, "alpha": 1})
    assert omitted.key == explicit.key == by_name.key
    # and in the JSON form, leaving the default out parses to the same signature
    obj = explicit.to_obj()
    obj["args"] = [x for x in obj["args"] if x["name"] != "alpha"]
    assert S.parse_signature(obj).key == explicit.key


@pytest.mark.parametrize("make", [
    sig_add_alpha, sig_mul,
    lambda: S.from_call(torch.ops.aten.embedding.default,
                        (torch.empty(64, 8), torch.zeros(4, 3, dtype=torch.long)), {}),
    lambda: S.from_call(torch.ops.aten.cat.default, ([torch.empty(2, 3), torch.empty(4, 3)],), {"dim": 0}),
    lambda: S.from_call(torch.ops.aten.softmax.int, (torch.empty(4, 10, dtype=torch.float16), -1), {}),
    lambda: S.from_call(torch.ops.aten.clamp.default, (torch.empty(3), None, float("inf")), {}),
    lambda: S.from_call(torch.ops.aten.mean.dim, (torch.empty(4, 8, 3), [1]), {"dtype": torch.float64}),
    lambda: S.from_call(torch.ops.aten.native_layer_norm.default,
                        (torch.empty(4, 32), [32], torch.empty(32), None, 1e-5), {}),
])
def test_to_obj_parse_round_trip(make):
    sig = make()
    obj = sig.to_obj()
    again = S.parse_signature(json.loads(json.dumps(obj)))
    assert again == sig and again.key == sig.key
    assert again.to_obj() == obj


def test_materialize_dtype_sizes_strides_and_index_range():
    weight = torch.empty(50, 8)
    idx = torch.zeros(6, 5, dtype=torch.long).t()  # non-contiguous int tensor, sizes [5, 6]
    sig = S.from_call(torch.ops.aten.embedding.default, (weight, idx), {})
    sig.hints["indices"] = {"range": [10, 49]}
    args, kwargs = S.materialize(sig, seed=3)
    w, ix = args[0], args[1]
    assert w.dtype == torch.float32 and list(w.shape) == [50, 8] and w.stride() == (8, 1)
    assert ix.dtype == torch.int64 and list(ix.shape) == [5, 6] and ix.stride() == (1, 5)
    assert int(ix.min()) >= 10 and int(ix.max()) <= 49
    torch.ops.aten.embedding.default(*args, **kwargs)  # in range: eager accepts it
    # deterministic per seed, different across seeds
    again, _ = S.materialize(sig, seed=3)
    other, _ = S.materialize(sig, seed=4)
    assert torch.equal(again[0], w) and not torch.equal(other[0], w)
    # half precision and a scalar argument come back as such
    sm = S.from_call(torch.ops.aten.softmax.int, (torch.empty(4, 10, dtype=torch.float16), -1), {})
    a2, _ = S.materialize(sm)
    assert a2[0].dtype == torch.float16 and a2[1] == -1


def test_no_private_name_of_signature_is_used_outside_it():
    """Other modules, scripts and tests use aoti_farm.signature's public names, imported
    from the package (its modules are its own business)."""
    import ast
    from pathlib import Path

    from unit.test_scripts import _aoti_imports

    root = Path(TESTS).parent
    inside = root / "aoti_farm" / "signature"
    files = [p for d in ("aoti_farm", "runtime", "workers", "scripts", "tests") for p in (root / d).rglob("*.py")
             if inside not in p.parents]
    bad = []
    for p in files:
        tree = ast.parse(p.read_text(), str(p))
        imports, aliases = _aoti_imports(tree)
        for module, name, line in imports:
            if module.startswith("aoti_farm.signature.") or (
                    module == "aoti_farm.signature" and name and name.startswith("_")):
                bad.append(f"{p.relative_to(root)}:{line}: from {module} import {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_"):
                bad.append(f"{p.relative_to(root)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert len(files) > 100 and not bad, "\n".join(bad)
