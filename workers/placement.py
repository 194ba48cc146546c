"""Where compile work goes: which pool a signature's compile goes to, how many actors of
each kind, and what an actor asks Ray for (resources, environment).  Plain functions, so
they are testable without a GPU or a Ray cluster; the scheduler and the warm/serve
orchestration use them.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # torch-free at import: sizing needs no torch
    from aoti_farm.signature import Signature

CPU, GPU = "cpu", "gpu"
#: How many times Ray itself restarts a dead actor before the scheduler replaces it.
ACTOR_MAX_RESTARTS = 2


def route(sig: Signature) -> str:
    """Which pool compiles ``sig``: CUDA signatures go to GPU actors, the rest to CPU actors."""
    return GPU if sig.device == "cuda" else CPU


def worker_env(libstdcxx: bool = True) -> dict[str, str]:
    """Environment for every actor (shipped through ``runtime_env.env_vars``).

    Hook for the GPU-machine trap (see :mod:`aoti_farm.startup.loadenv`): when this host was
    probed to need it, or ``AOTI_FARM_PRELOAD_LIBSTDCXX=1``, the system libstdc++ is
    preloaded into the actors.  ``libstdcxx=False``: without that ``LD_PRELOAD`` (and
    without importing torch, which the probe needs).  OpenMP's wait policy: see
    :mod:`aoti_farm.startup.ompwait`."""
    from aoti_farm.startup import ompwait

    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONWARNINGS": "ignore:Failed to initialize NumPy",
           **ompwait.compile_env(os.environ)}
    if libstdcxx:
        from aoti_farm.startup import loadenv

        preload = loadenv.child_env({}).get("LD_PRELOAD")
        if preload:
            env["LD_PRELOAD"] = preload
    for k in ("AOTI_FARM_PRELOAD_LIBSTDCXX", "XDG_CACHE_HOME"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    return env


def actor_options(kind: str, gpus_per_worker: float, env: dict[str, str] | None = None,
                  inherited: dict | None = None) -> dict:
    """Ray ``.options(...)`` for a CPU or a GPU compile actor.

    CPU actors ask for one CPU; GPU actors for one CPU (compiling is CPU work) and a
    fraction ``gpus_per_worker`` of a GPU, so several share one GPU.

    ``inherited``: the environment the cluster's workers already have (an embedded Ray
    started from this process's, see ``raysetup.start_ray``).  Only variables that differ
    from it go into a ``runtime_env``, and none at all when nothing differs: an actor with
    a ``runtime_env`` cannot use the workers Ray prestarts, so each one waits for a fresh
    Python process (3.6-4.3 s each with 16 starting at once on the 16-core host)."""
    want = dict(worker_env() if env is None else env)
    if inherited is not None:
        want = {k: v for k, v in want.items() if inherited.get(k) != v}
    opts: dict[str, Any] = {"num_cpus": 1, "max_restarts": ACTOR_MAX_RESTARTS, "max_task_retries": 0}
    if want or inherited is None:
        opts["runtime_env"] = {"env_vars": want}
    if kind == GPU:
        opts["num_gpus"] = gpus_per_worker
    return opts


def pool_sizes(resources: dict, *, cpu_workers: int | None, gpu_workers: int | None,
               gpus_per_worker: float, n_cpu_tasks: int, n_gpu_tasks: int) -> dict[str, int]:
    """Actors per kind: explicit counts win; otherwise GPUs / gpus_per_worker GPU actors and
    the remaining CPUs as CPU actors; never more actors than tasks of that kind."""
    gpus = float(resources.get("GPU", 0) or 0)
    cpus = int(resources.get("CPU", 0) or 0)
    g = gpu_workers if gpu_workers is not None else int(math.floor(gpus / gpus_per_worker + 1e-9))
    g = min(g, n_gpu_tasks)
    c = cpu_workers if cpu_workers is not None else max(1, cpus - g)
    c = min(c, n_cpu_tasks)
    return {CPU: max(0, c), GPU: max(0, g)}


def embedded_cpus(host_cpus: int, *, cpu_workers: int | None, n_cpu_sigs: int, n_gpu_sigs: int) -> int | None:
    """How many CPUs an embedded Ray should advertise, sized from the work: the CPU actors
    the job can use (``cpu_workers`` when given, never more than its CPU signatures), at
    most the host's cores.  Ray starts one worker process per advertised CPU and holds
    ``ray.init`` until they have started, so a job of 1 actor on a 16-core host would
    otherwise start 16.  ``n_cpu_sigs`` is an upper bound (planning only drops work), so
    the pool is never smaller than :func:`pool_sizes` would make it.  None (Ray's
    default: every core) when the job has GPU signatures, whose actors take CPUs too."""
    if n_gpu_sigs or n_cpu_sigs <= 0:
        return None
    want = n_cpu_sigs if cpu_workers is None else min(cpu_workers, n_cpu_sigs)
    return max(1, min(int(host_cpus), int(want)))
