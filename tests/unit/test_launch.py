"""The unit tests split from tests/e2e/test_launch.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from aoti_farm.errors import UserError
from aoti_farm.runtime import launch


def _ns(add, argv):
    """``argv`` parsed by the arguments ``add`` declares (``launch.add_run_args``, ``add_record_args``)."""
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(argv)


def test_run_refuses_a_stats_folder_that_does_not_exist(tmp_path, monkeypatch):
    """Bad input, caught before the program starts: one line naming it and the fix."""
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("AOTI_FARM_HOOK_STATS", str(missing))
    marker = tmp_path / "ran"
    ns = _ns(launch.add_run_args, ["--cache-dir", str(tmp_path / "c"), "--on-miss", "ignore", "--", sys.executable,
                                   "-c", f"open({str(marker)!r}, 'w').close()"])
    with pytest.raises(UserError, match="AOTI_FARM_HOOK_STATS") as e:
        launch.run_command(ns)
    assert str(missing) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def _site():
    """The launcher's sitecustomize, loaded as a module of its own (with no launcher
    variable set it only defines its functions)."""
    import importlib.util

    path = os.path.join(launch.SITE_DIR, "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("aoti_farm_site_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, orig, expected", [
    # torch's own scripts: Inductor's compile-worker pool, torchrun (as run by `-m`)
    (["/v/site-packages/torch/_inductor/compile_worker/__main__.py", "--workers=2"], None, True),
    (["/v/site-packages/torch/distributed/run.py", "train.py"], None, True),
    # Inductor's ISA load check, before and after torch 2.13
    (["-c"], ["py", "-c", 'import torch\nfrom ctypes import cdll\ncdll.LoadLibrary("/t/a.so")\n'], True),
    (["-c"], ["py", "-c", 'import sys\nif sys.platform != "linux":\n    import torch  # noqa: F401\n'
                          'from ctypes import cdll\ncdll.LoadLibrary("/t/a.so")\n'], True),
    # the program's own: a script, `-c` code that does more than load a library, `-m`'s package
    (["/home/u/serve.py"], None, False),
    (["-c"], ["py", "-c", "import torch; print(torch.relu(torch.ones(2)))"], False),
    (["-c"], ["py", "-c", 'from ctypes import cdll\nlib = cdll.LoadLibrary("x.so")\nlib.run()\n'], False),
    (["/v/site-packages/torchvision/x.py"], None, False),
])
def test_torch_helpers_are_told_from_the_programs_processes(argv, orig, expected):
    site = _site()
    torch_file = "/v/site-packages/torch/__init__.py"
    assert site._torch_helper(argv=argv, orig_argv=orig or ["py"] + argv, torch_file=torch_file) is expected


def test_record_ops_are_checked_before_the_program_starts():
    """``aoti-farm record --ops``: names are split and stripped; an unknown op, or none at
    all, is a one-line UserError naming the input."""
    assert launch.record_ops(None) is None
    assert launch.record_ops(" aten::addmm, aten::tanh,") == ["aten::addmm", "aten::tanh"]
    for bad, named in (("aten::addmm,aten::no_such_op", "aten::no_such_op"), (" , ", "--ops")):
        with pytest.raises(UserError, match=named) as e:
            launch.record_ops(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv, orig, expected", [
    # the farm's own children: verification child and server, host preparation, the command
    (["/src/aoti_farm/compile/compiler.py", "--serve"], None, True),
    (["-m"], ["py", "-m", "aoti_farm.compile.compiler", "--serve"], True),        # before runpy names the file
    (["-m"], ["py", "-W", "ignore", "-m", "aoti_farm.compile.hostprep", "{}"], True),
    (["/src/runtime/compile_worker.py"], None, True),
    (["/v/bin/aoti-farm", "warm"], None, True),
    (["-c"], ["py", "-c", "PROBE", "/k/kernel.so", "cpu"], True),         # the loader probe
    # the program's own
    (["/home/u/serve.py"], None, False),
    (["-m"], ["py", "-m", "mypkg.serve"], False),
    (["-c"], ["py", "-c", "import torch; print(1)"], False),
    (["/src/aoti_farm_extras/x.py"], None, False),
])
def test_the_farms_own_children_are_told_from_the_programs(argv, orig, expected):
    site = _site()
    got = site._farm_helper(argv=argv, orig_argv=orig or ["py"] + argv, farm_dirs=["/src/aoti_farm", "/src/runtime"],
                            probe="PROBE")
    assert got is expected


def test_python_dash_m_is_read_from_the_interpreters_arguments():
    site = _site()
    assert site._module(["py", "-m", "torch.distributed.run", "x.py"]) == "torch.distributed.run"
    assert site._module(["py", "-X", "dev", "-Wignore", "-m", "a.b"]) == "a.b"
    assert site._module(["py", "script.py", "-m", "a"]) == "" and site._module(["py", "-c", "x", "-m"]) == ""
    assert site._torch_helper(argv=["-m"], orig_argv=["py", "-m", "torch.distributed.run"], torch_file=None)
