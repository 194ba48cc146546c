"""The differential test of aoti_farm/build/serialsmall.py (a patch of Inductor's parallel-depth
decision): small kernels built with it (serial, no OpenMP region) and without it (a
parallel scope the OpenMP runtime manages) give bitwise the same results at 1, 2 and every
core's intra-op threads, and both pass verification as usual.  Reductions (Welford
included, and long reductions over few outputs) are in the corpus: a patch of this decision
once produced a wrong variance; they keep Inductor's decision, and only reduction-free
nests lose their parallel region."""

from __future__ import annotations

import os

import torch

from aoti_farm import signature as S
from aoti_farm.build import serialsmall
from aoti_farm.cache.store import Cache
from aoti_farm.compile.compiler import AOTICompiler, load_runner
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.fingerprint import fingerprint
from aoti_farm.compile.job import compile_and_publish


def _corpus():
    a, E, L = torch.ops.aten, torch.empty, torch.long
    return {
        "add": (a.add.Tensor, (E(2, 1, 128), E(2, 1, 128)), {}),
        "cat_int64": (a.cat.default, ([torch.empty(2, 38, dtype=L), torch.empty(2, 1, dtype=L)], -1), {}),
        "layer_norm": (a.native_layer_norm.default, (E(2, 1, 128), [128], E(128), E(128), 1e-5), {}),
        "softmax": (a._softmax.default, (E(2, 4, 1, 9), -1, False), {}),
        "sum": (a.sum.dim_IntList, (E(4, 128), [1]), {}),
        "var_mean": (a.var_mean.correction, (E(2, 8, 8, 8), [2, 3]), {"correction": 1, "keepdim": True}),
        "gelu": (a.gelu.default, (E(2, 1, 512),), {}),
        "amax": (a.amax.default, (E(16, 64), [1]), {}),
        "sum_long": (a.sum.dim_IntList, (E(8, 4096), [1]), {}),
        "sum_few_rows": (a.sum.dim_IntList, (E(2, 2000), [1]), {}),
        "mean_long": (a.mean.dim, (E(4, 2048), [1]), {}),
        "logsumexp_long": (a.logsumexp.default, (E(2, 3000), [1]), {}),
    }


#: Corpus kernels whose only loop nests are small and reduction-free: the patch makes them
#: serial (the manifest's ``build.serial_nests`` counts such nests; with the option at 0
#: it is 0 everywhere).  The others may have a reduction-free nest before their first
#: parallel region or after a closed one, made serial too.
_SERIAL = {"add", "cat_int64", "gelu"}


def _threads():
    return sorted({1, 2, len(os.sched_getaffinity(0))})


def test_small_kernels_are_bitwise_the_same_with_and_without_the_patch(tmp_path):
    built = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(1)   # built at 1 thread, run at 1..N: where a split reduction shows
    for label, opts in (("serial", {}), ("inductor", {serialsmall.OPTION: 0})):
        comp = AOTICompiler(opts, measure_speed=False)
        fp = fingerprint("cpu", comp.options())
        cache = Cache(tmp_path / label)
        for name, (op, args, kwargs) in _corpus().items():
            sig = S.from_call(op, args, kwargs)
            out = compile_and_publish(cache, comp, fp, sig, owner="t")
            assert out.status == "compiled", (label, name, out.error, out.evidence)
            entry = cache.open_entry(fp, sig.key)
            built[(label, name)] = (sig, load_runner(entry.kernel_path, "cpu"))
            serial = entry.manifest.get("build", {}).get("serial_nests")
            if label == "inductor" or name in _SERIAL:
                assert bool(serial) == (label == "serial"), (label, name, serial)
    assert fingerprint("cpu", AOTICompiler({}).options()).id != \
        fingerprint("cpu", AOTICompiler({serialsmall.OPTION: 0}).options()).id   # never one namespace
    torch.set_num_threads(saved)
    try:
        for name, (op, _, _) in _corpus().items():
            sig, serial = built[("serial", name)]
            _, inductor = built[("inductor", name)]
            args, kwargs = S.materialize(sig, seed=11)
            for n in _threads():
                torch.set_num_threads(n)
                x = serial.run(flat_tensors(sig, args, kwargs))
                y = inductor.run(flat_tensors(sig, args, kwargs))
                assert len(x) == len(y)
                for u, v in zip(x, y):
                    assert u.dtype == v.dtype and u.shape == v.shape and u.stride() == v.stride(), (name, n)
                    assert torch.equal(u, v) or (u.is_floating_point() and torch.equal(u.isnan(), v.isnan())
                                                 and torch.equal(u.nan_to_num(), v.nan_to_num())), (name, n)
    finally:
        torch.set_num_threads(saved)


def test_the_patch_goes_where_torch_is_not_the_one_read():
    assert serialsmall._supported() == torch.__version__.startswith(serialsmall.TORCH_VERSIONS)
