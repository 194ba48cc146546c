"""A serving process's settings: ``install()`` resolves here, through the one resolver,
:func:`aoti_farm.config.resolve` (``HookConfig``: argument > environment > TOML file >
default), exactly as ``aoti-farm run`` does (``runtime/launch.py``), so the same
environment and file give the same settings either way.  ``Hook`` and its collaborators
(room, gate, kernels, workers, metrics) take resolved values only.

``docs/settings.md`` lists every setting: its ``install()`` argument, variable, TOML key
and default.  Besides ``HookConfig``'s fields, ``install()`` resolves here the metrics
endpoint (``metrics_port``, ``config.metrics_endpoint``) and the signing key: an explicit
``signing_key`` (bytes) or the file ``signing_key_file`` (argument, then
``AOTI_FARM_SIGNING_KEY_FILE``, then ``[hook] signing_key_file``).  The hook's compile
worker reads the key from a file (``config.key_file_for_children``), never from its
arguments or environment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from aoti_farm import config
from aoti_farm.config import HookConfig, check_on_miss
from aoti_farm.errors import UserError
from aoti_farm.metrics.exposition import Endpoint


@dataclass(frozen=True)
class HookSettings:
    serve: str
    metrics: Endpoint | None
    explain_misses: bool
    signing_key: bytes | None
    cache_dir: str = ""                   # the cache directory (config.cache_dir applies the default)
    memory_budget: int | None = None      # bytes per compile for the compile worker; None: its default
    widen: str = "auto"                   # what a miss outside every shape class's range queues (widen.py)
    install_trial: float = 5.0            # seconds install() may time kernels before routing (pretrial.py)
    signing_key_file: str | None = None   # the key's file, where it came from one (the compile worker reads it)
    config: HookConfig | None = None      # every HookConfig field, resolved


#: install()'s arguments that are HookConfig fields (None: unset, resolved).
FIELDS = tuple(f.name for f in dataclasses.fields(HookConfig))


def check_retired(arguments) -> None:
    """A UserError for a retired setting given to ``install()`` (``config.RETIRED_SETTINGS``)."""
    for name in arguments:
        if name in config.RETIRED_SETTINGS:
            raise UserError(f"install({name}=...): retired ({config.RETIRED_SETTINGS[name]}); drop the argument")


def resolve(*, metrics_port=None, signing_key: bytes | str | None = None, config_path: str | None = None,
            env=None, **fields) -> HookSettings:
    """``fields`` (HookConfig's, None: unset) through :func:`aoti_farm.config.resolve`:
    explicit values win, then ``env`` (default ``os.environ``), then the TOML file
    (``config_path``, else ``$AOTI_FARM_CONFIG``), then the defaults.  A bad value is a
    UserError naming the argument, the variable or the file."""
    check_retired(fields)
    bad = sorted(set(fields) - set(FIELDS))
    if bad:
        raise UserError(f"install(): unknown argument {bad[0]!r}")
    cli = {k: (v if v is None or isinstance(v, (str, dict, bool, int, float)) else
               str(v) if k == "cache_dir" else tuple(v)) for k, v in fields.items()}
    raw_ops = cli.get("ops")
    if raw_ops is not None and not all(isinstance(o, str) for o in raw_ops if not isinstance(raw_ops, str)):
        cli.pop("ops")   # op objects (torch OpOverloads): checked by the dispatcher, not by a config table
    else:
        raw_ops = None
    cfg = config.resolve(HookConfig, cli=cli, env=env, config_path=config_path, cli_label="install({name}=...)")
    if raw_ops is not None:
        cfg = dataclasses.replace(cfg, ops=raw_ops)
    metrics = config.metrics_endpoint(metrics_port, env)
    if signing_key is not None:   # explicit bytes: an empty one is an error, never "no signing"
        key, key_file = config.load_signing_key(signing_key), None
    else:
        key, key_file = config.signing_key(cfg, env), cfg.signing_key_file
    return HookSettings(cfg.serve, metrics, cfg.explain_misses, key, cfg.cache_dir,
                        cfg.memory_budget, cfg.widen, cfg.install_trial, key_file, cfg)


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
