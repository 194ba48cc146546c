"""A serving process's settings: ``install()`` resolves here, through the one resolver,
:func:`aoti_farm.config.resolve` (``HookConfig``: argument > environment > TOML file >
default), exactly as ``aoti-farm run`` does (``runtime/launch.py``), so the same
environment and file give the same settings either way.  ``Hook`` and its collaborators
(room, gate, kernels, workers, metrics) take resolved values only.

:class:`Settings` is the public object: every setting ``install()`` knows, each None
(unset) unless given.  ``install()`` names the common ones as keywords; the rest go
through ``install(settings=Settings(...))``.  :func:`resolve` turns a ``Settings`` into a
:class:`HookSettings`: the resolved ``HookConfig`` plus only what it lacks (the metrics
endpoint, the signing key's bytes and file, the hook-only ``native`` / ``route`` and the
developer fields).

``docs/settings.md`` lists every setting: its ``Settings`` field, variable, TOML key and
default; ``docs/hook.md`` lists ``install()``'s keywords and ``Settings``' fields
(``tests/unit/test_install_settings.py`` checks both against the code).  Besides
``HookConfig``'s fields, ``install()`` resolves here the metrics endpoint
(``metrics_port``, ``config.metrics_endpoint``) and the signing key: an explicit
``signing_key`` (bytes) or the file ``signing_key_file`` (argument, then
``AOTI_FARM_SIGNING_KEY_FILE``, then ``[hook] signing_key_file``).  The hook's compile
worker reads the key from a file (``config.key_file_for_children``), never from its
arguments or environment.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any

from aoti_farm import config
from aoti_farm.config import HookConfig, check_on_miss
from aoti_farm.errors import UserError
from aoti_farm.metrics.exposition import Endpoint


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of ``install()``; None: unset, resolved as ``aoti-farm run`` resolves
    it (environment, then the TOML file's ``[hook]`` table, then the default; see
    ``docs/settings.md``).  Frozen: ``dataclasses.replace`` makes a changed copy.  An
    unknown or retired name is a UserError naming it."""

    # HookConfig's fields (aoti_farm/config.py): variable, TOML key and default in docs/settings.md
    cache_dir: Any = None            # str | os.PathLike: the shared kernel cache
    ops: Any = None                  # op names or OpOverloads; None: every supported op
    devices: Any = None              # e.g. ("cpu",); default ("cpu", "cuda")
    on_miss: str | None = None       # compile | queue | ignore
    poll_interval: float | None = None
    signing_key_file: str | None = None
    allow_insecure: bool | None = None
    inductor_options: dict | None = None
    serve: str | None = None         # faster | always
    explain_misses: bool | None = None
    memory_budget: Any = None        # bytes or a size ("6G")
    widen: str | None = None         # auto | always | off
    install_trial: float | None = None
    queue_cap: int | None = None
    queue_cap_per_op: int | None = None
    contract: str | None = None      # finite | strict
    # install()'s own (not HookConfig's)
    config: str | None = None        # the TOML file; None: $AOTI_FARM_CONFIG, else none
    signing_key: bytes | str | None = None   # the key's bytes (instead of signing_key_file)
    metrics_port: int | None = None  # serve metrics from this port; None: $AOTI_FARM_METRICS_PORT, else none
    native: str | None = None        # the native hit path: auto (default) | off | require
    route: str | None = None         # paying | all | servable-at-install | servable (check_arguments)
    # developer fields (tests, drills): not user settings
    worker_log: str | None = None    # the compile worker's log file; None: a private temporary file
    worker_idle: float | None = None  # seconds the compile worker waits for work before it exits; None: 60


#: Settings' fields that are HookConfig's (resolved by config.resolve).
FIELDS = tuple(f.name for f in dataclasses.fields(HookConfig))
#: Every field of Settings.
SETTINGS_FIELDS = tuple(f.name for f in dataclasses.fields(Settings))


def refuse(name: str, where: str, keywords=()) -> None:
    """The UserError for a name ``where`` (``install`` or ``Settings``) does not take:
    a retired setting (``config.RETIRED_SETTINGS``), a setting that goes through
    ``Settings`` (``keywords``: the names ``where`` does take), or an unknown name."""
    if name in config.RETIRED_SETTINGS:
        raise UserError(f"{where}({name}=...): retired ({config.RETIRED_SETTINGS[name]}); drop the argument")
    if name in SETTINGS_FIELDS:
        raise UserError(f"{where}({name}=...): not a keyword of {where}(); pass it as "
                        f"{where}(settings=Settings({name}=...)) (docs/hook.md)")
    raise UserError(f"{where}({name}=...): unknown argument {name!r}; {where}() takes "
                    f"{', '.join(n for n in (keywords or SETTINGS_FIELDS) if n != 'self')} (docs/hook.md)")


def refusing_unknown_names(fn):
    """``fn`` (keyword arguments named in its signature only), raising a UserError naming
    an argument it does not take (:func:`refuse`) instead of Python's TypeError, so a
    retired or misplaced setting is refused by name in one line.  Nothing else passes:
    ``inspect.signature`` of the result is ``fn``'s."""
    names = tuple(inspect.signature(fn).parameters)
    where = fn.__qualname__.split(".")[0] if fn.__name__ == "__init__" else fn.__name__

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for name in kwargs:
            if name not in names:
                refuse(name, where, names)
        return fn(*args, **kwargs)

    return checked


Settings.__init__ = refusing_unknown_names(Settings.__init__)


@dataclass(frozen=True)
class HookSettings:
    """Everything the hook needs, resolved: ``config`` (every HookConfig field) plus only
    what HookConfig lacks."""

    config: HookConfig
    metrics: Endpoint | None              # the metrics endpoint; None: none
    signing_key: bytes | None             # the key's bytes; None: no signing
    key_file: str | None = None           # the key's file, where it came from one (the compile worker reads it)
    native: str = "auto"                  # the native hit path: auto | off | require
    route: str = "paying"                 # the routing policy, resolved (check_arguments)
    worker_log: str | None = None         # developer: the compile worker's log; None: a private temporary file
    worker_idle: float | None = None      # developer: the compile worker's idle seconds; None: the hook's default


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 -- values that do not compare are not the same
        return a is b


def merge(settings: Settings | None, **keywords) -> Settings:
    """``settings`` with ``install()``'s keywords (None: not given) set.  A keyword and
    ``settings`` giving one setting different values is a UserError naming it."""
    if settings is None:
        settings = Settings()
    elif not isinstance(settings, Settings):
        raise UserError(f"install(settings=...): a {type(settings).__name__}, not a Settings; pass "
                        "aoti_farm.runtime.Settings(name=value, ...)")
    given = {}
    for name, value in keywords.items():
        if value is None:
            continue
        have = getattr(settings, name)
        if have is not None and not _same(have, value):
            raise UserError(f"install({name}=...): {value!r} but settings.{name} is {have!r}; give it once")
        given[name] = value
    return dataclasses.replace(settings, **given) if given else settings


def resolve(settings: Settings | None = None, *, env=None, **fields) -> HookSettings:
    """``settings`` (and ``fields``: its fields as keywords, for callers that build none)
    through :func:`aoti_farm.config.resolve`: explicit values win, then ``env`` (default
    ``os.environ``), then the TOML file (``settings.config``, else ``$AOTI_FARM_CONFIG``),
    then the defaults.  A bad value is a UserError naming the argument, the variable or
    the file."""
    s = merge(settings, **{k: v for k, v in fields.items() if k in SETTINGS_FIELDS})
    for name in fields:
        if name not in SETTINGS_FIELDS:
            refuse(name, "install")
    cli = {k: (v if v is None or isinstance(v, (str, dict, bool, int, float)) else
               str(v) if k == "cache_dir" else tuple(v)) for k in FIELDS for v in (getattr(s, k),)}
    raw_ops = cli.get("ops")
    if raw_ops is not None and not all(isinstance(o, str) for o in raw_ops if not isinstance(raw_ops, str)):
        cli.pop("ops")   # op objects (torch OpOverloads): checked by the dispatcher, not by a config table
    else:
        raw_ops = None
    cfg = config.resolve(HookConfig, cli=cli, env=env, config_path=s.config,
                         cli_label=config.install_argument)
    if raw_ops is not None:
        cfg = dataclasses.replace(cfg, ops=raw_ops)
    metrics = config.metrics_endpoint(s.metrics_port, env)
    if s.signing_key is not None:   # explicit bytes: an empty one is an error, never "no signing"
        key, key_file = config.load_signing_key(s.signing_key), None
    else:
        key, key_file = config.signing_key(cfg, env), cfg.signing_key_file
    native = "auto" if s.native is None else s.native
    route = check_arguments(cfg.on_miss, cfg.poll_interval, cfg.devices, native, s.route)
    return HookSettings(cfg, metrics, key, key_file, native=native, route=route, worker_log=s.worker_log,
                        worker_idle=s.worker_idle)


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
