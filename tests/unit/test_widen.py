"""The miss policy for calls outside every shape class's range (aoti_farm/compile/widen.py): the
decision, its settings and the queue item's optional field.  Pure: no compile (the hook and
the real class compile of a widened range are in tests/e2e/test_shapes.py, on its shared class)."""

from __future__ import annotations

import pytest

from aoti_farm.dynamic import shapes as SH
from aoti_farm import signature as S
from aoti_farm.compile import widen as W
from aoti_farm.cache import queue as missq
from aoti_farm.cache.store import Cache
from aoti_farm.config import HookConfig, resolve
from aoti_farm.errors import UserError
from aoti_farm.fingerprint import fingerprint


def T(sizes, dt="float32"):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= s
    return ("T", dt, tuple(sizes), tuple(strides), "cpu")


def gelu(n, m=64):
    import torch

    return S.from_call(torch.ops.aten.gelu.default, (torch.empty(n, m),), {})


CLS = SH.classes([gelu(n) for n in (8, 24, 40)])[0][0]          # s0 = 8..40


def test_auto_widens_a_near_miss_to_powers_of_two_and_queues_exact_far_ones():
    w = W.request("auto", [CLS], gelu(60))
    assert w is not None and w.ranges == (("s0", 8, 64),) and w.dims == CLS.dims
    assert w.contains(gelu(60)) and w.contains(gelu(8)) and w.key != CLS.key
    assert W.request("auto", [CLS], gelu(50)).key == w.key       # 50 and 60 ask for the same class
    assert W.request("auto", [CLS], gelu(5)).ranges == (("s0", 4, 40),)   # below: down to a power of two
    assert W.request("auto", [CLS], gelu(81)) is None            # more than twice the high end: exact
    assert W.request("auto", [CLS], gelu(3)) is None             # less than half the low end: exact
    assert W.request("auto", [CLS], gelu(80)).ranges == (("s0", 8, 128),)


def test_a_decode_step_past_a_stride_range_widens_the_stride():
    """GPT-2 decode at a longer prompt: the int64 add's column stride passes the recorded
    range; the request widens the stride symbol, and the widened class keeps the pattern."""
    def step(n):
        return S.Signature("aten::add.Tensor", (T((1, 1), "int64"), ("T", "int64", (2, 1), (n, 1), "cpu"), ("i", 1)))
    cls = SH.classes([step(n) for n in range(8, 40)])[0][0]
    w = W.request("auto", [cls], step(42))
    assert w is not None and w.ranges == (("s0", 8, 64),) and w.stride_symbols == {"s0"}
    assert w.contains(step(42)) and w.point({"s0": 64}).args[1][3] == (64, 1)
    assert W.parse_request(w.to_obj(), step(42)).key == w.key


def test_always_widens_whatever_the_distance_and_off_never():
    assert W.request("always", [CLS], gelu(1000)).ranges == (("s0", 8, 1024),)
    assert W.request("off", [CLS], gelu(60)) is None


def test_no_widening_inside_a_range_or_for_another_pattern():
    assert W.request("always", [CLS], gelu(17)) is None          # inside: missed for another reason (gate)
    assert W.request("always", [CLS], gelu(60, m=32)) is None    # a fixed dim differs: not this class
    two = SH.classes([S.Signature("aten::add.Tensor", (T((n, n)), T((n, n)), ("i", 1))) for n in (4, 8)])[0][0]
    tied_apart = S.Signature("aten::add.Tensor", (T((12, 16)), T((12, 16)), ("i", 1)))
    assert W.request("always", [two], tied_apart) is None         # tied dims disagree
    # of two classes of the group, the one needing the least widening
    wide = SH.ShapeClass(CLS.op, CLS.group, CLS.dims, (("s0", 8, 512),), CLS.example)
    far = SH.ShapeClass(CLS.op, CLS.group, CLS.dims, (("s0", 2, 4),), CLS.example)
    assert W.request("always", [far, wide], gelu(600)).ranges == (("s0", 8, 1024),)


def test_a_queued_request_is_checked_before_use():
    w = W.request("auto", [CLS], gelu(60)).to_obj()
    assert W.parse_request(w, gelu(60)).ranges == (("s0", 8, 64),)
    assert W.parse_request(w, gelu(100)) is None                  # does not contain the queued signature
    assert W.parse_request(None, gelu(60)) is None
    bad = {**w, "ranges": [["s0", 8, "x"]]}
    assert W.parse_request(bad, gelu(60)) is None                 # garbage: the exact signature


def test_policy_from_install_env_and_toml(tmp_path):
    from aoti_farm.runtime import settings

    assert HookConfig.widen == "auto"
    assert resolve(HookConfig, env={}).widen == "auto"
    assert resolve(HookConfig, env={"AOTI_FARM_WIDEN": "off"}).widen == "off"
    toml = tmp_path / "c.toml"
    toml.write_text('[hook]\nwiden = "always"\n')
    assert resolve(HookConfig, env={}, config_path=str(toml)).widen == "always"
    with pytest.raises(UserError, match="widen"):
        resolve(HookConfig, env={"AOTI_FARM_WIDEN": "sometimes"})
    assert settings.resolve(env={"AOTI_FARM_WIDEN": "always"}).config.widen == "always"
    assert settings.resolve(widen="off", env={"AOTI_FARM_WIDEN": "always"}).config.widen == "off"   # explicit wins
    with pytest.raises(UserError, match="widen"):
        settings.resolve(widen="wider", env={})


def test_queue_item_carries_the_request_and_stays_keyed_by_the_signature(tmp_path):
    cache = Cache(tmp_path / "c")
    fp = fingerprint("cpu")
    cache.ensure(fp)
    w = W.request("auto", [CLS], gelu(60)).to_obj()
    assert missq.enqueue(cache, fp.id, gelu(60), widen=w)
    assert not missq.enqueue(cache, fp.id, gelu(60))              # deduplicated by the signature's key
    assert missq.enqueue(cache, fp.id, gelu(100))
    assert missq.read_item(cache, fp.id, gelu(60).key) == (gelu(60), w)
    assert missq.read(cache, fp.id, gelu(60).key) == gelu(60)     # a drainer that ignores it: exact
    assert missq.read_item(cache, fp.id, gelu(100).key) == (gelu(100), None)
