"""The two test tiers, read from the sources (AST), so nothing is imported.

tests/unit holds fast tests: no compile, no Ray, no subprocess, no native-extension build.
A unit test file may not import Ray, ``subprocess`` or ``multiprocessing``, call
``os.system``/``fork``/``posix_spawn``/``popen``, import a compiling entry point
(``AOTICompiler``, a drill helper that spawns; ``compile_and_publish`` with a test
double is a unit test, and the run-time guard stops a real compile) or ask for a fixture
that compiles or builds (``kernels``, ``regular_install``, ``native_hit_path``).  Such a test
belongs in tests/e2e.  tests/unit/conftest.py backs this at run time (a process, Ray start
or compile during a unit test fails it); this test catches the file before it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent
TESTS = UNIT.parent

#: Modules a unit test may not import (top-level name, or the full dotted name).
FORBIDDEN_IMPORTS = {"ray", "subprocess", "multiprocessing", "concurrent.futures.process",
                     "e2e", "_install", "_procs", "_metrics_helpers"}
#: Names a unit test may not import from anywhere: they compile, or spawn a process.
FORBIDDEN_NAMES = {"AOTICompiler", "build_evil_so", "regular_install"}
#: ``os`` functions that start a process.
FORBIDDEN_OS = {"system", "fork", "forkpty", "popen", "posix_spawn", "posix_spawnp",
                "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"}
#: Fixtures that compile for real or build the native extension (tests/conftest.py).
FORBIDDEN_FIXTURES = {"kernels", "regular_install", "native_hit_path"}
#: Files here that may break the rules: the guard itself names what it blocks.
EXEMPT = {"conftest.py", "test_tiers.py"}


def violations(source: str, name: str = "<test>") -> list[str]:
    """What in ``source`` makes it an e2e test file (empty: it may be a unit test file)."""
    bad = []
    for node in ast.walk(ast.parse(source, name)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in FORBIDDEN_IMPORTS or a.name.split(".")[0] in FORBIDDEN_IMPORTS:
                    bad.append(f"{name}:{line}: imports {a.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            mod = node.module or ""
            if mod in FORBIDDEN_IMPORTS or mod.split(".")[0] in FORBIDDEN_IMPORTS:
                bad.append(f"{name}:{line}: imports from {mod}")
            for a in node.names:
                if a.name in FORBIDDEN_NAMES:
                    bad.append(f"{name}:{line}: imports {a.name} from {mod}")
                if mod == "os" and a.name in FORBIDDEN_OS:
                    bad.append(f"{name}:{line}: imports os.{a.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in FORBIDDEN_OS:
                bad.append(f"{name}:{line}: uses os.{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs:
                if a.arg in FORBIDDEN_FIXTURES:
                    bad.append(f"{name}:{line}: {node.name} asks for the fixture {a.arg}")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "usefixtures", "getfixturevalue"):
            for c in node.args:
                if isinstance(c, ast.Constant) and c.value in FORBIDDEN_FIXTURES:
                    bad.append(f"{name}:{line}: asks for the fixture {c.value}")
    return bad


def unit_files() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*.py") if p.name not in EXEMPT)


def test_unit_files_neither_compile_nor_start_ray_nor_processes():
    files = unit_files()
    assert len(files) > 10, files          # the tier is found where this test expects it
    bad = [v for p in files for v in violations(p.read_text(), str(p.relative_to(TESTS)))]
    assert not bad, "these belong in tests/e2e:\n" + "\n".join(bad)


E2E_USES = [
    "import ray\n",
    "import ray.util\n",
    "from ray import remote\n",
    "import subprocess\n",
    "from subprocess import run\n",
    "import multiprocessing as mp\n",
    "import os\nos.system('true')\n",
    "import os\ndef f():\n    return os.fork()\n",
    "from os import posix_spawn\n",
    "from aoti_farm.compile.compiler import AOTICompiler\n",
    "from _install import clean_env\n",
    "from e2e.test_drills_util import env\n",
    "from e2e import test_gate\n",
    "def test_x(kernels):\n    pass\n",
    "def test_x(tmp_path, *, regular_install):\n    pass\n",
    "import pytest\npytestmark = pytest.mark.usefixtures('native_hit_path')\n",
    "def test_x(request):\n    request.getfixturevalue('kernels')\n",
]


@pytest.mark.parametrize("source", E2E_USES, ids=[s.strip().replace("\n", "; ") for s in E2E_USES])
def test_the_check_finds_each_kind_of_e2e_use(source):
    assert violations(source)


def test_the_check_passes_a_plain_unit_test():
    assert violations("import os\nimport torch\nfrom aoti_farm.cache.store import Cache\n"
                      "def test_x(tmp_path, monkeypatch):\n    os.environ.get('X')\n    os.path.join('a')\n") == []


def test_a_process_started_in_a_unit_test_is_blocked_and_fails_it(tier_guard):
    """The run-time half (tests/unit/conftest.py): the start is refused before a process
    exists, and the test would fail at teardown even though the error was caught."""
    import os
    import subprocess

    from unit.conftest import TierViolation

    with pytest.raises(TierViolation):
        subprocess.run(["true"])
    with pytest.raises(TierViolation):
        os.system("true")
    assert tier_guard.seen == ["subprocess", "os.system"]
    tier_guard.seen.clear()                        # this test's own violations were on purpose
