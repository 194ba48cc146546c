"""The wire and the actor's side of the fork server (:mod:`aoti_farm.workers.forkserver`).

Frames: a 4-byte big-endian length, then msgpack.  :func:`attach` connects, has the
server fork a compiling copy running ``CompileActor(**kwargs)``, and returns the
:class:`Client` through which the Ray actor forwards its calls.
"""

from __future__ import annotations

import os
import socket
import struct
import time

DEV = "fork_server"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place
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
    """``AOTI_FARM_DEV=fork_server=...``: "0" (off), "1" (on), or "auto"."""
    v = _dev(DEV)
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


class Client:
    """A connection to one forked child (the Ray actor's side)."""

    def __init__(self, sock: socket.socket, hello: dict):
        self.sock, self.pid, self.server_pid = sock, int(hello["pid"]), hello.get("server_pid")
        #: what the copy was forked with: {"imports": "all" | "torch", "threads_seen": [...]}
        self.server = hello.get("server") or {}

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
        send(s, {"actor": actor_kwargs, "ids": list(ids), "watch": os.getpid(), "env": dict(os.environ),
                 "cwd": os.getcwd()})
        hello = recv(s)
        if not hello.get("ok"):
            raise Lost(str(hello.get("error") or "refused"))
        s.settimeout(None)
        return Client(s, hello)
    except BaseException:
        s.close()
        raise
