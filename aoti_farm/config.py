"""Settings: one frozen dataclass per component, resolved in one place.

Precedence, highest first: an argument or command-line flag > the environment (the
variables of :data:`ENV_VARS`) > a TOML file (:func:`config_file`: ``--config``, else
``$AOTI_FARM_CONFIG``; table ``[farm]`` or ``[hook]``) > the dataclass defaults.
:func:`resolve` is the one resolver: every command, ``aoti-farm run`` (``runtime/launch.py``)
and ``install()`` (``runtime/settings.py``) call it, so the same environment and file give
the same settings everywhere.  A bad value raises :class:`UserError` naming where it came
from and the field.  ``docs/settings.md`` lists every setting.

Only the variables of :data:`ENV_VARS` are read: a setting a user changes per run or per
host.  The rest of a table (worker counts, timeouts, retries...) is a flag or a TOML key,
which keeps the environment's surface small.  Developer A/B switches are one variable,
``AOTI_FARM_DEV`` (:func:`dev`).  A variable that is no longer read is refused
(:data:`RETIRED`) rather than silently ignored, so an old setting never changes nothing
without a word.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from aoti_farm.security import safeio
from aoti_farm.errors import UserError

#: Low-level switches: environment variables read where they act (not settings of a config
#: table; docs/settings.md names each).  Everything else is resolved here.
SWITCHES = {
    "AOTI_FARM_PRELOAD_LIBSTDCXX": "loadenv.forced: 1 forces the libstdc++ preload, 0 turns it off",
    "AOTI_FARM_NATIVE": "runtime.native.disabled: 0 never uses the native hit path",
    "AOTI_FARM_NATIVE_DIR": "runtime.native.native_dir: where the native hit path is built",
    "CXX": "runtime.native.compiler: the C++ compiler of the native hit path",
    "XDG_CACHE_HOME": "private.root: this user's private directory (memos, native build, Inductor cache) lives under it",
    "TORCHINDUCTOR_CACHE_DIR": "private.inductor_cache_dir: Inductor's cache for the farm's compiles (checked; default private)",
    "LD_PRELOAD": "loadenv.preloaded: whether this process has the libstdc++ preload",
}

#: ``AOTI_FARM_DEV="key=value,key=value"``: the developer's A/B switches (not user
#: settings), each with its default and meaning.  Read with :func:`dev` where they act;
#: children inherit the one variable.
DEV = {
    "split_build": ("1", "aoti_farm.build.splitbuild: 0 builds the AOTI wrapper whole"),
    "split_overlap": ("1", "aoti_farm.build.splitbuild: 0 waits for the wrapper's model half before Inductor compiles "
                           "the kernel (1 compiles them side by side)"),
    "lean_model": ("1", "aoti_farm.build.splitbuild: 0 lets the wrapper's model half instantiate std::regex and "
                   "include the model container's header (1: neither)"),
    "lean_match": ("1", "aoti_farm.build.splitbuild: 0 lets the lean model half instantiate std::regex_match's "
                   "matcher (1: declared extern, instantiated once in the common half)"),
    "gold_link": ("1", "aoti_farm.build.splitbuild: 0 links a kernel's library with g++'s default linker (1: gold, "
                       "where g++ has it)"),
    "abort_scan": ("1", "aoti_farm.build.abortscan: 0 builds and verifies a CPU kernel whose index check would end its "
                        "verification (verification refuses it)"),
    "isa_replay": ("1", "aoti_farm.fingerprint: 0 runs Inductor's own ISA checks in every process"),
    "fresh_isa": ("1", "workers.warm, aoti_farm.startup.isaload: 0 starts a fresh many-core host's ISA probe after the "
                       "traces are read, and keeps torch < 2.13's `import torch` in each of its load checks"),
    "precompile": ("1", "aoti_farm.startup.pyprecompile: 0 leaves a fresh bytecode cache to the importing processes"),
    "fork_server": ("auto", "workers.forkclient: 0 has each CPU actor import torch itself, 1 forks them also "
                            "on few cores"),
    "ray_dashboard": ("0", "workers.raysetup: 1 starts the embedded Ray's dashboard"),
    "min_saving_us": ("", "runtime.gate: the least saving, in µs a call on the serving host, for a kernel to be served "
                          "under serve=faster (empty: aoti_farm.speedgate.speed.MIN_SAVING_US); an A/B of that floor"),
    "native_early": ("1", "workers.warm, aoti_farm.compile.hostprep: 0 leaves the hit path's extension to the first "
                          "compile's speed measurement (1 builds it from warm's start)"),
    "typed_entry": ("1", "runtime/fastpath.cpp: 0 registers every served op's native kernel boxed (1: unboxed where "
                         "the op's C++ signature is one the typed entry has, calling eager's kernel unboxed)"),
    "omp_passive": ("1", "aoti_farm.startup.ompwait: 0 leaves libgomp's default wait policy (spin, then sleep) in the "
                         "compile processes"),
}
DEV_VAR = "AOTI_FARM_DEV"


def _parse_dev(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        k, eq, v = item.partition("=")
        k, v = k.strip(), v.strip()
        if not eq or k not in DEV or not v:
            raise UserError(f"environment {DEV_VAR}: {item!r} is not key=value with a key of "
                            f"{', '.join(DEV)}; fix the value (e.g. {DEV_VAR}=fork_server=0,split_build=0)")
        out[k] = v
    return out


def dev(name: str, env: Mapping[str, str] | None = None) -> str:
    """The developer switch ``name`` (a key of :data:`DEV`) from ``AOTI_FARM_DEV``, else its
    default.  Never raises (it is read in compiling and serving processes): a malformed
    variable is refused by :func:`resolve`, which every command and ``install()`` run first,
    and reads as the defaults here."""
    default = DEV[name][0]
    raw = (os.environ if env is None else env).get(DEV_VAR, "")
    try:
        return _parse_dev(raw).get(name, default)
    except UserError:
        return default


#: Settings retired without a replacement, and why: refused by name wherever one is given
#: (``install()``, the TOML file, the environment), never silently ignored.
RETIRED_SETTINGS = {
    "yield_core": "the hook never changes the program's thread count, so the setting had no effect",
}

#: Variables that are no longer read, and what replaced each.  Setting one is a UserError
#: (at :func:`resolve`), never silently ignored.
RETIRED = {
    **{old: f"{DEV_VAR}={key}={{value}}" for old, key in (
        ("AOTI_FARM_SPLIT_WRAPPER", "split_build"), ("AOTI_FARM_ISA_REPLAY", "isa_replay"),
        ("AOTI_FARM_ISA_FAST_LOAD", "fresh_isa"), ("AOTI_FARM_FORK_SERVER", "fork_server"),
        ("AOTI_FARM_RAY_DASHBOARD", "ray_dashboard"))},
    **{f"AOTI_FARM_{name.upper()}": f"nothing ({why})" for name, why in RETIRED_SETTINGS.items()},
    "AOTI_FARM_SIGNING_KEY": "a key file: put the key in a file only you can write and set "
                             "AOTI_FARM_SIGNING_KEY_FILE (a key travels to child processes by path only)",
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

    cache_dir: str | None = None          # resolve() always sets it (cache_dir(): the default is applied there only)
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

    cache_dir: str | None = None          # as FarmConfig's
    ops: tuple | None = None              # None: every op the recorder/compiler support
    devices: tuple = ("cpu", "cuda")
    on_miss: str = "compile"              # compile | queue | ignore
    poll_interval: float = 1.0            # hot reload, seconds
    signing_key_file: str | None = None
    allow_insecure: bool = False
    inductor_options: dict = field(default_factory=dict)
    serve: str = "faster"                 # faster: only kernels faster than eager (runtime/gate.py) | always
    explain_misses: bool = False          # explain each miss once (aoti_farm/report/explain.py)
    memory_budget: int | None = None      # the compile worker's budget per compile; None: budget.py's default
    widen: str = "auto"                   # a miss outside every shape class's range queues: auto | always | off (widen.py)
    install_trial: float = 5.0            # seconds install() may time kernels here before routing (runtime/pretrial.py); 0: off
    queue_cap: int = 1024                 # most signatures one serving process writes to the miss queue (runtime/misswriter.py)
    queue_cap_per_op: int = 128           # ... of them for one op
    contract: str = "finite"              # finite: kernels with edge notes are served | strict: they are not (docs/verification.md)


_SECTIONS = {FarmConfig: "farm", HookConfig: "hook"}

#: ``install()``'s keywords (``runtime/hook.py``; a unit test keeps them equal): every other
#: setting is a field of its ``Settings`` object only.
INSTALL_KEYWORDS = ("cache_dir", "ops", "devices", "on_miss", "serve", "route", "contract", "signing_key_file",
                    "config")


def install_argument(name: str) -> str:
    """How ``install()`` is given the setting ``name``, for an error's fix."""
    return f"install({name}=...)" if name in INSTALL_KEYWORDS else f"install(settings=Settings({name}=...))"

#: The fields a variable ``AOTI_FARM_<FIELD>`` sets (every other field is a flag, an
#: ``install()`` argument or a TOML key only; see the module docstring).
ENV_FIELDS = ("cache_dir", "signing_key_file", "address", "memory_budget", "dynamic",
              "on_miss", "serve", "ops", "explain_misses", "widen", "install_trial", "contract")

#: Every user-facing variable and what it sets (docs/settings.md has the full table).
ENV_VARS = {
    "AOTI_FARM_CONFIG": "the TOML file (config_file)",
    **{f"AOTI_FARM_{n.upper()}": f"field {n}" for n in ENV_FIELDS},
    "AOTI_FARM_METRICS_PORT": "metrics_endpoint: the port a process serves its metrics on",
    "AOTI_FARM_METRICS_ADDR": "metrics_endpoint: the address it binds",
    "AOTI_FARM_METRICS_PORTS": "metrics_endpoint: how many ports from the first it tries",
    "AOTI_FARM_METRICS_SD_DIR": "metrics_endpoint: where it writes a Prometheus file_sd target",
    "AOTI_FARM_HOOK_STATS": "runtime/launch.py: a directory where each `aoti-farm run` process writes its stats",
    **{k: v for k, v in SWITCHES.items() if k.startswith("AOTI_FARM_")},
    DEV_VAR: "developer A/B switches (DEV)",
}

#: Set by the farm for its own children, never by a user.
INTERNAL_VARS = ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD_DIR", "AOTI_FARM_RECORD_OPS", "AOTI_FARM_FORK_SOCKET")

#: The [farm] fields `warm` / `serve` take as flags (aoti_farm/cli/farm_cmds.py).
_FARM_FLAGS = {"cpu_workers", "gpu_workers", "gpus_per_worker", "timeout", "retries", "max_in_flight", "lease_ttl",
               "poll_interval"}
_farm = {f.name for f in dataclasses.fields(FarmConfig)}
_hook = {f.name for f in dataclasses.fields(HookConfig)}
for _n in sorted((_farm | _hook) - set(ENV_FIELDS)):
    _ways = ([(f"--{_n.replace('_', '-')} or " if _n in _FARM_FLAGS else "") + f"[farm] {_n}"]
             if _n in _farm else []) + (
        [f"{install_argument(_n)} or [hook] {_n}"] if _n in _hook else [])
    RETIRED[f"AOTI_FARM_{_n.upper()}"] = " or ".join(_ways) + " in the TOML file"


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """A UserError for a retired variable that is set (naming what replaced it) or a
    malformed ``AOTI_FARM_DEV``."""
    env = os.environ if env is None else env
    for var, instead in RETIRED.items():
        if var in env:
            raise UserError(f"environment {var}: no longer read; use {instead.format(value=env[var] or '0')} "
                            f"and unset {var}")
    _parse_dev(env.get(DEV_VAR, ""))


#: Where the shared kernel cache is when nothing names one.  Applied by :func:`cache_dir`
#: only (through :func:`resolve`); everything below takes the resolved path.
def default_cache_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "aoti-farm")


def config_file(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The TOML file every resolution reads: ``explicit`` (``--config``), else
    ``$AOTI_FARM_CONFIG``; None: no file (the defaults).  There is no implicit file: a
    setting never comes from a file the user did not name."""
    env = os.environ if env is None else env
    return explicit or env.get("AOTI_FARM_CONFIG") or None


#: What the hook does with a miss.
ON_MISS = ("compile", "queue", "ignore")


def check_on_miss(value) -> str:
    """The one check of ``on_miss`` (the config path and ``install()``'s argument)."""
    if value not in ON_MISS:
        raise UserError(f"on_miss: {value!r} is not one of {', '.join(ON_MISS)}; fix install(on_miss=...), "
                        f"--on-miss, AOTI_FARM_ON_MISS or [hook] on_miss")
    return value


def check_serve(value) -> str:
    """The one check of ``serve`` (the config path and ``install()``'s argument)."""
    if value not in ("faster", "always"):
        raise UserError(f"serve: {value!r} is not one of faster, always; fix --serve, "
                        f"AOTI_FARM_SERVE or [hook] serve")
    return value


#: The verification contract a served kernel meets (docs/verification.md, "The contract"):
#: "finite" serves a kernel whose only differences from eager are edge notes (non-finite
#: inputs, overflowing magnitudes, the sign of a zero); "strict" serves none that has one.
CONTRACTS = ("finite", "strict")


def check_contract(value) -> str:
    """The one check of ``contract`` (the config path and ``install()``'s argument)."""
    if value not in CONTRACTS:
        raise UserError(f"contract: {value!r} is not one of {', '.join(CONTRACTS)}; fix install(contract=...), "
                        f"--contract, AOTI_FARM_CONTRACT or [hook] contract")
    return value


#: What a miss outside every shape class's range queues (aoti_farm/compile/widen.py).
WIDEN = ("auto", "always", "off")


def check_widen(value) -> str:
    if value not in WIDEN:
        raise UserError(f"widen: {value!r} is not one of auto, always, off; fix {install_argument('widen')}, "
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
        raise UserError(f"install_trial: {value!r} is not a number of seconds >= 0; "
                        f"fix {install_argument('install_trial')}, "
                        f"AOTI_FARM_INSTALL_TRIAL or [hook] install_trial")
    return v


def from_env(cls: type, name: str, env: Mapping[str, str] | None = None) -> Any:
    """One field of ``cls`` from its variable ``AOTI_FARM_<NAME>``, coerced (a bad value is a
    UserError naming the variable); None when unset or empty.  :func:`resolve` and the
    serving process's settings (``runtime/settings.py``) both read the environment here."""
    if name not in ENV_FIELDS:
        return None
    env = os.environ if env is None else env
    var = f"AOTI_FARM_{name.upper()}"
    v = env.get(var)
    return None if v is None or v == "" else _coerce(cls, name, v, f"environment {var}")


def cache_dir(explicit: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> str:
    """The shared kernel cache: ``explicit``, else ``AOTI_FARM_CACHE_DIR``, else
    :func:`default_cache_dir` (the one place that default is applied)."""
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
    v = (from_env(HookConfig, "serve", env) or "").lower()
    return v if v in ("faster", "always") else default


def metrics_endpoint(port=None, env: Mapping[str, str] | None = None, addr: str | None = None):
    """Where a process serves its metrics: ``port`` (``--metrics-port``), else
    ``AOTI_FARM_METRICS_PORT``; with ``addr`` (``--metrics-addr``) else ``AOTI_FARM_METRICS_ADDR``
    (default 127.0.0.1: loopback only), ``AOTI_FARM_METRICS_PORTS``
    (ports to try, default 64) and ``AOTI_FARM_METRICS_SD_DIR``.  None: no endpoint.  A bad
    port is a UserError naming the flag or the variable."""
    from aoti_farm.metrics.exposition import DEFAULT_PORT_RANGE, LOOPBACK, Endpoint, parse_port

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
    """The resolved signing key's bytes for ``cfg``: the file ``cfg.signing_key_file``
    (``--config``'s TOML or ``AOTI_FARM_SIGNING_KEY_FILE``, through :func:`resolve`); None
    when none is configured.  Fails closed (UserError)."""
    env = os.environ if env is None else env
    if cfg.signing_key_file is None:   # none resolved: a variable set but empty still fails closed
        return load_signing_key(env=env)
    var = env.get("AOTI_FARM_SIGNING_KEY_FILE")
    source = ("AOTI_FARM_SIGNING_KEY_FILE" if var is not None and var.strip() == cfg.signing_key_file
              else "signing_key_file")
    return load_signing_key(path=cfg.signing_key_file, source=source)


def load_signing_key(explicit: str | bytes | None = None, *, path: str | None = None,
                     source: str = "signing_key_file", env: Mapping[str, str] | None = None) -> bytes | None:
    """The signing key: ``explicit`` (bytes); else the file ``path`` (named ``source`` in
    errors); else the file ``AOTI_FARM_SIGNING_KEY_FILE``; None when none is configured.
    Fails closed: a key that is configured but empty, whitespace-only, unreadable or in a
    file someone else could have written is a UserError, never "no signing".  The key
    itself is never read from the environment: it reaches a child process by path only."""
    if explicit is not None:
        key = explicit.encode() if isinstance(explicit, str) else bytes(explicit)
        if not key.strip():
            raise UserError("signing key: empty; pass the key, or None to run without signing")
        return key
    if path is not None:
        return _read_key_file(path, source)
    env = os.environ if env is None else env
    if "AOTI_FARM_SIGNING_KEY" in env:
        raise UserError(f"environment AOTI_FARM_SIGNING_KEY: no longer read; use {RETIRED['AOTI_FARM_SIGNING_KEY']}")
    if "AOTI_FARM_SIGNING_KEY_FILE" in env:
        return _read_key_file(env["AOTI_FARM_SIGNING_KEY_FILE"], "AOTI_FARM_SIGNING_KEY_FILE")
    return None


_key_files: dict[bytes, str] = {}


def key_file_for_children(key: bytes | None, path: str | None) -> str | None:
    """The path a child process reads ``key`` from: ``path`` where the key came from a
    file, else (a key passed as bytes, e.g. ``Settings(signing_key=...)``) a file of this
    process's own (mode 0600 in a 0700 directory, removed at exit).  A key is never an
    argument or an environment variable of a child: both are visible to other users
    (``/proc/<pid>/cmdline``) or inherited by whatever the child starts."""
    if key is None:
        return None
    if path is not None:
        return path
    if key not in _key_files:
        d = tempfile.mkdtemp(prefix="aoti-farm-key-")     # 0700, this user's
        atexit.register(shutil.rmtree, d, True)
        p = os.path.join(d, "key")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        _key_files[key] = p
    return _key_files[key]


#: Most bytes a signing key file may have.
KEY_FILE_MAX = 1 << 16


def _read_key_file(path: str, source: str) -> bytes:
    if not str(path).strip():
        raise UserError(f"{source}: set but empty; name the key file, or unset it to run without signing")
    try:
        # links are followed (secrets are often mounted as links); FIFOs, devices and huge files are not read
        # owner and mode checked as for the cache's own files: this user or root, not world-writable
        data = safeio.read_bounded(os.path.realpath(path), max_bytes=KEY_FILE_MAX, uids=safeio.allowed_uids(),
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
        raise UserError(f"{source}: {name}: {e}; fix the value (set by {where(cls, name)})") from None


def where(cls: type, name: str) -> str:
    """Where the setting ``name`` of ``cls`` is set, for an error's fix (docs/settings.md)."""
    ways = [install_argument(name)] if cls is HookConfig else []
    if cls is FarmConfig and name in _FARM_FLAGS | {"cache_dir", "address", "memory_budget", "dynamic"}:
        ways.append(f"--{name.replace('_', '-')}")
    if name in ENV_FIELDS:
        ways.append(f"AOTI_FARM_{name.upper()}")
    return ", ".join(ways + [f"[{_SECTIONS[cls]}] {name}"])


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
            config_path: str | None = None, cli_label: str | Callable[[str], str] = "option --{flag}") -> Any:
    """Build ``cls`` from defaults < TOML < environment < CLI (values of None are unset).
    ``cli_label`` names an explicit value in errors (``{flag}``, ``{name}``, or a function of
    the name): a flag for a command, an argument for ``install()`` (:func:`install_argument`)."""
    env = os.environ if env is None else env
    check_environment(env)
    section = _SECTIONS[cls]
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    path = config_file(config_path, env)
    if path:
        doc = load_toml(path)
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise UserError(f"config {path}: [{section}] must be a table; fix the file")
        for k, v in table.items():
            if k in RETIRED_SETTINGS:
                raise UserError(f"config {path}: [{section}] {k} is retired ({RETIRED_SETTINGS[k]}); remove it")
            if k not in names:
                raise UserError(f"config {path}: [{section}] has unknown key {k!r}; valid keys: {', '.join(names)}")
            values[k] = _coerce(cls, k, v, f"config {path} [{section}]")
    for k in names:
        ev = from_env(cls, k, env)
        if ev is not None:
            values[k] = ev
    for k, v in (cli or {}).items():
        if v is not None:
            label = (cli_label(k) if callable(cli_label) else
                     cli_label.format(flag=k.replace("_", "-"), name=k))
            if k not in names:
                raise UserError(f"{label}: unknown")
            values[k] = _coerce(cls, k, v, label)
    values["cache_dir"] = cache_dir(values.get("cache_dir"), {})   # the default, applied here only
    cfg = cls(**values)
    if isinstance(cfg, HookConfig):
        check_on_miss(cfg.on_miss)
    if isinstance(cfg, HookConfig):
        check_serve(cfg.serve)
        check_contract(cfg.contract)
        check_widen(cfg.widen)
        check_install_trial(cfg.install_trial)
        for n in ("queue_cap", "queue_cap_per_op"):
            if getattr(cfg, n) < 1:
                raise UserError(f"{n}: {getattr(cfg, n)} must be at least 1 (on_miss='ignore' queues nothing); "
                                f"fix {install_argument(n)} or [hook] {n}")
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
