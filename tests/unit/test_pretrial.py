"""The unit tests split from tests/e2e/test_pretrial.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.errors import UserError
from aoti_farm.runtime import Settings, install, trial


@pytest.mark.parametrize("bad", [-1, "soon", float("inf")])
def test_a_bad_install_trial_is_a_clear_error(tmp_path, monkeypatch, bad):
    with pytest.raises(UserError, match="install_trial.*AOTI_FARM_INSTALL_TRIAL"):
        install(cache_dir=str(tmp_path), on_miss="ignore", settings=Settings(install_trial=bad))
    monkeypatch.setenv("AOTI_FARM_INSTALL_TRIAL", str(bad))
    with pytest.raises(UserError, match="AOTI_FARM_INSTALL_TRIAL"):
        install(cache_dir=str(tmp_path), on_miss="ignore")


class _Entry:
    def __init__(self, manifest):
        self.manifest = manifest

    def close(self):
        pass


class _OneEntryCache:
    """The one call trial makes of a cache (``open_entry(...).manifest``)."""

    def __init__(self, manifest):
        self.manifest = manifest

    def open_entry(self, fp, key):
        return _Entry(self.manifest)


def test_the_trial_feeds_the_kernel_inputs_of_the_signature_it_was_compiled_for():
    """A call's own signature has no value ranges; the manifest's has the recorded index
    range.  Random indices into a 2-row table would make eager (and the kernel) fail."""
    weight, idx = torch.randn(2, 4), torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    live = S.from_call(torch.ops.aten.embedding.default, (weight, idx), {})   # what the hook builds
    compiled = S.Signature(live.op, live.args, {"indices": {"range": [0, 1]}})  # as the recorder writes it
    assert live.key == compiled.key and not live.hints
    with pytest.raises(IndexError):              # the call's own signature: indices out of range
        torch.ops.aten.embedding.default(*S.materialize(live, seed=0)[0])
    ran = []

    class Runner:
        def run(self, tensors):
            ran.append(tensors)

    class Call:
        sig, key, device = live, live.key, "cpu"

    speed, make = trial._sides(_OneEntryCache({"signature": compiled.to_obj(), "speed": {"ratio": 0.5}}),
                               None, Call, Runner(), lambda: __import__("contextlib").nullcontext())
    assert speed() == {"ratio": 0.5}
    run_kernel, run_eager, device, _ = make()
    run_eager()                                # in range: eager accepts the inputs
    run_kernel()
    assert device == "cpu" and int(ran[0][1].max()) <= 1


def test_a_short_budget_decides_whole_ops_first():
    """Candidates: exact entries of routed ops the gate could serve and has not decided,
    ops with the fewest entries first."""
    from types import SimpleNamespace

    from aoti_farm.runtime.index import EntryMeta
    from aoti_farm.runtime.pretrial import candidates

    meta = {"k1": EntryMeta("a", 0.5, False, False), "k2": EntryMeta("a", 0.5, False, False),
            "k3": EntryMeta("b", 0.5, False, False), "k4": EntryMeta("b", 2.0, False, False),   # gated at compile
            "k5": EntryMeta("c", None, True, True),                                          # a shape class
            "k6": EntryMeta("d", 0.5, False, False), "k7": EntryMeta("b", 0.5, False, False),
            "k8": EntryMeta("a", 0.5, False, False)}
    idx = SimpleNamespace(keys=set(meta), meta=meta)
    gate = SimpleNamespace(ratio=0.95, decision=lambda k: True if k == "k7" else None)
    got = candidates({"cpu": idx}, gate, bad={"k8"}, routed={"a", "b", "c"})
    assert got == [("cpu", "k3"), ("cpu", "k1"), ("cpu", "k2")]
