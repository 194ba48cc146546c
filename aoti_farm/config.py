"""Configuration: one frozen dataclass per component, resolved in one place.

Precedence, highest first: command-line flags > environment (``AOTI_FARM_<FIELD>``) >
a TOML file (``--config`` or ``$AOTI_FARM_CONFIG``; table ``[farm]`` or ``[hook]``) >
the dataclass defaults.  :func:`resolve` is the only function that reads any of them.
A bad value raises :class:`UserError` naming where it came from and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Mapping

from aoti_farm import safeio
from aoti_farm.errors import UserError

#: Low-level switches: environment variables read where they act (not settings of a config
#: table; README names each).  Everything else is resolved here, by the command layer.
SWITCHES = {
    "AOTI_FARM_PRELOAD_LIBSTDCXX": "loadenv.forced: 1 forces the libstdc++ preload, 0 turns it off",
    "AOTI_FARM_SPLIT_WRAPPER": "splitbuild.enabled: 0 builds the AOTI wrapper whole",
    "AOTI_FARM_ISA_REPLAY": "fingerprint.seed_inductor_vec_isa: 0 runs Inductor's own ISA checks (A/B)",
    "AOTI_FARM_ISA_PREDICT": "isapredict.enabled: 0 makes a fresh host's preparation wait for the probed ISA (A/B)",
    "AOTI_FARM_ISA_FORK": "isafork.enabled: 0 probes a fresh host's ISA in an exec'd child, not a fork (A/B)",
    "AOTI_FARM_EARLY_RAY": "workers.earlyray.enabled: 0 has warm load its traces before it starts Ray (A/B)",
    "AOTI_FARM_ISA_FAST_LOAD": "isaload.fast_loads: 0 keeps torch < 2.13's `import torch` in each ISA load check (A/B)",
    "AOTI_FARM_PRECOMPILE": "pyprecompile.enabled: 0 leaves a fresh bytecode cache to the importing processes (A/B)",
    "AOTI_FARM_FORK_SERVER": "workers.forkclient.mode: 0 has each CPU actor import torch itself, 1 forks them also on few cores (A/B)",
    "AOTI_FARM_RAY_DASHBOARD": "workers.raysetup.start_ray: 1 starts the embedded Ray's dashboard",
    "AOTI_FARM_NATIVE": "runtime.native.disabled: 0 never uses the native hit path",
    "AOTI_FARM_NATIVE_DIR": "runtime.native.native_dir: where the native hit path is built",
    "CXX": "runtime.native.compiler: the C++ compiler of the native hit path",
    "XDG_CACHE_HOME": "private.root: this user's private directory (memos, native build, Inductor cache) lives under it",
    "TORCHINDUCTOR_CACHE_DIR": "private.inductor_cache_dir: Inductor's cache for the farm's compiles (checked; default private)",
    "LD_PRELOAD": "loadenv.preloaded: whether this process has the libstdc++ preload",
}

#: Warm-up levels: "none" (nothing), "light" (imports, fingerprint, one torch.export of a
#: trivial op: ~1.5 s), "compile" (also a full AOTInductor compile of a trivial op into a
#: scratch directory: ~9 s on one core, of which ~3.5 s is first-compile overhead that the
#: next compile then skips).  "light" is the default: it overlaps with the driver's
#: start-up and costs no full compile; see the measurement in :mod:`aoti_farm.workers.warm`;
#: the actors run :meth:`aoti_farm.workers.compile_actor.CompileActor.warmup`.
WARMUP_LEVELS = ("none", "light", "compile")


@dataclass(frozen=True, kw_only=True)
class FarmConfig:
    """`aoti-farm warm` / `aoti-farm serve`."""

    cache_dir: str | None = None          # None: $AOTI_FARM_CACHE_DIR or ~/.cache/aoti-farm
    address: str | None = None            # None: $RAY_ADDRESS, else an embedded local Ray; "auto" or host:port
    cpu_workers: int | None = None        # None: the cluster's CPUs
    gpu_workers: int | None = None        # None: GPUs / gpus_per_worker
    gpus_per_worker: float = 0.25
    timeout: float = 600.0                # per-signature compile timeout, seconds
    retries: int = 2                      # retries after infrastructure failures
    lease_ttl: float = 30.0
    max_in_flight: int | None = None      # None: 2 x workers
    inductor_options: dict = field(default_factory=dict)
    signing_key_file: str | None = None
    poll_interval: float = 1.0            # serve: queue polling, seconds
    warmup: str = "light"                 # compile actors' warm-up: none | light | compile
    memory_budget: int | None = None      # bytes per compile ("6G"); None: a quarter of the host's memory (budget.py)
    dynamic: str = "off"                  # warm: auto = a shape-general kernel per class of >= 2 shapes (dynwarm.py) | off


@dataclass(frozen=True, kw_only=True)
class HookConfig:
    """The runtime hook (`aoti_farm.runtime.install`, `aoti-farm run`)."""

    cache_dir: str | None = None
    ops: tuple | None = None              # None: every op the recorder/compiler support
    devices: tuple = ("cpu", "cuda")
    on_miss: str = "compile"              # compile | queue | ignore
    poll_interval: float = 1.0            # hot reload, seconds
    signing_key_file: str | None = None
    allow_insecure: bool = False
    inductor_options: dict = field(default_factory=dict)
    yield_core: bool = True               # fewer serving intra-op threads while compiling
    serve: str = "faster"                 # faster: only kernels faster than eager (runtime/gate.py) | always
    explain_misses: bool = False          # explain each miss once (aoti_farm/explain.py)
    memory_budget: int | None = None      # the compile worker's budget per compile; None: budget.py's default
    widen: str = "auto"                   # a miss outside every shape class's range queues: auto | always | off (widen.py)
    install_trial: float = 5.0            # seconds install() may time kernels here before routing (runtime/pretrial.py); 0: off


_SECTIONS = {FarmConfig: "farm", HookConfig: "hook"}


#: What the hook does with a miss.
ON_MISS = ("compile", "queue", "ignore")


def check_on_miss(value) -> str:
    """The one check of ``on_miss`` (the config path and ``install()``'s argument)."""
    if value not in ON_MISS:
        raise UserError(f"on_miss: {value!r} is not one of {', '.join(ON_MISS)}")
    return value


def check_serve(value) -> str:
    """The one check of ``serve`` (the config path and ``install()``'s argument)."""
    if value not in ("faster", "always"):
        raise UserError(f"serve: {value!r} is not one of faster, always; fix --serve, "
                        f"AOTI_FARM_SERVE or [hook] serve")
    return value


#: What a miss outside every shape class's range queues (aoti_farm/widen.py).
WIDEN = ("auto", "always", "off")


def check_widen(value) -> str:
    if value not in WIDEN:
        raise UserError(f"widen: {value!r} is not one of auto, always, off; fix install(widen=...), "
                        f"AOTI_FARM_WIDEN or [hook] widen")
    return value


#: Number fields where 0 means "off".
_ZERO_OK = frozenset({"install_trial"})


def check_install_trial(value) -> float:
    """The one check of ``install_trial`` (seconds, >= 0)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (v >= 0 and v != float("inf")):
        raise UserError(f"install_trial: {value!r} is not a number of seconds >= 0; fix install(install_trial=...), "
                        f"AOTI_FARM_INSTALL_TRIAL or [hook] install_trial")
    return v


def from_env(cls: type, name: str, env: Mapping[str, str] | None = None) -> Any:
    """One field of ``cls`` from its variable ``AOTI_FARM_<NAME>``, coerced (a bad value is a
    UserError naming the variable); None when unset or empty.  :func:`resolve` and the
    serving process's settings (``runtime/settings.py``) both read the environment here."""
    env = os.environ if env is None else env
    var = f"AOTI_FARM_{name.upper()}"
    v = env.get(var)
    return None if v is None or v == "" else _coerce(cls, name, v, f"environment {var}")


def cache_dir(explicit: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> str:
    """The shared kernel cache: ``explicit``, else ``AOTI_FARM_CACHE_DIR``, else
    ``~/.cache/aoti-farm`` (:func:`aoti_farm.fsutil.default_cache_dir`)."""
    from aoti_farm.fsutil import default_cache_dir

    if explicit:
        return os.fspath(explicit)
    return from_env(HookConfig, "cache_dir", env) or default_cache_dir()


def memory_budget(explicit: int | str | None = None, env: Mapping[str, str] | None = None) -> int | None:
    """The memory budget per compile in bytes: ``explicit`` (a size), else
    ``AOTI_FARM_MEMORY_BUDGET``; None: budget.py's host default."""
    if explicit is not None:
        return _coerce(HookConfig, "memory_budget", explicit, "memory_budget")
    return from_env(HookConfig, "memory_budget", env)


# --- settings of one process that are not a config table's -----------------------------------


def policy_from_env(default: str = "faster", env: Mapping[str, str] | None = None) -> str:
    """The serving policy ``AOTI_FARM_SERVE`` (faster | always), else ``default``."""
    v = (os.environ if env is None else env).get("AOTI_FARM_SERVE", "").strip().lower()
    return v if v in ("faster", "always") else default


def metrics_endpoint(port=None, env: Mapping[str, str] | None = None, addr: str | None = None):
    """Where a process serves its metrics: ``port`` (``--metrics-port``), else
    ``AOTI_FARM_METRICS_PORT``; with ``addr`` (``--metrics-addr``) else ``AOTI_FARM_METRICS_ADDR``
    (default 127.0.0.1: loopback only), ``AOTI_FARM_METRICS_PORTS``
    (ports to try, default 64) and ``AOTI_FARM_METRICS_SD_DIR``.  None: no endpoint.  A bad
    port is a UserError naming the flag or the variable."""
    from aoti_farm.exposition import DEFAULT_PORT_RANGE, LOOPBACK, Endpoint, parse_port

    env = os.environ if env is None else env
    raw = port if port is not None else env.get("AOTI_FARM_METRICS_PORT")
    if raw is None or raw == "":
        return None
    p = parse_port(raw, "metrics_port" if port is not None else "AOTI_FARM_METRICS_PORT")
    span = _coerce_span(env.get("AOTI_FARM_METRICS_PORTS"))
    return Endpoint(p, addr or env.get("AOTI_FARM_METRICS_ADDR") or LOOPBACK, span or DEFAULT_PORT_RANGE,
                    env.get("AOTI_FARM_METRICS_SD_DIR") or None)


def _coerce_span(v) -> int | None:
    if v is None or not str(v).strip():
        return None
    try:
        n = int(v)
    except ValueError:
        raise UserError(f"environment AOTI_FARM_METRICS_PORTS: {v!r} is not a number of ports; fix the value") from None
    if n < 1:
        raise UserError(f"environment AOTI_FARM_METRICS_PORTS: {n} must be at least 1; fix the value")
    return n


# --- the signing key ---------------------------------------------------------------------------


def signing_key(cfg: FarmConfig | HookConfig, env: Mapping[str, str] | None = None) -> bytes | None:
    """The resolved signing key's bytes for ``cfg``: its ``signing_key_file`` (``--config``'s
    TOML, or ``AOTI_FARM_SIGNING_KEY_FILE`` through :func:`resolve`), else the key itself in
    ``AOTI_FARM_SIGNING_KEY``; None when none is configured.  Fails closed (UserError)."""
    env = os.environ if env is None else env
    source = ("AOTI_FARM_SIGNING_KEY_FILE" if cfg.signing_key_file is not None
              and env.get("AOTI_FARM_SIGNING_KEY_FILE") == cfg.signing_key_file else "signing_key_file")
    return load_signing_key(path=cfg.signing_key_file, source=source, env=env)


def load_signing_key(explicit: str | bytes | None = None, *, path: str | None = None,
                     source: str = "signing_key_file", env: Mapping[str, str] | None = None) -> bytes | None:
    """The signing key: ``explicit``; else the file ``path`` (a config's ``signing_key_file``,
    named ``source`` in errors); else ``AOTI_FARM_SIGNING_KEY`` (the key itself) or
    ``AOTI_FARM_SIGNING_KEY_FILE``; None when none is configured.  Fails closed: a key
    that is configured but empty, whitespace-only or unreadable is a UserError, never
    "no signing"."""
    if explicit is not None:
        key = explicit.encode() if isinstance(explicit, str) else bytes(explicit)
        if not key.strip():
            raise UserError("signing key: empty; pass the key, or None to run without signing")
        return key
    if path is not None:
        return _read_key_file(path, source)
    env = os.environ if env is None else env
    if "AOTI_FARM_SIGNING_KEY" in env:
        value = env["AOTI_FARM_SIGNING_KEY"]
        if not value.strip():
            raise UserError("AOTI_FARM_SIGNING_KEY: set but empty; set it to the key, or unset it "
                            "to run without signing")
        return os.fsencode(value)   # the environment's own bytes (any encoding)
    if "AOTI_FARM_SIGNING_KEY_FILE" in env:
        return _read_key_file(env["AOTI_FARM_SIGNING_KEY_FILE"], "AOTI_FARM_SIGNING_KEY_FILE")
    return None


#: Most bytes a signing key file may have.
KEY_FILE_MAX = 1 << 16


def _read_key_file(path: str, source: str) -> bytes:
    if not str(path).strip():
        raise UserError(f"{source}: set but empty; name the key file, or unset it to run without signing")
    try:
        # links are followed (secrets are often mounted as links); FIFOs, devices and huge files are not read
        data = safeio.read_bounded(os.path.realpath(path), max_bytes=KEY_FILE_MAX,
                                   what=f"signing key file {path}")
    except safeio.UnsafeFile as e:
        raise UserError(f"{e}; fix {source}") from None
    key = data.strip()
    if not key:
        raise UserError(f"signing key file {path}: empty; put the key in it, or unset {source} "
                        f"to run without signing")
    return key



def _coerce(cls: type, name: str, value: Any, source: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    t = str(f.type)
    try:
        if name == "memory_budget" and value is not None:
            from aoti_farm.budget import parse_size

            return parse_size(value.strip() if isinstance(value, str) else value)
        if value is None:
            if "None" in t:
                return None
            raise ValueError("may not be empty")
        if isinstance(value, str) and source != "toml":
            value = value.strip()
            if "dict" in t:
                value = json.loads(value)
            elif "tuple" in t:
                value = tuple(v.strip() for v in value.split(",") if v.strip())
        if "bool" in t and "int" not in t:
            if isinstance(value, str):
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError(f"{value!r} is not a boolean")
                return value.lower() in ("1", "true", "yes")
            if not isinstance(value, bool):
                raise ValueError(f"{value!r} is not a boolean")
            return value
        if t.startswith("int"):
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not an integer")
            v = int(value)
            if v < 0:
                raise ValueError(f"{v} is negative")
            return v
        if t.startswith("float"):
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number")
            v = float(value)
            if not (v > 0 or (v == 0 and name in _ZERO_OK)):
                raise ValueError(f"{v} must be {'>= 0' if name in _ZERO_OK else 'positive'}")
            return v
        if "dict" in t:
            if not isinstance(value, dict):
                raise ValueError(f"{value!r} is not a table")
            return value
        if "tuple" in t:
            if isinstance(value, list):
                value = tuple(value)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{value!r} is not a list of strings")
            return value
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        return value
    except (ValueError, TypeError, json.JSONDecodeError) as e:
        raise UserError(f"{source}: {name}: {e}; fix the value") from None


def load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config {path}: no such file; pass an existing --config") from None
    except OSError as e:
        raise UserError(f"config {path}: unreadable ({e.strerror}); fix its permissions") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config {path}: not valid TOML ({e}); fix the file") from None


def resolve(cls: type, *, cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
            config_path: str | None = None) -> Any:
    """Build ``cls`` from defaults < TOML < environment < CLI (values of None are unset)."""
    env = os.environ if env is None else env
    section = _SECTIONS[cls]
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    path = config_path or env.get("AOTI_FARM_CONFIG")
    if path:
        doc = load_toml(path)
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise UserError(f"config {path}: [{section}] must be a table; fix the file")
        for k, v in table.items():
            if k not in names:
                raise UserError(f"config {path}: [{section}] has unknown key {k!r}; valid keys: {', '.join(names)}")
            values[k] = _coerce(cls, k, v, f"config {path} [{section}]")
    for k in names:
        ev = from_env(cls, k, env)
        if ev is not None:
            values[k] = ev
    for k, v in (cli or {}).items():
        if v is not None:
            if k not in names:
                raise UserError(f"option {k}: unknown")
            values[k] = _coerce(cls, k, v, f"option --{k.replace('_', '-')}")
    cfg = cls(**values)
    if isinstance(cfg, HookConfig):
        check_on_miss(cfg.on_miss)
    if isinstance(cfg, HookConfig):
        check_serve(cfg.serve)
        check_widen(cfg.widen)
        check_install_trial(cfg.install_trial)
    if isinstance(cfg, FarmConfig) and cfg.dynamic not in ("auto", "off"):
        raise UserError(f"dynamic: {cfg.dynamic!r} is not one of auto, off; fix --dynamic, AOTI_FARM_DYNAMIC or [farm] dynamic")
    if isinstance(cfg, FarmConfig) and cfg.lease_ttl > 3600:   # leases.MAX_TTL: a longer one reads as expired
        raise UserError(f"lease_ttl: {cfg.lease_ttl:g} s is more than an hour, which leases treat as broken; "
                        f"fix --lease-ttl, AOTI_FARM_LEASE_TTL or [farm] lease_ttl")
    if isinstance(cfg, FarmConfig) and cfg.warmup not in WARMUP_LEVELS:
        raise UserError(f"warmup: {cfg.warmup!r} is not one of {', '.join(WARMUP_LEVELS)}")
    if isinstance(cfg, FarmConfig) and cfg.address == "":
        raise UserError("address: empty; pass 'auto' or host:port, or leave it unset for a local Ray")
    if isinstance(cfg, FarmConfig) and cfg.address is None and env.get("RAY_ADDRESS"):
        cfg = dataclasses.replace(cfg, address=env["RAY_ADDRESS"])   # Ray's own variable, below ours
    return cfg
