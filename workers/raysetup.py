"""Starting and stopping Ray for `warm` and `serve`, and the compile actors' pool.

An embedded Ray starts without its dashboard (nobody could reach it: it lives for one
run); ``AOTI_FARM_DEV=ray_dashboard=1`` starts it (when Ray's dashboard dependencies are
installed).  ``--address``/``$RAY_ADDRESS`` joins a cluster instead.

An embedded Ray is this user's alone: its node address is 127.0.0.1 (its services and the
dashboard, when started, on loopback), and its temp tree (sockets, session logs, runtime
resources) lives in a fresh ``mkdtemp`` directory (0700) instead of Ray's shared
``/tmp/ray``, removed when it stops.  A cluster joined with ``--address`` keeps its own
settings.
"""

from __future__ import annotations

import os
from typing import Callable

from aoti_farm.startup import spawn
from aoti_farm.config import FarmConfig, dev as _dev, key_file_for_children
from aoti_farm.errors import UserError


#: Ray's switch (read by its raylet from the environment) naming the modules each new
#: worker process imports before it accepts work (Ray 2.60.0: ``preload_python_modules``,
#: an experimental RayConfig entry; a Ray without it ignores the variable).
RAY_PRELOAD_VAR = "RAY_preload_python_modules"
#: The actors' imports (:mod:`aoti_farm.workers.actor_preload`).
PRELOAD_MODULE = "aoti_farm.workers.actor_preload"


#: What an embedded Ray's workers get for CUDA_VISIBLE_DEVICES when ``hide_gpus``.
NO_GPUS = ""


def start_ray(cfg: FarmConfig, *, num_cpus: int | None = None, preload: bool = False, hide_gpus: bool = False,
              fork_server: bool = False):
    """(ray, started_here).  Reuses an already initialised Ray (tests, notebooks).

    For an embedded Ray only: ``num_cpus`` (None: every core) is the CPUs it advertises
    (sized from the work: :func:`aoti_farm.workers.placement.embedded_cpus`; Ray starts a
    worker process per CPU and ``ray.init`` waits for them), and ``preload`` has those
    prestarted workers import the compile actors' modules as soon as they start
    (:mod:`aoti_farm.workers.actor_preload`), while Ray finishes starting and the
    actors are created.  ``hide_gpus`` (a job with no GPU signature): the workers see no
    GPU (``CUDA_VISIBLE_DEVICES`` empty in what Ray's processes inherit, this process's own
    left as it was).  A CPU compile uses no GPU, but torch asks whether CUDA is available
    (every export's FakeTensorMode), and on a GPU host that initialises the CUDA driver in
    every actor: on a 4-GPU, 64-core host about 60 of 64 actors sat 6-7 s in
    the driver (``uvm_gpu_retain_by_uuid``, ``os_acquire_rwlock_*``) with most CPUs idle.
    Hidden before any worker starts, torch in them never sees a GPU, as on a host without
    one; hiding it in an actor after its imports broke its compiles.
    ``fork_server`` (a job with CPU signatures only): a process that imports torch once
    starts beside Ray and forks each CPU actor's compiling copy
    (:mod:`aoti_farm.workers.forkserver`); it takes the place of ``preload``.  These are
    ignored when joining a cluster (``--address``)."""
    import logging

    import ray

    if ray.is_initialized():
        return ray, False
    address = cfg.address or None   # config.resolve: --address > AOTI_FARM_ADDRESS > [farm] > RAY_ADDRESS
    # "local", not None: ray.init(address=None) would join any cluster `ray start` left in
    # /tmp/ray/ray_current_cluster on this host instead of starting the embedded one.
    kw: dict = {"address": address or "local", "logging_level": logging.WARNING}
    if address is None and _dev("ray_dashboard") != "1":
        # the embedded Ray lives for one run and its address is printed nowhere
        kw["include_dashboard"] = False
    global _EMBEDDED_ENV, _RAY_TMP
    if address is None:
        _loopback_node(ray)
        kw["_node_ip_address"] = LOOPBACK
        kw["dashboard_host"] = LOOPBACK
        _RAY_TMP = _RAY_TMP or private_ray_tmp()
        kw["_temp_dir"] = _RAY_TMP
        quiet_embedded_ray()
        from aoti_farm.startup import pycache

        pycache.apply()   # the workers inherit it (warm applied it already; serve here)
        # The embedded Ray's workers inherit this environment: give it the actors'
        # variables now, so the actors need no runtime_env and take the workers Ray
        # prestarts (placement.actor_options).  Not LD_PRELOAD: Ray's own binaries get none.
        from .placement import worker_env

        os.environ.update(worker_env(libstdcxx=False))
        if num_cpus is not None:
            kw["num_cpus"] = int(num_cpus)
        if preload:   # read by the raylet when it starts; taken out of this process again below
            os.environ[RAY_PRELOAD_VAR] = PRELOAD_MODULE
    gpus_before = os.environ.get("CUDA_VISIBLE_DEVICES")
    hide = address is None and hide_gpus
    if hide:   # inherited by Ray's processes; this process's own is restored below
        os.environ["CUDA_VISIBLE_DEVICES"] = NO_GPUS
    global _FORK_SERVER
    if address is None and fork_server and _FORK_SERVER is None:
        from . import forkserver
        from .forkclient import SOCKET_VAR

        os.environ.pop(RAY_PRELOAD_VAR, None)   # the workers import nothing: the server did
        _FORK_SERVER = forkserver.start(dict(os.environ))
        if _FORK_SERVER is not None:   # read by the actors (CompileActor._attach_fork)
            os.environ[SOCKET_VAR] = _FORK_SERVER.path
    try:
        # Ray puts the driver's working directory first on every worker's sys.path:
        # make it the farm's private one (aoti_farm.startup.spawn)
        with spawn.private_cwd():
            ray.init(**kw)
    except ConnectionError as e:
        raise UserError(f"--address {address}: no Ray cluster there ({' '.join(str(e).split())[:160]}); "
                        f"start one with `ray start --head` or leave --address/RAY_ADDRESS unset") from None
    except OSError as e:   # the embedded Ray could not start here: one line, not Ray's traceback
        _stop_fork_server()
        if address is not None:
            raise
        raise UserError(f"cannot start the embedded Ray ({' '.join(str(e).split())[:200]}); "
                        "free the resource it names, or point --address at a running Ray cluster") from None
    except BaseException:
        _stop_fork_server()
        raise
    finally:
        if address is None and preload:
            os.environ.pop(RAY_PRELOAD_VAR, None)
        if _FORK_SERVER is not None:
            from .forkclient import SOCKET_VAR

            os.environ.pop(SOCKET_VAR, None)   # Ray's processes have it; this one's children need not
        if hide:
            if gpus_before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus_before
    _EMBEDDED_ENV = dict(os.environ) if address is None else None
    return ray, True


#: Where an embedded Ray listens.
LOOPBACK = "127.0.0.1"
#: The embedded Ray's private temp directory (None: none started).
_RAY_TMP: str | None = None


#: Ray's switch (read when ``ray._private.ray_constants`` is imported, in every Ray Python
#: process) that makes a node's address the loopback one, as Ray does on macOS/Windows.
RAY_LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _loopback_node(ray) -> None:
    """Make the embedded Ray's node address 127.0.0.1.

    Ray internal (checked against Ray 2.60.0): ``ray.init(_node_ip_address="127.0.0.1")``
    is turned into the host's routable address by ``services.resolve_ip_for_localhost``
    unless ``ray_constants.ENABLE_RAY_CLUSTER`` is false (its macOS/Windows default,
    github.com/ray-project/ray/issues/18730).  So: the variable for Ray's processes started
    from here, the constant for this one (read at import).  The node address is also what
    binds Ray's listeners: its C++ gRPC servers (GCS, raylet, core workers) listen on
    127.0.0.1 exactly when the node address is 127.0.0.1 (``GrpcServer``'s
    ``listen_to_localhost_only``, set from ``node_ip_address == "127.0.0.1"``), and so do
    its Python agents; there is no separate setting.  It can go when Ray offers a
    loopback-only local cluster.  ``tests/e2e/test_drills_env.py::test_drill_8_*`` checks
    the node's address and that every TCP port Ray's processes listen on is loopback."""
    os.environ[RAY_LOOPBACK_VAR] = "0"
    try:
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    except AttributeError:  # another Ray: its routable address stays
        pass


#: Bytes Ray appends to the directory that holds its temp tree, for its longest socket:
#: ``/aoti-farm-ray-XXXXXXXX/r/session_YYYY-MM-DD_HH-MM-SS_ffffff_<pid, up to 7 digits>/sockets/plasma_store``.
RAY_SOCKET_TAIL = 23 + 2 + 43 + 21
#: A Unix socket's path has at most this many bytes (``sun_path`` less its NUL).
SOCKET_PATH_MAX = 107


def private_ray_tmp(base: str | None = None) -> str:
    """A fresh directory for an embedded Ray's temp tree, inside a ``mkdtemp`` directory
    (0700, an unpredictable name): Ray makes its own temp directory mode 0777, so only the
    private one above it keeps other users out.  Under ``$TMPDIR`` (``base``) where Ray's
    socket paths fit there (at most 107 bytes), else under ``/tmp``: a deep ``$TMPDIR``
    would stop Ray from starting at all.  ``mkdtemp`` keeps either private."""
    import tempfile

    base = base or tempfile.gettempdir()
    if len(base) + RAY_SOCKET_TAIL > SOCKET_PATH_MAX and os.path.isdir("/tmp"):
        base = "/tmp"
    return os.path.join(tempfile.mkdtemp(prefix="aoti-farm-ray-", dir=base), "r")


#: The fork server of the embedded Ray started by :func:`start_ray` (None: none).
_FORK_SERVER = None


def _stop_fork_server() -> None:
    global _FORK_SERVER
    if _FORK_SERVER is not None:
        _FORK_SERVER.stop()
        _FORK_SERVER = None


#: The environment an embedded Ray started by :func:`start_ray` gave its workers (None:
#: no embedded Ray, or a cluster whose workers' environment this process does not know).
_EMBEDDED_ENV: dict | None = None


#: Ray's notices, by logger, that a user of the embedded one-run Ray cannot act on: it
#: turns token authentication on for a new local cluster and says so at WARNING level on
#: every run.  Only these exact messages are dropped; every other warning still shows.
#: The logger is Ray-internal (checked against Ray 2.60.0); a Ray that renames it or drops
#: the notice makes this a no-op.  It can go when Ray stops announcing it at WARNING level.
EMBEDDED_RAY_NOTICES = {
    "ray._private.authentication.authentication_token_setup": ("Token authentication is enabled for this Ray cluster",),
}


def quiet_embedded_ray() -> None:
    """Drop :data:`EMBEDDED_RAY_NOTICES` (once per process)."""
    from aoti_farm.startup import notices

    notices.drop(EMBEDDED_RAY_NOTICES)


def stop_ray(ray) -> None:
    """``ray.shutdown()`` of a Ray this process started.  Ray stops the node's processes
    one by one, each with a grace period, and its autoscaler monitor only exits on its next
    1 s tick; on the embedded one-node Ray the monitor has nothing to save, so it is killed
    first (1.4 s -> 0.35 s here).  A driver of a cluster (--address) only disconnects.

    Ray internal: ``ray._private.worker._global_node.all_processes["monitor"]`` (checked
    against Ray 2.60.0).  Why: Ray has no public way to stop its monitor first.  It can go
    when ``ray.shutdown()`` stops the monitor without waiting for its tick; any Ray that
    lacks these internals gets a plain ``ray.shutdown()``."""
    try:
        node = ray._private.worker._global_node
        if node is not None and node.head:
            for info in node.all_processes.get("monitor", []):
                if info.process is not None and info.process.poll() is None:
                    info.process.kill()
    except Exception:  # noqa: BLE001 -- a Ray without these internals: a plain shutdown
        pass
    ray.shutdown()
    _stop_fork_server()   # after the actors: their forked copies end with them
    global _EMBEDDED_ENV, _RAY_TMP
    _EMBEDDED_ENV = None
    if _RAY_TMP is not None:
        import shutil

        shutil.rmtree(os.path.dirname(_RAY_TMP), ignore_errors=True)
        _RAY_TMP = None


def _key_file(cfg: FarmConfig, cache) -> str | None:
    """The signing key's file for the actors: they read the key themselves
    (``config.load_signing_key``), never take it as an argument (Ray keeps actor
    arguments in its object store and shows them in its dashboard and logs).

    The one rule for every child (the hook's compile worker too,
    :func:`aoti_farm.config.key_file_for_children`): a key travels by path.  A key that
    came as bytes gets a private file of this process, which only this host can read: so
    an embedded Ray's actors take that file, and a cluster's (actors on other hosts)
    need ``signing_key_file``, a file every host has."""
    if cache.signing_key is None:
        return None
    if cfg.signing_key_file:
        # absolute: an embedded Ray's workers run in the farm's private directory, not in the
        # driver's working directory (aoti_farm.startup.spawn.private_cwd)
        return os.path.abspath(cfg.signing_key_file)
    if _EMBEDDED_ENV is not None:   # this host's own Ray: its workers are this host's processes
        return key_file_for_children(cache.signing_key, None)
    raise UserError("signing key: the compile actors of a Ray cluster read it from a file every host has; set "
                    "signing_key_file ([farm] signing_key_file or AOTI_FARM_SIGNING_KEY_FILE)")


def make_scheduler(ray, cfg: FarmConfig, cache, sizes: dict, *, compiler_factory: Callable | None = None,
                   on_event: Callable | None = None):
    from .compile_actor import CompileActor
    from .placement import actor_options
    from .scheduler import Scheduler

    remote_cls = ray.remote(CompileActor)

    def make_actor(kind: str):
        # everything an actor needs is an argument (no runtime_env: an embedded Ray's
        # prestarted workers can take the actors, see placement.actor_options)
        return remote_cls.options(**actor_options(kind, cfg.gpus_per_worker, None, inherited=_EMBEDDED_ENV)).remote(
            str(cache.root), kind, cfg.inductor_options, cfg.lease_ttl, _key_file(cfg, cache), compiler_factory,
            cfg.warmup, cfg.memory_budget)

    return Scheduler(ray, cache, make_actor, sizes, timeout=cfg.timeout, retries=cfg.retries,
                     lease_ttl=cfg.lease_ttl, max_in_flight=cfg.max_in_flight, on_event=on_event)
