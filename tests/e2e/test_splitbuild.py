"""The wrapper's split build (aoti_farm.build.splitbuild): the model-independent half of every
AOTI wrapper is compiled once per host and linked into each kernel; every way it can go
wrong falls back to Inductor's whole-file build, and the kernel is still verified.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_splitbuild.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from filelock import FileLock

from aoti_farm import signature as S
from aoti_farm.build import commonobj, splitbuild
from aoti_farm.compile.compiler import AOTICompiler

from conftest import sig_add_alpha


def _sig(n):
    a, b = torch.empty(n, 8), torch.empty(8)
    return S.from_call(torch.ops.aten.sub.Tensor, (a, b), {"alpha": 3})


def test_session_kernels_are_split_built(kernels):
    """What every compile in this suite does: the wrapper was built in two halves, and the
    entry says so (the kernel was verified against eager before it was published)."""
    add = sig_add_alpha()
    assert kernels.ensure(add).status in ("compiled", "cached")
    build = kernels.cache.open_entry(kernels.fp, add.key).manifest["build"]
    assert build["wrapper"] == "split", build
    assert build["common"] in ("built", "reused") or build["common"].startswith("rebuilt"), build
    assert build["common_s"] + build["model_s"] > 0


def _wrapper(r) -> dict:
    """How the wrapper was built (the build record less what the compiler adds to it: the
    serial nests' count of aoti_farm/build/serialsmall.py, the cleared stack request of
    aoti_farm/cache/elfstack.py)."""
    return {k: v for k, v in r.build.items() if k not in ("serial_nests", "exec_stack")}


def test_fallbacks_still_build_verified_kernels(tmp_path, monkeypatch):
    """Real compiles: split (reusing the common object), then with the common object's
    lock held by someone else, then with the split turned off, then after the cached
    common object was damaged.  Each kernel is verified against eager by compile()."""
    comp = AOTICompiler()
    r = comp.compile(_sig(3), str(tmp_path / "a"))
    assert r.build["wrapper"] == "split" and r.verification["ok"], r.build
    obj = os.path.join(commonobj.common_dir(), r.build["common_object"])
    assert os.path.exists(obj) and commonobj._intact(obj)

    before = splitbuild.stats()
    monkeypatch.setattr(commonobj, "COMMON_WAIT_S", 0.5)   # it waits that long for the holder, then builds whole
    with FileLock(obj + ".lock"):
        os.rename(obj, obj + ".away")   # so this compile must build it, and finds the lock held
        try:
            r = comp.compile(_sig(4), str(tmp_path / "b"))
        finally:
            os.rename(obj + ".away", obj)
    assert _wrapper(r) == {"wrapper": "whole", "reason": "common_busy"} and r.verification["ok"]
    after = splitbuild.stats()
    assert after["common_busy"] == before["common_busy"] + 1 and after["whole"] == before["whole"] + 1

    monkeypatch.setenv("AOTI_FARM_DEV", f"{splitbuild.DEV}=0")
    r = comp.compile(_sig(5), str(tmp_path / "c"))
    assert _wrapper(r) == {"wrapper": "whole", "reason": f"AOTI_FARM_DEV={splitbuild.DEV}=0"} and r.verification["ok"]
    monkeypatch.delenv("AOTI_FARM_DEV")

    data = bytearray(open(obj, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(obj, "wb").write(bytes(data))           # a flipped byte: never linked
    r = comp.compile(_sig(6), str(tmp_path / "d"))
    assert r.build["wrapper"] == "split" and r.build["common"].startswith("rebuilt"), r.build
    assert r.verification["ok"] and commonobj._intact(obj)
    assert splitbuild.stats()["common_damaged"] == after["common_damaged"] + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_wrapper_is_split_built(tmp_path):
    """The CUDA wrapper (another device include, the same interface) splits the same way,
    into its own common object, and the kernel agrees with eager on the GPU."""
    a, b = torch.empty(16, 32, device="cuda"), torch.empty(32, device="cuda")
    sig = S.from_call(torch.ops.aten.sub.Tensor, (a, b), {"alpha": 3})
    comp = AOTICompiler()
    first = comp.compile(sig, str(tmp_path / "a"))
    assert first.build["wrapper"] == "split" and first.verification["ok"], first.build
    a2 = torch.empty(17, 32, device="cuda")
    second = comp.compile(S.from_call(torch.ops.aten.sub.Tensor, (a2, b), {"alpha": 3}), str(tmp_path / "b"))
    assert second.build["wrapper"] == "split" and second.build["common"] == "reused", second.build
    assert second.build["common_object"] == first.build["common_object"]


def _text(lib: str) -> bytes:
    import subprocess

    out = lib + ".text"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", lib, out], check=True)
    with open(out, "rb") as f:
        return f.read()


def _built_both_ways(tmp_path, monkeypatch, switch: str, n: int) -> dict:
    """``_sig(n)`` compiled with ``AOTI_FARM_DEV=<switch>=1`` and then ``=0``, each verified
    against eager and split-built: ``{"1": result, "0": result}``.  Both with g++'s default
    linker: with gold two libraries' ``.text`` differed by the link's layout, and the tests
    compare the model half's code."""
    comp = AOTICompiler()
    out = {}
    for on in ("1", "0"):
        monkeypatch.setenv("AOTI_FARM_DEV", f"{switch}={on},gold_link=0")
        r = comp.compile(_sig(n), str(tmp_path / f"{switch}{on}"))
        assert r.verification["ok"] and r.build["wrapper"] == "split", r.build
        out[on] = r
    return out


def test_model_half_beside_the_kernel(tmp_path, monkeypatch):
    """The model half compiles while Inductor compiles the kernel (joined at the link): the
    same code either way (the libraries' ``.text`` is byte for byte the same), verified
    against eager."""
    built = _built_both_ways(tmp_path, monkeypatch, "split_overlap", 23)
    for overlap, r in built.items():
        ran_beside = r.build["model_s"] - r.build["model_wait_s"]   # the kernel's compile ran meanwhile
        assert ran_beside > 0.1 if overlap == "1" else ran_beside < 0.05, r.build
    assert _text(built["1"].files["kernel.so"]) == _text(built["0"].files["kernel.so"])


def _run_impl(lib: str) -> list[str]:
    """``AOTInductorModel::run_impl``'s instructions in ``lib``, addresses left out (the two
    libraries lay their functions out differently)."""
    import re
    import subprocess

    dis = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", lib], capture_output=True, text=True,
                         check=True).stdout
    head = re.search(r"^[0-9a-f]+ <torch::aot_inductor::AOTInductorModel::run_impl\(AtenTensorOpaque\*\*[^@>]*>:$",
                     dis, re.M)
    body = dis[head.end() + 1:dis.index("\n\n", head.end())]
    return [re.sub(r"[0-9a-f]{2,}", "X", line.split(":", 1)[1]) for line in body.splitlines() if ":" in line]


@pytest.mark.parametrize("switch,n", [("lean_model", 31), ("lean_match", 33)])
def test_lean_model_half_leaves_the_served_code_as_it_was(tmp_path, monkeypatch, switch, n):
    """``lean_model`` (the default) declares std::regex extern in the model half and leaves
    the container's header out; ``lean_match`` (the default, within it) declares
    regex_match's worker extern too.  With each switch on and off the library is verified
    against eager, and its ``run_impl``, what a served call runs, is the same machine code."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    from aoti_farm.build import commonobj

    # the compiler Inductor launches, whose library the build record's probe reads
    if switch == "lean_match" and not commonobj.regex_match_declared(get_cpp_compiler()):
        pytest.skip("this compiler's libstdc++ is not a release lean_match declares its worker for")
    built = _built_both_ways(tmp_path, monkeypatch, switch, n)
    for on, r in built.items():
        assert r.build[switch] is (on == "1"), r.build
    code = {on: _run_impl(r.files["kernel.so"]) for on, r in built.items()}
    assert len(code["1"]) > 20 and code["1"] == code["0"]


def _gold(lib: str) -> bool:
    import subprocess

    notes = subprocess.run(["readelf", "-n", lib], capture_output=True, text=True, check=True).stdout
    return "gold version" in notes


def test_the_library_is_linked_by_gold_where_g_has_it(tmp_path, monkeypatch):
    """The split build's link uses gold (``gold_link``, the default) and says so in the
    build record; ``AOTI_FARM_DEV=gold_link=0`` links with g++'s default linker.  Both
    libraries are verified against eager."""
    comp = AOTICompiler()
    for on in ("1", "0"):
        monkeypatch.setenv("AOTI_FARM_DEV", f"gold_link={on}")
        r = comp.compile(_sig(29 + int(on)), str(tmp_path / f"gold{on}"))
        assert r.verification["ok"] and r.build["wrapper"] == "split", r.build
        assert r.build["linker"] == ("gold" if on == "1" else "default"), r.build
        assert _gold(r.files["kernel.so"]) is (on == "1")
