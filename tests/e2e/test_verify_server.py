"""The long-lived verification child (aoti_farm.compile.verifyserver), exercised on CPU.

``AOTI_FARM_PRELOAD_LIBSTDCXX=1`` declares a host that needs the preload, so this process
(started without it) verifies in a preloaded child.  That child imports torch once per
process, not once per kernel (a child per kernel cost 4.5 s a signature with 16 actors on
a 16-core host), and a child that dies is replaced.  Counts, no timing.
"""

from __future__ import annotations

import os
import signal

import pytest

from aoti_farm.startup import loadenv
from aoti_farm.compile import verifyserver
from aoti_farm.compile.compiler import AOTICompiler

from conftest import sig_add_alpha, sig_mul

pytestmark = pytest.mark.skipif(loadenv.system_libstdcxx() is None, reason="no system libstdc++ to preload")


@pytest.fixture
def unsafe_host(monkeypatch):
    monkeypatch.setenv("AOTI_FARM_PRELOAD_LIBSTDCXX", "1")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert not loadenv.load_safe()


def _paths(kernels, *sigs):
    out = []
    for sig in sigs:
        kernels.ensure(sig)
        out.append((sig, kernels.cache.open_entry(kernels.fp, sig.key).kernel_path))
    return out


def test_one_child_verifies_many_kernels(kernels, unsafe_host):
    (s1, p1), (s2, p2) = _paths(kernels, sig_add_alpha(), sig_mul())
    before = verifyserver.stats()
    comp = AOTICompiler()
    results = [comp.verify(s, p) for s, p in ((s1, p1), (s2, p2), (s1, p1))]
    after = verifyserver.stats()
    assert all(r["ok"] is True and r.get("in_child") is True for r in results), results
    assert all("child" in r["timing"] and "speed" in r for r in results), results
    assert after["requests"] - before["requests"] == 3
    # at most one start (none when an earlier test's child still runs), never one per kernel
    assert after["started"] - before["started"] <= 1, (before, after)


def test_a_dead_child_is_replaced(kernels, unsafe_host):
    ((sig, path),) = _paths(kernels, sig_add_alpha())
    comp = AOTICompiler()
    assert comp.verify(sig, path)["ok"] is True
    started = verifyserver.stats()["started"]
    os.kill(verifyserver._proc.pid, signal.SIGKILL)
    verifyserver._proc.wait()
    res = comp.verify(sig, path)
    assert res["ok"] is True and res.get("in_child") is True
    assert verifyserver.stats()["started"] == started + 1


_CHILD_IMPORTS = r"""
import json, sys
from aoti_farm.compile.child import _verify_request

ans = _verify_request({"sig": json.loads(sys.argv[1]), "path": sys.argv[2], "trials": 3, "speed": True})
print("OUT " + json.dumps({"ok": ans.get("ok"), "speed": "speed" in ans,
                           "inductor": sorted(m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo")))}))
"""


def test_a_verification_child_does_not_import_inductor(kernels):
    """A verification child only loads kernels and runs them: it verifies (random and
    adversarial inputs, thread counts, speed) without importing Inductor or Dynamo, whose
    import was most of its start (every replacement after an aborting kernel pays it)."""
    import json
    import subprocess
    import sys

    ((sig, path),) = _paths(kernels, sig_add_alpha())
    res = subprocess.run([sys.executable, "-c", _CHILD_IMPORTS, json.dumps(sig.to_obj()), path],
                         capture_output=True, text=True, timeout=300)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("OUT ")), None)
    assert line, res.stderr[-3000:]
    out = json.loads(line[4:])
    assert out["ok"] is True and out["speed"] is True, out
    assert out["inductor"] == [], out["inductor"][:10]
