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
    assert IFACE in common and common.index(IFACE) < common.index(splitbuild.EXPLICIT)
    assert "cpp_fused_add_0" not in common
    assert IFACE not in model and "cpp_fused_add_0" in model and splitbuild.EXTERN in model
    # the model half sees the interface's headers but the container's, before its own code,
    # and instantiates std::regex nowhere: the common half does, once (lean_model)
    assert "#include <torch/csrc/inductor/aoti_runtime/interface.h>" in model
    assert "#include <torch/csrc/inductor/aoti_runtime/model_container.h>" not in model
    assert model.index("extern template class std::basic_regex<char>;") < model.index(splitbuild.EXTERN)
    assert model.index(splitbuild.EXTERN) < model.index("cpp_fused_add_0")
    assert "\ntemplate class std::basic_regex<char>;" in common and "extern template" not in common
    # whitespace-only lines written as empty ones still match (Inductor's splice does that)
    spaced = IFACE.replace("\n\n", "\n   \n", 1)
    assert splitbuild.split_wrapper(HEAD + spaced + TAIL) is not None
    # the model's own text is cut unchanged: trailing blanks inside a raw string stay
    raw = 'const char* spec = R"(line one   \nline two)";\n'
    assert raw in splitbuild.split_wrapper(HEAD + IFACE + "\n" + raw)[1]


def test_lean_model_off_keeps_the_whole_interface_and_instantiates_regex_in_each_half(monkeypatch):
    monkeypatch.setenv("AOTI_FARM_DEV", "lean_model=0")
    common, model = splitbuild.split_wrapper(HEAD + IFACE + "\n\n" + TAIL)
    assert model.index("#include <torch/csrc/inductor/aoti_runtime/model_container.h>") < model.index(splitbuild.EXTERN)
    assert "std::basic_regex" not in model and "std::basic_regex" not in common
    # the two sides' common objects differ, so neither links the other's
    monkeypatch.delenv("AOTI_FARM_DEV")
    assert splitbuild.split_wrapper(HEAD + IFACE + "\n\n" + TAIL)[0] != common


def test_regex_instantiations_are_guarded_to_libstdcxx():
    for extern in (True, False):
        kw = "extern template" if extern else "template"
        lines = commonobj.regex_instantiations(extern, match=False).splitlines()
        body = lines[lines.index("#if defined(__GLIBCXX__)") + 1:lines.index("#endif")]
        assert body == [f"{kw} class {c};" for c in commonobj.REGEX_CLASSES]
        # regex_match's worker has libstdc++'s internal signature: only the releases it was
        # checked on declare it, inside the libstdc++ guard
        lines = commonobj.regex_instantiations(extern).splitlines()
        g = lines.index(commonobj.REGEX_MATCH_GUARD)
        assert lines.index("#if defined(__GLIBCXX__)") < g
        assert lines[g + 1:g + 4] == [f"{kw} {commonobj.REGEX_MATCH};", "#endif", "#endif"]


def test_lean_match_off_leaves_regex_match_implicit_in_both_halves(monkeypatch):
    common, model = splitbuild.split_wrapper(HEAD + IFACE + "\n\n" + TAIL)
    assert f"extern template {commonobj.REGEX_MATCH};" in model
    assert f"\ntemplate {commonobj.REGEX_MATCH};" in common
    monkeypatch.setenv("AOTI_FARM_DEV", "lean_match=0")
    common0, model0 = splitbuild.split_wrapper(HEAD + IFACE + "\n\n" + TAIL)
    assert commonobj.REGEX_MATCH not in model0 and commonobj.REGEX_MATCH not in common0
    assert "extern template class std::basic_regex<char>;" in model0   # still lean
    assert common0 != common   # a common object of its own


@pytest.mark.parametrize("text", [
    HEAD + TAIL,                                   # no interface (static linkage, another torch)
    HEAD + IFACE + TAIL + IFACE,                   # twice
    HEAD + "int x = 1;\n" + IFACE + TAIL,          # code before it: not ours to move
    HEAD + IFACE + TAIL + splitbuild.EXPLICIT,     # already instantiates the base itself
])
def test_split_wrapper_refuses_anything_else(text):
    assert splitbuild.split_wrapper(text) is None


def test_orphans_of_dead_builds_are_removed_after_an_hour(tmp_path):
    names = ["k.123.cpp", "k.123.o.tmp", "k.123.o.tmp.sha256", "k.o", "k.o.sha256", "k.o.lock",
             "k.pch.h", "k.pch.h.gch", "k.pch.h.lock"]   # an earlier version's precompiled prefix
    for n in names:
        (tmp_path / n).write_text("x")
    old = time.time() - 7200
    for n in names:
        os.utime(tmp_path / n, (old, old))
    (tmp_path / "k.456.cpp").write_text("a build running now")
    commonobj._remove_orphans(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.456.cpp", "k.o", "k.o.lock", "k.o.sha256"]
