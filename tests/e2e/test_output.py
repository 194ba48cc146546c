"""What a user sees in a served process: torch's one-time "Overriding a previously
registered kernel" warning is not printed for the hook's own registrations (the native
path's and the Python kernels'), and a warning about the user's own registration still is
not hidden from anything else (only the one-time notice is consumed, on a private op)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aoti_farm.runtime import native

CHILD = r"""
import sys, torch
from aoti_farm.runtime import Settings, install
hook = install(cache_dir=sys.argv[1], ops=["aten::add.Tensor"], on_miss="ignore", route="all",
               serve="always", settings=Settings(native=sys.argv[2]))
a = torch.ones(3)
torch.add(a, a)
print("routed", hook.stats()["routed_ops"], "native", hook.stats()["native"]["active"])
hook.uninstall()
"""


@pytest.mark.parametrize("mode", ["off", "require"])
def test_no_override_warning_from_our_registrations(tmp_path, mode):
    if mode == "require" and native.disabled():
        pytest.skip("AOTI_FARM_NATIVE=0")
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), mode], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "routed 1" in p.stdout, p.stdout
    assert "previously registered kernel" not in p.stderr and "Warning only once" not in p.stderr, p.stderr


def test_a_served_process_that_never_misses_starts_no_compile_worker(tmp_path):
    """on_miss="compile" (the default): the compile worker starts at the first miss, not at
    install (its start-up, an interpreter importing torch, ran beside the program's first
    requests in every served process)."""
    import time

    import torch

    from aoti_farm.runtime import Settings, install

    a = torch.ones(3)
    with install(cache_dir=str(tmp_path), ops=["aten::mul.Tensor"], on_miss="compile",
                 settings=Settings(native="off")) as hook:
        torch.add(a, a)                       # not a routed op: never a miss
        time.sleep(1.0)                       # the miss writer's thread has run
        hook.flush()
        st = hook.stats()
        assert hook.worker is None and st["workers_started"] == 0, st
