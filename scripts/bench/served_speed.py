#!/usr/bin/env python
"""Compile a few single-op signatures into a fresh cache and print each kernel's speed as
the hook serves it (the manifest's compile-time record, timed through the dispatcher into
the native hit path: aoti_farm/speedgate/speed.py ``time_served_call``), with its refusal or edge
notes: the ops issue 48 names (index ops, ``upsample_bilinear2d``, ``max_pool2d``), on the
device given.  ``via: runner`` marks an op the hit path cannot register at the device's
dispatch key (a composite op such as ``embedding``: eager runs its decomposition, and the
hook serves the ops that reach the key).

    python scripts/bench/served_speed.py [--device cpu|cuda] [--out DIR | --json FILE]

On the GPU hosts start it with ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6``
(../shared/device/NOTES.md).  One compile process, no Ray.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_output_args, machine, write_output  # noqa: E402


def _calls(device: str) -> dict:
    import torch

    d, L = device, torch.long
    return {
        "embedding [1000,128] by [2,8]": (torch.ops.aten.embedding.default,
                                          (torch.randn(1000, 128, device=d), torch.randint(0, 1000, (2, 8), device=d))),
        "embedding [50000,768] by [8,512]": (torch.ops.aten.embedding.default,
                                             (torch.randn(50000, 768, device=d),
                                              torch.randint(0, 50000, (8, 512), device=d))),
        "index_select [1000,128] by 16": (torch.ops.aten.index_select.default,
                                          (torch.randn(1000, 128, device=d), 0, torch.randint(0, 1000, (16,), device=d))),
        "gather [64,64] by [64,8]": (torch.ops.aten.gather.default,
                                     (torch.randn(64, 64, device=d), 1, torch.randint(0, 64, (64, 8), device=d, dtype=L))),
        "upsample_bilinear2d [8,64,64,64] to 128x128": (torch.ops.aten.upsample_bilinear2d.default,
                                                        (torch.randn(8, 64, 64, 64, device=d), [128, 128], False)),
        "max_pool2d [8,64,128,128] 3x3/2": (torch.ops.aten.max_pool2d_with_indices.default,
                                            (torch.randn(8, 64, 128, 128, device=d), [3, 3], [2, 2], [1, 1])),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    add_output_args(ap, "served_speed")
    ns = ap.parse_args(argv)

    from aoti_farm import signature as S
    from aoti_farm.cache.store import Cache
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.fingerprint import fingerprint
    from aoti_farm.compile.job import compile_and_publish

    comp = AOTICompiler()
    fp = fingerprint("cuda:0" if ns.device == "cuda" else "cpu", comp.options())
    rows = []
    with tempfile.TemporaryDirectory() as root:
        cache = Cache(os.path.join(root, "c"), signing_key=None)
        for name, (op, args) in _calls(ns.device).items():
            sig = S.from_call(op, args, {})
            out = compile_and_publish(cache, comp, fp, sig, owner="bench")
            row = {"signature": name, "status": out.status, "error": out.error}
            if out.status == "compiled":
                m = cache.open_entry(fp, sig.key).manifest
                sp, v = m.get("speed") or {}, m.get("verification") or {}
                row.update(kernel_us=sp.get("kernel_us"), eager_us=sp.get("eager_us"), ratio=sp.get("ratio"),
                           via=sp.get("via"), edge_notes=sorted({n.get("class") for n in v.get("edge_notes") or ()}),
                           index_asserts=v.get("index_asserts"), computed_in=v.get("computed_in"))
                print(f"{name:40} {row['ratio']:.3f}x eager ({row['kernel_us']:.1f} / {row['eager_us']:.1f} us, "
                      f"via {row['via']}) notes {row['edge_notes'] or '-'}"
                      + (f" index asserts {row['index_asserts']}" if row["index_asserts"] else ""), flush=True)
            else:
                print(f"{name:40} {out.status}: {out.error}", flush=True)
            rows.append(row)
    write_output(ns, {"bench": "served_speed", "device": ns.device, "machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
