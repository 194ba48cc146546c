"""A serving process's settings: the one place in ``runtime/`` that resolves them, through
:mod:`aoti_farm.config` (which reads the environment).

``install()`` (the Python entry point of a serving process) resolves here what its caller
left unset (None); ``aoti-farm run``'s child (``runtime/launch.py``, the command layer of
that process) passes everything explicitly after ``config.resolve(HookConfig)``.  ``Hook``
and its collaborators (room, gate, kernels, workers, metrics) take resolved values only,
so an explicit argument always wins over the environment.

=============================  ==================  ============================
variable                       ``install()`` arg   when unset
=============================  ==================  ============================
``AOTI_FARM_SERVE``            ``serve``           ``"faster"``
``AOTI_FARM_YIELD_CORE``       ``yield_core``      on
``AOTI_FARM_METRICS_PORT``     ``metrics_port``    no endpoint
``AOTI_FARM_EXPLAIN_MISSES``   ``explain_misses``  off
``AOTI_FARM_SIGNING_KEY``,     ``signing_key``     no signing
``AOTI_FARM_SIGNING_KEY_FILE``
``AOTI_FARM_CACHE_DIR``        ``cache_dir``       ``~/.cache/aoti-farm``
``AOTI_FARM_MEMORY_BUDGET``    ``memory_budget``   a quarter of host memory
``AOTI_FARM_WIDEN``            ``widen``           ``"auto"`` (aoti_farm/widen.py)
``AOTI_FARM_INSTALL_TRIAL``    ``install_trial``   5 seconds (runtime/pretrial.py)
=============================  ==================  ============================

Low-level switches, documented in the README, read where they act:
``AOTI_FARM_NATIVE=0`` and ``AOTI_FARM_NATIVE_DIR`` (``runtime/native.py``, with ``CXX``),
``XDG_CACHE_HOME`` for host memos (``aoti_farm/fsutil.py``'s ``memo_dir``: the op-list memo,
the native build), ``AOTI_FARM_PRELOAD_LIBSTDCXX`` (``aoti_farm/loadenv.py``).  ``runtime/launch.py`` reads
``AOTI_FARM_HOOK``, ``AOTI_FARM_HOOK_STATS`` and ``AOTI_FARM_RECORD_DIR`` (its child's side)
and :func:`aoti_farm.runtime.supervisor.worker_env` builds a compile worker's environment.
"""

from __future__ import annotations

from dataclasses import dataclass

from aoti_farm import config
from aoti_farm.config import HookConfig, check_on_miss
from aoti_farm.errors import UserError
from aoti_farm.exposition import Endpoint


@dataclass(frozen=True)
class HookSettings:
    serve: str
    yield_core: bool
    metrics: Endpoint | None
    explain_misses: bool
    signing_key: bytes | None
    cache_dir: str = ""                   # the cache directory (config.cache_dir)
    memory_budget: int | None = None      # bytes per compile for the compile worker; None: its default
    widen: str = "auto"                   # what a miss outside every shape class's range queues (widen.py)
    install_trial: float = 5.0            # seconds install() may time kernels before routing (pretrial.py)


def resolve(*, serve: str | None = None, yield_core: bool | None = None, metrics_port=None,
            explain_misses: bool | None = None, signing_key: bytes | str | None = None,
            cache_dir=None, memory_budget=None, widen: str | None = None, install_trial=None,
            env=None) -> HookSettings:
    """Explicit values as given; unset ones from ``env`` (default ``os.environ``), through
    :mod:`aoti_farm.config`'s resolution (``config.from_env``: the variables, their parsing
    and ``HookConfig``'s defaults exist once).  A bad value is a UserError naming the
    argument or the variable."""
    if serve is None:
        serve = config.from_env(HookConfig, "serve", env) or HookConfig.serve
    config.check_serve(serve)
    if yield_core is None:
        yield_core = config.from_env(HookConfig, "yield_core", env)
        yield_core = HookConfig.yield_core if yield_core is None else yield_core
    if explain_misses is None:
        explain_misses = config.from_env(HookConfig, "explain_misses", env)
        explain_misses = HookConfig.explain_misses if explain_misses is None else explain_misses
    if widen is None:
        widen = config.from_env(HookConfig, "widen", env) or HookConfig.widen
    config.check_widen(widen)
    if install_trial is None:
        install_trial = config.from_env(HookConfig, "install_trial", env)
        install_trial = HookConfig.install_trial if install_trial is None else install_trial
    install_trial = config.check_install_trial(install_trial)
    metrics = config.metrics_endpoint(metrics_port, env)
    # explicit, else AOTI_FARM_SIGNING_KEY(_FILE); an empty or unreadable one is an error,
    # never "no signing"
    key = config.load_signing_key(signing_key, env=env)
    return HookSettings(serve, bool(yield_core), metrics, bool(explain_misses), key,
                        config.cache_dir(cache_dir, env), config.memory_budget(memory_budget, env), widen,
                        install_trial)


#: The hook's routing policies (see check_arguments).
ROUTES = ("all", "paying", "servable-at-install", "servable")


def check_arguments(on_miss: str, poll_interval, devices, native: str, route: str | None) -> str:
    """``install()``'s other arguments, checked (UserError naming the argument); returns
    the routing policy (``route``: None is the default: "servable-at-install" with
    ``on_miss="ignore"``, else "paying").

    * "all": every requested op (a miss must be seen to be queued);
    * "paying": every requested op except those whose entries here all lose to eager on
      this host (decided at ``install()``, ``runtime/pretrial.py``): such an op costs
      exactly eager, and its new signatures are not queued (they would lose the same way);
    * "servable-at-install" (only with ``on_miss="ignore"``): the ops with a servable entry
      when ``install()`` runs; the registration never changes afterwards;
    * "servable" (only with ``on_miss="ignore"``; opt-in): the same set, re-registered
      whenever it changes.  torch does not promise that replacing a kernel is safe while
      another thread is inside it, so only this opt-in re-registers after the start."""
    check_on_miss(on_miss)   # the one check, shared with config.resolve
    if route is None:
        route = "servable-at-install" if on_miss == "ignore" else "paying"
    if route not in ROUTES or (route not in ("all", "paying") and on_miss != "ignore"):
        raise UserError(f"route: {route!r} is not 'all', 'paying', or 'servable-at-install' / 'servable' with "
                        "on_miss='ignore' (a miss must be seen to be queued)")
    if native not in ("auto", "off", "require"):
        raise UserError(f"native: {native!r} is not one of auto, off, require")
    if not poll_interval or poll_interval <= 0:
        raise UserError(f"poll_interval: {poll_interval!r} must be a positive number of seconds")
    bad = [d for d in devices if d not in ("cpu", "cuda")]
    if bad:
        raise UserError(f"devices: {bad[0]!r} is not 'cpu' or 'cuda'")
    return route
