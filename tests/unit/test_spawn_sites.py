"""Every place the package starts a process is found here, and each Python child imports
only the farm's and the environment's code (aoti_farm/startup/spawn.py): its argv comes from
``spawn.python`` (``-P``), and ``ray.init`` runs inside ``spawn.private_cwd`` (Ray puts the
driver's working directory first on every worker's ``sys.path``).

Read from the sources (AST) of aoti_farm/, runtime/ and workers/: a new call that starts a
process fails this test until it is listed in :data:`SITES` with what it starts.  The
drill that plants modules in a working directory and runs the helpers from there is
tests/e2e/test_drills_planted_modules.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("aoti_farm", "workers", "runtime")

#: Calls that start a process (module alias, attribute).
STARTERS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output", "getoutput",
                                        "getstatusoutput")}
STARTERS |= {("os", n) for n in ("system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle",
                                 "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                                 "spawnle", "posix_spawn", "posix_spawnp")}
STARTERS |= {("ray", "init"), ("multiprocessing", "Process"), ("multiprocessing", "Pool"),
             ("multiprocessing", "get_context")}

PY = "python"          # argv from spawn.python in the same function, or (PY, name): in the
                       # function or module-level variable ``name`` of the same file
RAY = "ray"            # inside `with spawn.private_cwd()`
#: (file, function) -> what it starts.  PY and RAY are checked; the others say why no
#: Python of ours is started there.
SITES = {
    ("aoti_farm/startup/loadenv.py", "_try_load"): PY,
    ("aoti_farm/startup/pyprecompile.py", "start"): PY,
    ("aoti_farm/startup/pyprecompile.py", "record"): PY,
    ("aoti_farm/compile/verifyserver.py", "_start_locked"): (PY, "CHILD"),
    ("aoti_farm/compile/hostprep.py", "prepare_in_child"): PY,
    ("aoti_farm/compile/hostprep.py", "__init__"): PY,
    ("aoti_farm/compile/hostprep.py", "start_native_build"): PY,
    ("aoti_farm/startup/isaload.py", "check_call"): PY,
    ("runtime/native.py", "build_in_background"): PY,
    ("runtime/supervisor.py", "_start"): (PY, "command"),
    ("runtime/drill.py", "compile_all"): PY,
    ("runtime/drill.py", "replay"): PY,
    ("workers/forkserver.py", "start"): PY,
    ("workers/raysetup.py", "start_ray"): RAY,
    ("aoti_farm/build/commonobj.py", "_compiler_version"): "the C++ compiler's --version",
    ("aoti_farm/build/commonobj.py", "regex_match_declared"): "the C++ compiler's preprocessor (-E) on a probe",
    ("aoti_farm/build/commonobj.py", "_start"): "a C++ compiler (Inductor's own command line)",
    ("aoti_farm/speedgate/hitpath.py", "_compiler_version"): "the C++ compiler's --version",
    ("aoti_farm/speedgate/hitpath.py", "build"): "the C++ compiler building the native hit path",
    ("runtime/launch.py", "_run"): "the user's own program (`aoti-farm run -- CMD`)",
    ("aoti_farm/cli/bench.py", "main"): "scripts/bench/run.py by its path: its own directory, the checkout's",
}


def _parse(rel: str):
    tree = ast.parse((REPO / rel).read_text(), rel)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    return tree, parents


def _function_of(node, parents):
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _is_attr(node, mod: str, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
            and node.value.id == mod)


def _sources():
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield str(path.relative_to(REPO))


def spawn_sites() -> list[tuple[str, str, int, ast.AST, dict]]:
    """(file, function, line, call node, parents) of every call that starts a process."""
    out = []
    for rel in _sources():
        tree, parents = _parse(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(_is_attr(node.func, m, n) for m, n in STARTERS):
                fn = _function_of(node, parents)
                out.append((rel, fn.name if fn else "<module>", node.lineno, node, parents))
    return out


def _calls_spawn_python(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and _is_attr(n.func, "spawn", "python") for n in ast.walk(fn))


def _named(rel: str, name: str):
    """The function or module-level assignment called ``name`` in ``rel``."""
    tree, _ = _parse(rel)
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
            return n
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            return n
    return None


def _inside_private_cwd(node, parents) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With) and any(
                isinstance(i.context_expr, ast.Call) and _is_attr(i.context_expr.func, "spawn", "private_cwd")
                for i in node.items):
            return True
    return False


def test_every_site_that_starts_a_process_is_listed_and_safe():
    sites = spawn_sites()
    assert len(sites) >= len(SITES) - 2, "the scan found too few sites: is it still reading the sources?"
    unlisted, unsafe = [], []
    for rel, fn_name, line, node, parents in sites:
        kind = SITES.get((rel, fn_name))
        where = f"{rel}:{line} ({fn_name})"
        if kind is None:
            unlisted.append(where)
        elif kind == PY or (isinstance(kind, tuple) and kind[0] == PY):
            built_in = _function_of(node, parents) if kind == PY else _named(rel, kind[1])
            if built_in is None or not _calls_spawn_python(built_in):
                unsafe.append(f"{where}: a Python child whose argv is not spawn.python(...)")
        elif kind == RAY and not _inside_private_cwd(node, parents):
            unsafe.append(f"{where}: ray.init outside `with spawn.private_cwd()`")
    assert not unlisted, f"processes started at sites this test does not know; list them in SITES: {unlisted}"
    assert not unsafe, unsafe
    found = {(rel, fn) for rel, fn, *_ in sites}
    assert not set(SITES) - found, f"SITES lists places that start nothing now: {sorted(set(SITES) - found)}"


def test_no_argv_names_the_interpreter_except_spawn():
    """``sys.executable`` inside a list or tuple (an argv) only in aoti_farm/startup/spawn.py and
    the benchmark runner (a script by path, SITES says why)."""
    found = []
    for rel in _sources():
        if rel in ("aoti_farm/startup/spawn.py", "aoti_farm/cli/bench.py"):
            continue
        tree, parents = _parse(rel)
        for node in ast.walk(tree):
            if _is_attr(node, "sys", "executable") and isinstance(parents.get(node), (ast.List, ast.Tuple, ast.Starred)):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"an argv built around sys.executable instead of spawn.python: {found}"


def test_spawn_python_drops_the_unsafe_path_entry():
    import sys

    from aoti_farm.startup import spawn

    argv = spawn.python("-m", "x")
    assert argv[:2] == [sys.executable, "-P"] and argv[2:] == ["-m", "x"]
