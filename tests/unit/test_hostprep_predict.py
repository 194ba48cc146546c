"""The unit tests split from tests/e2e/test_hostprep_predict.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import os

import pytest


def test_a_prediction_is_confirmed_only_by_every_answer_it_used_and_the_same_isa():
    from aoti_farm.isapredict import confirmed

    picked = {"isa": "avx512", "used": {"a": True, "b": False}}
    assert confirmed(picked, {"isa": "avx512", "checks": {"a": True, "b": False, "c": True}})
    assert not confirmed(picked, {"isa": "avx2", "checks": {"a": True, "b": False}})     # another ISA
    assert not confirmed(picked, {"isa": "avx512", "checks": {"a": True, "b": True}})    # one answer differs
    assert not confirmed(picked, {"isa": "avx512", "checks": {"a": True}})               # one never probed
    assert not confirmed(picked, {"isa": "avx512"})                                      # no check answers
    assert not confirmed(picked, None) and not confirmed(None, {"isa": "avx512", "checks": {}})


def test_after_a_misprediction_a_new_child_prepares_on_the_probed_memo(monkeypatch):
    from aoti_farm import hostprep

    answers = [{"status": "mispredicted", "isa": {"predicted": "avx512", "probed": "avx2"}, "seconds": 1.0},
               {"status": "prepared", "seconds": 2.0}]
    calls: list = []
    monkeypatch.setattr(hostprep, "_prepare_child",
                        lambda opts, timeout, predict: calls.append((opts, predict)) or dict(answers.pop(0)))
    out = hostprep.prepare_in_child({"x": 1}, predict=True)
    assert calls == [({"x": 1}, True), ({"x": 1}, False)]   # the second child: on the probed memo
    assert out["status"] == "prepared" and out["mispredicted"]["isa"]["probed"] == "avx2"


def test_a_process_that_picked_by_prediction_never_probes_or_writes_the_memo(tmp_path, monkeypatch):
    """Its Inductor would answer the probe with the prediction: host_isa_memo refuses."""
    from aoti_farm import fingerprint, isapredict

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(isapredict, "_PICKED", [True])
    probes = fingerprint.host_steps()["isa_probe"]
    with pytest.raises(RuntimeError, match="prediction"):
        fingerprint.host_isa_memo(need_checks=True)
    assert not os.path.exists(fingerprint._isa_memo_path())
    assert fingerprint.host_steps()["isa_probe"] == probes
