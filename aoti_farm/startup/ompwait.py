"""The OpenMP wait policy of the processes that compile and verify kernels.

Verification runs a CPU kernel and eager at every intra-op thread count the kernel may be
served at (:func:`aoti_farm.compile.verify.verify_thread_counts`: 1, 2 and the host's cores), so
a compile process opens OpenMP regions as wide as the host while every core is compiling.
libgomp's default lets a thread that waits at a region's barrier spin for about 3 ms
(``GOMP_SPINCOUNT`` 300,000) before it sleeps.  On a host whose cores are all busy, a
region's threads wait for each other to be scheduled, and each of them spins meanwhile:
CPU taken from the compiles beside it.  ``OMP_WAIT_POLICY=PASSIVE`` makes a waiting thread
sleep at once.  The A/B (on and off in one run, 16 actors) is in docs/benchmarks.md.

The policy changes how a thread waits, never how a loop is split among threads (torch's
and Inductor's regions partition by thread count alone), so a kernel's and eager's
results are the same under either policy: ``tests/e2e/test_ompwait_differential.py``
compares them bit for bit.  libgomp reads the variable once, when it is loaded, so it goes
into the environment a compile process *starts* with: the compile actors'
(``workers/placement.worker_env``, which an embedded Ray's workers and the fork server
inherit), their verification children's (inherited), and the hook's compile worker's
(``runtime/supervisor.worker_env``).  A serving process keeps its own.

A policy the environment already names is kept (a user's choice); ``AOTI_FARM_DEV=
omp_passive=0`` leaves libgomp's default, for the A/B.
"""

from __future__ import annotations

from typing import Mapping

from aoti_farm import config

VAR = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
DEV = "omp_passive"


def compile_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The wait-policy variable a compile process started from ``environ`` gets: the
    policy ``environ`` names, else the passive one; none under ``omp_passive=0``."""
    if environ.get(VAR):
        return {VAR: environ[VAR]}
    if config.dev(DEV, environ) == "0":
        return {}
    return {VAR: PASSIVE}
