"""The differential drill of served kernels against eager (docs/verification.md).

    .venv/bin/python scripts/drill_differential.py [--quick] [--device cpu|cuda] [--no-ray]
                                                   [--threads 1,2,16] [--contract finite|strict] [--out DIR]

Records a corpus of op cases covering every op family the recorder supports, compiles it
into a fresh cache (``aoti-farm warm`` on a local Ray pool; ``--no-ray``: in this process,
as the tests do, for a machine without Ray), replays it under the serving hook
(``serve="always"``, native and Python hit paths, and under ``aoti_farm.record``) with
random and adversarial inputs at each thread count, and prints one line per op case:
``served-equal``, ``served-edge`` (differs from eager only where the contract in force
does not call it a difference: a zero's sign or a non-finite input, under ``finite``),
``declined (<reason>)`` or ``WRONG (<what differs>)``, then a summary line (machine,
cores, torch, date).  Exit 1 on any WRONG, 2 on a bad flag.

``--out DIR`` writes the raw log (``DIR/drill.json``: every call, its counters and
verdict); nothing is written otherwise.  The work (trace, cache) lives in a temporary
directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings

warnings.filterwarnings("ignore")


class _Parser(argparse.ArgumentParser):
    def error(self, message):     # one line, exit 2, no usage dump
        sys.stderr.write(f"drill_differential: {message} (see --help)\n")
        raise SystemExit(2)


def _threads(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads {text!r}: give thread counts like 1,2,16") from None
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"--threads {text!r}: give thread counts >= 1 like 1,2,16")
    return out


def parse(argv):
    p = _Parser(prog="drill_differential", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", metavar="DIR", help="write the raw JSON log to DIR/drill.json (default: none)")
    p.add_argument("--quick", action="store_true", help="the small subset the test suite runs")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--no-ray", action="store_true", help="compile in this process instead of aoti-farm warm")
    p.add_argument("--threads", type=_threads, default=None,
                   help="intra-op thread counts to replay at (default: 1, 2 and this host's cores)")
    p.add_argument("--contract", choices=("finite", "strict"), default=None,
                   help="the serving contract the hooks run under and the drill judges by (default: "
                        "AOTI_FARM_CONTRACT, else finite): under finite a call differing from eager only in "
                        "a zero's sign or on a non-finite input is counted apart as an edge, under strict WRONG")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.out and os.path.exists(a.out) and not os.path.isdir(a.out):
        sys.stderr.write(f"drill_differential: --out {a.out} is not a directory; give a directory\n")
        return 2
    if not a.no_ray and importlib.util.find_spec("ray") is None:
        sys.stderr.write("drill_differential: Ray is not installed here; pass --no-ray to compile in-process\n")
        return 2
    # one Inductor compile thread: the drill's in-process compiles share the host with its replays
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    from aoti_farm.runtime import drill

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.stderr.write("drill_differential: --device cuda but torch sees no CUDA device; use --device cpu\n")
        return 2
    from aoti_farm.config import HookConfig, resolve
    from aoti_farm.errors import UserError

    try:   # one settings path: --contract > AOTI_FARM_CONTRACT > TOML > finite
        contract = resolve(HookConfig, cli={"contract": a.contract}).contract
    except UserError as e:
        sys.stderr.write(f"drill_differential: {e}\n")
        return 2
    plan = drill.Plan(device=a.device, quick=a.quick, ray=not a.no_ray, contract=contract,
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    if a.threads:
        plan.threads = a.threads
    n_wrong, rows, summary = drill.run(plan, out_dir=a.out)
    width = max((len(r[0]) for r in rows), default=0)
    for name, _, line, _ in rows:
        print(f"{name:<{width}}  {line}")
    print(summary)
    return 1 if n_wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
