"""Whose fault a failed compile is: the host's, ours, or the signature's.

* the host's -- :func:`infrastructure_error` (disk full, out of memory, the C++ compiler
  killed): :class:`CompileInfraError`, retried and never recorded;
* ours -- :func:`own_code_error` (an exception whose innermost frame is aoti-farm's own
  code): recorded once with its traceback, never retried;
* the signature's -- what export and Inductor raise (:func:`_compile_errors`): a refusal.

Split out of :mod:`aoti_farm.compile.compiler`, which sorts every exception of a build
through here; ``job.compile_and_publish`` and the workers read the verdicts.
"""

from __future__ import annotations

import os
import subprocess

from aoti_farm.errors import FarmError


class CompileInfraError(FarmError):
    """A compile that failed for a reason outside the signature (disk full, the C++ compiler
    killed, out of memory): never recorded as a refusal; the farm retries it."""


#: Words of a C++ compiler's output that say the host failed it, not the code.
_INFRA_OUTPUT = ("No space left on device", "Disk quota exceeded", "Cannot allocate memory",
                 "virtual memory exhausted", "out of memory", "Killed signal terminated program",
                 "terminated signal", "Read-only file system", "Input/output error", "Too many open files",
                 "No working C++ compiler found")


def infrastructure_error(e: BaseException) -> str | None:
    """Why ``e`` (raised by a compile) is a failure of this host rather than of the
    signature, or None.  Walks Inductor's wrappers (``InductorError.inner_exception``,
    ``__cause__``/``__context__``): an ``OSError`` anywhere (disk full, quota, EIO, too many
    open files, the compiler binary gone), ``MemoryError``, a C++ compiler killed by a
    signal (OOM killer, a timeout) or reporting such a condition in its output."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return f"OSError errno {x.errno}" if x.errno else "OSError"
        if isinstance(x, MemoryError):
            return "out of memory"
        if isinstance(x, subprocess.CalledProcessError) and isinstance(x.returncode, int) and x.returncode < 0:
            return f"compiler killed by signal {-x.returncode}"
        if isinstance(x, subprocess.TimeoutExpired):
            return "compiler timed out"
        out = getattr(x, "output", None)
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        for text in (out if isinstance(out, str) else "", str(x)):
            hit = next((w for w in _INFRA_OUTPUT if w in text), None)
            if hit:
                return hit
        todo += [getattr(x, "inner_exception", None), x.__cause__, x.__context__]
    return None


#: Directories of aoti-farm's own code (the package; workers/ and runtime/ are mapped into it
#: as aoti_farm.workers and aoti_farm.runtime, see docs/DESIGN.md).
_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), d) + os.sep
                  for d in ("aoti_farm", "workers", "runtime"))

#: Longest traceback kept in a failure record.
TRACEBACK_MAX = 8000


def own_code_error(e: BaseException) -> dict | None:
    """Evidence that ``e`` (raised during a compile) is a bug of aoti-farm, or None.

    A bug: an exception whose innermost Python frame is aoti-farm's own code, that is not
    one of aoti-farm's deliberate errors (:class:`FarmError`: a refusal, an ineligible
    call) nor a failure of the host (:func:`infrastructure_error`).  An exception raised
    inside torch, Inductor or the C++ compiler is theirs (a refusal or an infrastructure
    failure), whoever called them.  A bug is deterministic: it is recorded once with its
    traceback and counted, never retried as infrastructure (a retry fails the same way
    and hides it).  Evidence: ``bug`` (True), ``exception`` ("KeyError: 0"), ``where``
    (file:line in function, relative to the checkout) and ``traceback`` (bounded)."""
    import traceback

    if (isinstance(e, (FarmError, RuntimeError)) or not isinstance(e, Exception)
            or infrastructure_error(e) is not None):
        # RuntimeError from our frame is torch's C++ (an op, a runner) or a deliberate
        # host condition ("CUDA ... on a worker without a GPU"): not a bug of ours
        return None
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = os.path.abspath(last.filename)
    if not path.startswith(_OWN_DIRS) or last.name == "forward":
        return None   # not ours; or OpModule.forward, where the op itself raised
    root = os.path.dirname(os.path.dirname(_OWN_DIRS[0]))
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"bug": True, "exception": f"{type(e).__name__}: {_first_line(e)}",
            "where": f"{os.path.relpath(path, root)}:{last.lineno} in {last.name}",
            "traceback": tb[-TRACEBACK_MAX:]}


def _compile_errors() -> tuple:
    """What export and Inductor raise for a signature they cannot compile (a refusal,
    unless :func:`infrastructure_error` blames the host)."""
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError, torch._inductor.exc.InductorError,
            NotImplementedError, AssertionError, TypeError, ValueError, RuntimeError, OSError, MemoryError)


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__
