"""Run code we do not trust yet in a child process, never in this one.

A kernel that does not carry this fleet's signature (an upstream cache being imported, for
example) is a shared library written by someone else: loading it runs its constructors.
So it is loaded only in a child process that

* has no secret in its environment (the signing key, and any variable whose name says it
  holds a key, token, secret, password or credential), and no inherited descriptors;
* has an address-space limit (CPU kernels; a CUDA context needs a huge address space, so
  CUDA children get the timeout only);
* is killed after a timeout.

The child is ``python -m aoti_farm.compiler`` (its verification entry point): it loads the
library, runs it against eager on fresh inputs and prints one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from typing import Callable

from aoti_farm import loadenv
from aoti_farm import signature as S
from aoti_farm.errors import CompileRefused

#: Seconds a child may take to load and verify one kernel.
TIMEOUT_S = 300.0
#: Address-space limit of a CPU child (torch itself maps about 2-3 GiB).
CPU_MEMORY_BYTES = 8 << 30

_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.IGNORECASE)


def scrubbed_env(env: dict | None = None) -> dict:
    """``env`` (default os.environ) without secrets, with the libstdc++ preload if needed."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if not _SECRET.search(k)}
    return loadenv.child_env(env)


def _limits(memory_bytes: int | None) -> Callable[[], None] | None:
    if not memory_bytes:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def verify_in_child(sig: S.Signature, kernel_path: str, *, trials: int = 2, timeout: float = TIMEOUT_S,
                    memory_bytes: int | None = CPU_MEMORY_BYTES) -> dict:
    """Verify the library at ``kernel_path`` against eager in a sandboxed child; returns
    the verification record or raises :class:`CompileRefused` (crash, timeout, memory
    limit, disagreement)."""
    req = json.dumps({"sig": sig.to_obj(), "path": kernel_path, "trials": trials})
    try:
        r = subprocess.run([sys.executable, "-m", "aoti_farm.compiler"], input=req, text=True,
                           capture_output=True, env=scrubbed_env(), timeout=timeout, close_fds=True,
                           stdin=None, cwd=os.path.dirname(kernel_path) or None,
                           preexec_fn=_limits(memory_bytes if sig.device == "cpu" else None))
    except subprocess.TimeoutExpired:
        raise CompileRefused(f"kernel did not finish loading and running within {timeout:.0f} s") from None
    if r.returncode < 0:
        raise CompileRefused(f"kernel crashed its loader (signal {-r.returncode})")
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise CompileRefused(f"kernel does not load or run (exit {r.returncode}): {tail}") from None
    if "refused" in out:
        raise CompileRefused(out["refused"], out.get("evidence"))
    return {**out, "in_child": True, "sandboxed": True}
