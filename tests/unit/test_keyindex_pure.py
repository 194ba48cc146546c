"""keyindex's nearest-entry search runs no torch op: a serving hook explains its misses
with it (``explain_misses``), and a torch op there would enter the very hook it explains
(counted as a miss, queued, and explained in turn).  And a difference of no key field is
named "none", never the undocumented "other"."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from aoti_farm.cache.index import OpGroup, category, field_diff


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _row(sizes, dtype="float32", alpha=1):
    # (tag, value) fields, as keyindex.flatten_args makes them
    return {"self.sizes": ("L", tuple(sizes)), "self.dtype": ("S", dtype), "alpha": ("I", alpha)}


def test_nearest_entry_runs_no_torch_op_and_picks_the_closest():
    items = [("k1", _row([2, 16, 64])), ("k2", _row([2, 17, 64])), ("k3", _row([2, 17, 64], alpha=2)),
             ("k4", _row([2, 17, 64], dtype="int64"))]
    with _Ops() as mode:
        g = OpGroup(items)
        near = [g.nearest(_row([2, 18, 64]))[0], g.nearest(_row([2, 15, 64]))[0],
                g.nearest(_row([2, 17, 64], alpha=2))[0], g.nearest(_row([3, 17, 64], dtype="int64"))[0],
                g.nearest(_row([2, 17]))[0]]
    assert mode.seen == []
    # fewest differing fields, then the closest sizes, then the smallest key
    assert near == ["k2", "k1", "k3", "k4", "k2"]


def test_categories_are_named():
    assert category(field_diff(_row([2, 3]), _row([2, 4]))) == "shape"
    assert category(field_diff(_row([2, 3]), _row([2, 3], alpha=2))) == "argument"
    assert category([]) == "none"
