"""The wrapper's split build (aoti_farm.splitbuild): the model-independent half of every
AOTI wrapper is compiled once per host and linked into each kernel; every way it can go
wrong falls back to Inductor's whole-file build, and the kernel is still verified."""

from __future__ import annotations

import os
import time

import pytest
import torch
from filelock import FileLock

from aoti_farm import signature as S
from aoti_farm import splitbuild
from aoti_farm.compiler import AOTICompiler

from conftest import sig_add_alpha

IFACE = splitbuild.interface_text()
HEAD = "\n#include <torch/csrc/inductor/aoti_include/cpu.h>\n"
TAIL = "\nextern \"C\" void cpp_fused_add_0(const float* in_ptr0);\nnamespace torch::aot_inductor {}\n"


def test_split_wrapper_cuts_at_the_interface():
    assert IFACE and "AOTInductorModelContainerRun" in IFACE
    common, model = splitbuild.split_wrapper(HEAD + IFACE + "\n\n" + TAIL)
    assert IFACE in common and common.rstrip().endswith(splitbuild.EXPLICIT)
    assert "cpp_fused_add_0" not in common
    assert IFACE not in model and "cpp_fused_add_0" in model and splitbuild.EXTERN in model
    # the model half sees the same headers as the whole file did, before its own code
    assert model.index("#include <torch/csrc/inductor/aoti_runtime/model_container.h>") < model.index(splitbuild.EXTERN)
    assert model.index(splitbuild.EXTERN) < model.index("cpp_fused_add_0")
    # whitespace-only lines written as empty ones still match (Inductor's splice does that)
    spaced = IFACE.replace("\n\n", "\n   \n", 1)
    assert splitbuild.split_wrapper(HEAD + spaced + TAIL) is not None
    # the model's own text is cut unchanged: trailing blanks inside a raw string stay
    raw = 'const char* spec = R"(line one   \nline two)";\n'
    assert raw in splitbuild.split_wrapper(HEAD + IFACE + "\n" + raw)[1]


@pytest.mark.parametrize("text", [
    HEAD + TAIL,                                   # no interface (static linkage, another torch)
    HEAD + IFACE + TAIL + IFACE,                   # twice
    HEAD + "int x = 1;\n" + IFACE + TAIL,          # code before it: not ours to move
    HEAD + IFACE + TAIL + splitbuild.EXPLICIT,     # already instantiates the base itself
])
def test_split_wrapper_refuses_anything_else(text):
    assert splitbuild.split_wrapper(text) is None


def test_orphans_of_dead_builds_are_removed_after_an_hour(tmp_path):
    names = ["k.123.cpp", "k.123.o.tmp", "k.123.o.tmp.sha256", "k.o", "k.o.sha256", "k.o.lock"]
    for n in names:
        (tmp_path / n).write_text("x")
    old = time.time() - 7200
    for n in names:
        os.utime(tmp_path / n, (old, old))
    (tmp_path / "k.456.cpp").write_text("a build running now")
    splitbuild._remove_orphans(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.456.cpp", "k.o", "k.o.lock", "k.o.sha256"]


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


def test_fallbacks_still_build_verified_kernels(tmp_path, monkeypatch):
    """Real compiles: split (reusing the common object), then with the common object's
    lock held by someone else, then with the split turned off, then after the cached
    common object was damaged.  Each kernel is verified against eager by compile()."""
    comp = AOTICompiler()
    r = comp.compile(_sig(3), str(tmp_path / "a"))
    assert r.build["wrapper"] == "split" and r.verification["ok"], r.build
    obj = os.path.join(splitbuild.common_dir(), r.build["common_object"])
    assert os.path.exists(obj) and splitbuild._intact(obj)

    before = splitbuild.stats()
    monkeypatch.setattr(splitbuild, "COMMON_WAIT_S", 0.5)   # it waits that long for the holder, then builds whole
    with FileLock(obj + ".lock"):
        os.rename(obj, obj + ".away")   # so this compile must build it, and finds the lock held
        try:
            r = comp.compile(_sig(4), str(tmp_path / "b"))
        finally:
            os.rename(obj + ".away", obj)
    assert r.build == {"wrapper": "whole", "reason": "common_busy"} and r.verification["ok"]
    after = splitbuild.stats()
    assert after["common_busy"] == before["common_busy"] + 1 and after["whole"] == before["whole"] + 1

    monkeypatch.setenv("AOTI_FARM_DEV", f"{splitbuild.DEV}=0")
    r = comp.compile(_sig(5), str(tmp_path / "c"))
    assert r.build == {"wrapper": "whole", "reason": f"AOTI_FARM_DEV={splitbuild.DEV}=0"} and r.verification["ok"]
    monkeypatch.delenv("AOTI_FARM_DEV")

    data = bytearray(open(obj, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(obj, "wb").write(bytes(data))           # a flipped byte: never linked
    r = comp.compile(_sig(6), str(tmp_path / "d"))
    assert r.build["wrapper"] == "split" and r.build["common"].startswith("rebuilt"), r.build
    assert r.verification["ok"] and splitbuild._intact(obj)
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
