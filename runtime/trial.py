"""The speed gate's on-host trial of one served kernel (``runtime/gate.py`` decides).

:func:`request` hands the gate two callables for its own thread: ``speed()`` reads the
manifest's compile-time speed (the entry is opened and verified again), and ``trial()``
returns the kernel and eager on fresh inputs of the signature, with the hook bypassed in
that thread.  A native kernel id cannot be called from Python, so for one the trial times
a Python runner loaded from the same verified private copy.
"""

from __future__ import annotations

from aoti_farm import signature as S
from aoti_farm.compiler import flat_tensors, load_runner
from aoti_farm.runtime.gate import Gate, compile_ratio
from aoti_farm.runtime.kernels import runner_device


def request(gate: Gate, cache, fp, call, handle, bypassed) -> None:
    """Have ``gate`` decide ``call.key`` in its thread; ``bypassed()`` is the context in
    which the hook lets this thread's calls through to eager."""
    opened: list = []
    native = isinstance(handle, tuple)   # (native registration, kernel id)

    def speed():
        e = cache.open_entry(fp, call.key, private=native)
        sp = e.manifest.get("speed")
        r = compile_ratio(sp)
        if native and r is not None and r <= gate.ratio:
            opened.append(e)   # its private copy is loaded for the trial
        else:
            e.close()
        return sp

    def trial():
        try:
            runner = load_runner(opened[0].load_path, runner_device(call.device)) if native else handle
        finally:
            for e in opened:
                e.close()
        args, kwargs = S.materialize(call.sig, seed=0)
        tensors = flat_tensors(call.sig, args, kwargs)
        op = S.resolve_op(call.sig.op)
        return (lambda: runner.run(tensors)), (lambda: op(*args, **kwargs)), call.device, bypassed()

    gate.request(call.key, speed, trial)
