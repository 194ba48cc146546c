"""What a compile actor imports before its first compile, imported by Ray's prestarted
worker processes themselves.

An embedded Ray sized to the pool (:func:`aoti_farm.workers.placement.embedded_cpus`)
starts one worker process per actor as soon as its raylet is up, while ``ray.init`` is
still returning and before any actor exists.  :func:`aoti_farm.workers.raysetup.start_ray`
names this module in Ray's ``RAY_preload_python_modules`` (each new worker imports the
listed modules before it accepts work), so torch, Inductor and the compile path are
imported there, in parallel with the rest of Ray's start and the actors' creation,
instead of in each actor's ``warmup()`` afterwards (which then finds them imported).

Importing this module is the warm-up.  It never raises: a failed import is left to the
actor's ``warmup()``, which imports the same modules and reports the error.  ``SPAN``
holds the wall-clock (start, end) of the imports, for the warm report's timeline.
"""

from __future__ import annotations

import os
import time
import warnings

SPAN: tuple[float, float] | None = None
ERROR: str | None = None


def _preload() -> None:
    global SPAN, ERROR
    t0 = time.time()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # the same notices the actor silences (CompileActor.__init__): nothing a user can act on
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        from aoti_farm.startup import notices

        notices.drop(notices.TORCH_NOTICES)
        import torch  # noqa: F401
        import torch._inductor  # noqa: F401
        from torch._inductor import codecache  # noqa: F401

        from aoti_farm.compile.compiler import import_compile_path

        import_compile_path()
    except Exception as e:  # noqa: BLE001 -- the actor's warmup() imports again and reports it
        ERROR = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    SPAN = (t0, time.time())


_preload()
