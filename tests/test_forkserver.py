"""The fork server (workers/forkserver.py): one process imports torch, the CPU actors'
compiling copies are forked from it.  A real warm through it (a real compile) is
tests/test_earlyray.py's; here: a copy ends with its actor, a server with another thread
refuses to fork and the actor compiles in its own process, and the server ends with its
driver.  Real processes and sockets, no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from aoti_farm.workers import forkserver

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")

_ACTOR = textwrap.dedent("""
    import sys, time
    from aoti_farm.workers import forkserver
    try:
        c = forkserver.attach(sys.argv[1], {"cache_root": sys.argv[2]}, ("actor-1", "node-1"))
    except Exception as e:
        print("refused", e, flush=True)
        sys.exit(3)
    print("forked", c.pid, c.server_pid, len(c.server_threads), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def server():
    env = {k: v for k, v in os.environ.items() if k != forkserver.SOCKET_VAR}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    srv = forkserver.start(env)
    assert srv is not None
    yield srv
    srv.stop()
    assert srv.proc.returncode is not None and not os.path.exists(srv.folder)


def test_a_forked_copy_ends_with_its_actor(server, tmp_path):
    """The scheduler's ray.kill of a stuck actor must not leave its compiler running."""
    actor = subprocess.Popen([sys.executable, "-c", _ACTOR, server.path, str(tmp_path / "cache")],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = actor.stdout.readline().split()   # waits while the server imports torch
        assert line[:1] == ["forked"], line
        copy, server_pid = int(line[1]), int(line[2])
        assert line[3] == "0"   # no other thread in the server here (numpy's OpenBLAS pool kept from starting)
        assert server_pid == server.proc.pid and copy not in (server_pid, actor.pid)
        assert _alive(copy)
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=10)
        assert _wait_gone(copy), "the copy outlived its actor"
        assert server.proc.poll() is None   # the server goes on serving the others
    finally:
        actor.kill()


def test_the_copy_runs_the_actors_calls_in_its_own_process(server, tmp_path):
    c = forkserver.attach(server.path, {"cache_root": str(tmp_path / "cache")}, ("a", "n"))
    try:
        assert c.pid not in (os.getpid(), server.proc.pid)
        with pytest.raises(RuntimeError, match="unknown call"):
            c.call("__init__")   # only the actor's calls (forkserver.METHODS)
        with pytest.raises(RuntimeError, match="TypeError"):
            c.call("compile_class", {}, 1, 2, 3)  # a call that raises there comes back as one line
    finally:
        c.close()
    assert _wait_gone(c.pid), "the copy outlived its connection"


def test_a_server_with_another_thread_refuses_and_the_actor_compiles_itself(tmp_path, monkeypatch):
    """A fork copies only the forking thread: a server running another Python thread
    (which may hold a lock the copy then needs) refuses, and the actor falls back to its
    own process."""
    path = str(tmp_path / "s")
    code = ("import threading, time, sys\n"
            "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "from aoti_farm.workers.forkserver import serve\n"
            "sys.exit(serve(sys.argv[1]))\n")
    srv = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE)
    try:
        out = subprocess.run([sys.executable, "-c", _ACTOR, path, str(tmp_path / "cache")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 3 and "refused" in out.stdout and "Python threads" in out.stdout, out
        from aoti_farm.workers.compile_actor import CompileActor

        monkeypatch.setenv(forkserver.SOCKET_VAR, path)
        a = CompileActor(str(tmp_path / "cache"))
        assert a._attach_fork() is False and "threads" in a.fork["error"], a.fork
        assert a._remote is None                  # its calls run here
        monkeypatch.setattr(forkserver, "CONNECT_WAIT_S", 0.5)
        monkeypatch.setenv(forkserver.SOCKET_VAR, str(tmp_path / "nothing-here"))
        b = CompileActor(str(tmp_path / "cache"))
        assert b._attach_fork() is False and "error" in b.fork, b.fork
        # a GPU actor or a test double's never asks
        assert CompileActor(str(tmp_path / "cache"), device="cuda")._attach_fork() is False
        assert CompileActor(str(tmp_path / "cache"), compiler_factory=object)._attach_fork() is False
    finally:
        srv.stdin.close()
        srv.wait(timeout=30)
    assert srv.returncode == 0   # its input closed (the driver gone): it ended


def test_a_lost_copy_makes_the_actor_compile_in_its_own_process(server, tmp_path):
    from aoti_farm.workers.compile_actor import CompileActor

    a = CompileActor(str(tmp_path / "cache"))
    os.environ[forkserver.SOCKET_VAR] = server.path
    try:
        assert a._attach_fork() is True
    finally:
        os.environ.pop(forkserver.SOCKET_VAR)
    copy = a._remote.pid
    os.kill(copy, signal.SIGKILL)
    assert _wait_gone(copy)
    assert a._forward("compile", {"key": "x"}, 1) is None   # the caller then compiles here
    assert a._remote is None and "lost" in a.fork and a.fork["pid"] == copy, a.fork
