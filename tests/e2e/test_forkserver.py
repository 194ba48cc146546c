"""The fork server (workers/forkserver.py): one process imports torch, the CPU actors'
compiling copies are forked from it.  A real warm through it (a real compile) is
tests/e2e/test_warm_startup.py's; here: a copy ends with its actor; a server never forks while it
has another thread (the second import stage then leaves and the first serves, or the
actor compiles in its own process); the server ends with its driver.  Real processes
and sockets, no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from _procs import alive, wait_gone

from aoti_farm.workers import forkclient, forkserver

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")

_ACTOR = textwrap.dedent("""
    import json, sys, time
    from aoti_farm.workers import forkclient
    try:
        c = forkclient.attach(sys.argv[1], {"cache_root": sys.argv[2]}, ("actor-1", "node-1"))
    except Exception as e:
        print("refused", e, flush=True)
        sys.exit(3)
    print("forked", c.pid, c.server_pid, json.dumps(c.server), flush=True)
    time.sleep(600)
""")

#: A second stage's import that leaves a thread running (as the 16-core host's CUDA torch
#: 2.11 did after Inductor's imports).
_THREADED = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"


def _env(extra_path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != forkclient.SOCKET_VAR}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([extra_path] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _actor(path: str, cache: str, cwd: str | None = None) -> tuple[subprocess.Popen, list]:
    p = subprocess.Popen([sys.executable, "-c", _ACTOR, path, cache], stdout=subprocess.PIPE, text=True, cwd=cwd)
    return p, p.stdout.readline().strip().split(" ", 3)   # waits while the server imports


@pytest.fixture(scope="module")
def server():
    srv = forkserver.start(_env())
    assert srv is not None
    yield srv
    srv.stop()
    assert srv.proc.returncode is not None and not os.path.exists(srv.folder)


def test_a_forked_copy_has_everything_imported_and_ends_with_its_actor(server, tmp_path):
    """The scheduler's ray.kill of a stuck actor must not leave its compiler running."""
    import json

    actor, line = _actor(server.path, str(tmp_path / "cache"), cwd=str(tmp_path))
    try:
        assert line[:1] == ["forked"], line
        copy, server_pid, info = int(line[1]), int(line[2]), json.loads(line[3])
        assert os.readlink(f"/proc/{copy}/cwd") == str(tmp_path)   # works where its actor does
        # here both import stages stay single-threaded: the copies come from the second
        assert info == {"imports": "all", "threads_seen": []}, info
        assert copy not in (server_pid, actor.pid, server.proc.pid) and alive(copy)
        actor.send_signal(signal.SIGKILL)
        actor.wait(timeout=10)
        assert wait_gone(copy), "the copy outlived its actor"
        assert server.proc.poll() is None   # the server goes on serving the others
    finally:
        actor.kill()


def test_the_copy_runs_only_the_actors_calls_in_its_own_process(server, tmp_path):
    c = forkclient.attach(server.path, {"cache_root": str(tmp_path / "cache")}, ("a", "n"))
    try:
        assert c.pid not in (os.getpid(), server.proc.pid)
        with pytest.raises(RuntimeError, match="unknown call"):
            c.call("__init__")   # only the actor's calls (forkclient.METHODS)
        with pytest.raises(RuntimeError, match="TypeError"):
            c.call("compile_class", {}, 1, 2, 3)  # a call that raises there comes back as one line
    finally:
        c.close()
    assert wait_gone(c.pid), "the copy outlived its connection"


#: A second stage's import as on a CUDA build: Inductor's import asks
#: ``torch.cuda.is_available()``, and the CUDA driver's initialisation (here: the CUDA
#: runtime's device count, which a CPU build lacks, stood in for) starts a thread.
_CUDA_LIKE = textwrap.dedent("""
    import threading, time, torch
    def _driver_init():
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        return 0
    torch.cuda._is_compiled = lambda: True
    torch._C._cuda_getDeviceCount = _driver_init
    AVAILABLE = torch.cuda.is_available()
""")


def test_a_cuda_builds_availability_check_leaves_the_second_stage_single_threaded(tmp_path):
    """With the GPUs hidden (a CPU-only job's workers), the second stage still serves:
    the availability check starts no driver thread (seen on a GPU host)."""
    import json

    (tmp_path / "cuda_like_preload.py").write_text(_CUDA_LIKE)
    srv = forkserver.start({**_env(str(tmp_path)), "CUDA_VISIBLE_DEVICES": ""}, preload="cuda_like_preload")
    try:
        actor, line = _actor(srv.path, str(tmp_path / "cache"))
        actor.kill()
        assert line[:1] == ["forked"], line
        info = json.loads(line[3])
        assert info["imports"] == "all" and not info["threads_seen"], info
    finally:
        srv.stop()


def test_a_thread_after_the_second_import_stage_leaves_the_first_to_serve(tmp_path):
    """The second stage imports, finds a thread it did not have, and leaves; the first
    (torch only, single-threaded) forks the copies, which import the rest themselves."""
    import json

    (tmp_path / "threaded_preload.py").write_text(_THREADED)
    srv = forkserver.start(_env(str(tmp_path)), preload="threaded_preload")
    try:
        actor, line = _actor(srv.path, str(tmp_path / "cache"))
        actor.kill()
        assert line[:1] == ["forked"], line
        info = json.loads(line[3])
        assert info["imports"] == "torch" and info["threads_seen"], info
        assert "thread" in info["second_stage"], info
    finally:
        srv.stop()
    assert srv.proc.returncode == 0


def test_a_server_with_another_thread_refuses_and_the_actor_compiles_itself(tmp_path, monkeypatch):
    """Another thread already in the first stage: no fork at all; the actor falls back to
    its own process."""
    path = str(tmp_path / "s")
    code = _THREADED + "import sys\nfrom aoti_farm.workers.forkserver import serve\nsys.exit(serve(sys.argv[1]))\n"
    srv = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE, env=_env())
    try:
        out = subprocess.run([sys.executable, "-c", _ACTOR, path, str(tmp_path / "cache")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 3 and "refused" in out.stdout and "other thread" in out.stdout, out
        from aoti_farm.workers.compile_actor import CompileActor

        monkeypatch.setenv(forkclient.SOCKET_VAR, path)
        a = CompileActor(str(tmp_path / "cache"))
        assert a._attach_fork() is False and "other thread" in a.fork["error"], a.fork
        assert a._copy is None                  # its calls run here
        monkeypatch.setattr(forkclient, "CONNECT_WAIT_S", 0.5)
        monkeypatch.setenv(forkclient.SOCKET_VAR, str(tmp_path / "nothing-here"))
        b = CompileActor(str(tmp_path / "cache"))
        assert b._attach_fork() is False and "error" in b.fork, b.fork
        # a GPU actor or a test double's never asks
        assert CompileActor(str(tmp_path / "cache"), device="cuda")._attach_fork() is False
        assert CompileActor(str(tmp_path / "cache"), compiler_factory=object)._attach_fork() is False
    finally:
        srv.stdin.close()
        srv.wait(timeout=30)
    assert srv.returncode == 0   # its input closed (the driver gone): it ended


def test_a_lost_copy_makes_the_actor_compile_in_its_own_process(server, tmp_path, monkeypatch):
    from aoti_farm.workers.compile_actor import CompileActor

    a = CompileActor(str(tmp_path / "cache"))
    monkeypatch.setenv(forkclient.SOCKET_VAR, server.path)
    assert a._attach_fork() is True and a.fork["imports"] == "all"
    copy = a._copy.pid
    os.kill(copy, signal.SIGKILL)
    assert wait_gone(copy)
    assert a._forward("compile", {"key": "x"}, 1) is None   # the caller then compiles here
    assert a._copy is None and "lost" in a.fork and a.fork["pid"] == copy, a.fork


def test_the_first_stage_serves_when_the_second_dies(tmp_path):
    import json

    srv = forkserver.start(_env())
    try:
        actor, line = _actor(srv.path, str(tmp_path / "cache"))
        actor.kill()
        assert json.loads(line[3])["imports"] == "all", line
        second = int(line[2])   # the copy's parent: the second stage
        assert second != srv.proc.pid
        os.kill(second, signal.SIGKILL)
        assert wait_gone(second)
        actor, line = _actor(srv.path, str(tmp_path / "cache"))
        actor.kill()
        info = json.loads(line[3])
        assert int(line[2]) == srv.proc.pid and info["imports"] == "torch", line
        assert info["second_stage"] == "died while serving"
    finally:
        srv.stop()
