"""aoti_farm/build/tritonscan.py: a CUDA index kernel is served only where its generated Triton
code asserts every indirect index before using it.  The sources are Inductor's own output
(torch 2.11, one H200, 2026-11-29) for ``embedding`` and ``gather``, and edits of them."""

from __future__ import annotations

from aoti_farm.build import tritonscan

EMBEDDING = '''
@triton.jit
def triton_poi_fused_embedding_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 2048
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x1 = xindex // 128
    x0 = (xindex % 128)
    x2 = xindex
    tmp0 = tl.load(in_ptr0 + (x1), xmask, eviction_policy='evict_last')
    tmp1 = tl.full([XBLOCK], 1000, tl.int32)
    tmp2 = tmp0 + tmp1
    tmp3 = tmp0 < 0
    tmp4 = tl.where(tmp3, tmp2, tmp0)
    tl.device_assert(((0 <= tmp4) & (tmp4 < 1000)) | ~(xmask), "index out of bounds: 0 <= tmp4 < 1000")
    tmp6 = tl.load(in_ptr1 + (x0 + 128*tmp4), xmask)
    tl.store(out_ptr0 + (x2), tmp6, xmask)
'''

GATHER = '''
@triton.jit
def triton_poi_fused_gather_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (x2), xmask)
    tmp1 = tl.full([XBLOCK], 64, tl.int32)
    tmp2 = tmp0 + tmp1
    tmp3 = tmp0 < 0
    tmp4 = tl.where(tmp3, tmp2, tmp0)
    tl.device_assert(((0 <= tmp4) & (tmp4 < 64)) | ~(xmask), "index out of bounds: 0 <= tmp4 < 64")
    tmp6 = tl.load(in_ptr1 + (tmp4 + 64*x1), xmask, eviction_policy='evict_last')
    tl.store(out_ptr0 + (x2), tmp6, xmask)
'''

POINTWISE = '''
def triton_poi_fused_add_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (x0), xmask)
    tmp1 = tl.load(in_ptr1 + (x0), xmask)
    tmp2 = tmp0 + tmp1
    tl.store(out_ptr0 + (x0), tmp2, xmask)
'''


def test_kernels_whose_every_indirect_address_is_asserted_pass():
    assert tritonscan.check([EMBEDDING, GATHER, POINTWISE]) is None
    assert tritonscan.check([]) is None            # nothing generated: eager's own kernel runs


def test_an_indirect_address_without_its_assert_is_refused():
    no_assert = "\n".join(line for line in EMBEDDING.splitlines() if "device_assert" not in line)
    why = tritonscan.check([POINTWISE, no_assert])
    assert why is not None and "tl.load(in_ptr1 + (x0 + 128*tmp4)" in why
    # an assert that is not an index check does not count
    other = EMBEDDING.replace('"index out of bounds: 0 <= tmp4 < 1000"', '"some other check"')
    assert tritonscan.check([other]) is not None
    # an assert after the access is too late
    late = GATHER.replace("    tl.device_assert", "    #").replace(
        "    tl.store(", '    tl.device_assert((tmp4 < 64), "index out of bounds: tmp4 < 64")\n    tl.store(')
    assert tritonscan.check([late]) is not None
    # a store through an unchecked index (scatter-like), and an atomic
    store = POINTWISE.replace("tl.store(out_ptr0 + (x0)", "tl.store(out_ptr0 + (tmp0)")
    assert tritonscan.check([store]) is not None
    atomic = POINTWISE.replace("tl.store(out_ptr0 + (x0), tmp2, xmask)", "tl.atomic_add(out_ptr0 + (tmp1), tmp2, xmask)")
    assert tritonscan.check([atomic]) is not None


def test_sources_that_could_not_be_read_are_refused():
    assert tritonscan.check(None) is not None


def test_first_argument_stops_at_the_call_level_comma():
    assert tritonscan._first_argument("in_ptr1 + (x0 + f(a, tmp4)), xmask)") == "in_ptr1 + (x0 + f(a, tmp4))"
    assert tritonscan._first_argument("p + x)") == "p + x"


def test_the_capture_wrapper_changes_nothing_it_wraps(monkeypatch):
    """The differential test of the patch: Inductor's ``define_kernel`` gets exactly its
    arguments and its result is returned unchanged, in and out of :func:`capture`; sources
    are recorded only inside the block."""
    import torch
    from torch._inductor.codegen import triton as triton_codegen

    if not tritonscan._supported():
        assert torch.__version__ not in tritonscan.TORCH_VERSIONS
        return
    calls = []

    def original(self, src_code, node_schedule, kernel):
        calls.append((self, src_code, node_schedule, kernel))
        return f"name-{len(calls)}"

    monkeypatch.setattr(triton_codegen.TritonScheduling, "define_kernel", original)
    monkeypatch.setattr(tritonscan, "_patched", False)
    sched, sched_nodes, kern = object(), ["n"], object()
    with tritonscan.capture() as got:
        wrapped = triton_codegen.TritonScheduling.define_kernel
        assert wrapped is not original and wrapped.__wrapped__ is original
        assert wrapped(sched, EMBEDDING, sched_nodes, kern) == "name-1"
    assert got == [EMBEDDING]
    assert calls == [(sched, EMBEDDING, sched_nodes, kern)]
    assert wrapped(sched, GATHER, sched_nodes, kern) == "name-2"   # outside: passed through, not recorded
    assert got == [EMBEDDING] and calls[-1] == (sched, GATHER, sched_nodes, kern)
