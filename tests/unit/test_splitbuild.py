"""The unit tests split from tests/e2e/test_splitbuild.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import os
import time

import pytest

from aoti_farm.build import commonobj, splitbuild

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
    commonobj._remove_orphans(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.456.cpp", "k.o", "k.o.lock", "k.o.sha256"]
