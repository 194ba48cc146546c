"""Per-host preparation: what every first CPU compile on a host would build, built once.

On a fresh host (or a fresh Inductor cache) the first AOTInductor compile pays for steps
that are the same for every signature and every process of the host:

* the CPU vector-ISA probe (:func:`aoti_farm.fingerprint.host_isa_memo`: Inductor's check
  builds, recorded so that other processes replay them);
* Inductor's precompiled headers for the wrapper and the kernels (built under Inductor's
  own file lock into its global header directory);
* the split build's common object (:mod:`aoti_farm.build.splitbuild`, under its lock);
* the libstdc++ loader probe (:mod:`aoti_farm.startup.loadenv`).

When 16 actors start together, each one's first compile would queue behind whichever
process builds these.  :func:`prepare` builds them all with one real compile of a
trivial signature (``relu`` of four floats, the farm's own compiler and Inductor
options, never published), in the ``warm`` driver while Ray and the actors start (see
:mod:`aoti_farm.workers.warm`).  The actors never wait for :func:`prepare` itself: a compile that
needs one of its products before it is ready waits on that product's own lock, exactly
as it would without this module.  So this changes only *when* the work is done and *how
often*, never what a compile uses.

:func:`prepare_in_child` runs it in a child process (``python -m aoti_farm.compile.hostprep``),
which is how ``warm`` uses it: in a thread of the driver, its imports and its compile
held the driver's interpreter lock while ``ray.init`` and the actors' creation needed it.

Once per host, toolchain and Inductor cache: a marker ``prep-<fingerprint id>.json`` in
the split build's directory of the Inductor cache records it (a marker that lies only
costs a first compile its usual work).  :func:`stats` counts the runs in this process.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings

from aoti_farm.startup import spawn
from aoti_farm.metrics.counters import Counters
from aoti_farm.security.fsutil import atomic_write

_counters = Counters("prepared", "skipped_done", "skipped_busy", "failed")


def stats() -> dict:
    return _counters.snapshot()


def _count(name: str) -> None:
    _counters.inc(name)


def _marker(fp_id: str) -> str:
    from aoti_farm.build import commonobj

    return os.path.join(commonobj.common_dir(), f"prep-{fp_id}.json")


def prepare(inductor_options: dict | None = None, compiler_factory=None) -> dict:
    """Build this host's per-host compile products once (see the module doc).  Returns
    ``{"status": "prepared"|"done"|"busy"|"failed", "seconds": ..., ...}``; never raises."""
    t0 = time.perf_counter()
    # torch's notices about its own internal APIs (pytree, export): nothing a user can act on
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        from filelock import FileLock, Timeout

        from aoti_farm import signature as S
        from aoti_farm.compile.compiler import AOTICompiler
        from aoti_farm.fingerprint import fingerprint, host_isa_memo
        from aoti_farm.compile.compiler import import_compile_path

        import_compile_path()   # while a fresh host's ISA probe runs (mostly subprocesses)
        host_isa_memo(need_checks=True)
        comp = (compiler_factory or AOTICompiler)(inductor_options)
        fp = fingerprint("cpu", comp.options())
        marker = _marker(fp.id)
        if os.path.exists(marker):
            _count("skipped_done")
            return {"status": "done", "seconds": time.perf_counter() - t0}
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        lock = FileLock(marker + ".lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:   # another process prepares: nobody waits for it here
            _count("skipped_busy")
            return {"status": "busy", "seconds": time.perf_counter() - t0}
        try:
            if os.path.exists(marker):
                _count("skipped_done")
                return {"status": "done", "seconds": time.perf_counter() - t0}
            import torch

            sig = S.from_call(torch.ops.aten.relu.default, (torch.empty(4),), {})
            with tempfile.TemporaryDirectory(prefix="aoti-farm-hostprep-") as d:
                res = comp.compile(sig, d)
            out = {"status": "prepared", "seconds": time.perf_counter() - t0, "build": res.build,
                   "phases": res.phases}
            _write_marker(marker, fp.id, res.build)
            _count("prepared")
            return out
        finally:
            lock.release()
    except Exception as e:  # noqa: BLE001 -- the actors' first compiles do the work instead
        _count("failed")
        return {"status": "failed", "seconds": time.perf_counter() - t0,
                "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _write_marker(marker: str, fp_id: str, build) -> None:
    """The per-host marker: this fingerprint's products are built (atomic)."""
    atomic_write(marker, json.dumps({"fp_id": fp_id, "at": time.time(), "build": build}).encode())


def prepare_in_child(inductor_options: dict | None = None, timeout: float = 900.0) -> dict:
    """:func:`prepare` in a child process (this interpreter, this environment); the same
    answer, plus ``"child": True``.  Never raises: a child that fails or says nothing is
    ``{"status": "failed", "error": ...}``."""
    import subprocess

    t0 = time.perf_counter()
    try:
        p = subprocess.run(spawn.python("-m", "aoti_farm.compile.hostprep", json.dumps(inductor_options or {})),
                           capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        for line in reversed(p.stdout.splitlines()):
            if line.startswith(_REPLY):
                out = json.loads(line[len(_REPLY):])
                out["child"] = True
                return out
        why = f"exit {p.returncode}: {' '.join((p.stderr or '').split())[-200:]}"
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return {"status": "failed", "seconds": time.perf_counter() - t0, "error": why, "child": True}


def start_native_build():
    """Start building the hit path's extension (``runtime/fastpath.cpp``,
    :mod:`aoti_farm.speedgate.hitpath`) in a detached child, where it is not built yet and
    not disabled; the child (``python -m aoti_farm.runtime.native build``) or None.

    Every compile times its kernel as the hook serves it, through that extension
    (:func:`aoti_farm.speedgate.speed.time_served_call`).  On a fresh host the first compile
    to reach that step builds it (one g++ process: 15-25 s on the 16-core H200 hosts), and
    every other compile waits on its lock meanwhile: the cores stand idle.  Started at
    ``warm``'s start instead, the build overlaps Ray's start, the actors' imports and the
    first compiles; they wait on the same lock only for what is left of it.  It changes
    when the extension is built, never what is built or used (the same command and lock
    as a first hooked program's build).  The child outlives a ``warm`` that ends first, so
    the host's extension is never left half-built (the build writes a temporary file and
    renames it)."""
    import subprocess

    from aoti_farm.speedgate import hitpath

    if hitpath.disabled() or hitpath.library_path().exists():
        return None
    try:
        return subprocess.Popen(spawn.python("-m", "aoti_farm.runtime.native", "build"), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except (OSError, ValueError):   # the first compile builds it, as before
        return None


#: Marks the child's answer line (anything else it prints is skipped).
_REPLY = "aoti-farm-hostprep: "


def isa_memo_known() -> bool:
    """Whether this host has its ISA memo (a fresh host has none: :class:`IsaChild`
    helps), decided without importing torch (:mod:`aoti_farm.startup.hostid`); False where it
    cannot tell."""
    from aoti_farm.startup import hostid

    git = hostid.torch_git_version()
    if git is None:
        return False
    try:
        return hostid.read_isa_memo(hostid.isa_memo_path(git)) is not None
    except Exception:  # noqa: BLE001 -- an unsafe private directory (memo_dir raises): not known
        return False


class IsaChild:
    """A fresh host's ISA probe (:func:`aoti_farm.fingerprint.host_isa_memo`, with its
    check answers) in a child process (``python -m aoti_farm.compile.hostprep --isa``), which
    writes the host's memo; the caller's own :func:`~aoti_farm.fingerprint.fingerprint`
    then reads it.  For ``warm``'s planner: probing in the driver imports Inductor there
    (6.3 s of compiling modules from source on the 16-core GPU host), holding the
    driver's interpreter lock while ``import ray`` and ``ray.init`` need it
    (``import ray`` 2.4 s and ``ray.init`` 6.7 s there, against 0.9 s and 5.1 s alone).

    The child starts when this object is made and is awaited by :meth:`result`, so that
    ``warm`` can start it before its own imports (the child still finds a memo that
    another process wrote meanwhile, and only reads it).  A child whose answer is not
    wanted (the command failed first) is stopped by :meth:`cancel`; the memo is written
    by rename, so a stopped probe leaves none half-written."""

    def __init__(self) -> None:
        import subprocess

        self.t0 = time.time()
        self.end: float | None = None
        self._answer: dict | None = None
        try:
            self._proc = subprocess.Popen(spawn.python("-m", "aoti_farm.compile.hostprep", "--isa"),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          stdin=subprocess.DEVNULL)
        except (OSError, ValueError) as e:
            self._proc = None
            self._answer = {"status": "failed", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}

    def result(self, timeout: float = 900.0) -> dict:
        """The child's answer (waits for it).  Never raises: ``{"status":
        "probed"|"known"|"failed", "seconds", ...}``; after a failure the caller probes
        in-process as before (under the same lock)."""
        import subprocess

        if self._answer is None:
            try:
                out, err = self._proc.communicate(timeout=timeout)
                for line in reversed(out.splitlines()):
                    if line.startswith(_REPLY):
                        self._answer = json.loads(line[len(_REPLY):])
                        break
                else:
                    self._answer = {"status": "failed",
                                    "error": f"exit {self._proc.returncode}: {' '.join((err or '').split())[-200:]}"}
            except (OSError, ValueError, subprocess.SubprocessError) as e:
                self.cancel()
                self._answer = {"status": "failed", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
            self.end = time.time()
        return {**self._answer, "seconds": round((self.end or time.time()) - self.t0, 2)}

    def cancel(self) -> None:
        """Stop the child if it still runs (never raises)."""
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
                self._proc.communicate(timeout=30)
        except Exception:  # noqa: BLE001 -- a child already gone
            pass


def _isa_main() -> dict:
    try:
        t0 = time.perf_counter()
        from aoti_farm.fingerprint import host_isa_memo, host_steps

        t1 = time.perf_counter()
        memo = host_isa_memo(need_checks=True)
        steps = host_steps()
        # where the child's time goes: torch (and aoti_farm), then the probe (Inductor's import, checks)
        return {"status": "probed" if steps.get("isa_probe") else "known", "isa": memo.get("isa"), "steps": steps,
                "import_s": round(t1 - t0, 2), "probe_s": round(time.perf_counter() - t1, 2), "done_at": time.time()}
    except Exception as e:  # noqa: BLE001 -- told to the parent, which probes itself
        return {"status": "failed", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--isa"]:
        print(_REPLY + json.dumps(_isa_main(), default=str), flush=True)
        return 0
    opts = json.loads(argv[0]) if argv else {}
    print(_REPLY + json.dumps(prepare(opts or None), default=str), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
