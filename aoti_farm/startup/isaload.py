"""The ISA probe's load checks without importing torch in each child (torch < 2.13).

Each of Inductor's ISA checks (``VecISA.check_build``) builds a test library and then
loads it in a child Python.  Before torch 2.13 that child runs ``import torch`` and then
``cdll.LoadLibrary``: seconds per check on a many-core host where all checks run at once,
on the path to a fresh host's first plan (the probe gates the plan and every actor's
fingerprint).  Torch 2.13 dropped the import on Linux (pytorch/pytorch#183515, after
#140970): its child only loads the library, with torch's ``lib`` directory first on
``LD_LIBRARY_PATH`` (``VecISA._build_probe_env``).

:func:`fast_loads` does what 2.13 does for a torch whose load code still imports torch.
While the block runs, ``torch._inductor.cpu_vec_isa.subprocess`` is a stand-in, and its
``check_call`` spots exactly that load command (the module's own ``_avx_py_load`` with
a library path).  It runs 2.13's load code, with 2.13's environment and its 60 s bound.
A load that fails or hangs is then tried the old way, so an answer is only ever "yes"
sooner, never a different "no".  Everything else goes to the real ``subprocess``.
Linux only; a torch whose load code has no ``import torch`` is left alone.

Patch of a torch internal (``cpu_vec_isa.subprocess``, ``VecISA._avx_py_load``), checked
against torch 2.11 (and left alone by 2.13's load code).  It can go once the farm requires
torch >= 2.13.  Measured together with ``warm``'s early start of the probe, as one
mechanism (``AOTI_FARM_DEV=fresh_isa=0`` turns both off); the differential test
``tests/e2e/test_isaload.py`` shows an answer is never a different "no".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

#: torch 2.13's load code on Linux (``VecISA._avx_py_load`` without its non-Linux import)
LOAD_CODE = 'from ctypes import cdll\ncdll.LoadLibrary("__lib_path__")\n'
DEV = "fresh_isa"   # its key in AOTI_FARM_DEV (aoti_farm/config.py), with warm's early ISA child
from aoti_farm.startup import spawn  # noqa: E402
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place


def _target(cmd, template: str) -> str | None:
    """The library path of ``cmd`` if it is Inductor's load command for ``template``."""
    if not isinstance(cmd, (list, tuple)) or len(cmd) != 3 or cmd[1] != "-c" or not isinstance(cmd[2], str):
        return None
    head, sep, tail = template.partition("__lib_path__")
    code = cmd[2]
    if not sep or not code.startswith(head) or not code.endswith(tail) or len(code) <= len(head) + len(tail):
        return None
    path = code[len(head):len(code) - len(tail)]
    return path if '"' not in path and "\n" not in path else None


class _Stand:
    """``subprocess`` for cpu_vec_isa: its load command runs without ``import torch``."""

    def __init__(self, template: str, lib_dir: str):
        self._template, self._lib_dir = template, lib_dir
        self.fast = self.fallback = 0

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def check_call(self, cmd, *args, **kwargs):
        path = _target(cmd, self._template)
        if path is not None:
            env = dict(kwargs.get("env") or os.environ)
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (self._lib_dir, env.get("LD_LIBRARY_PATH")) if p)
            try:
                subprocess.run(spawn.python("-c", LOAD_CODE.replace("__lib_path__", path)), cwd=kwargs.get("cwd"),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, timeout=60, check=True)
                self.fast += 1
                return 0
            except (OSError, subprocess.SubprocessError):
                self.fallback += 1   # the old way decides
        if isinstance(cmd, list) and cmd and cmd[0] == sys.executable and spawn.SAFE_PATH not in cmd:
            cmd = spawn.python(*cmd[1:])   # Inductor's `python -c`: nothing from its working directory
        return subprocess.check_call(cmd, *args, **kwargs)


@contextlib.contextmanager
def fast_loads(cpu_vec_isa):
    """Within this block, ``cpu_vec_isa``'s load checks skip ``import torch`` (see the
    module doc); yields the stand-in (its ``fast``/``fallback`` counts) or None."""
    template = getattr(getattr(cpu_vec_isa, "VecISA", None), "_avx_py_load", None)
    real = getattr(cpu_vec_isa, "subprocess", None)
    if (not sys.platform.startswith("linux") or _dev(DEV) == "0" or not isinstance(template, str)
            or "import torch" not in template or "sys.platform" in template or real is not subprocess):
        yield None
        return
    import torch

    stand = _Stand(template, os.path.join(os.path.dirname(torch.__file__), "lib"))
    cpu_vec_isa.subprocess = stand
    try:
        yield stand
    finally:
        cpu_vec_isa.subprocess = real
