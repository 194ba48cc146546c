"""docs/cluster.md, end to end: `scripts/cluster_job.sh` submits `aoti-farm warm` as a
Ray job (`ray job submit`, the dashboard's job server from `ray[default]`) to a real Ray
head on this machine, and the job compiles, verifies and publishes the kernel.

Two ways through the script, one real compile each:

* ``test_job_on_running_head``: the test starts a head (``ray start --head --block``) and
  the script finds it through ``RAY_ADDRESS`` and only submits;
* ``test_script_starts_head``: no cluster is running, so the script starts the head itself
  (``RAY_START_ARGS``) and then submits.

Ray 2.60 turns token authentication on when a token exists, and its CLI sends the token
only with ``RAY_AUTH_MODE=token``, which the script sets exactly when a token exists: the
first test runs with a token (``RAY_AUTH_TOKEN``), the second as on a fresh machine with
none (``HOME`` without ``~/.ray``), so its head runs without authentication.

Isolation from any other Ray on this host: every head gets its own temp dir and free
ports and is stopped by killing exactly its processes (never `ray stop`, which stops
every Ray on the host); ``~/.ray`` is neither read nor written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.compile.tolerance import compare
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.compiler import load_runner
from aoti_farm.fingerprint import fingerprint

from e2e.test_drills_util import kill_tree, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster_job.sh"
BIN = os.path.dirname(sys.executable)
RAY = os.path.join(BIN, "ray")

RELU = S.from_call(torch.ops.aten.relu.default, (torch.empty(4, 4),), {})
NEG = S.from_call(torch.ops.aten.neg.default, (torch.empty(4, 4),), {})


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Head:
    """Ports, temp dir, token and environment of one throwaway Ray head."""

    def __init__(self):
        (self.port, self.dash, self.client, self.agent, self.agent_grpc, self.env_agent, self.metrics,
         self.nm, self.om) = _free_ports(9)
        self.tmp = tempfile.mkdtemp(prefix="rcj-", dir="/tmp")  # short: Ray's unix sockets live under it
        self.token = secrets.token_hex(32)
        self.dashboard = f"http://127.0.0.1:{self.dash}"

    def start_args(self) -> list[str]:
        return ["--port", str(self.port), "--dashboard-port", str(self.dash), "--include-dashboard=true",
                "--ray-client-server-port", str(self.client), "--dashboard-agent-listen-port", str(self.agent),
                "--dashboard-agent-grpc-port", str(self.agent_grpc), "--runtime-env-agent-port", str(self.env_agent),
                "--metrics-export-port", str(self.metrics), "--node-manager-port", str(self.nm),
                "--object-manager-port", str(self.om), "--num-cpus", "2", "--object-store-memory", "200000000",
                "--disable-usage-stats"]

    def env(self, token: bool = True, **kw) -> dict:
        """No RAY_* or AOTI_FARM_* from outside; this head's own token, or none at all."""
        e = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AOTI_FARM_"))}
        e.update(RAY_USAGE_STATS_ENABLED="0", TORCHINDUCTOR_COMPILE_THREADS="1", PYTHONWARNINGS="ignore")
        if token:
            e["RAY_AUTH_TOKEN"] = self.token
        else:
            e["HOME"] = os.path.join(self.tmp, "home")   # no ~/.ray/auth_token
            os.makedirs(e["HOME"], exist_ok=True)
        e.update({k: str(v) for k, v in kw.items()})
        return e

    def processes(self) -> list[int]:
        """Every live process whose command line names this head's temp dir."""
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        if self.tmp.encode() in f.read():
                            out.append(int(d))
                except OSError:
                    pass
        return out

    def kill_leftovers(self) -> None:
        for pid in self.processes():
            kill_tree(pid)
        wait_for(lambda: not self.processes(), 30, 0.2)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def job_server_up(self) -> bool:
        req = urllib.request.Request(self.dashboard + "/api/jobs/", headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def dashboard_log(self) -> str:
        logs = list(Path(self.tmp).glob("**/logs/dashboard.*"))
        return "\n".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in logs) or "(no dashboard log)"


def _need_job_server():
    missing = [m for m in ("aiohttp", "aiohttp_cors", "opencensus") if importlib.util.find_spec(m) is None]
    # ray[default] is a required dependency (pyproject): its absence is a broken install
    assert not missing, (f"Ray's job server needs ray[default] (missing: {', '.join(missing)}); "
                         f"`pip install -e .` installs it")


def _trace(path: Path, sig) -> Path:
    entry = {"order": 0, "count": 1, "op": sig.op, "args": sig.to_obj()["args"]}
    path.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1, "entries": [entry]}))
    return path


def _run_script(head: Head, tmp_path: Path, sig, env: dict) -> tuple[subprocess.CompletedProcess, Path, Path]:
    trace, cache, report = _trace(tmp_path / "trace.json", sig), tmp_path / "cache", tmp_path / "report.json"
    env = {**env, "PATH": BIN + os.pathsep + env.get("PATH", ""),   # as in an activated venv
           "RAY_DASHBOARD_ADDRESS": head.dashboard,
           "AOTI_FARM_WARM_ARGS": f"--cpu-workers 1 --report {report}"}
    p = subprocess.run(["bash", str(SCRIPT), str(trace), str(cache)], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=240)
    return p, cache, report


def _check_published(p: subprocess.CompletedProcess, cache_dir: Path, report: Path, sig) -> None:
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "succeeded" in out, out[-4000:]
    rep = json.loads(report.read_text())["signatures"]
    assert [(r["key"], r["status"]) for r in rep] == [(sig.key, "compiled")], rep
    # the cache holds the kernel: listed, fully verified on open (hashes, fingerprint, key),
    # and it computes what eager computes
    fp = fingerprint("cpu")
    cache = Cache(cache_dir)
    assert cache.list_keys(fp.id) == {sig.key}
    assert cache.failed_keys(fp.id) == set()
    entry = cache.open_entry(fp, sig.key)
    args, kwargs = S.materialize(sig, seed=3)
    expected = S.resolve_op(sig.op)(*args, **kwargs)
    assert compare(expected, load_runner(entry.kernel_path, "cpu").run(flat_tensors(sig, args, kwargs))) is None


@pytest.fixture
def head(tmp_path):
    _need_job_server()
    h = Head()
    yield h
    h.kill_leftovers()


def test_job_on_running_head(head, tmp_path):
    """`ray start --head` (the test's), then the script: it finds the head and submits."""
    log = tmp_path / "head.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([RAY, "start", "--head", "--block", "--temp-dir", head.tmp, *head.start_args()],
                                stdout=f, stderr=subprocess.STDOUT, env=head.env(RAY_AUTH_MODE="token"),
                                start_new_session=True)
    try:
        up = wait_for(lambda: proc.poll() is not None or "Ray runtime started" in log.read_text(), 120, 0.2)
        if proc.poll() is not None or not up:
            pytest.fail("ray start --head failed:\n" + log.read_text()[-3000:])
        if not wait_for(head.job_server_up, 90, 0.5):
            pytest.skip("Ray's dashboard / job server did not come up on this machine:\n" + head.dashboard_log())
        p, cache, report = _run_script(head, tmp_path, RELU, head.env(RAY_ADDRESS=f"127.0.0.1:{head.port}"))
        assert "Local node IP" not in p.stdout + p.stderr, "the script started a second head"
        _check_published(p, cache, report, RELU)
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=60)


def test_script_starts_head(head, tmp_path):
    """No cluster and no token (a fresh machine): the script's own `ray start --head`, then
    the job."""
    # RAY_TMPDIR: where `ray status` looks for a running cluster and `ray start` puts its
    # temp dir, so the script neither sees nor disturbs another Ray on this host.
    env = head.env(token=False, RAY_TMPDIR=head.tmp, RAY_START_ARGS=" ".join(head.start_args()))
    p, cache, report = _run_script(head, tmp_path, NEG, env)
    if p.returncode != 0 and not head.job_server_up():
        pytest.skip("Ray's dashboard / job server did not come up on this machine:\n" + head.dashboard_log())
    assert "Ray runtime started" in p.stdout + p.stderr, (p.stdout + p.stderr)[-4000:]
    assert head.processes(), "no Ray process under the head's temp dir: did the script start its own head?"
    _check_published(p, cache, report, NEG)
