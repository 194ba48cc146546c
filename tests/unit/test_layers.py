"""The import layers of the package, read from the sources (AST), so nothing is imported.

Layers (folders):
  * core     -- ``aoti_farm/``: its rooms (security, metrics, signature, dynamic, startup,
               speedgate, build, cache, compile, interop, report) and the flat modules
               (config, errors, fingerprint, trace, budget);
  * workers  -- ``workers/`` = ``aoti_farm.workers`` (everything Ray);
  * runtime  -- ``runtime/`` = ``aoti_farm.runtime`` (everything in a serving process);
  * command  -- ``aoti_farm/cli/`` = ``aoti_farm.cli`` (arguments, environment, TOML, printing,
               exit codes), and ``aoti_farm/__main__.py``.
Rules: the core imports neither workers, runtime nor the command layer; workers and runtime
import neither each other nor the command layer.  The one exception is the package's
``aoti_farm/__init__.py``, the distribution's entrance: its documented ``aoti_farm.record``
forwards to ``aoti_farm.runtime.recorder`` (imported when called).

Rooms: inside the core, each subpackage of ``aoti_farm/`` is a room (``compile``, ``build``,
``cache``, ...) and each module left directly in ``aoti_farm/`` is a room of its own
(``config``, ``errors``, ...).  :data:`ROOMS` says which rooms each room may import; the
table itself has no cycle, so a lower room never imports a higher one.  A new room, or a
new kind of edge between rooms, fails until it is entered there (and in docs/DESIGN.md's map).
At most :data:`FLAT_MAX` modules sit directly in ``aoti_farm/``, and no module of the
package is longer than :data:`LINES_MAX` lines.

Edges: module A -> module B when A holds an ``import`` of B anywhere (module level,
function level, under ``if TYPE_CHECKING``: every import statement counts).  ``from P import
n`` is an edge to ``P.n`` when that is a module, else to ``P``; ``import P.Q`` is an edge to
``P.Q`` only (the parent packages' ``__init__`` run too, but that is Python's mechanics,
not a dependency of A).  A cycle is a strongly connected component of that graph with two
or more modules, or a module importing itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"aoti_farm": REPO / "aoti_farm", "aoti_farm.workers": REPO / "workers",
         "aoti_farm.runtime": REPO / "runtime"}
ENTRANCE = "aoti_farm"
ENTRANCE_ALLOWED = {"aoti_farm.runtime.recorder"}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (packages by their ``__init__``)."""
    out = {}
    for pkg, root in ROOTS.items():
        for f in root.rglob("*.py"):
            rel = f.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if "_site" in parts:          # the launcher's sitecustomize: runs in a child, not imported
                continue
            out[".".join([pkg, *parts])] = f
    return out


def layer(mod: str) -> str:
    if mod == "aoti_farm.__main__":       # ``python -m aoti_farm``: the command
        return "cli"
    for name in ("workers", "runtime", "cli"):
        if mod == f"aoti_farm.{name}" or mod.startswith(f"aoti_farm.{name}."):
            return name
    return "core"


def _resolve_from(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports (see the module docstring)."""
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_from(mod, is_pkg, node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for n in names:
                if n.startswith(ENTRANCE):
                    assert n in mods, f"{path}: imports {n}, which is not a module of the package"
                    deps.add(n)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan) with more than one module, and self-imports."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


FORBIDDEN = {"core": {"workers", "runtime", "cli"}, "workers": {"cli", "runtime"}, "runtime": {"cli", "workers"},
             "cli": set()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        for d in sorted(deps):
            if mod == ENTRANCE and d in ENTRANCE_ALLOWED:
                continue
            if layer(d) in FORBIDDEN[layer(mod)]:
                bad.append(f"{mod} ({layer(mod)}) imports {d} ({layer(d)})")
    return bad


def test_the_walk_sees_every_kind_of_import():
    mods = modules()
    assert {"aoti_farm.cache.store", "aoti_farm.workers.compile_actor", "aoti_farm.runtime.hook"} <= set(mods)
    g = imports(mods)
    # a module-level, a function-level and a relative-free from-import are all seen
    assert "aoti_farm.cache.store" in g["aoti_farm.compile.job"]
    assert "aoti_farm.runtime.recorder" in g["aoti_farm"]          # inside record()
    assert "aoti_farm.runtime.room" in g["aoti_farm.runtime.hook"]   # a relative import (from .room import ...)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]] and cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_crosses_the_layers_upward():
    bad = upward(imports(modules()))
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    found = cycles(imports(modules()))
    assert not found, "\n".join(" <-> ".join(c) for c in found)


#: The core's rooms, bottom up, and the rooms each may import (its own modules aside).
#: ``aoti_farm`` is the package's ``__init__`` (the entrance; ``IMPORTED_AT``).
ROOMS: dict[str, set[str]] = {
    "errors": set(),
    "aoti_farm": set(),
    "security": {"errors"},
    "signature": {"errors"},
    "metrics": {"errors", "security"},
    "dynamic": {"errors", "signature"},
    "budget": {"errors", "metrics", "signature"},
    "config": {"budget", "errors", "metrics", "security"},
    "trace": {"errors", "security", "signature"},
    "startup": {"aoti_farm", "config", "errors", "security", "trace"},
    "fingerprint": {"config", "errors", "security", "startup"},
    "speedgate": {"config", "errors", "security", "signature", "startup"},
    "build": {"config", "errors", "metrics", "security", "startup"},
    "cache": {"config", "dynamic", "errors", "fingerprint", "metrics", "security", "signature"},
    "compile": {"budget", "build", "cache", "config", "dynamic", "errors", "fingerprint", "metrics", "security",
                "signature", "speedgate", "startup", "trace"},
    "interop": {"cache", "compile", "errors", "fingerprint", "security", "signature"},
    "report": {"aoti_farm", "cache", "config", "dynamic", "errors", "fingerprint", "metrics", "security",
               "signature", "speedgate", "trace"},
}
FLAT_MAX = 12
LINES_MAX = 600


def room(mod: str) -> str | None:
    """The core room of ``mod`` (None outside the core: the command layer, workers, runtime)."""
    if layer(mod) != "core":
        return None
    parts = mod.split(".")
    return "aoti_farm" if len(parts) == 1 else parts[1]


def room_violations(graph: dict[str, set[str]], rooms: dict[str, set[str]] = ROOMS) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        r = room(mod)
        if r is None:
            continue
        if r not in rooms:
            bad.append(f"{mod}: room {r} is not in ROOMS")
            continue
        for d in sorted(deps):
            rd = room(d)
            if rd is not None and rd != r and rd not in rooms[r]:
                bad.append(f"{mod} ({r}) imports {d} ({rd}): not in ROOMS[{r!r}]")
    return bad


def test_the_room_table_has_no_cycle_and_names_only_rooms():
    assert not cycles(ROOMS), cycles(ROOMS)
    assert all(d in ROOMS for deps in ROOMS.values() for d in deps)
    # a room the table allows but that is not there any more is stale
    present = {room(m) for m in modules()} - {None}
    assert set(ROOMS) == present, (set(ROOMS) ^ present)


def test_the_rule_sees_a_forbidden_import():
    g = {"aoti_farm.security.private": {"aoti_farm.compile.job"}, "aoti_farm.compile.job": {"aoti_farm.security.private"},
         "aoti_farm.cli.flags": {"aoti_farm.compile.job"}}
    assert room_violations(g) == ["aoti_farm.security.private (security) imports aoti_farm.compile.job (compile): "
                                  "not in ROOMS['security']"]
    assert room_violations({"aoti_farm.newroom.x": set()}) == ["aoti_farm.newroom.x: room newroom is not in ROOMS"]


def test_no_room_imports_a_higher_one():
    bad = room_violations(imports(modules()))
    assert not bad, "\n".join(bad)


def test_the_core_is_not_flat_and_no_module_is_long():
    flat = sorted(p.name for p in ROOTS["aoti_farm"].glob("*.py"))
    assert len(flat) <= FLAT_MAX, f"{len(flat)} modules directly in aoti_farm/ (at most {FLAT_MAX}): {flat}"
    long = [f"{p.relative_to(REPO)}: {n} lines" for root in ROOTS.values() for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > LINES_MAX]
    assert not long, f"modules over {LINES_MAX} lines (split them by concern):\n" + "\n".join(long)


def test_the_design_map_names_every_room_and_module():
    """docs/DESIGN.md's core map matches the rooms: every room of :data:`ROOMS` and every
    module of a room (``compile/verify.py``) is named there.  ``signature/`` and ``cli/``
    are mapped by their own ``__init__`` (DESIGN names their parts without paths)."""
    design = (REPO / "docs" / "DESIGN.md").read_text()
    missing = [r for r in ROOMS if r not in ("aoti_farm", "signature") and f"`{r}" not in design]
    for p in sorted(ROOTS["aoti_farm"].glob("*/*.py")):
        r = p.parent.name
        if r not in ("signature", "cli") and p.name != "__init__.py" and f"{r}/{p.name}" not in design:
            missing.append(f"{r}/{p.name}")
    assert not missing, f"docs/DESIGN.md does not name: {missing}"
