"""The unit tier's guard: no compile, no Ray, no subprocess (see tests/unit/test_tiers.py).

During every test here, starting a process (``subprocess``, ``os.fork``/``posix_spawn``/
``system``, ``multiprocessing``), ``ray.init`` and AOTInductor's compile entry points raise
:class:`TierViolation`, and the test fails at teardown even if the code under test caught
it (the farm's serving code catches errors on purpose).  A test that needs any of these
belongs in tests/e2e.

``TierViolation`` derives from BaseException so that ``except Exception`` in the code under
test does not hide it.  Threads that were already running when the test started (left by an
e2e test earlier in the same session) are not this test's doing and pass through.  Inductor's
C++ build and Ray's start both spawn processes, so the process guard also covers a compile or
a Ray start that enters through a path not patched by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import _posixsubprocess
import pytest


class TierViolation(BaseException):
    """A unit test started a process, Ray or a compile."""


class _Guard:
    def __init__(self):
        self.seen: list[str] = []
        self._foreign = {t.ident for t in threading.enumerate()} - {threading.main_thread().ident}

    def forbid(self, what: str, orig):
        def blocked(*args, **kwargs):
            if threading.get_ident() in self._foreign:
                return orig(*args, **kwargs)
            self.seen.append(what)
            raise TierViolation(f"{what} in a unit test: move the test to tests/e2e (tests/unit/conftest.py)")
        return blocked


@pytest.fixture(autouse=True)
def tier_guard(monkeypatch):
    g = _Guard()
    monkeypatch.setattr(subprocess.Popen, "_execute_child", g.forbid("subprocess", subprocess.Popen._execute_child))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", g.forbid("a child process", _posixsubprocess.fork_exec))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, g.forbid(f"os.{name}", getattr(os, name)))
    ray = sys.modules.get("ray")          # not imported here: importing Ray costs seconds
    ray_before = ray is not None and ray.is_initialized()
    if ray is not None:
        monkeypatch.setattr(ray, "init", g.forbid("ray.init", ray.init))
    inductor = sys.modules.get("torch._inductor")
    if inductor is not None:
        for name in ("aot_compile", "aoti_compile_and_package"):
            if hasattr(inductor, name):
                monkeypatch.setattr(inductor, name, g.forbid(f"torch._inductor.{name}", getattr(inductor, name)))
    yield g
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and not ray_before:
        g.seen.append("Ray")
    if g.seen:
        pytest.fail(f"unit test started {', '.join(dict.fromkeys(g.seen))}: it belongs in tests/e2e", pytrace=False)
