"""This host's gate decisions kept between processes (aoti_farm/speedgate/hostgate.py, Gate.preload):
a later gate takes a measured decision with no trial, only at the thread count it was
measured at, and never from a memo another user could have written."""

from __future__ import annotations

import json
import os

import pytest

from aoti_farm.speedgate import hostgate
from aoti_farm.runtime.gate import Gate

FP = "f" * 16
T = lambda: (lambda: None, lambda: None, "cpu")  # noqa: E731


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(hostgate, "overloaded", lambda: False)   # the shared test host's load
    return tmp_path


def _rec(ok=True, ratio=0.5, threads=2, at=None):
    return hostgate.record(ok, {"ratio": ratio, "threads": threads, "kernel_us": 5.0, "eager_us": 10.0},
                           now=at)


def test_round_trip_filters_threads_and_age(xdg):
    root = xdg / "cache"
    assert hostgate.save(FP, root, {"a": _rec(), "b": _rec(False, 1.3, threads=1)})
    d = os.path.dirname(hostgate.memo_path(FP, root))
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert set(hostgate.load(FP, root)) == {"a", "b"}
    assert set(hostgate.load(FP, root, threads=2)) == {"a"}
    assert hostgate.load(FP, root, threads=1)["b"]["host_ratio"] == 1.3
    # another cache's decisions are its own (two caches may hold different kernels for a key)
    assert hostgate.load(FP, xdg / "other") == {}
    # old decisions are tried again
    assert hostgate.save(FP, root, {"c": _rec(at=1.0)})
    assert "c" not in hostgate.load(FP, root) and {"a", "b"} <= set(hostgate.load(FP, root))


def test_an_unsafe_or_bad_memo_reads_as_empty(xdg):
    root = xdg / "cache"
    assert hostgate.save(FP, root, {"a": _rec()})
    path = hostgate.memo_path(FP, root)
    d = os.path.dirname(path)
    os.chmod(d, 0o755)   # others could have replaced it
    assert hostgate.load(FP, root) == {}
    assert not hostgate.save(FP, root, {"b": _rec()})
    os.chmod(d, 0o700)
    with open(path, "w") as f:
        json.dump({"version": 1, "decisions": {"a": {"ok": "yes"}, "b": _rec()}}, f)
    assert set(hostgate.load(FP, root)) == {"b"}
    with open(path, "w") as f:
        f.write("{not json")
    assert hostgate.load(FP, root) == {}
    # a link in the memo's place is not followed
    os.rename(d, d + ".real")
    os.symlink(d + ".real", d)
    assert hostgate.load(FP, root) == {}


def test_a_later_gate_takes_the_decision_without_a_trial(xdg):
    root = xdg / "cache"
    calls = []

    def measure(run_kernel, run_eager, device, **kw):
        calls.append(1)
        return {"ratio": 1.4, "kernel_us": 14.0, "eager_us": 10.0, "calls": 10, "threads": 2}

    g = Gate("faster")
    g.measure = measure
    assert g.preload(FP, root, threads=2) == 0
    g.request("k", lambda: {"ratio": 0.5}, T, fp_id=FP)   # faster on the compile host, slower here
    assert g.wait(30) and g.decision("k") is False and calls == [1]
    g.close()
    assert hostgate.load(FP, root, 2)["k"]["host_ratio"] == 1.4

    g2 = Gate("faster")
    g2.measure = measure
    assert g2.preload(FP, root, threads=2) == 1
    assert g2.decision("k") is False and g2.why["k"]["reason"] == "slower here (remembered)"
    g2.request("k", lambda: {"ratio": 0.5}, T, fp_id=FP)
    assert g2.wait(30) and calls == [1] and g2.stats()["remembered"] == 1
    g2.close()
    # at another thread count the decision is made again
    g3 = Gate("faster")
    assert g3.preload(FP, root, threads=1) == 0 and g3.decision("k") is None
    g3.close()


def test_budget_spent_declines_are_not_kept(xdg):
    root = xdg / "cache"
    g = Gate("faster", process_budget_s=0.0)
    g.preload(FP, root, threads=2)
    g.request("k", lambda: {"ratio": 0.5}, T, fp_id=FP)
    assert g.wait(30) and g.decision("k") is False and g.why["k"]["reason"] == "trial budget spent"
    g.close()
    assert hostgate.load(FP, root) == {}


def test_ops_whose_every_call_ran_eager_are_kept(xdg):
    root = xdg / "cache"
    per_op = {"aten::index_select": {"hits": 0, "misses": 0, "fallbacks": 900},   # failed signatures only
              "aten::addmm": {"hits": 40, "misses": 0, "fallbacks": 3},
              "aten::gelu": {"hits": 0, "misses": 2, "fallbacks": 0},              # a miss is queued: routed
              "aten::tanh": {"hits": 0, "misses": 0, "fallbacks": 0}}
    recs = hostgate.op_records(per_op, threads=2)
    assert set(recs) == {"aten::index_select", "aten::addmm", "aten::gelu"}
    assert hostgate.save(FP, root, {}, ops=recs)
    assert hostgate.load_ops(FP, root, threads=2) == {"aten::index_select"}
    assert hostgate.load_ops(FP, root, threads=1) == set()
    # a later process that served the op routes it again next time; decisions are kept alongside
    assert hostgate.save(FP, root, {"a": _rec()}, ops=hostgate.op_records(
        {"aten::index_select": {"hits": 5, "misses": 0, "fallbacks": 0}}, threads=2))
    assert hostgate.load_ops(FP, root, threads=2) == set() and set(hostgate.load(FP, root)) == {"a"}


def test_a_decision_measured_on_an_overloaded_host_is_used_but_not_kept(xdg, monkeypatch):
    monkeypatch.setattr(hostgate, "overloaded", lambda: True)
    g = Gate("faster")
    g.measure = lambda *a, **kw: {"ratio": 0.5, "kernel_us": 5.0, "eager_us": 50.0, "calls": 10, "threads": 2}
    g.preload(FP, xdg / "cache", threads=2)
    g.request("k", lambda: {"ratio": 0.5}, T, fp_id=FP)
    assert g.wait(30) and g.decision("k") is True
    g.close()
    assert hostgate.load(FP, xdg / "cache") == {}


def test_a_kept_decision_follows_the_floor_in_force(xdg, monkeypatch):
    """A kept record is judged again from its measurement by the rule in force: a kernel
    kept as 'faster by less than a routed call costs' under one floor is served under a
    lower one (and the other way), with no new trial; explain reads it the same way."""
    root = xdg / "cache"
    # 8 -> 5 µs: ratio 0.625, a saving of 3 µs (below the default 4 µs floor)
    small = hostgate.record(False, {"ratio": 0.625, "threads": 2, "kernel_us": 5.0, "eager_us": 8.0})
    big = hostgate.record(True, {"ratio": 0.5, "threads": 2, "kernel_us": 5.0, "eager_us": 10.0})
    old = {k: v for k, v in hostgate.record(True, {"ratio": 0.9, "threads": 2, "kernel_us": 1.0,
                                                     "eager_us": 1.1}).items() if not k.endswith("_us")}
    assert hostgate.save(FP, root, {"small": small, "big": big, "old": old})
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    g = Gate("faster")
    assert g.preload(FP, root, threads=2) == 3
    assert (g.decision("small"), g.decision("big"), g.decision("old")) == (False, True, True)
    assert hostgate.kept_ok(small) is False
    assert g.why["small"]["reason"] == "faster here by less than a routed call costs (remembered)"
    g.close()
    monkeypatch.setenv("AOTI_FARM_DEV", "min_saving_us=2")
    g = Gate("faster")
    assert g.min_saving_us == 2.0 and g.preload(FP, root, threads=2) == 3
    assert (g.decision("small"), g.decision("big")) == (True, True)
    assert hostgate.kept_ok(small) is True
    g.close()
    monkeypatch.setenv("AOTI_FARM_DEV", "min_saving_us=6")
    g = Gate("faster")
    assert g.preload(FP, root, threads=2) == 3 and (g.decision("small"), g.decision("big")) == (False, False)
    g.close()
