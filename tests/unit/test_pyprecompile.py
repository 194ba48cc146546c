"""The unit tests split from tests/e2e/test_pyprecompile.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

from aoti_farm.startup import pyprecompile


def test_nothing_starts_where_it_does_not_apply(tmp_path, monkeypatch):
    assert pyprecompile.start(None, n_cpu=16) is None                       # no farm bytecode cache
    assert pyprecompile.start(str(tmp_path), n_cpu=pyprecompile.MIN_CORES - 1) is None
    monkeypatch.setenv("AOTI_FARM_DEV", f"{pyprecompile.DEV}=0")
    assert pyprecompile.start(str(tmp_path), n_cpu=16) is None
    assert list(tmp_path.iterdir()) == []


def test_the_list_names_no_module_of_ours_that_is_gone():
    """The generated list (``python -m aoti_farm.startup.pyprecompile --write``) holds other
    environments' modules on purpose, but never a module of this package that no longer
    exists: ``--write`` drops such names, and this fails until the list is regenerated
    after a module is removed or moved."""
    from pathlib import Path

    repo = Path(pyprecompile.__file__).resolve().parents[2]
    ours = {"aoti_farm." + ".".join(f.relative_to(repo).with_suffix("").parts[(0 if top != "aoti_farm" else 1):])
            .removesuffix(".__init__") for top in ("aoti_farm", "runtime", "workers")
            for f in (repo / top).rglob("*.py") if "_site" not in f.parts}
    assert {"aoti_farm.compile.compiler", "aoti_farm.cache.store", "aoti_farm.runtime.hook", "aoti_farm.workers"} <= ours
    assert all(pyprecompile._exists(n) for n in ours) and not pyprecompile._exists("aoti_farm.no_such_module")
    names = [n.strip() for n in pyprecompile.LIST.read_text().splitlines() if n.strip() and not n.startswith("#")]
    stale = [n for n in names if n.split(".")[0] == "aoti_farm" and not pyprecompile._exists(n)]
    assert not stale, f"{pyprecompile.LIST.name} names modules that are gone: {stale}; run " \
                      "`python -m aoti_farm.startup.pyprecompile --write`"
