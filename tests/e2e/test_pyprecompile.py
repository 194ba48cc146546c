"""The compile path's bytecode compiled ahead of the importers (aoti_farm/startup/pyprecompile.py,
#17): the names resolve to the files Python imports, the children write the ``.pyc``
files a later import really loads, nothing runs where it does not apply, and the
shipped list still covers what the compile path imports here.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_pyprecompile.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aoti_farm.startup import pyprecompile
from _procs import warm_on_a_bad_trace

REPO = Path(__file__).resolve().parents[2]


def test_names_resolve_to_the_files_python_imports():
    import json.decoder  # noqa: F401 -- a stdlib package's submodule
    import torch._inductor.codecache  # noqa: F401 -- a deep one in site-packages

    names = ["json", "json.decoder", "torch._inductor.codecache", "aoti_farm.startup.pyprecompile", "torch"]
    got = pyprecompile.source_files(names + ["sys", "no_such_pkg.mod", "torch.no_such_mod", "json"])
    assert got == [sys.modules[n].__file__ for n in names]


def _tree(tmp_path: Path) -> tuple[Path, list[str]]:
    src = tmp_path / "src"
    (src / "pp_pkg" / "sub").mkdir(parents=True)
    (src / "pp_pkg" / "__init__.py").write_text("A = 1\n")
    (src / "pp_pkg" / "sub" / "__init__.py").write_text("")
    for i in range(6):
        (src / "pp_pkg" / "sub" / f"m{i}.py").write_text(f"X = {i}\n")
    return src, ["pp_pkg", "pp_pkg.sub"] + [f"pp_pkg.sub.m{i}" for i in range(6)]


def _listed(tmp_path: Path, monkeypatch, src: Path, names: list[str], header: str = "") -> Path:
    """``names`` (modules under ``src``) as the module's list; returns an empty prefix."""
    (tmp_path / "list.txt").write_text(header + "\n".join(names) + "\n")
    monkeypatch.setattr(pyprecompile, "LIST", tmp_path / "list.txt")
    monkeypatch.syspath_prepend(str(src))
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    return prefix


def test_the_children_write_the_bytecode_a_later_import_loads(tmp_path, monkeypatch):
    src, names = _tree(tmp_path)
    prefix = _listed(tmp_path, monkeypatch, src, names, header="# a comment\n")
    run = pyprecompile.start(str(prefix), n_cpu=4)
    assert run is not None
    res = run.result()
    assert res["files"] == 8 and res["workers"] == 2 and res["failed"] == 0
    assert res["compiled"] == 8 and res["span"][1] >= res["span"][0]
    # an importer with bytecode writing off loads those .pyc files (python -v names each)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX",)}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(src)})
    out = subprocess.run([sys.executable, "-v", "-c", "import pp_pkg.sub.m5, pp_pkg.sub.m0"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = [ln for ln in out.stderr.splitlines() if ln.startswith("# code object from") and "pp_pkg" in ln]
    assert len(loaded) == 4 and all(str(prefix) in ln for ln in loaded), loaded
    assert not list(src.rglob("__pycache__"))   # nothing next to the sources
    # everything fresh now: nothing starts
    assert pyprecompile.start(str(prefix), n_cpu=4) is None
    # a changed source is compiled again, the others are skipped
    (src / "pp_pkg" / "sub" / "m3.py").write_text("X = 'changed, and longer'\n")
    (src / "pp_pkg" / "sub" / "m5.py").write_text("X = 'changed too, and longer'\n")
    res = pyprecompile.start(str(prefix), n_cpu=4).result()
    assert (res["compiled"], res["skipped"]) == (2, 6)


def test_the_shipped_list_covers_what_the_compile_path_imports_here():
    """What an actor imports at warm-up, in a fresh process, is nearly all in the list; a
    stale list only costs start-up time, so this names the fix rather than the speed."""
    # modules loaded from a source file (a frozen or built-in one never has bytecode to write)
    code = ("import aoti_farm.workers.actor_preload as p, sys; assert p.ERROR is None, p.ERROR; "
            "print('\\n'.join(n for n, m in list(sys.modules.items()) "
            "if getattr(getattr(m, '__spec__', None), 'origin', None) not in (None, 'frozen', 'built-in')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {n for n in out.stdout.split() if pyprecompile.source_files([n])}
    listed = set(pyprecompile.module_names())
    missing = sorted(imported - listed)
    assert len(imported) > 1000
    assert len(missing) <= 0.05 * len(imported), (
        f"{len(missing)} of {len(imported)} modules the compile path imports are not in {pyprecompile.LIST.name} "
        f"(e.g. {missing[:5]}): run `python -m aoti_farm.startup.pyprecompile --write`")


def test_cancel_stops_the_children_and_leaves_no_partial_bytecode(tmp_path, monkeypatch):
    """``warm`` cancels the children when it fails before its plan (a bad trace): none
    may outlive the command, and what they wrote is whole bytecode or nothing."""
    src, names = _tree(tmp_path)
    prefix = _listed(tmp_path, monkeypatch, src, names)
    run = pyprecompile.start(str(prefix), n_cpu=4)
    assert run is not None
    run.cancel()
    assert all(p.poll() is not None for p in run.procs)
    assert not [f for f in prefix.rglob("*") if f.is_file() and not f.name.endswith(".pyc")]   # no temp file left
    run.cancel()   # twice: never raises


def test_warm_starts_the_precompile_first_and_stops_it_on_bad_input(tmp_path, monkeypatch):
    """``warm`` starts the children before anything imports torch (reading the traces
    does), with the farm's bytecode cache as their prefix; a trace that fails to load
    ends the command with its one-line error, and no child is left running."""
    from aoti_farm.startup import pycache

    src = tmp_path / "src"
    (src / "pp_big").mkdir(parents=True)
    (src / "pp_big" / "__init__.py").write_text("")
    body = "".join(f"def f{i}(x):\n    return [x * {i} for _ in range({i})]\n" for i in range(60))
    names = ["pp_big"] + [f"pp_big.m{i}" for i in range(1500)]   # seconds of compiling for one child
    for n in names[1:]:
        (src / "pp_big" / f"{n.split('.')[1]}.py").write_text(body)
    prefix = _listed(tmp_path, monkeypatch, src, names)
    monkeypatch.setattr(pyprecompile, "MIN_CORES", 1)
    monkeypatch.setenv("AOTI_FARM_DEV", "fresh_isa=0")   # the ISA probe's child: another test's subject
    monkeypatch.setattr(pycache, "apply", lambda here=False: str(prefix))
    runs: list = []
    real_start = pyprecompile.start
    monkeypatch.setattr(pyprecompile, "start", lambda p, n_cpu=None: runs.append((p, real_start(p, n_cpu))) or runs[-1][1])
    seen: dict = {}
    warm_on_a_bad_trace(tmp_path, monkeypatch, lambda: seen.update(started_before_load=[r is not None for _, r in runs]))
    assert seen["started_before_load"] == [True]
    assert runs[0][0] == str(prefix)
    assert all(p.poll() is not None for p in runs[0][1].procs)   # none left running
