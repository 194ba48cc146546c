"""Settings are resolved once, by the command layer (``aoti_farm/cli/``, through
``aoti_farm/config.py``): no module below it reads the environment, except where it builds a
child process's environment, reads a documented low-level switch (``config.SWITCHES``), or
is the command layer of a process of its own (``aoti-farm run``'s launcher and its child
side).  A serving process's ``runtime/settings.py`` resolves through ``config.py`` too.  Read from the sources (AST): every ``os.environ`` / ``os.getenv``
outside a write (``os.environ[k] = v``, ``.setdefault``, ``.update``, ``.pop``: this process
telling torch or a child something) counts as a read.
"""

from __future__ import annotations

import ast
from pathlib import Path

from aoti_farm.config import SWITCHES

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("aoti_farm", "workers", "runtime")
COMMAND_LAYER = ("aoti_farm/cli/", "aoti_farm/config.py", "aoti_farm/__main__.py")
WRITES = {"setdefault", "update", "pop"}

CHILD = "builds a child process's environment"
#: (file, function) -> why it may read the environment; a switch names its variable.
ALLOWED = {
    ("aoti_farm/loadenv.py", "child_env"): CHILD,
    ("aoti_farm/loadenv.py", "_try_load"): CHILD + " (the loader probe)",
    ("aoti_farm/sandbox.py", "scrubbed_env"): CHILD + " (secrets removed)",
    ("workers/placement.py", "worker_env"): CHILD + " (the compile actors)",
    ("workers/raysetup.py", "start_ray"): CHILD + " (what an embedded Ray's workers inherit); switch AOTI_FARM_RAY_DASHBOARD",
    ("runtime/supervisor.py", "worker_env"): CHILD + " (the hook's compile worker)",
    ("workers/compile_actor.py", "info"): "reports the CUDA_VISIBLE_DEVICES its Ray worker was started with",
    ("runtime/launch.py", "_child_env"): CHILD + " (`aoti-farm run`'s program)",
    ("aoti_farm/loadenv.py", "forced"): "switch AOTI_FARM_PRELOAD_LIBSTDCXX",
    ("aoti_farm/loadenv.py", "preloaded"): "switch LD_PRELOAD",
    ("aoti_farm/splitbuild.py", "enabled"): "switch AOTI_FARM_SPLIT_WRAPPER",
    ("aoti_farm/fingerprint.py", "seed_inductor_vec_isa"): "switch AOTI_FARM_ISA_REPLAY",
    ("aoti_farm/isapredict.py", "enabled"): "switch AOTI_FARM_ISA_PREDICT",
    ("aoti_farm/isafork.py", "enabled"): "switch AOTI_FARM_ISA_FORK",
    ("aoti_farm/isaload.py", "fast_loads"): "switch AOTI_FARM_ISA_FAST_LOAD",
    ("aoti_farm/isaload.py", "check_call"): CHILD + " (an ISA load check)",
    ("workers/earlyray.py", "enabled"): "switch AOTI_FARM_EARLY_RAY",
    ("workers/forkclient.py", "mode"): "switch AOTI_FARM_FORK_SERVER",
    ("workers/forkclient.py", "inherited_socket"): "where an embedded Ray's workers find the fork server (set by start_ray)",
    ("workers/forkclient.py", "attach"): "the actor hands its environment to its forked copy",
    ("workers/forkserver.py", "_copy"): "a forked copy takes its actor's environment",
    ("workers/forkserver.py", "_apply_threads"): "a forked copy takes its actor's OMP_NUM_THREADS",
    ("aoti_farm/pyprecompile.py", "enabled"): "switch AOTI_FARM_PRECOMPILE",
    ("aoti_farm/pyprecompile.py", "start"): CHILD + " (a bytecode compiler)",
    ("aoti_farm/pyprecompile.py", "record"): CHILD + " (the list's recording warm, a developer's tool)",
    ("aoti_farm/private.py", "root"): "switch XDG_CACHE_HOME",
    ("aoti_farm/private.py", "inductor_cache_dir"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("aoti_farm/private.py", "inductor_cache_scope"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("aoti_farm/private.py", "default_cache_dir"): "switch TORCHINDUCTOR_CACHE_DIR",
    ("runtime/native.py", "disabled"): "switch AOTI_FARM_NATIVE",
    ("runtime/native.py", "compiler"): "switch CXX",
    ("runtime/native.py", "native_dir"): "switch AOTI_FARM_NATIVE_DIR, XDG_CACHE_HOME",
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
    assert ("aoti_farm/splitbuild.py", "enabled") in {(f, fn) for f, fn, _ in reads}
    # the compile actor sets TORCHINDUCTOR_COMPILE_THREADS for its own Inductor (a write) and
    # only reports what its worker was given (a read)
    assert [r[1] for r in reads if r[0] == "workers/compile_actor.py"] == ["info"]


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

    from aoti_farm.config import HookConfig
    from aoti_farm.errors import UserError
    from aoti_farm.exposition import Endpoint
    from aoti_farm.fsutil import default_cache_dir
    from aoti_farm.runtime.settings import resolve

    env = {"AOTI_FARM_CACHE_DIR": str(tmp_path), "AOTI_FARM_MEMORY_BUDGET": "6G", "AOTI_FARM_SERVE": "always",
           "AOTI_FARM_YIELD_CORE": "0", "AOTI_FARM_EXPLAIN_MISSES": "1", "AOTI_FARM_METRICS_PORT": "0",
           "AOTI_FARM_METRICS_PORTS": "3"}
    s = resolve(env=env)
    assert (s.cache_dir, s.memory_budget, s.serve, s.yield_core, s.explain_misses) == (
        str(tmp_path), 6 << 30, "always", False, True)
    assert s.metrics == Endpoint(0, span=3)
    s = resolve(env=env, cache_dir=tmp_path / "x", memory_budget="1M", serve="faster", yield_core=True,
                explain_misses=False, metrics_port=9000)
    assert (s.cache_dir, s.memory_budget, s.serve, s.yield_core, s.explain_misses, s.metrics.port) == (
        str(tmp_path / "x"), 1 << 20, "faster", True, False, 9000)
    s = resolve(env={})
    assert (s.cache_dir, s.memory_budget, s.serve, s.yield_core, s.explain_misses, s.metrics, s.signing_key) == (
        default_cache_dir(), None, HookConfig.serve, HookConfig.yield_core, HookConfig.explain_misses, None, None)
    for var, bad in (("AOTI_FARM_MEMORY_BUDGET", "lots"), ("AOTI_FARM_SERVE", "sometimes"),
                     ("AOTI_FARM_YIELD_CORE", "maybe"), ("AOTI_FARM_EXPLAIN_MISSES", "perhaps"),
                     ("AOTI_FARM_METRICS_PORT", "http")):
        with pytest.raises(UserError, match=var):
            resolve(env={var: bad})


def test_the_compile_worker_gets_its_hooks_budget_as_an_argument(tmp_path):
    import threading
    from types import SimpleNamespace

    from aoti_farm.cache import Cache
    from aoti_farm.runtime.room import ThreadRoom
    from aoti_farm.runtime.supervisor import WorkerSupervisor

    def command(budget):
        sup = WorkerSupervisor(Cache(tmp_path), {"cpu": SimpleNamespace(id="0" * 24)}, {}, str(tmp_path / "log"),
                               1.0, ThreadRoom(False), threading.Event(), budget)
        return sup.command("cpu")

    cmd = command(6 << 30)
    assert cmd[cmd.index("--memory-budget") + 1] == str(6 << 30)
    assert "--memory-budget" not in command(None)
