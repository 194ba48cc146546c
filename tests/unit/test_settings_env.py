"""Settings are resolved once, by ``aoti_farm/config.py`` (for the commands, ``install()``
through ``runtime/settings.py``, and ``aoti-farm run``): no module below it reads the
environment, except where it builds a child process's environment, reads a documented
low-level switch (``config.SWITCHES``), or is the command layer of a process of its own
(``aoti-farm run``'s launcher and its child side).  Developer A/B switches are read through
``config.dev`` (``AOTI_FARM_DEV``), never as variables of their own; and no ``AOTI_FARM_*``
name appears in the source that ``config.py`` does not list as user-facing, internal or
retired.  Read from the sources (AST): every ``os.environ`` / ``os.getenv``
outside a write (``os.environ[k] = v``, ``.setdefault``, ``.update``, ``.pop``: this process
telling torch or a child something) counts as a read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import re

from aoti_farm.config import ENV_VARS, INTERNAL_VARS, RETIRED, SWITCHES

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("aoti_farm", "workers", "runtime")
COMMAND_LAYER = ("aoti_farm/cli/", "aoti_farm/config.py", "aoti_farm/__main__.py")
WRITES = {"setdefault", "update", "pop"}

CHILD = "builds a child process's environment"
#: (file, function) -> why it may read the environment; a switch names its variable.
ALLOWED = {
    ("aoti_farm/startup/loadenv.py", "child_env"): CHILD,
    ("aoti_farm/startup/loadenv.py", "_try_load"): CHILD + " (the loader probe)",
    ("aoti_farm/startup/isaload.py", "check_call"): CHILD + " (an ISA load check)",
    ("workers/placement.py", "worker_env"): CHILD + " (the compile actors)",
    ("workers/raysetup.py", "start_ray"): CHILD + " (what an embedded Ray's workers inherit)",
    ("aoti_farm/startup/pyprecompile.py", "start"): CHILD + " (a bytecode compiler)",
    ("aoti_farm/startup/pyprecompile.py", "record"): CHILD + " (the list's recording warm, a developer's tool)",
    ("runtime/supervisor.py", "worker_env"): CHILD + " (the hook's compile worker)",
    ("workers/compile_actor.py", "info"): "reports the CUDA_VISIBLE_DEVICES and OMP_WAIT_POLICY its Ray worker "
                                          "was started with",
    ("runtime/launch.py", "_child_env"): CHILD + " (`aoti-farm run`'s program)",
    ("aoti_farm/startup/loadenv.py", "forced"): "switch AOTI_FARM_PRELOAD_LIBSTDCXX",
    ("aoti_farm/startup/loadenv.py", "preloaded"): "switch LD_PRELOAD",
    ("workers/forkclient.py", "inherited_socket"): "where an embedded Ray's workers find the fork server (set by start_ray)",
    ("workers/forkclient.py", "attach"): "the actor hands its environment to its forked copy",
    ("workers/forkserver.py", "_copy"): "a forked copy takes its actor's environment",
    ("workers/forkserver.py", "_apply_threads"): "a forked copy takes its actor's OMP_NUM_THREADS",
    ("aoti_farm/security/private.py", "root"): "switch XDG_CACHE_HOME",
    ("aoti_farm/security/private.py", "inductor_cache_dir"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("aoti_farm/security/private.py", "inductor_cache_scope"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("aoti_farm/security/private.py", "private_cache_dir"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("aoti_farm/speedgate/hitpath.py", "disabled"): "switch AOTI_FARM_NATIVE",
    ("aoti_farm/speedgate/hitpath.py", "compiler"): "switch CXX",
    ("aoti_farm/speedgate/hitpath.py", "native_dir"): "switch AOTI_FARM_NATIVE_DIR, XDG_CACHE_HOME",
    # the launched program's side (its own command layer)
    ("runtime/launch.py", "run_command"): "`aoti-farm run`: a command",
    ("runtime/launch.py", "boot"): "the launched program's side of `aoti-farm run`/`record`",
    ("runtime/_site/sitecustomize.py", "<module>"): "the launched program's side of `aoti-farm run`/`record`",
}


def env_reads() -> list[tuple[str, str, int]]:
    """(file, enclosing function, line) of every read of the environment below the command layer."""
    out = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel.startswith(COMMAND_LAYER):
                continue
            tree = ast.parse(path.read_text(), rel)
            parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}

            def function_of(node) -> str:
                while node in parents:
                    node = parents[node]
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        return node.name
                return "<module>"

            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                        and isinstance(node.value, ast.Name) and node.value.id == "os"):
                    continue
                up = parents.get(node)
                if isinstance(up, ast.Attribute) and up.attr in WRITES and isinstance(parents.get(up), ast.Call):
                    continue
                if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store):
                    continue
                out.append((rel, function_of(node), node.lineno))
    return out


def test_the_scan_sees_reads_and_not_writes(tmp_path):
    reads = env_reads()
    assert ("aoti_farm/speedgate/hitpath.py", "disabled") in {(f, fn) for f, fn, _ in reads}
    # the compile actor sets TORCHINDUCTOR_COMPILE_THREADS for its own Inductor (a write) and
    # only reports what its worker was given (a read)
    assert set(r[1] for r in reads if r[0] == "workers/compile_actor.py") == {"info"}


def test_no_environment_read_below_the_command_layer_but_the_listed_ones():
    bad = [f"{f}:{line} ({fn}) reads the environment" for f, fn, line in env_reads() if (f, fn) not in ALLOWED]
    assert not bad, "\n".join(bad) + "\nresolve the setting in aoti_farm/config.py and pass it down"


def test_the_exceptions_are_still_true():
    """The core's and the workers' exceptions still read there (runtime/ drops its own as
    its settings move; those may go from ALLOWED after it)."""
    seen = {(f, fn) for f, fn, _ in env_reads()}
    stale = sorted(k for k in ALLOWED if k not in seen)
    assert not stale, f"no longer read there; drop them from ALLOWED: {stale}"


def test_every_switch_is_listed_in_one_place():
    named = {v.strip(",") for why in ALLOWED.values() if "switch " in why
             for v in why.split("switch ", 1)[1].replace(",", " ").split()}
    assert named == set(SWITCHES), (named ^ set(SWITCHES))


def test_a_serving_process_resolves_its_settings_through_config(tmp_path):
    """install()'s unset settings come from config.py's resolution (one set of variable
    names, parsers and defaults); an explicit argument wins; a bad value names its variable."""
    import pytest

    from aoti_farm.config import HookConfig, default_cache_dir
    from aoti_farm.errors import UserError
    from aoti_farm.metrics.exposition import Endpoint
    from aoti_farm.runtime.settings import resolve

    env = {"AOTI_FARM_CACHE_DIR": str(tmp_path), "AOTI_FARM_MEMORY_BUDGET": "6G", "AOTI_FARM_SERVE": "always",
           "AOTI_FARM_EXPLAIN_MISSES": "1", "AOTI_FARM_METRICS_PORT": "0",
           "AOTI_FARM_METRICS_PORTS": "3", "AOTI_FARM_ON_MISS": "queue"}
    s = resolve(env=env)
    c = s.config
    assert (c.cache_dir, c.memory_budget, c.serve, c.explain_misses, c.on_miss) == (
        str(tmp_path), 6 << 30, "always", True, "queue")
    assert s.metrics == Endpoint(0, span=3)
    s = resolve(env=env, cache_dir=tmp_path / "x", memory_budget="1M", serve="faster",
                explain_misses=False, metrics_port=9000, on_miss="ignore")
    c = s.config
    assert (c.cache_dir, c.memory_budget, c.serve, c.explain_misses, s.metrics.port,
            c.on_miss) == (str(tmp_path / "x"), 1 << 20, "faster", False, 9000, "ignore")
    s = resolve(env={})
    c = s.config
    assert (c.cache_dir, c.memory_budget, c.serve, c.explain_misses, s.metrics, s.signing_key) == (
        default_cache_dir(), None, HookConfig.serve, HookConfig.explain_misses, None, None)
    assert s.config == HookConfig(cache_dir=default_cache_dir())
    for var, bad in (("AOTI_FARM_MEMORY_BUDGET", "lots"), ("AOTI_FARM_SERVE", "sometimes"),
                     ("AOTI_FARM_YIELD_CORE", "1"), ("AOTI_FARM_EXPLAIN_MISSES", "perhaps"),
                     ("AOTI_FARM_METRICS_PORT", "http"), ("AOTI_FARM_ON_MISS", "later"),
                     ("AOTI_FARM_FORK_SERVER", "0"), ("AOTI_FARM_SIGNING_KEY", "k")):
        with pytest.raises(UserError, match=var):
            resolve(env={var: bad})


def _run_ns(argv):
    import argparse

    from aoti_farm.runtime import launch

    p = argparse.ArgumentParser()
    launch.add_run_args(p)
    return p.parse_args(argv + ["--", "true"])


def test_install_and_run_resolve_the_same_settings(tmp_path):
    """One environment and one TOML file: ``install()`` (runtime/settings.py) and
    ``aoti-farm run`` (its parent's resolution, then its child's install() from the
    arguments the parent hands over) resolve the same HookConfig; the file's [hook] table
    and AOTI_FARM_ON_MISS count for both, and a flag wins for run as an argument does for
    install()."""
    import json

    from aoti_farm.runtime import launch
    from aoti_farm.runtime import settings

    key = tmp_path / "key"
    key.write_bytes(b"fleet-secret\n")
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[hook]\nserve = "always"\npoll_interval = 0.5\nwiden = "off"\ninstall_trial = 0\n'
                    f'devices = ["cpu"]\ninductor_options = {{ max_autotune = false }}\n'
                    f'signing_key_file = "{key}"\nexplain_misses = true\n')
    env = {"AOTI_FARM_CONFIG": str(toml), "AOTI_FARM_ON_MISS": "queue", "AOTI_FARM_CACHE_DIR": str(tmp_path / "c"),
           "AOTI_FARM_EXPLAIN_MISSES": "0", "AOTI_FARM_OPS": "aten::add.Tensor"}

    by_install = settings.resolve(env=env)
    by_run = launch.hook_config(_run_ns([]), env=env)
    assert by_install.config == by_run
    cfg = by_run
    assert (cfg.serve, cfg.poll_interval, cfg.widen, cfg.install_trial, cfg.devices) == (
        "always", 0.5, "off", 0.0, ("cpu",))                                  # the TOML file
    assert (cfg.on_miss, cfg.cache_dir, cfg.explain_misses, cfg.ops) == (
        "queue", str(tmp_path / "c"), False, ("aten::add.Tensor",))           # the environment over it
    assert by_install.signing_key == b"fleet-secret" and by_install.key_file == str(key)
    # the child: install() with the arguments `aoti-farm run` hands it (AOTI_FARM_HOOK)
    raw = json.dumps(launch.install_arguments(by_run))
    assert b"fleet-secret" not in raw.encode()                               # the key goes by path
    child = settings.resolve(env=env, **launch.child_arguments(raw))
    assert child.config == by_install.config and child.signing_key == by_install.signing_key
    # a flag wins, as install()'s argument does
    flagged = launch.hook_config(_run_ns(["--on-miss", "ignore", "--serve", "faster"]), env=env)
    assert flagged == settings.resolve(env=env, on_miss="ignore", serve="faster").config
    assert (flagged.on_miss, flagged.serve) == ("ignore", "faster")


def test_developer_switches_are_read_through_config_only():
    """The A/B switches are keys of AOTI_FARM_DEV, read by config.dev where they act: no
    module reads a switch variable of its own, and each reader names a key config knows."""
    from aoti_farm.config import DEV

    src = {p: p.read_text() for folder in FOLDERS for p in (REPO / folder).rglob("*.py")}
    used = {k for text in src.values() for k in re.findall(r'DEV = "(\w+)"', text)}
    used |= {k for text in src.values() for k in re.findall(r'_dev\("(\w+)"\)', text)}
    used |= {k for text in src.values() for k in re.findall(r'REPLAY_DEV = "(\w+)"', text)}
    assert used and used <= set(DEV), used - set(DEV)
    retired = {v for v in RETIRED if "AOTI_FARM_DEV" in RETIRED[v]}
    for p, text in src.items():
        rel = str(p.relative_to(REPO))
        if rel == "aoti_farm/config.py":
            continue
        named = retired & set(re.findall(r"AOTI_FARM_[A-Z0-9_]+", text))
        assert not named, f"{rel} still names {sorted(named)}"


def test_every_variable_in_the_source_is_listed_and_few_are_user_facing():
    """Every AOTI_FARM_* name the farm's source mentions is one config.py lists: a
    user-facing variable (at most 25, each in docs/settings.md), an internal one (set by
    the farm for its children) or a retired one (refused, naming its replacement)."""
    known = set(ENV_VARS) | set(INTERNAL_VARS) | set(RETIRED)
    seen = {}
    for folder in FOLDERS:
        for p in (REPO / folder).rglob("*.py"):
            for name in re.findall(r"AOTI_FARM_[A-Z0-9_]*[A-Z0-9]", p.read_text()):
                seen.setdefault(name, str(p.relative_to(REPO)))
    unknown = {n: f for n, f in seen.items() if n not in known}
    assert not unknown, f"variables config.py does not list: {unknown}"
    user = [v for v in ENV_VARS if v.startswith("AOTI_FARM_")]
    assert len(user) <= 25, user
    doc = (REPO / "docs" / "settings.md").read_text()
    missing = [v for v in user if f"`{v}`" not in doc]
    assert not missing, f"docs/settings.md lacks {missing}"
    import dataclasses

    from aoti_farm.config import DEV, FarmConfig, HookConfig

    fields = {f.name for cls in (FarmConfig, HookConfig) for f in dataclasses.fields(cls)}
    missing = sorted(k for k in fields | set(DEV) if f"`{k}`" not in doc)
    assert not missing, f"docs/settings.md lacks the keys {missing}"


def test_the_cache_directorys_default_is_applied_in_one_place():
    """``config.cache_dir`` applies the default; nothing else does (a Cache or open_cache
    without a resolved directory is a programming error, not a silent default)."""
    import pytest

    from aoti_farm.cache.store import Cache
    from aoti_farm.cache.opening import open_cache

    callers = sorted(str(p.relative_to(REPO)) for folder in FOLDERS for p in (REPO / folder).rglob("*.py")
                     if "default_cache_dir(" in p.read_text())
    assert callers == ["aoti_farm/config.py"], callers
    text = (REPO / "aoti_farm/config.py").read_text()
    assert len(re.findall(r"(?<!def )default_cache_dir\(\)", text)) == 1   # the call in cache_dir()
    with pytest.raises(ValueError):
        Cache(None)
    with pytest.raises(ValueError):
        open_cache(None)


def test_the_compile_worker_gets_its_hooks_budget_as_an_argument(tmp_path):
    import threading
    from types import SimpleNamespace

    from aoti_farm.cache.store import Cache
    from aoti_farm.runtime.room import ThreadRoom
    from aoti_farm.runtime.supervisor import WorkerSupervisor

    def command(budget):
        sup = WorkerSupervisor(Cache(tmp_path), {"cpu": SimpleNamespace(id="0" * 24)}, {}, str(tmp_path / "log"),
                               1.0, ThreadRoom(), threading.Event(), budget)
        return sup.command("cpu")

    cmd = command(6 << 30)
    assert cmd[cmd.index("--memory-budget") + 1] == str(6 << 30)
    assert "--memory-budget" not in command(None)
