"""The speed gate's on-host trial of one served kernel (``runtime/gate.py`` decides).

:func:`request` hands the gate two callables for its own thread: ``speed()`` reads the
manifest's compile-time speed (the entry is opened and verified again), and ``trial()``
returns the kernel and eager on fresh inputs of the signature.

Both sides are timed the way a served call runs, as the compiler times them too
(:func:`aoti_farm.speedgate.speed.time_served_call`).  For a native kernel (the hit path
almost every process uses) both call the op through the dispatcher, from the gate's
thread: the kernel side with the native path forced to run that kernel
(``FastPath.force``: boxing, the runner, its output tensors), the eager side with the hook
bypassed.  Timing a runner from Python against ``torch.ops`` from Python instead would
charge eager the Python binding's argument parsing (a few µs a call) that a call from a
model's C++ (a composite op, a ``torch.*`` function) never pays, and serve tiny kernels
that lose inside the model.  On the Python path the trial times the Python runner the
hook serves with against the op, hook bypassed.
"""

from __future__ import annotations

from aoti_farm import signature as S
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.speedgate.speed import through_dispatcher
from .gate import Gate


def request(gate: Gate, cache, fp, call, handle, bypassed) -> None:
    """Have ``gate`` decide ``call.key`` in its thread; ``bypassed()`` is the context in
    which the hook lets this thread's calls through to eager."""
    speed, trial = _sides(cache, fp, call, handle, bypassed)
    gate.request(call.key, speed, trial, fp_id=fp.id)


def confirm_now(gate: Gate, cache, fp, call, handle, bypassed) -> bool | None:
    """Decide ``call.key`` in this thread (``install()``'s trials, ``runtime/pretrial.py``)."""
    speed, trial = _sides(cache, fp, call, handle, bypassed)
    try:
        sp = speed()
    except Exception:  # noqa: BLE001 -- an unreadable entry has no speed: declined
        sp = None
    return gate.confirm(call.key, sp, trial, fp_id=fp.id)


def _sides(cache, fp, call, handle, bypassed) -> tuple:
    """(speed, trial) for :class:`Gate`: ``speed()`` reads the entry's manifest (its
    compile-time speed, and the signature it was compiled for, with the recorded value
    ranges of integer inputs: a call's own signature has none, and an index tensor of
    random values would make a gathering kernel fail); ``trial()`` materialises inputs of
    that signature."""
    native = isinstance(handle, tuple)   # (native registration, kernel id)
    compiled_for: list = []

    def speed():
        e = cache.open_entry(fp, call.key)
        try:
            m = e.manifest
        finally:
            e.close()
        try:
            sig = S.parse_signature(m["signature"])
            if sig.key == call.key:
                compiled_for.append(sig)
            elif "shape_class" in m:
                # a class entry: the call's own shapes, with the value ranges of the class's
                # members (its example's; an index stays inside the table the class fixes)
                compiled_for.append(S.Signature(call.sig.op, call.sig.args, sig.hints))
        except Exception:  # noqa: BLE001 -- the call's own signature then (no value ranges)
            pass
        return m.get("speed")

    def trial():
        sig = compiled_for[0] if compiled_for else call.sig
        args, kwargs = S.materialize(sig, seed=0)
        op = S.resolve_op(sig.op)
        if native:
            nreg, kid = handle
            return through_dispatcher(nreg.fp, nreg.mod, kid, op, args, kwargs) + (call.device,)
        tensors = flat_tensors(sig, args, kwargs)
        return (lambda: handle.run(tensors)), (lambda: op(*args, **kwargs)), call.device, bypassed()

    return speed, trial
