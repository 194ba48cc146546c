"""The memory budget: a signature whose compile would need more memory than allowed is
refused before anything is allocated.

A trace is input: one entry such as ``relu`` on ``float32[2**29]`` validates, and its
compile then needs tens of GB (it grew ``compile-one`` to 24.3 GB before the OOM killer
took it; the hook's worker compiled a queued ``relu[2**27]`` at 8.5 GB).  So every path
that compiles checks the estimate first: ``trace validate`` (exit 2), ``compile-one``
(exit 2), ``warm``'s planning (the signature is reported ``failed`` with the reason, the
others compile), and :func:`aoti_farm.compile.job.compile_and_publish`, which every compile goes
through (the Ray actors, the hook's background worker): there it is a ``failed`` outcome
with the reason and no failure record, because the budget belongs to the host, not to
the signature.

**The estimate** (:func:`estimate`) counts elements, not bytes, because the work that
dominates does not depend on the dtype: a compile builds random example inputs (through a
float64 buffer), runs eager and the kernel on fresh inputs, and compares the results in
float64 with masks and differences.  So it is

    16 bytes x every input tensor's storage elements  +  64 bytes x every output element

with the outputs' shapes from running the op on meta tensors (no memory; when the op has
no meta kernel, the outputs are taken to be as large as all inputs together).  Measured
by ``scripts/bench/compile_peak_rss.py`` on a 2-core, 24 GiB host (torch 2.13,
one compile in a warm process, peak RSS over the process's baseline of 0.39 GB):
relu float32[2**24] 1.16 GB (estimate
1.34 GB, 1.16x), relu float16[2**24] 1.02 GB (1.31x), add float32[4096,1]+[1,4096]
0.94 GB (1.14x).  A relu[2**27], compiled at 8.5 GB, estimates 10.7 GB.  The
fixed cost of a compile process (imports, Inductor, the C++ compiler) is not counted.

CUDA signatures are estimated the same way: the comparison runs on the host.  ``warm``'s
planning checks the inputs alone (a lower bound, no meta run: the first one imports
torch._dynamo, ~3.5 s); the whole estimate is checked where the compile happens.

**The budget** is per compile: ``memory_budget`` in ``[farm]``, ``AOTI_FARM_MEMORY_BUDGET``
(resolved by the command layer; the hook's compile worker gets it from its hook as
``--memory-budget``, the Ray actors from ``warm``'s config) or ``--memory-budget`` on ``warm``, ``serve``, ``compile-one`` and
``trace validate``; sizes like ``6G``, ``512M`` or bytes.  Default: a quarter of the
host's memory (MemTotal in /proc/meminfo): 5.9 GiB on this host (MemTotal 23.5 GiB).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aoti_farm.metrics.counters import Counters

INPUT_BYTES_PER_ELEMENT = 16
OUTPUT_BYTES_PER_ELEMENT = 64
#: the default budget is this fraction of the host's memory
DEFAULT_FRACTION = 0.25
#: used when the host's memory cannot be read
FALLBACK_BUDGET = 4 << 30
ENV = "AOTI_FARM_MEMORY_BUDGET"
#: named counters of this process: compiles refused by compile_and_publish
COUNTERS = Counters("refused")
FIX = ("raise the budget (--memory-budget, AOTI_FARM_MEMORY_BUDGET or memory_budget in [farm]) "
       "or drop the entry")

_SIZE_RE = re.compile(r"\s*(\d{1,15}(?:\.\d{1,6})?)\s*([kmgt]?)(?:i?b)?\s*", re.I)


def parse_size(text: Any) -> int:
    """'6G', '512M', '1024K', '1.5G', 123 (bytes) -> bytes (powers of 1024); ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int):
        n = text
    else:
        m = _SIZE_RE.fullmatch(str(text))
        if not m:
            raise ValueError(f"{str(text)[:40]!r} is not a size; write it like 6G, 512M or a number of bytes")
        n = int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()])
    if not 0 < n < 1 << 62:
        raise ValueError(f"{n} is not a positive size")
    return n


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def host_memory() -> int | None:
    """MemTotal of /proc/meminfo in bytes (else the physical pages), None if unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(65536).decode("ascii", "replace").splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def default_budget() -> int:
    mem = host_memory()
    return int(mem * DEFAULT_FRACTION) if mem else FALLBACK_BUDGET


def current(explicit: int | None = None) -> tuple[int, str]:
    """(budget in bytes, where it came from): ``explicit`` (a value resolved by a command
    layer: ``config.resolve``'s ``memory_budget``, ``config.memory_budget``), else the host
    default.  No environment here: ``AOTI_FARM_MEMORY_BUDGET`` is resolved by the command
    layer (the hook's compile worker gets it as ``--memory-budget``)."""
    if explicit:
        return int(explicit), "configured"
    return default_budget(), "a quarter of this host's memory"


@dataclass(frozen=True)
class Estimate:
    bytes: int
    input_elements: int
    output_elements: int | None   # None: not looked at (the inputs alone were over)
    outputs_known: bool           # False: not looked at, or no meta kernel (outputs taken as large as the inputs)

    def as_dict(self) -> dict:
        return {"estimate_bytes": self.bytes, "input_elements": self.input_elements,
                "output_elements": self.output_elements, "outputs_known": self.outputs_known}


def _tensors(sig) -> list[tuple]:
    out = []
    for a in sig.args:
        if a[0] == "T":
            out.append(a)
        elif a[0] == "TL":
            out.extend(t for t in a[1] if t[0] == "T")
    return out


def _output_elements(sig) -> int | None:
    """Elements of the op's outputs, from running it on meta tensors; None if it can't."""
    import torch

    from aoti_farm import signature as S

    try:
        info = sig.info()
        args, kwargs = [], {}

        def meta(t: tuple):
            return torch.empty_strided(t[2], t[3], dtype=S.dtype_from_name(t[1]), device="meta")

        for name, a, kwo in zip(info.arg_names, sig.args, info.kwarg_only):
            if a[0] == "T":
                v: Any = meta(a)
            elif a[0] == "TL":
                v = [None if t[0] == "N" else meta(t) for t in a[1]]
            elif a[0] == "dev":
                v = torch.device("meta")
            else:
                v = S.decode_value(a)
            (kwargs.__setitem__(name, v) if kwo else args.append(v))
        with torch.no_grad():
            res = S.resolve_op(sig.op)(*args, **kwargs)
        outs = res if isinstance(res, (tuple, list)) else [res]
        if not all(isinstance(o, torch.Tensor) for o in outs):
            return None
        return sum(int(o.numel()) for o in outs)
    except Exception:  # noqa: BLE001 -- no meta kernel, or the op rejects the inputs: unknown
        return None


def input_elements(sig) -> int:
    """Storage elements of every tensor input (what the example inputs allocate)."""
    from aoti_farm import signature as S

    return sum(S.storage_size(t[2], t[3]) for t in _tensors(sig))


@lru_cache(maxsize=4096)
def _estimate(op: str, args: tuple) -> Estimate:
    from aoti_farm import signature as S

    sig = S.Signature(op, args)
    n_in = input_elements(sig)
    n_out = _output_elements(sig)
    known = n_out is not None
    if n_out is None:
        n_out = n_in
    return Estimate(INPUT_BYTES_PER_ELEMENT * n_in + OUTPUT_BYTES_PER_ELEMENT * n_out, n_in, n_out, known)


def estimate(sig) -> Estimate:
    """The memory a compile and verification of ``sig`` needs (see the module doc)."""
    return _estimate(sig.op, sig.args)


def refusal(sig, budget: int | None = None, *, outputs: bool = True) -> tuple[str, dict] | None:
    """None when ``sig`` fits ``budget`` (None: :func:`current`), else (reason, evidence):
    the reason is one line naming the estimate, the budget and the fix.

    The inputs alone are checked first (cheap).  ``outputs=False`` stops there: a lower
    bound for planners that must not pay for the meta run (the first one imports
    torch._dynamo, ~3.5 s here); the compile path checks the whole estimate."""
    limit, source = current(budget)
    n_in = input_elements(sig)
    if INPUT_BYTES_PER_ELEMENT * n_in > limit:
        est = Estimate(INPUT_BYTES_PER_ELEMENT * n_in, n_in, None, False)
        what = f"its example inputs alone need about {human(est.bytes)} ({n_in} elements)"
    elif not outputs:
        return None
    else:
        est = estimate(sig)
        if est.bytes <= limit:
            return None
        what = (f"compiling and verifying it needs about {human(est.bytes)} ({est.input_elements} input and "
                f"{est.output_elements} output elements"
                f"{'' if est.outputs_known else ', outputs assumed as large as the inputs'})")
    reason = f"over the memory budget: {what}, the budget is {human(limit)} ({source}); {FIX}"
    return reason, {"refused": "memory_budget", **est.as_dict(), "budget_bytes": limit}


__all__ = ["Estimate", "estimate", "input_elements", "refusal", "current", "default_budget", "host_memory", "parse_size", "human"]
