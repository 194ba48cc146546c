"""The ISA probe's load checks skip `import torch` on torch < 2.13 (aoti_farm/startup/isaload.py).
This box has torch 2.13, whose load code no longer imports torch, so a stand-in for
`torch._inductor.cpu_vec_isa` carries torch 2.11's load code; the children are real."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from aoti_farm.startup import isaload

OLD_LOAD = '\nimport torch\nfrom ctypes import cdll\ncdll.LoadLibrary("__lib_path__")\n'   # torch 2.11


def _module(tmp_path):
    """A cpu_vec_isa with 2.11's load code, and a `torch` on the children's path that
    leaves a mark when imported."""
    mod = types.SimpleNamespace(VecISA=types.SimpleNamespace(_avx_py_load=OLD_LOAD), subprocess=subprocess)
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    mark = tmp_path / "torch-imported"
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write('x')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site")}
    return mod, mark, env


def _load_cmd(path: str) -> list:
    return [sys.executable, "-c", OLD_LOAD.replace("__lib_path__", path)]


def test_a_loadable_library_is_checked_without_importing_torch(tmp_path):
    mod, mark, env = _module(tmp_path)
    with isaload.fast_loads(mod) as stand:
        assert mod.subprocess is stand
        assert mod.subprocess.check_call(_load_cmd("libm.so.6"), env=env, cwd=str(tmp_path)) == 0
        assert mod.subprocess.DEVNULL == subprocess.DEVNULL          # the rest is the real module
    assert mod.subprocess is subprocess
    assert (stand.fast, stand.fallback) == (1, 0)
    assert not mark.exists(), "the fast check imported torch"
    # without the block, the same command imports torch (the old way)
    subprocess.check_call(_load_cmd("libm.so.6"), env=env, cwd=str(tmp_path))
    assert mark.exists()


def test_a_failed_fast_load_is_decided_the_old_way(tmp_path):
    mod, mark, env = _module(tmp_path)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    with isaload.fast_loads(mod) as stand:
        with pytest.raises(subprocess.CalledProcessError):
            mod.subprocess.check_call(_load_cmd(str(junk)), env=env, cwd=str(tmp_path), stderr=subprocess.DEVNULL)
        # any other command goes to the real subprocess untouched
        assert mod.subprocess.check_call([sys.executable, "-c", "pass"]) == 0
    assert (stand.fast, stand.fallback) == (0, 1)
    assert mark.exists(), "the fallback is the old command, which imports torch"


def test_left_alone_where_the_load_code_does_not_import_torch(tmp_path, monkeypatch):
    from torch._inductor import cpu_vec_isa

    mod, _, _ = _module(tmp_path)
    mod.VecISA._avx_py_load = 'import sys\nif sys.platform != "linux":\n    import torch\n' + OLD_LOAD.split("\n", 2)[2]
    with isaload.fast_loads(mod) as stand:
        assert stand is None and mod.subprocess is subprocess
    with isaload.fast_loads(cpu_vec_isa) as stand:      # this torch (2.13 has the fix)
        assert (stand is None) == ("sys.platform" in cpu_vec_isa.VecISA._avx_py_load)
    monkeypatch.setenv("AOTI_FARM_DEV", f"{isaload.DEV}=0")
    mod.VecISA._avx_py_load = OLD_LOAD
    with isaload.fast_loads(mod) as stand:
        assert stand is None
