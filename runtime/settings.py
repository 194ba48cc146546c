"""A serving process's settings: the one place in ``runtime/`` that reads them from the
environment.

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
=============================  ==================  ============================

Low-level switches, documented in the README, read where they act:
``AOTI_FARM_NATIVE=0`` and ``AOTI_FARM_NATIVE_DIR`` (``runtime/native.py``, with ``CXX``),
``XDG_CACHE_HOME`` for host memos (``aoti_farm/fsutil.py``'s ``memo_dir``: the op-list memo,
the native build), ``AOTI_FARM_PRELOAD_LIBSTDCXX`` (``aoti_farm/loadenv.py``).  ``runtime/launch.py`` reads
``AOTI_FARM_HOOK``, ``AOTI_FARM_HOOK_STATS`` and ``AOTI_FARM_RECORD_DIR`` (its child's side)
and :func:`aoti_farm.runtime.supervisor.worker_env` builds a compile worker's environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from aoti_farm.cache import load_signing_key
from aoti_farm.config import check_on_miss
from aoti_farm.errors import UserError
from aoti_farm.runtime.gate import POLICIES
from aoti_farm.exposition import DEFAULT_PORT_RANGE, parse_port

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where a hook serves its metrics (``runtime/metrics.py``'s ``serve_http``)."""

    port: int
    addr: str = "0.0.0.0"
    span: int = DEFAULT_PORT_RANGE
    sd_dir: str | None = None


@dataclass(frozen=True)
class HookSettings:
    serve: str
    yield_core: bool
    metrics: MetricsEndpoint | None
    explain_misses: bool
    signing_key: bytes | None


def resolve(*, serve: str | None = None, yield_core: bool | None = None, metrics_port=None,
            explain_misses: bool | None = None, signing_key: bytes | str | None = None,
            env=None) -> HookSettings:
    """Explicit values as given; unset ones from ``env`` (default ``os.environ``).  A bad
    value is a UserError naming the argument or the variable."""
    env = os.environ if env is None else env
    if serve is None:
        v = env.get("AOTI_FARM_SERVE", "").strip().lower()
        serve = v if v in POLICIES else "faster"
    if yield_core is None:
        yield_core = env.get("AOTI_FARM_YIELD_CORE", "1").strip().lower() not in _OFF
    if explain_misses is None:
        explain_misses = env.get("AOTI_FARM_EXPLAIN_MISSES", "").strip().lower() in _ON
    metrics = None
    raw = metrics_port if metrics_port is not None else env.get("AOTI_FARM_METRICS_PORT")
    if raw is not None and raw != "":
        port = parse_port(raw, "metrics_port" if metrics_port is not None else "AOTI_FARM_METRICS_PORT")
        span = int(env.get("AOTI_FARM_METRICS_PORTS", DEFAULT_PORT_RANGE) or DEFAULT_PORT_RANGE)
        metrics = MetricsEndpoint(port, env.get("AOTI_FARM_METRICS_ADDR", "0.0.0.0"), span,
                                  env.get("AOTI_FARM_METRICS_SD_DIR") or None)
    # explicit, else AOTI_FARM_SIGNING_KEY(_FILE); an empty or unreadable one is an error,
    # never "no signing"
    key = load_signing_key(signing_key)
    return HookSettings(serve, bool(yield_core), metrics, bool(explain_misses), key)


def check_arguments(on_miss: str, poll_interval, devices, native: str, route: str | None) -> str:
    """``install()``'s other arguments, checked (UserError naming the argument); returns
    the routing policy (``route``: None is "all").  "servable" (only with
    ``on_miss="ignore"``) is opt-in: it re-registers the dispatcher whenever the set of
    servable ops changes, and torch does not promise that replacing a kernel is safe while
    another thread is inside it, so the default never re-registers after the start."""
    check_on_miss(on_miss)   # the one check, shared with config.resolve
    route = route or "all"
    if route not in ("all", "servable") or (route == "servable" and on_miss != "ignore"):
        raise UserError(f"route: {route!r} is not 'all', or 'servable' with on_miss='ignore' "
                        "(a miss must be seen to be queued)")
    if native not in ("auto", "off", "require"):
        raise UserError(f"native: {native!r} is not one of auto, off, require")
    if not poll_interval or poll_interval <= 0:
        raise UserError(f"poll_interval: {poll_interval!r} must be a positive number of seconds")
    bad = [d for d in devices if d not in ("cpu", "cuda")]
    if bad:
        raise UserError(f"devices: {bad[0]!r} is not 'cpu' or 'cuda'")
    return route
