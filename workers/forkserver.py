"""One import of torch per host: the CPU compile actors' processes are forked from it.

On a 16-core GPU host each of 16 CPU actors imported torch,
Inductor and the compile path itself: 6 s each with 16 at once (3.6 s alone), about
90 CPU-seconds in all, while Ray was starting and the first compiles waited.  One
process that has imported them forks a copy per actor instead: a fork costs
milliseconds and no import.

The server (``python -m aoti_farm.workers.forkserver SOCKET``) is started by the warm
driver beside its embedded Ray (:func:`aoti_farm.workers.raysetup.start_ray`), with the
environment Ray's workers get.  It listens on a Unix socket in a private (0700)
directory before it imports, so an early actor waits in the backlog.

**It never forks while it has another thread.**  A fork copies only the forking
thread; another one (an OpenMP team, a library's helper) could hold a lock the copy then
needs, or be missing when the copy calls on it.  So the imports come in two stages:

1. ``import torch``, with numpy's OpenBLAS pool kept from starting
   (``OPENBLAS_NUM_THREADS=1``; compiles use torch's own BLAS).
2. A fork of that single-threaded server imports the rest
   (:mod:`aoti_farm.workers.actor_preload`: Inductor and the compile path).  If it is
   still single-threaded it serves the actors.  Otherwise it leaves, and the first stage
   serves: each copy then imports the rest itself.  The first stage also takes over if
   the second dies while serving.

On a CUDA build, Inductor's import asks ``torch.cuda.is_available()``
(``torch/_inductor/runtime/benchmarking.py``), which by default initialises the CUDA
driver, and the driver starts a thread (``cuda00001400006``) even with every GPU hidden:
seen on a 16-core host with torch 2.11+cu130, where it made every copy
import Inductor itself.  The server runs with ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, torch's
documented way to answer that question without the driver (without "poisoning fork");
with the GPUs hidden (a CPU-only job's workers, :func:`~aoti_farm.workers.raysetup.start_ray`)
the answer, no GPU, is the same and nothing is initialised.  The copies take their
actor's environment, which does not carry it.

Each copy reports which (``"imports": "all" | "torch"``) and the second stage's other
threads by name.  A server with another thread at a fork refuses the connection, and
the actor compiles in its own process, as it would without a server.  The server exits
when its standard input closes (the driver gone) and never runs a compile.

Each copy serves one :class:`~aoti_farm.workers.compile_actor.CompileActor`: the Ray
actor (its "proxy") sends its constructor's values, its Ray ids and its environment,
then one call per message (:mod:`aoti_farm.workers.forkclient`); the copy runs them on
a real ``CompileActor`` in its own process (Ray is never imported there).  The copy
ends when the socket closes or the proxy's process is gone (the scheduler's ``ray.kill``
of a stuck actor), so a forked compiler never outlives its actor.

``AOTI_FARM_DEV=fork_server=...``: ``0`` off, ``1`` on wherever an embedded Ray's job has only
CPU signatures (also on a 2-core host, for the tests), default: on from
:data:`~aoti_farm.workers.warm.PREP_MIN_CORES` cores.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time

from aoti_farm.startup import spawn
from .forkclient import METHODS, SOCKET_VAR, Lost, recv, send

#: A copy's process name (``/proc/PID/comm``, at most 15 characters).
COPY_NAME = "aoti-farm-copy"
#: What the second stage imports (what a compile actor imports before its first compile).
PRELOAD = "aoti_farm.workers.actor_preload"


def _other_threads() -> list[str]:
    """The names of this process's OS threads other than the calling one (Python's own
    count misses native ones)."""
    me = str(threading.get_native_id())
    out = []
    try:
        for t in os.listdir("/proc/self/task"):
            if t != me:
                try:
                    with open(f"/proc/self/task/{t}/comm") as f:
                        out.append(f.read().strip())
                except OSError:
                    out.append("?")
    except OSError:
        if threading.active_count() != 1:
            out.append("python")
    return out


# -- the driver's side --------------------------------------------------------------

class Server:
    """A started server process (the driver's handle)."""

    def __init__(self, proc, path: str, folder: str):
        self.proc, self.path, self.folder = proc, path, folder

    def stop(self, grace: float = 2.0) -> None:
        """Close its input (it exits), kill it after ``grace`` s, remove its folder."""
        import shutil

        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=grace)
        except Exception:  # noqa: BLE001 -- still running: kill it
            try:
                self.proc.kill()
                self.proc.wait(timeout=grace)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(self.folder, ignore_errors=True)


def start(env: dict, preload: str = PRELOAD) -> Server | None:
    """Start a server with environment ``env``; None where it cannot be started.
    ``preload``: the second stage's import (the tests name another)."""
    import subprocess
    import tempfile

    # see the module's doc: no OpenBLAS pool (stage 1), no CUDA driver thread (stage 2)
    env = {"OPENBLAS_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1", **env}
    try:
        folder = tempfile.mkdtemp(prefix="aoti-farm-fork-")   # 0700: only this user connects
        path = os.path.join(folder, "s")
        with open(os.path.join(folder, "server.log"), "wb") as log:
            # the driver's working directory is not on its import path (aoti_farm.startup.spawn: a
            # module there must not shadow torch); each copy works in its actor's directory (_copy)
            proc = subprocess.Popen(spawn.python("-m", "aoti_farm.workers.forkserver", path, preload),
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                    close_fds=True)
        return Server(proc, path, folder)
    except OSError:
        return None


# -- the server ---------------------------------------------------------------------

def serve(path: str, preload: str = PRELOAD) -> int:
    """The server (see the module's doc); returns when its input closes."""
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(path)
    lst.listen(256)   # actors that come before the imports end wait here
    stdin = sys.stdin.fileno()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    from aoti_farm.startup import notices

    notices.drop(notices.TORCH_NOTICES)
    import torch  # noqa: F401 -- stage 1

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children are reaped by the kernel
    info = {"imports": "torch", "threads_seen": _other_threads()}
    if not info["threads_seen"]:
        second = _second_stage(preload)
        if second is None:   # this process is the second stage: everything imported, one thread
            return _accept_loop(lst, stdin, {"imports": "all", "threads_seen": []})
        if second.get("ok"):   # the second stage serves; this one waits for the end, then for it
            if not _wait_end(stdin, second.get("pidfd")):
                # the second stage died serving: this one serves (the copies import the rest)
                return _accept_loop(lst, stdin, {**info, "second_stage": "died while serving"})
            try:
                os.waitpid(second["pid"], 0)   # (SIGCHLD ignored: returns, or fails, once it has exited)
            except ChildProcessError:
                pass
            return 0
        info["threads_seen"] = second.get("threads") or []
        info["second_stage"] = second.get("why")
    return _accept_loop(lst, stdin, info)


def _second_stage(preload: str) -> dict | None:
    """Fork; the child imports ``preload`` and serves if still single-threaded (then
    returns None, in the child, when done).  In the parent: the child's verdict
    ``{"ok", "threads", "why"}``."""
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        return {"ok": False, "why": f"fork failed: {e}"}
    if pid == 0:
        os.close(r)
        verdict: dict = {"ok": False}
        try:
            import importlib

            mod = importlib.import_module(preload)
            others = _other_threads()
            err = getattr(mod, "ERROR", None)
            verdict = {"ok": not others and not err, "threads": others,
                       "why": err or (f"{len(others)} more thread(s) after its imports" if others else None)}
        except BaseException as e:  # noqa: BLE001 -- the first stage serves
            verdict = {"ok": False, "why": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(verdict).encode())
        os.close(w)
        if not verdict["ok"]:
            os._exit(0)
        return None
    os.close(w)
    try:   # opened at once: it stays this child's even after the kernel reaps it
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    try:
        return {**json.loads(b"".join(chunks).decode()), "pid": pid, "pidfd": pidfd}
    except ValueError:
        return {"ok": False, "why": "the second stage died while importing", "pid": pid}


def _wait_end(stdin: int, pidfd: int | None) -> bool:
    """Wait until the input closes (True) or the process behind ``pidfd`` ends (False)."""
    fds = [stdin] + ([pidfd] if pidfd is not None else [])
    while True:
        ready, _, _ = select.select(fds, [], [])
        if stdin in ready and not os.read(stdin, 4096):
            return True
        if pidfd is not None and pidfd in ready:
            return False


def _accept_loop(lst: socket.socket, stdin: int, info: dict) -> int:
    """Fork a copy per connection while single-threaded; refuse otherwise."""
    while True:
        ready, _, _ = select.select([lst, stdin], [], [])
        if stdin in ready and not os.read(stdin, 4096):
            return 0   # the driver closed our input (or is gone)
        if lst not in ready:
            continue
        conn, _ = lst.accept()
        others = _other_threads()
        if others:
            _refuse(conn, f"the fork server runs {len(others)} other thread(s) ({', '.join(sorted(set(others)))}); "
                          "compiling in the actor's own process")
            continue
        try:
            pid = os.fork()
        except OSError as e:
            _refuse(conn, f"fork failed: {e}")
            continue
        if pid == 0:
            code = 1
            try:
                lst.close()
                code = _copy(conn, info)
            finally:
                os._exit(code)
        conn.close()


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        recv(conn)
        send(conn, {"ok": False, "error": why})
    except Exception:  # noqa: BLE001 -- the actor finds out anyway
        pass
    conn.close()


def _copy(conn: socket.socket, info: dict) -> int:
    """A forked copy: serves one actor's calls until the connection closes."""
    try:   # its name in ps and top (and how the scaling benchmark tells it from the server)
        with open("/proc/self/comm", "w") as f:
            f.write(COPY_NAME)
    except OSError:
        pass
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # the compilers' children are waited for
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    hello = recv(conn)
    # the actor's environment (Ray's worker settings, e.g. OMP_NUM_THREADS) is this process's
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in (hello.get("env") or {}).items()})
    os.environ.pop(SOCKET_VAR, None)
    try:
        os.chdir(hello.get("cwd") or os.getcwd())
    except OSError:
        pass
    _apply_threads()
    _watch(int(hello["watch"]))
    from .compile_actor import CompileActor

    actor = CompileActor(**hello["actor"])
    actor.forked_ids = tuple(hello.get("ids") or ("", ""))
    send(conn, {"ok": True, "pid": os.getpid(), "server_pid": os.getppid(), "server": info})
    while True:
        try:
            msg = recv(conn)
        except (Lost, OSError):
            return 0
        m = msg.get("m")
        try:
            if m not in METHODS:
                raise ValueError(f"unknown call {m!r}")
            out = {"r": getattr(actor, m)(*msg.get("a", []))}
        except Exception as e:  # noqa: BLE001 -- the proxy gets one line
            out = {"e": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        try:
            send(conn, out)
        except OSError:
            return 0


def _apply_threads() -> None:
    """torch read OMP_NUM_THREADS when the server imported it; the actor's value applies."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return
    if n >= 1:
        import torch

        torch.set_num_threads(n)


def _watch(pid: int) -> None:
    """End this copy when the process ``pid`` (its actor) is gone."""
    def run() -> None:
        fd = None
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass
        while True:
            if fd is not None:
                if select.select([fd], [], [], 5.0)[0]:
                    os._exit(1)
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except OSError:
                pass
            time.sleep(0.5)

    threading.Thread(target=run, name="aoti-farm-actor-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    code = serve(argv[1], *argv[2:3])
    # no interpreter teardown (torch and Inductor loaded: about a second on 2 cores, which
    # the driver's shutdown would wait for); nothing is left to flush but the log
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
