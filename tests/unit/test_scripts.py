"""scripts/ stays runnable as the package changes under it, without running it: every
Python script parses and every name it imports from aoti_farm exists (and every
``S.<name>`` it takes from ``aoti_farm.signature`` is public and exists); every shell
script parses.  The benchmarks themselves run in test_bench_smoke.py; the GPU validation
needs a GPU (scripts/gpu/validate.sh).

The tests of this module that compile, start Ray or start processes are in tests/e2e/test_scripts.py.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
PY = sorted(SCRIPTS.rglob("*.py"))
SH = sorted(SCRIPTS.rglob("*.sh"))


def _aoti_imports(tree: ast.AST):
    """(module, name or None, line) of every import of aoti_farm, at any depth, and the
    local names bound to ``aoti_farm.signature``."""
    out, sig_alias = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] == "aoti_farm":
            for a in node.names:
                out.append((node.module, a.name, node.lineno))
                if node.module == "aoti_farm" and a.name == "signature":
                    sig_alias.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "aoti_farm":
                    out.append((a.name, None, node.lineno))
                    if a.name == "aoti_farm.signature" and a.asname:
                        sig_alias.add(a.asname)
    return out, sig_alias


def test_there_are_scripts():
    assert (SCRIPTS / "bench" / "run.py") in PY and (SCRIPTS / "gpu" / "validate.sh") in SH


@pytest.mark.parametrize("path", PY, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_python_script_imports_what_exists(path):
    tree = ast.parse(path.read_text(), str(path))
    imports, sig_alias = _aoti_imports(tree)
    missing = []
    for module, name, line in imports:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{path.name}:{line}: {module}: {e}")
            continue
        if name not in (None, "*") and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    if sig_alias:
        from aoti_farm import signature as S

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in sig_alias:
                if node.attr.startswith("_") or not hasattr(S, node.attr):
                    missing.append(f"{path.name}:{node.lineno}: aoti_farm.signature.{node.attr} is not public")
    assert not missing, "\n".join(missing)


#: the options through which a benchmark writes results or logs, or keeps scratch
OUTPUT_OPTIONS = {"--out", "--json", "--log", "--dir", "--workdir"}


@pytest.mark.parametrize("path", sorted((SCRIPTS / "bench").glob("*.py")), ids=lambda p: p.name)
def test_benchmark_writes_nowhere_by_default(path):
    """A benchmark writes its raw results only where the user names (``--out DIR``,
    ``--json FILE``): none of its output options has a default path, so a run from inside
    the checkout leaves nothing in the source tree (docs/benchmarks.md, "Output")."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            for kw in node.keywords:
                if names & OUTPUT_OPTIONS and kw.arg == "default" and \
                        not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                    bad.append(f"{path.name}:{node.lineno}: {sorted(names)} defaults to {ast.unparse(kw.value)}")
    assert not bad, "\n".join(bad)


def test_benchmark_output_goes_where_named(tmp_path, monkeypatch):
    """scripts/bench/common.py's output helper: nothing without --out/--json, DIR/<name>.json
    under --out, FILE itself under --json."""
    import argparse
    import json
    import sys

    monkeypatch.syspath_prepend(str(SCRIPTS / "bench"))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("common", None)
    import common

    def ns(*argv):
        ap = argparse.ArgumentParser()
        common.add_output_args(ap, "demo")
        return ap.parse_args(list(argv))

    assert common.write_output(ns(), {"a": 1}) is None
    assert list(tmp_path.iterdir()) == []
    p = common.write_output(ns("--out", str(tmp_path / "o")), {"a": 1})
    assert p == tmp_path / "o" / "demo.json" and json.loads(p.read_text()) == {"a": 1}
    assert common.write_output(ns("--out", str(tmp_path / "o")), "text", ".md").read_text() == "text"
    assert common.write_output(ns("--json", str(tmp_path / "r.json")), {"b": 2}) == tmp_path / "r.json"
    assert common.write_output(ns("--json", str(tmp_path / "new" / "r.json")), {"c": 3}).exists()
