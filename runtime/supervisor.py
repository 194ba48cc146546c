"""The serving hook's compile workers: start, watch and stop them.

With ``on_miss="compile"`` the hook keeps one compile worker *process* per device
(``python -m aoti_farm.runtime.compile_worker``, spawned, at the lowest priority: see
:func:`aoti_farm.startup.spawn.lowest_priority`) that drains the miss queue and exits when
idle.  A start that fails is retried at most every :data:`RETRY_SECONDS`.  The workers
(and the native path's background build, :meth:`WorkerSupervisor.watch_build`) write JSON
events to one log that this module follows: their busy/idle events set the serving
threads' limit (:mod:`.room`), and an outcome tells the poller to look at the index now.

:func:`worker_env` is the one place that builds a worker's environment: this process's,
minus the launcher's variables and any signing key variable, with one compile thread and
the libstdc++ preload where this host needs it.  The signing key reaches a worker as the
path of a file it reads itself (``--signing-key-file``, :func:`aoti_farm.config.key_file_for_children`),
never as an argument or a variable: both are visible to whatever else runs as this user
(``/proc/<pid>/cmdline``, ``environ``) and the variable to everything the worker starts.

One worker per host, device and cache namespace, shared by the host's serving processes
(of this user): the worker holds an exclusive ``flock`` on
``<private dir>/workers/<device>-<namespace>.lock`` (:func:`worker_lock_path`) for its
life, and a supervisor that finds it held starts none (a live worker drains the shared
queue for everyone; a worker that loses a start race exits at once).  A worker ends with
the process that started it (``PR_SET_PDEATHSIG`` and a parent watch, in
:mod:`aoti_farm.runtime.compile_worker`) and after ``--idle`` seconds without a compile,
whatever its queue still holds: the queue stays for ``serve`` or the next process.

The log the workers and the native build write is a file in this user's private
directory (:func:`aoti_farm.security.private.new_log`, ``mkstemp``), never a predictable name in a
shared one; a log the caller names is opened without following links, and only if it is
this user's (:func:`aoti_farm.security.private.open_append`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import threading
import time

from aoti_farm import config
from aoti_farm.startup import loadenv, ompwait, spawn
from aoti_farm.security import private
from aoti_farm.cache.store import Cache
from aoti_farm.metrics.counters import Counters
from .compile_worker import BUSY_EVENTS, read_events, worker_lock_path
from .room import ThreadRoom
from aoti_farm.startup.spawn import lowest_priority

log = logging.getLogger("aoti_farm.hook")

#: Seconds before a worker that could not be started is tried again.
RETRY_SECONDS = 10.0
#: Events after which a compile (or the worker) ended: the index may have changed.
ENDED_EVENTS = frozenset({"outcome", "error", "bad-item", "idle-exit", "terminated"})
#: The launcher's variables (``runtime/launch.py``): a worker is not a hooked program.
_LAUNCHER_VARS = ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD_DIR")


def worker_alive(lock_path: str) -> bool:
    """Whether a worker holds ``lock_path`` now (a live worker of another process, maybe)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def worker_env() -> dict[str, str]:
    """The environment of a compile worker started by this process."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.update(ompwait.compile_env(env))   # its verification opens regions of every core
    env = loadenv.child_env(env)
    env.pop("AOTI_FARM_SIGNING_KEY_FILE", None)   # the worker reads the file its hook names
    env.pop("AOTI_FARM_SIGNING_KEY", None)
    return env


class WorkerSupervisor:
    """The compile workers of one hook, per device, and the log they write."""

    def __init__(self, cache: Cache, fps: dict, inductor_options: dict, log_path: str, idle: float,
                 room: ThreadRoom, wake: threading.Event, memory_budget: int | None = None,
                 key_file: str | None = None):
        self.cache, self.fps, self.inductor_options = cache, fps, inductor_options
        self.key_file = key_file   # where the hook's signing key came from (None: bytes, or no key)
        self.memory_budget = memory_budget   # bytes per compile (the worker's --memory-budget); None: its default
        self.log_path, self.idle, self.room, self.wake = log_path, idle, room, wake
        self.last: subprocess.Popen | None = None          # the worker last started
        self._workers: dict[str, subprocess.Popen] = {}    # per device
        self._build: subprocess.Popen | None = None        # the native path's background build
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._state: dict[int, str] = {}                   # worker pid -> its last event
        self._log_pos, self._log_partial = max(self._log_size(), 0), b""
        self._shared_until: dict[str, float] = {}            # device -> when to look at its lock again
        self.counters = Counters("workers_started", "worker_errors", "worker_shared")

    def ensure(self, device: str) -> None:
        """A worker for ``device`` runs (started unless one does)."""
        with self._lock:
            w = self._workers.get(device)
            if w is not None and w.poll() is None:
                return
            now = time.monotonic()
            if now < self._retry_at:
                return  # the last start failed: not more often than every RETRY_SECONDS
            if now < self._shared_until.get(device, 0.0):
                return
            try:
                lock = worker_lock_path(device, str(self.cache.root), self.fps[device].id)
            except Exception as e:  # noqa: BLE001 -- no private dir: no worker (logged, counted)
                log.warning("cannot start the compile worker: %s", e)
                self._retry_at = now + RETRY_SECONDS
                self.counters.inc("worker_errors")
                return
            if worker_alive(lock):   # another serving process's worker drains the same queue
                self._shared_until[device] = now + 1.0
                self.counters.inc("worker_shared")
                return
            self._start(device)

    def command(self, device: str) -> list[str]:
        """The command line of a compile worker for ``device``: the hook's resolved settings
        as arguments, the signing key as the path of its file."""
        cmd = [*spawn.python("-m", "aoti_farm.runtime.compile_worker"), "--cache-dir", str(self.cache.root),
               "--device", device, "--fp-id", self.fps[device].id, "--idle", str(self.idle),
               "--inductor-options", json.dumps(self.inductor_options), "--parent-pid", str(os.getpid())]
        if self.cache.allow_insecure:
            cmd.append("--allow-insecure")
        if self.memory_budget:
            cmd += ["--memory-budget", str(int(self.memory_budget))]
        key_file = config.key_file_for_children(self.cache.signing_key, self.key_file)
        if key_file:
            cmd += ["--signing-key-file", key_file]
        return cmd

    def _start(self, device: str) -> None:
        cmd = self.command(device)
        try:
            logf = (open(os.devnull, "ab") if self.log_path == os.devnull
                    else os.fdopen(private.open_append(self.log_path), "ab"))
            try:
                # its own process group: a worker that ends takes its compiler children along
                self.last = self._workers[device] = subprocess.Popen(
                    cmd, env=worker_env(), stdin=subprocess.DEVNULL, stdout=logf,
                    stderr=logf, preexec_fn=lowest_priority, start_new_session=True)
            finally:
                logf.close()
            self.room.set_compiles(self.compiles_now())   # warming up from now
            self.wake.set()
        except Exception as e:  # noqa: BLE001
            log.warning("cannot start the compile worker: %s", e)
            self._retry_at = time.monotonic() + RETRY_SECONDS
            self.counters.inc("worker_errors")
            return
        self.counters.inc("workers_started")

    def watch_build(self, proc: subprocess.Popen | None) -> None:
        """Follow the native path's background build like a compile (it takes a core)."""
        self._build = proc

    def build_running(self) -> bool:
        b = self._build
        return b is not None and b.poll() is None

    def running(self) -> bool:
        """Whether a worker or the native build runs now."""
        return self.build_running() or any(w.poll() is None for w in list(self._workers.values()))

    def follow(self) -> bool:
        """Read the log's new events; set the thread limit from what runs now.  True when a
        compile ended (the index may have changed)."""
        events, self._log_pos, self._log_partial = read_events(self.log_path, self._log_pos, self._log_partial)
        ended = False
        for ev in events:
            pid, what = ev.get("pid"), ev.get("event")
            if isinstance(pid, int) and isinstance(what, str):
                self._state[pid] = what
            ended = ended or what in ENDED_EVENTS
        self.room.set_compiles(self.compiles_now())
        return ended

    def unread(self) -> bool:
        """Whether the log has lines not followed yet (a worker that just exited)."""
        return self._log_size() not in (-1, self._log_pos)

    def compiles_now(self) -> int:
        n = sum(1 for w in list(self._workers.values())
                if w.poll() is None and self._state.get(w.pid, "start") in BUSY_EVENTS)
        return n + self.build_running()

    def _log_size(self) -> int:
        try:
            return os.stat(self.log_path).st_size
        except OSError:
            return -1

    def stop(self) -> None:
        """Terminate the running workers (the native build goes on: the next process uses it)."""
        for w in list(self._workers.values()):
            if w.poll() is None:
                w.terminate()
                try:
                    w.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    w.kill()
