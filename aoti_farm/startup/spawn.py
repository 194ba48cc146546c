"""Every process the farm starts imports only the farm's code and the environment's.

``python -m module`` and ``python -c code`` put the working directory first on
``sys.path``; ``python script.py`` puts the script's directory there.  A helper the hook
starts from a serving program whose working directory is shared (``/tmp``, a group
folder) would then import a planted ``argparse.py`` or ``aoti_farm/`` before the real
one, and run it as the serving user.  So:

* every Python child is started with :func:`python` (``-P``, Python 3.11's "safe path":
  nothing is prepended to ``sys.path``; ``PYTHONPATH``, site-packages and an editable
  install still apply, so the child imports what its parent's environment names);
* Ray's driver adds its working directory to every Ray worker's ``sys.path``
  (``JobConfig._py_driver_sys_path``, inserted at index 0 before the worker unpickles an
  actor class), so ``ray.init`` runs inside :func:`private_cwd`: the directory it adds is
  the farm's own private one (0700, this user's), where nobody else can plant a module.

``tests/unit/test_spawn_sites.py`` finds every place the package starts a process and
fails on one that does not go through here (or is not listed there with its reason).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

#: Python's flag for "prepend nothing to sys.path" (3.11+; pyproject requires 3.11).
SAFE_PATH = "-P"


def python(*args: str) -> list[str]:
    """The argv of a Python child of this interpreter: ``[sys.executable, "-P", *args]``."""
    return [sys.executable, SAFE_PATH, *args]


@contextlib.contextmanager
def private_cwd() -> Iterator[str]:
    """Run the block (``ray.init``) with the working directory set to the farm's private
    run directory (:func:`aoti_farm.security.private.subdir`), then return to where this process
    was, by descriptor (the old directory may have been renamed meanwhile).  The path is
    under this user's home, so on a cluster's other nodes too it is nobody else's.  Yields
    the directory."""
    from aoti_farm.security import private

    d = private.subdir("run")
    old = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(d)
        try:
            yield d
        finally:
            os.fchdir(old)
    finally:
        os.close(old)


def lowest_priority() -> None:
    """In a compile's child process, before exec: run only on CPU time that serving leaves
    idle (SCHED_IDLE, inherited by the C++ compiler it starts); nice 19 where that is not
    allowed.  (A ``preexec_fn`` of the hook's background builds and compile worker.)"""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)
    except OSError:
        pass
