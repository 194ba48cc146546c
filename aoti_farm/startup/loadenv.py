"""Loading AOTI libraries safely: the statically linked libstdc++ trap.

Inductor links each AOTInductor ``wrapper.so`` with ``-static-libstdc++``.  On some hosts
(seen on an H100 host with torch 2.11+cu130) loading *any* such library
into a process whose global symbol scope has no libstdc++ segfaults in ``std::regex``
inside ``torch::aot_inductor::parse_device_str``.  Starting the process with
``LD_PRELOAD=<system libstdc++.so.6>`` avoids it.

aoti-farm handles it like this:

* :func:`probe` loads a kernel in a *child* process, plain and then with the preload,
  and tells which works.  The compile actors run it once per host and torch build, on
  their warm-up kernel, and the answer is remembered in
  ``~/.cache/aoti-farm/loadenv-<host>-<torch>.json``.
* :func:`child_env` adds the preload to the environment of every process aoti-farm
  starts (Ray actors' ``runtime_env``, ``aoti-farm run``/``record`` children, the
  runtime's background compile worker) when the probe said so, or when
  ``AOTI_FARM_PRELOAD_LIBSTDCXX=1``; ``=0`` turns it off.
* Kernels are verified by loading them in the compile worker, so a kernel that crashes
  its loader costs an actor restart and a failure record, never a serving process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from functools import lru_cache

import torch

from aoti_farm.startup import spawn
from aoti_farm.security.fsutil import memo_dir

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/aarch64-linux-gnu/libstdc++.so.6",
    "/usr/lib64/libstdc++.so.6",
    "/lib/x86_64-linux-gnu/libstdc++.so.6",
)

_PROBE = (
    "import sys, torch\n"
    "p, dev = sys.argv[1], sys.argv[2]\n"
    "r = (torch._C._aoti.AOTIModelContainerRunnerCuda(p, 1, dev) if dev.startswith('cuda')\n"
    "     else torch._C._aoti.AOTIModelContainerRunnerCpu(p, 1))\n"
    "print('loaded')\n"
)


@lru_cache(maxsize=1)
def system_libstdcxx() -> str | None:
    for c in CANDIDATES:
        if os.path.exists(c):
            return c
    return None


def _memo_path() -> str:
    tag = f"{socket.gethostname()}-{torch.version.git_version[:12]}"
    return os.path.join(memo_dir(), f"loadenv-{tag}.json")


def remembered() -> dict | None:
    try:
        with open(_memo_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remember(result: dict) -> None:
    try:
        from aoti_farm.security.fsutil import atomic_write

        atomic_write(_memo_path(), json.dumps(result).encode())   # in the private memo directory
    except OSError:
        pass


def _try_load(kernel_path: str, device: str, preload: str | None, timeout: float) -> tuple[bool, int | None]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    try:
        r = subprocess.run(spawn.python("-c", _PROBE, kernel_path, device), env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, None
    return (r.returncode == 0 and "loaded" in r.stdout), r.returncode


#: From this many cores the two loads of :func:`probe` run at once (each child imports
#: torch: 4-5 s on the 16-core GPU host, where every first verification waits for the memo).
PARALLEL_PROBE_MIN_CORES = 4


def probe(kernel_path: str, device: str = "cpu", timeout: float = 120.0) -> dict:
    """Load ``kernel_path`` in child processes; returns and remembers
    ``{"needs_preload": bool, "plain_rc": int, "preload_rc": int|None, "preload": path}``.

    The plain load decides; the load with the preload is asked only when the plain one
    fails.  On hosts of :data:`PARALLEL_PROBE_MIN_CORES` cores or more both children
    start at once (the same answer, one child's time instead of two; ``preload_rc`` is
    then recorded even when the plain load worked)."""
    lib = system_libstdcxx()
    if lib and (os.cpu_count() or 1) >= PARALLEL_PROBE_MIN_CORES:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2, thread_name_prefix="aoti-farm-loadprobe") as ex:
            plain = ex.submit(_try_load, kernel_path, device, None, timeout)
            pre = ex.submit(_try_load, kernel_path, device, lib, timeout)
            (ok, rc), (ok2, rc2) = plain.result(), pre.result()
        result = {"needs_preload": (not ok) and ok2, "plain_rc": rc, "preload_rc": rc2, "preload": lib}
        remember(result)
        return result
    ok, rc = _try_load(kernel_path, device, None, timeout)
    result = {"needs_preload": False, "plain_rc": rc, "preload_rc": None, "preload": lib}
    if not ok and lib:
        ok2, rc2 = _try_load(kernel_path, device, lib, timeout)
        result["preload_rc"] = rc2
        result["needs_preload"] = ok2
    remember(result)
    return result


def forced() -> bool | None:
    """``AOTI_FARM_PRELOAD_LIBSTDCXX`` (a low-level switch): True (``1``), False (``0``), else
    None (the probe decides)."""
    flag = os.environ.get("AOTI_FARM_PRELOAD_LIBSTDCXX")
    return None if flag not in ("0", "1") else flag == "1"


def needs_probe() -> bool:
    """Whether the first kernel built here should be probed: nothing remembered, not forced."""
    return remembered() is None and forced() is None


def preload_wanted() -> bool:
    if forced() is not None:
        return bool(forced())
    memo = remembered()
    return bool(memo and memo.get("needs_preload"))


def child_env(env: dict | None = None) -> dict:
    """A copy of ``env`` (default os.environ) with the libstdc++ preload added if wanted."""
    env = dict(os.environ if env is None else env)
    lib = system_libstdcxx()
    if lib and preload_wanted():
        parts = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        if lib not in parts:
            env["LD_PRELOAD"] = ":".join([lib] + parts)
    return env


def preloaded() -> bool:
    """True if this process already has the system libstdc++ preloaded."""
    lib = system_libstdcxx()
    return bool(lib) and lib in os.environ.get("LD_PRELOAD", "")


def load_safe() -> bool:
    """False when loading an AOTI library in *this* process would hit the trap."""
    return not (preload_wanted() and system_libstdcxx() and not preloaded())
