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

from aoti_farm.errors import UserError

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
    address: str | None = None            # None: embedded local Ray; "auto" or host:port
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


_SECTIONS = {FarmConfig: "farm", HookConfig: "hook"}


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
            if not v > 0:
                raise ValueError(f"{v} must be positive")
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
        ev = env.get(f"AOTI_FARM_{k.upper()}")
        if ev is not None and ev != "":
            values[k] = _coerce(cls, k, ev, f"environment AOTI_FARM_{k.upper()}")
    for k, v in (cli or {}).items():
        if v is not None:
            if k not in names:
                raise UserError(f"option {k}: unknown")
            values[k] = _coerce(cls, k, v, f"option --{k.replace('_', '-')}")
    cfg = cls(**values)
    if isinstance(cfg, HookConfig) and cfg.on_miss not in ("compile", "queue", "ignore"):
        raise UserError(f"on_miss: {cfg.on_miss!r} is not one of compile, queue, ignore")
    if isinstance(cfg, HookConfig) and cfg.serve not in ("faster", "always"):
        raise UserError(f"serve: {cfg.serve!r} is not one of faster, always; fix --serve, "
                        f"AOTI_FARM_SERVE or [hook] serve")
    if isinstance(cfg, FarmConfig) and cfg.dynamic not in ("auto", "off"):
        raise UserError(f"dynamic: {cfg.dynamic!r} is not one of auto, off; fix --dynamic, AOTI_FARM_DYNAMIC or [farm] dynamic")
    if isinstance(cfg, FarmConfig) and cfg.lease_ttl > 3600:   # leases.MAX_TTL: a longer one reads as expired
        raise UserError(f"lease_ttl: {cfg.lease_ttl:g} s is more than an hour, which leases treat as broken; "
                        f"fix --lease-ttl, AOTI_FARM_LEASE_TTL or [farm] lease_ttl")
    if isinstance(cfg, FarmConfig) and cfg.warmup not in WARMUP_LEVELS:
        raise UserError(f"warmup: {cfg.warmup!r} is not one of {', '.join(WARMUP_LEVELS)}")
    if isinstance(cfg, FarmConfig) and cfg.address == "":
        raise UserError("address: empty; pass 'auto' or host:port, or leave it unset for a local Ray")
    return cfg
