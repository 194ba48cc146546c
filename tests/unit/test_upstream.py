"""The unit tests split from tests/e2e/test_upstream.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.interop import upstream as U
from aoti_farm.cli import upstream_cmds
from aoti_farm.cache.store import Cache
from aoti_farm.errors import Ineligible, UserError

from conftest import sig_add_alpha, sig_mul


def sig_div_floor(shape=(8, 16)):
    a, b = torch.empty(shape), torch.empty(shape)
    return S.from_call(torch.ops.aten.div.Tensor_mode, (a, b), {"rounding_mode": "floor"})


# --- the metadata rules (no compile) ------------------------------------------------------


def test_meta_info_follows_upstream_extract_functions():
    from torch._inductor import aoti_eager as AE

    a, b = torch.empty(8, 16), torch.empty(16)
    meta = U.meta_info(sig_add_alpha())
    want = [AE.extract_tensor_metadata(False, a), AE.extract_tensor_metadata(False, b),
            AE.extract_scalar_metadata("cpu", 2)]
    for i, m in enumerate(want):
        m["arg_order"] = i
    assert meta == want
    assert meta[2]["dtype"] == "torch.int32" and meta[2]["scalar_value"] == 2

    # alpha equal to the schema default (int 1) is left out; 1.0 is not the default (IValue
    # comparison is type-strict) and is a float scalar
    no_alpha = S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 1})
    assert [m["arg_order"] for m in U.meta_info(no_alpha)] == [0, 1]
    f_alpha = U.meta_info(S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 1.0}))
    assert f_alpha[2]["dtype"] == "torch.float32" and f_alpha[2]["scalar_value"] == 1.0

    div = U.meta_info(sig_div_floor())
    assert div[2] == {**AE.extract_string_metadata("floor"), "arg_order": 2}

    # the load_fn form carries torch objects and matches what load_aoti_eager_cache makes
    obj = U.meta_info(sig_add_alpha(), as_objects=True)
    assert obj[0]["dtype"] is torch.float32 and obj[2]["dtype"] is torch.int32


def test_meta_info_round_trips_through_the_schema():
    a = torch.empty(8, 16)
    sigs = [sig_add_alpha(), sig_mul(), sig_div_floor(),
            S.from_call(torch.ops.aten.add.Tensor, (a, a), {"alpha": 1.5}),
            S.from_call(torch.ops.aten.gelu.default, (a,), {"approximate": "tanh"}),
            S.from_call(torch.ops.aten._softmax.default, (a, 1, False), {}),
            S.from_call(torch.ops.aten.addmm.default, (a, a, a.t()), {"beta": 2, "alpha": 3})]
    for sig in sigs:
        back = U.signature_from_meta(sig.op, json.loads(json.dumps(U.meta_info(sig))), "cpu")
        assert back.key == sig.key, S.describe(sig)


def test_unsupported_arguments_are_ineligible_and_bad_meta_is_named():
    a = torch.empty(8, 16)
    with pytest.raises(Ineligible, match="int list"):
        U.meta_info(S.from_call(torch.ops.aten.sum.dim_IntList, (a, [1]), {}))
    # upstream's holder could not tell addmm(beta=2) from addmm(alpha=2): never exported
    with pytest.raises(Ineligible, match="more than one way"):
        U.meta_info(S.from_call(torch.ops.aten.addmm.default, (a, a, a.t()), {"beta": 2}))
    with pytest.raises(ValueError, match=r"x\.json\[0\]"):
        U.signature_from_meta("aten::add.Tensor", [{"arg_order": 0, "string_value": "no"}], "cpu", "x.json[0]")
    with pytest.raises(ValueError, match="arg_order"):
        U.signature_from_meta("aten::add.Tensor", [{"sizes": [1]}], "cpu")


def test_enable_without_upstream_api_raises(monkeypatch, tmp_path):
    from torch._inductor import aoti_eager

    from aoti_farm.runtime import enable_upstream_backend

    monkeypatch.delattr(aoti_eager, "register_aoti_compile_backend")
    with pytest.raises(UserError, match=re.escape(f"torch {torch.__version__} lacks ") + ".*register_aoti_compile_backend"):
        enable_upstream_backend(tmp_path)


def test_commands_name_bad_directories(tmp_path):
    with pytest.raises(UserError, match="aoti_eager"):
        upstream_cmds.import_command(argparse.Namespace(cache_dir=str(tmp_path / "c"), src=str(tmp_path), json=False))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match="--to"):
        U.export_upstream(Cache(tmp_path / "c"), f)
