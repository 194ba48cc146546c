"""Drills of the attacks around the shared cache that need real processes: the embedded
Ray's listeners and temp tree (attack 8), and the serving process's compile worker (it ends
with its parent, and one runs per host, device and cache namespace)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from aoti_farm.cache.store import Cache

from _procs import alive as _alive, wait_all_gone as _wait_gone, workers_of as _workers_of

REPO = Path(__file__).resolve().parents[2]


# --- 8. the embedded Ray ------------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def _listening(inodes: set[int]) -> list[tuple[str, int]]:
    """(address, port) of the TCP listeners among ``inodes`` (/proc/net/tcp and tcp6)."""
    import ipaddress

    from aoti_farm.metrics.exposition import parse_proc_net_tcp

    out = []
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}") as f:
            for hexaddr, port, _uid, inode in parse_proc_net_tcp(f.read()):
                if inode in inodes:
                    raw = b"".join(bytes.fromhex(hexaddr[i:i + 8])[::-1] for i in range(0, len(hexaddr), 8))
                    addr = ipaddress.ip_address(raw)
                    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                        addr = addr.ipv4_mapped
                    out.append((str(addr), port))
    return out


def test_drill_8_embedded_ray_is_private_and_on_loopback():
    """Its temp tree sits in a 0700 mkdtemp directory of ours (Ray makes its own 0777), not
    /tmp/ray; its node address is 127.0.0.1, and so every TCP port its processes listen on
    (GCS, raylet, workers, agents: Ray's gRPC servers bind 127.0.0.1 exactly when the node
    address is 127.0.0.1) is on loopback; both go when it stops."""
    import ray

    from aoti_farm.config import FarmConfig
    from aoti_farm.workers import raysetup

    if ray.is_initialized():
        pytest.skip("a Ray is already initialised in this process")
    mine_before = _socket_inodes(os.getpid())
    r, started = raysetup.start_ray(FarmConfig(), num_cpus=1)
    try:
        assert started

        @r.remote
        def pid():
            return os.getpid()

        worker = r.get(pid.remote())   # a worker process exists and serves
        procs = _descendants(os.getpid())
        assert worker in procs
        inodes = (_socket_inodes(os.getpid()) - mine_before).union(*(_socket_inodes(p) for p in procs))
        listeners = _listening(inodes)
        names = {open(f"/proc/{p}/comm").read().strip() for p in procs if os.path.exists(f"/proc/{p}/comm")}
        assert {"gcs_server", "raylet"} <= names, names
        assert len(listeners) >= 3, listeners   # GCS, raylet, the worker's own server at least
        wide = [(a, p) for a, p in listeners if not a.startswith("127.")]
        assert wide == [], f"the embedded Ray listens beyond loopback: {wide}"
        tmp = raysetup._RAY_TMP
        top = os.path.dirname(tmp)
        st = os.stat(top)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
        node = r._private.worker._global_node
        assert os.path.realpath(node.get_temp_dir_path()).startswith(os.path.realpath(top) + "/")
        assert node.node_ip_address == "127.0.0.1"
    finally:
        raysetup.stop_ray(r)
    assert not os.path.exists(top)


# --- workers end with their parents ----------------------------------------------------------


@pytest.fixture(scope="module")
def fp_id():
    from aoti_farm.fingerprint import fingerprint

    return fingerprint("cpu", {}).id


def _worker_cmd(cache_root: str, fp: str, parent: int | None, idle: float = 600) -> list[str]:
    cmd = [sys.executable, "-m", "aoti_farm.runtime.compile_worker", "--cache-dir", cache_root, "--fp-id", fp,
           "--idle", str(idle)]
    return cmd + (["--parent-pid", str(parent)] if parent else [])


def _wait_for(path: Path, text: bytes, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_bytes():
            return True
        time.sleep(0.2)
    return False


def test_worker_ends_when_its_parent_is_killed(tmp_path, fp_id):
    """The parent starts a worker (idle timeout 600 s), waits until it is ready, and is
    killed (no atexit, no stop()): the worker is gone within seconds."""
    cache = Cache(tmp_path / "c")
    cache.ensure()
    log = tmp_path / "worker.log"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        cmd = {_worker_cmd(str(cache.root), fp_id, None)!r} + ["--parent-pid", str(os.getpid())]
        p = subprocess.Popen(cmd, stdout=open({str(log)!r}, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert _wait_for(log, b'"ready"'), log.read_text()[-2000:]
        assert _alive(pid)
        parent.kill()
        parent.wait()
        assert _wait_gone([pid], 30) == [], "the compile worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in _workers_of(str(cache.root)):
            os.kill(p, 9)


def test_one_worker_per_host_device_and_namespace(tmp_path, fp_id):
    """A second worker for the same cache and device finds the first one's lock and exits
    at once (0, ``already-running``); the supervisor's probe sees the live one.  The second
    worker is asked first, with a short idle time: without the lock it would start, idle
    and exit (``idle-exit``), which the test tells apart from ``already-running``."""
    from aoti_farm.runtime.compile_worker import worker_lock_path
    from aoti_farm.runtime.supervisor import worker_alive

    cache = Cache(tmp_path / "c")
    cache.ensure()
    log = tmp_path / "a.log"
    a = subprocess.Popen(_worker_cmd(str(cache.root), fp_id, os.getpid()), stdout=open(log, "wb"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert _wait_for(log, b'"ready"'), log.read_text()[-2000:]
        b = subprocess.run(_worker_cmd(str(cache.root), fp_id, os.getpid(), idle=2), capture_output=True,
                           text=True, timeout=300)
        assert b.returncode == 0 and '"already-running"' in b.stdout, b.stdout + b.stderr
        assert '"start"' not in b.stdout, b.stdout
        assert worker_alive(worker_lock_path("cpu", str(cache.root), fp_id))
        assert a.poll() is None
    finally:
        a.kill()
        a.wait()
    assert not worker_alive(worker_lock_path("cpu", str(cache.root), fp_id))


def test_no_compile_worker_outlives_aoti_farm_run(tmp_path):
    """`aoti-farm run` of a program that misses and then ends abruptly (``os._exit``: no
    atexit, no hook shutdown) leaves no compile worker behind."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import os, time, torch
        for n in range(3, 9):
            torch.relu(torch.randn(n, 5))
        time.sleep(15)   # the worker starts and warms up meanwhile
        mine = 0
        for d in os.listdir("/proc"):
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            if b"aoti_farm.runtime.compile_worker" in cmd and str(os.getpid()).encode() in cmd:
                mine += 1
        print("workers", mine, flush=True)
        os._exit(0)
    """))
    cache = tmp_path / "c"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    r = subprocess.run([str(REPO / ".venv/bin/aoti-farm"), "run", "--cache-dir", str(cache), "--",
                        sys.executable, str(prog)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "workers 1" in r.stdout, r.stdout + r.stderr[-2000:]   # one started, and one only
    left = _wait_gone(_workers_of(str(cache)), 30)
    for p in left:
        os.kill(p, 9)
    assert left == [], "a compile worker outlived `aoti-farm run`"
