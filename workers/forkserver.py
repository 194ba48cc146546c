"""One import of torch per host: the CPU compile actors' processes are forked from it.

On the 16-core GPU host (run 17, 2026-11-27) each of 16 CPU actors imported torch,
Inductor and the compile path itself: 6 s each with 16 at once (3.6 s alone), about
90 CPU-seconds in all, while Ray was starting and the first compiles waited.  One
process that has imported them forks a copy per actor instead: a fork costs
milliseconds and no import.

The server (``python -m aoti_farm.workers.forkserver SOCKET``) is started by the warm
driver beside its embedded Ray (:func:`aoti_farm.workers.raysetup.start_ray`), with the
environment Ray's workers get.  It listens on a Unix socket in a private (0700)
directory before it imports, so an early actor waits in the backlog; then it imports
what a compile actor imports (:mod:`aoti_farm.workers.actor_preload`) and forks one
child per connection.  A fork copies only the forking thread.  The server forks only
while it runs no other Python thread (one could hold a lock the copy then needs);
otherwise it refuses the connection and the actor compiles in its own process, as it
would without a server.  It runs nothing parallel (no OpenMP team exists to be lost),
and numpy's OpenBLAS pool is kept from starting (``OPENBLAS_NUM_THREADS=1``; OpenBLAS
also stops it before a fork).  A library's idle native thread (the 16-core host's CUDA
build of torch 2.11 starts one during these imports, run 17) is not in the copies,
which compile on the CPU only; each copy reports the server's other threads by name.
It exits when its standard input closes (the driver gone) and never runs a compile.

Each child serves one :class:`~aoti_farm.workers.compile_actor.CompileActor`: the Ray
actor (its "proxy") sends its constructor's values, its Ray ids and its environment,
then one call per message; the child runs them on a real ``CompileActor`` in its own
process (Ray is never imported there).  The child ends when the socket closes or the
proxy's process is gone (the scheduler's ``ray.kill`` of a stuck actor), so a forked
compiler never outlives its actor.

Frames: a 4-byte big-endian length, then msgpack.  The proxy's side is :class:`Client`.
``AOTI_FARM_FORK_SERVER``: ``0`` off, ``1`` on wherever an embedded Ray's job has only
CPU signatures (also on a 2-core host, for the tests), default: on from
:data:`~aoti_farm.workers.warm.PREP_MIN_CORES` cores.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import threading
import time

ENV = "AOTI_FARM_FORK_SERVER"
#: Where an embedded Ray's workers find the server (set in the environment they inherit).
SOCKET_VAR = "AOTI_FARM_FORK_SOCKET"
#: The calls a child runs on its CompileActor.
METHODS = ("warmup", "compile", "compile_class", "info")
_HDR = struct.Struct(">I")
#: How long an actor waits for a just-started server to listen.
CONNECT_WAIT_S = 20.0
#: The largest frame either side accepts (a compile's outcome is a few KiB).
MAX_FRAME = 64 << 20


def mode() -> str:
    """``AOTI_FARM_FORK_SERVER``: "0" (off), "1" (on), or "auto"."""
    v = os.environ.get(ENV, "auto")
    return v if v in ("0", "1") else "auto"


def inherited_socket() -> str | None:
    """The server's socket an embedded Ray gave this worker, or None."""
    return os.environ.get(SOCKET_VAR) or None


class Lost(Exception):
    """The other side closed or broke the connection."""


def send(sock: socket.socket, obj) -> None:
    import msgpack

    data = msgpack.packb(obj, default=str, use_bin_type=True)
    sock.sendall(_HDR.pack(len(data)) + data)


def recv(sock: socket.socket):
    import msgpack

    (n,) = _HDR.unpack(_read(sock, _HDR.size))
    if n > MAX_FRAME:
        raise Lost(f"a frame of {n} bytes")
    return msgpack.unpackb(_read(sock, n), raw=False, strict_map_key=False)


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        b = sock.recv(min(n - len(buf), 1 << 20))
        if not b:
            raise Lost("connection closed")
        buf += b
    return bytes(buf)


def _native_threads() -> list[str]:
    """The names of this process's OS threads other than the calling one."""
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
        pass
    return out


# -- the proxy's side ---------------------------------------------------------------

class Client:
    """A connection to one forked child (the Ray actor's side)."""

    def __init__(self, sock: socket.socket, pid: int, server_pid: int | None, server_threads: list | None = None):
        self.sock, self.pid, self.server_pid = sock, pid, server_pid
        self.server_threads = server_threads or []

    def call(self, method: str, *args):
        """The child's answer to ``method(*args)``; raises :class:`Lost` where the child
        is gone, RuntimeError with its one line where the call raised there."""
        try:
            send(self.sock, {"m": method, "a": list(args)})
            out = recv(self.sock)
        except (OSError, struct.error, ValueError) as e:
            raise Lost(f"{type(e).__name__}: {e}") from None
        if "e" in out:
            raise RuntimeError(out["e"])
        return out.get("r")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def attach(path: str, actor_kwargs: dict, ids: tuple[str, str], timeout: float = 120.0) -> Client:
    """Connect to the server at ``path`` and have it fork a child running
    ``CompileActor(**actor_kwargs)``; raises :class:`Lost` (or OSError) where it cannot.
    ``timeout`` bounds the wait for the fork (the server may still be importing)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        end = time.monotonic() + min(timeout, CONNECT_WAIT_S)
        while True:   # a server just started may not listen yet
            try:
                s.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        send(s, {"actor": actor_kwargs, "ids": list(ids), "watch": os.getpid(), "env": dict(os.environ)})
        hello = recv(s)
        if not hello.get("ok"):
            raise Lost(str(hello.get("error") or "refused"))
        s.settimeout(None)
        return Client(s, int(hello["pid"]), hello.get("server_pid"), hello.get("server_threads"))
    except BaseException:
        s.close()
        raise


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


def start(env: dict) -> Server | None:
    """Start a server with environment ``env``; None where it cannot be started."""
    import subprocess
    import tempfile

    # numpy's OpenBLAS starts a pool of threads when torch imports it; a server with them
    # may not fork (compiles use torch's own BLAS, never numpy's)
    env = {"OPENBLAS_NUM_THREADS": "1", **env}
    try:
        folder = tempfile.mkdtemp(prefix="aoti-farm-fork-")   # 0700: only this user connects
        path = os.path.join(folder, "s")
        with open(os.path.join(folder, "server.log"), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "aoti_farm.workers.forkserver", path],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                    close_fds=True)
        return Server(proc, path, folder)
    except OSError:
        return None


# -- the server and its children ----------------------------------------------------

def serve(path: str) -> int:
    """The server's main loop (see the module's doc)."""
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(path)
    lst.listen(256)   # actors that come before the imports end wait here
    from aoti_farm.workers import actor_preload   # noqa: F401 -- the import is the point

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children are reaped by the kernel
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([lst, stdin], [], [])
        if stdin in ready and not os.read(stdin, 4096):
            return 0   # the driver closed our input (or is gone)
        if lst not in ready:
            continue
        conn, _ = lst.accept()
        if threading.active_count() != 1:
            _refuse(conn, f"the fork server runs {threading.active_count()} Python threads; "
                          "compiling in the actor's own process")
            continue
        global _SERVER_THREADS
        _SERVER_THREADS = _native_threads()
        try:
            pid = os.fork()
        except OSError as e:
            _refuse(conn, f"fork failed: {e}")
            continue
        if pid == 0:
            code = 1
            try:
                lst.close()
                code = _child(conn)
            finally:
                os._exit(code)
        conn.close()


#: The server's other OS threads when it forked (the copy has none of them): reported.
_SERVER_THREADS: list = []


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        recv(conn)
        send(conn, {"ok": False, "error": why})
    except Exception:  # noqa: BLE001 -- the actor finds out anyway
        pass
    conn.close()


def _child(conn: socket.socket) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # the compilers' children are waited for
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    hello = recv(conn)
    # the actor's environment (Ray's worker settings, e.g. OMP_NUM_THREADS) is this process's
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in (hello.get("env") or {}).items()})
    os.environ.pop(SOCKET_VAR, None)
    _apply_threads()
    _watch(int(hello["watch"]))
    from aoti_farm.workers.compile_actor import CompileActor

    actor = CompileActor(**hello["actor"])
    actor.forked_ids = tuple(hello.get("ids") or ("", ""))
    send(conn, {"ok": True, "pid": os.getpid(), "server_pid": os.getppid(), "server_threads": _SERVER_THREADS})
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
    """End this child when the process ``pid`` (its actor) is gone."""
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


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
