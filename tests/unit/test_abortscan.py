"""aoti_farm/build/abortscan.py: the index check inside an OpenMP region, read from generated C++
(no compile: the sources below are Inductor's own output for one ``index_select``,
torch 2.13, CPU); tests/e2e/test_abortscan.py compiles each such op both ways."""

from __future__ import annotations

import os

import pytest
import torch

from aoti_farm.build import abortscan, splitbuild
from aoti_farm import signature as S
from aoti_farm.compile.adversarial import BAD_INDEX_CASES
from aoti_farm.compile.verify import eager_raises_on_adversarial, is_verification_refusal

#: ``index_select(float32[1000, 64], 0, int64[128])`` under ``cpp.dynamic_threads`` (the
#: farm's default): the loops, and the index check, inside ``#pragma omp parallel``.
PARALLEL = """\
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  cpp_fused_index_select_0(const int64_t* in_ptr0,
                       const float* in_ptr1,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    #pragma omp parallel
    {
        int tid = omp_get_thread_num();
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(128L); x0+=static_cast<int64_t>(1L))
            {
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(64L); x1+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(64L)))
                        {
                            auto tmp0 = in_ptr0[static_cast<int64_t>(x0)];
                            auto tmp1 = 1000L;
                            auto tmp2 = c10::convert<int64_t>(tmp1);
                            auto tmp3 = int64_t(tmp0 + tmp2);
                            auto tmp4 = tmp0 < 0;
                            auto tmp5 = tmp4 ? tmp3 : tmp0;
                            auto tmp6 = tmp5;
                            auto tmp7 = c10::convert<int64_t>(tmp6);
                            AOTI_TORCH_CHECK((0 <= tmp7) & (tmp7 < 1000L), "index out of bounds: 0 <= tmp7 < 1000L");
                            auto tmp9 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 64L*tmp5), static_cast<int64_t>(16));
                            tmp9.store(out_ptr0 + static_cast<int64_t>(x1 + 64L*x0));
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
"""

#: The same op built for one fixed thread: no OpenMP region, so the check's exception
#: leaves the kernel (its verification decides).
SERIAL = """\
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  cpp_fused_index_select_0(const int64_t* in_ptr0,
                       const float* in_ptr1,
                       float* out_ptr0)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(128L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(64L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(64L)))
                    {
                        auto tmp0 = in_ptr0[static_cast<int64_t>(x0)];
                        auto tmp1 = 1000L;
                        auto tmp2 = c10::convert<int64_t>(tmp1);
                        auto tmp3 = int64_t(tmp0 + tmp2);
                        auto tmp4 = tmp0 < 0;
                        auto tmp5 = tmp4 ? tmp3 : tmp0;
                        auto tmp6 = tmp5;
                        auto tmp7 = c10::convert<int64_t>(tmp6);
                        AOTI_TORCH_CHECK((0 <= tmp7) & (tmp7 < 1000L), "index out of bounds: 0 <= tmp7 < 1000L");
                        auto tmp9 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 64L*tmp5), static_cast<int64_t>(16));
                        tmp9.store(out_ptr0 + static_cast<int64_t>(x1 + 64L*x0));
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
"""

CHECK = "index out of bounds: 0 <= tmp7 < 1000L"


def test_a_check_inside_a_parallel_region_is_found():
    assert abortscan.index_check_in_parallel_region(PARALLEL) == CHECK
    (a, b), = abortscan.parallel_regions(PARALLEL)
    assert PARALLEL[a:b].lstrip().startswith("#pragma omp parallel") and PARALLEL[a:b].rstrip().endswith("}")
    assert PARALLEL[b:].lstrip().startswith("inductor_cpu_integer_div_error_flag = nullptr;")


def test_a_check_outside_every_parallel_region_is_not():
    assert CHECK in SERIAL and "#pragma omp" not in SERIAL.replace("#pragma omp for", "")
    assert abortscan.index_check_in_parallel_region(SERIAL) is None
    # a region that closes before the check
    moved = PARALLEL.replace('AOTI_TORCH_CHECK((0 <= tmp7) & (tmp7 < 1000L), "index out of bounds: 0 <= tmp7 < 1000L");', "")
    moved = moved.replace("inductor_cpu_integer_div_error_flag = nullptr;",
                          'AOTI_TORCH_CHECK(true, "index out of bounds: 0 <= tmp7 < 1000L");\n'
                          "    inductor_cpu_integer_div_error_flag = nullptr;")
    assert abortscan.index_check_in_parallel_region(moved) is None
    assert abortscan.index_check_in_parallel_region(PARALLEL.replace("index out of bounds", "other")) is None
    # a pragma over one statement: the block after it is no region
    one = PARALLEL.replace("#pragma omp parallel\n", "#pragma omp parallel\n    noop();\n", 1)
    assert one != PARALLEL and abortscan.parallel_regions(one) == []
    assert abortscan.index_check_in_parallel_region(one) is None
    # a parallel for: its loop body is the region
    pfor = PARALLEL.replace("#pragma omp parallel\n", "#pragma omp parallel for\n    for(int i=0; i<1; i++)\n", 1)
    assert abortscan.index_check_in_parallel_region(pfor) == CHECK


def test_a_region_that_catches_what_it_throws_is_not_counted():
    """A kernel that rethrows after its region (pytorch/pytorch#195482) raises as eager does."""
    guarded = PARALLEL.replace("int tid = omp_get_thread_num();",
                               "int tid = omp_get_thread_num();\n        try {").replace(
        "            }\n        }\n    }\n    inductor_cpu_integer_div_error_flag = nullptr;",
        "            }\n        } } catch (...) { err = std::current_exception(); }\n    }\n"
        "    inductor_cpu_integer_div_error_flag = nullptr;")
    (a, b), = abortscan.parallel_regions(guarded)
    assert CHECK in guarded[a:b] and "catch (...)" in guarded[a:b]
    assert abortscan.index_check_in_parallel_region(guarded) is None
    assert abortscan.index_check_in_parallel_region(guarded.replace("catch (...)", "/* no catch */")) == CHECK


def test_braces_in_literals_and_comments_do_not_end_a_region():
    tricky = PARALLEL.replace("int tid = omp_get_thread_num();",
                              "int tid = omp_get_thread_num(); // }\n        /* } */ const char* s = \"}\\\"}\"; char c = '}';")
    assert abortscan.index_check_in_parallel_region(tricky) == CHECK


def _write(d, name, wrapper, text=PARALLEL):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(abortscan.KERNEL_HEADER + wrapper + "\n\n" + text)
    return p


def test_the_kernel_source_is_the_one_that_names_its_wrapper(tmp_path, monkeypatch):
    d = str(tmp_path)
    wrapper = os.path.join(d, "cabc.wrapper.cpp")
    assert abortscan.kernel_source(wrapper) is None                  # none yet
    _write(d, "cother.kernel.cpp", os.path.join(d, "cother.wrapper.cpp"), SERIAL)
    assert abortscan.kernel_source(wrapper) is None                  # another wrapper's
    _write(d, "cdef.kernel.cpp", wrapper)
    assert abortscan.kernel_source(wrapper).endswith(PARALLEL)
    with pytest.raises(abortscan.PredictedAbort, match="0 <= tmp7 < 1000L"):
        abortscan.check_before_build(wrapper)
    monkeypatch.setattr(abortscan, "MAX_SOURCE", 100)                # bounded read
    assert abortscan.kernel_source(wrapper) is None
    monkeypatch.undo()
    _write(d, "cghi.kernel.cpp", wrapper)                            # two: which one is unknown
    assert abortscan.kernel_source(wrapper) is None
    abortscan.check_before_build(wrapper)                            # unknown: no refusal


def test_found_through_inductors_wrapping():
    pa = abortscan.PredictedAbort(CHECK)

    class InductorError(Exception):
        def __init__(self, inner):
            super().__init__(str(inner))
            self.inner_exception = inner

    assert abortscan.find(InductorError(pa)) is pa
    try:
        try:
            raise pa
        except abortscan.PredictedAbort:
            raise RuntimeError("wrapped")
    except RuntimeError as e:
        assert abortscan.find(e) is pa
    assert abortscan.find(RuntimeError("x")) is None and abortscan.find(None) is None
    assert is_verification_refusal(abortscan.refusal(CHECK))


class _WrapperBuild:
    """What the split build's patch tests before reading a build as a wrapper's."""
    _compile_only, _precompiling, _use_relative_path = True, False, False

    def __init__(self, src):
        self._sources_args = src


def test_the_split_builds_hook_runs_before_the_wrapper_build_only_in_its_block(tmp_path, monkeypatch):
    from torch._inductor import cpp_builder

    built = []
    monkeypatch.setattr(cpp_builder.CppBuilder, "build", lambda self: built.append(self._sources_args))
    monkeypatch.setenv("AOTI_FARM_DEV", "split_build=0")   # the whole build: the recorder above
    seen = []
    src = str(tmp_path / "cabc.wrapper.cpp")
    with splitbuild.active(before_wrapper=seen.append):
        splitbuild._patched_build(_WrapperBuild(src))
        splitbuild._patched_build(_WrapperBuild(str(tmp_path / "cabc.kernel.cpp")))   # not a wrapper
    assert seen == [src] and built == [src, str(tmp_path / "cabc.kernel.cpp")]

    def refuse(path):
        raise abortscan.PredictedAbort(CHECK)

    with splitbuild.active(before_wrapper=refuse), pytest.raises(abortscan.PredictedAbort):
        splitbuild._patched_build(_WrapperBuild(src))
    assert built == [src, str(tmp_path / "cabc.kernel.cpp")]            # nothing built
    with splitbuild.active():                                            # the hook is the block's only
        splitbuild._patched_build(_WrapperBuild(src))
    assert len(built) == 3 and cpp_builder.CppBuilder.build is not splitbuild._patched_build


def test_only_signatures_where_eager_rejects_an_index_are_scanned():
    w, idx = torch.empty(10, 4), torch.empty(3, dtype=torch.int64)
    sel = S.from_call(torch.ops.aten.index_select.default, (w, 0, idx), {})
    sel = S.Signature(sel.op, sel.args, {"index": {"range": [0, 9]}})
    assert eager_raises_on_adversarial(sel, only=BAD_INDEX_CASES)
    add = S.from_call(torch.ops.aten.add.Tensor, (w, w), {})
    assert not eager_raises_on_adversarial(add, only=BAD_INDEX_CASES)
    assert not eager_raises_on_adversarial(add)


def test_the_switch_is_a_developer_switch(monkeypatch):
    monkeypatch.delenv("AOTI_FARM_DEV", raising=False)
    assert abortscan.enabled()
    monkeypatch.setenv("AOTI_FARM_DEV", "abort_scan=0")
    assert not abortscan.enabled()
