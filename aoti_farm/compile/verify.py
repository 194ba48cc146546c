"""THE verification loop: a built kernel against eager, of exact and class kernels alike.

:class:`Verifier` is the verifying half of :class:`aoti_farm.compile.compiler.AOTICompiler`
(a mixin: it uses the compiler's ``load``, ``_probe``, ``verify_trials`` and
``measure_speed``): ``verify`` (an exact kernel: random inputs at
:func:`verify_thread_counts`, then adversarial inputs; in the verification child,
:mod:`aoti_farm.compile.verifyserver`, where this process cannot load kernels or eager
raises on an adversarial case), ``verify_class`` (a class kernel at sampled shapes) and
``_check`` (the loop itself; one case's checks are :mod:`aoti_farm.compile.checks`).  Also
the speed measured after verification and what counts as a verification refusal
(:func:`is_verification_refusal`).
"""

from __future__ import annotations

import os
import time

import torch

from aoti_farm import signature as S
from aoti_farm.compile import adversarial
from aoti_farm.compile.checks import _note, _raises, stated_tolerance, check_case, check_precision, eager_flags, edge_note
from aoti_farm.compile.faults import _first_line
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.tolerance import compare
from aoti_farm.dynamic import dyncompile
from aoti_farm.dynamic import shapes as SH
from aoti_farm.errors import CompileRefused
from aoti_farm.startup import loadenv


class Verifier:
    """The verification methods of :class:`~aoti_farm.compile.compiler.AOTICompiler`."""

    def verify(self, sig: S.Signature, kernel_path: str) -> dict:
        """Run the kernel and eager on fresh random inputs; raise CompileRefused on any
        disagreement (shape, dtype, strides, a NaN, a value out of tolerance).

        The first kernel built on a host (per torch build) is first loaded in a child
        process (:meth:`_probe`).  Where this process cannot load AOTI
        libraries safely (the libstdc++ trap), verification runs in a child that has
        the preload, so a crashing loader costs a failure record, not this worker.

        ``timing`` in the result: seconds of the loader probe (when this call ran it), of
        the verification child (when one ran), of the checks and of the speed gate."""
        timing: dict = {}
        self._probe(sig.device, kernel_path, timing)
        t1 = time.perf_counter()
        if sig.device == "cuda":   # compile() refuses these before building; verify() alone too
            why = adversarial.unverifiable(sig, *S.materialize(sig, seed=1000))
            if why is not None:
                raise CompileRefused(why)
        guards = adversarial.index_guards(sig, *S.materialize(sig, seed=1000))
        if not loadenv.load_safe() or eager_raises_on_adversarial(sig, guards=guards):
            # also where eager raises on an adversarial case the index guards do not send
            # to eager: a kernel's check that throws inside an OpenMP region (every
            # dynamic-threads CPU kernel has one) calls std::terminate, which would take
            # this worker with it; in the child it costs a refusal
            out = self._verify_in_child(sig, kernel_path, guards)
            timing["child"] = time.perf_counter() - t1
        else:
            out = self._verify_here(sig, kernel_path, guards)
        out["timing"] = {**(out.get("timing") or {}), **{k: round(v, 4) for k, v in timing.items()}}
        return out

    def verify_class(self, cls: SH.ShapeClass, kernel_path: str) -> tuple[list[dict], dict]:
        """A class kernel against eager at every sampled shape of its range
        (:func:`aoti_farm.dynamic.dyncompile.verify_points`), by :meth:`_check` as an exact kernel;
        DynamicUnsupported (or another CompileRefused) naming the first disagreement.
        Returns (one dict per sample: ``at``, the symbol values, and ``speed`` where
        measured; the manifest's ``verification``).  It never runs in the verification
        child: where this process cannot load kernels, or eager raises on an adversarial
        input that the class's index guards (:func:`class_index_guards`) do not send to
        eager, the class is refused and its members are compiled exactly (their
        verification runs those cases in the child)."""
        timing: dict = {}
        self._probe(cls.device, kernel_path, timing)
        if not loadenv.load_safe():
            raise dyncompile.DynamicUnsupported("this process cannot load kernels safely (libstdc++ preload): "
                                                "exact kernels")
        points = dyncompile.verify_points(cls)
        guards = refuse_class_where_eager_raises(points)
        t0 = time.perf_counter()
        runner = self.load(kernel_path, cls.device)
        n_cases, notes = self._check(points, runner, guards)
        timing["check"] = time.perf_counter() - t0
        samples = [{"at": env} for _sig, _seed, env in points]
        if self.measure_speed:
            t1 = time.perf_counter()
            for one, (sig, seed, _env) in zip(samples, points):
                one["speed"] = _time_against_eager(runner, sig, seed, budget_s=dyncompile.SAMPLE_SPEED_BUDGET_S)
            timing["speed"] = time.perf_counter() - t1
        verification = {"ok": True, "samples": len(samples), "shapes": [s["at"] for s in samples],
                        "adversarial_cases": n_cases, **({"edge_notes": notes} if notes else {}),
                        # served only where every index is in range, as an exact kernel
                        **({"index_guards": [list(g) for g in guards]} if guards else {}),
                        "timing": {k: round(v, 4) for k, v in timing.items()}}
        return samples, verification

    def _verify_in_child(self, sig: S.Signature, kernel_path: str, guards: list | None = None) -> dict:
        """In this process's long-lived, preloaded verification child (one torch import
        per process, not per kernel: :mod:`aoti_farm.compile.verifyserver`)."""
        from aoti_farm.compile import verifyserver

        out, rc, err = verifyserver.request({"sig": sig.to_obj(), "path": kernel_path, "trials": self.verify_trials,
                                             "guards": [list(g) for g in guards or ()],
                                             "speed": self.measure_speed})
        if out is None and rc is not None and rc < 0:
            why = _abort_message(err)
            raise CompileRefused(f"kernel crashed its loader (signal {-rc})" if why is None else
                                 f"kernel aborts the process where eager raises (signal {-rc}): {why}",
                                 {"signal": -rc, **({"abort": why} if why else {})})
        if out is None or "error" in out:
            why = (out or {}).get("error") or f"exit {rc}: {err[-500:]}"
            raise RuntimeError(f"verification child failed ({why})")
        out.pop("server_pid", None)
        if "refused" in out:
            raise CompileRefused(out["refused"], out.get("evidence"))
        return {**out, "in_child": True}

    def _verify_here(self, sig: S.Signature, kernel_path: str, guards: list | None = None) -> dict:
        """``guards``: the kernel's index guards (:func:`adversarial.index_guards`, computed
        once by :meth:`verify` and handed to a verification child with the request)."""
        device = sig.device
        t0 = time.perf_counter()
        runner = self.load(kernel_path, device)
        threads = verify_thread_counts(device)
        n_cases, notes = self._check([(sig, 1000 + trial, None) for trial in range(self.verify_trials)], runner,
                                     guards)
        out = {"trials": self.verify_trials, "ok": True, "adversarial_cases": n_cases,
               **({"edge_notes": notes} if notes else {}),
               # served only where every index is in range (manifest.index_guards); the rest is eager's
               **({"index_guards": [list(g) for g in guards]} if guards else {}),
               **({"threads": threads} if threads else {}), **({"flags": eager_flags()} if device == "cuda" else {})}
        t1 = time.perf_counter()
        out["timing"] = {"check": round(t1 - t0, 4)}
        if self.measure_speed:
            # as the hook serves it (through the dispatcher, the hit path's boxed entry),
            # where the extension loads here; else the runner against the op from Python
            out["speed"] = _time_served_call(sig, kernel_path, guards) or _time_against_eager(runner, sig, 1000)
            out["timing"]["speed"] = round(time.perf_counter() - t1, 4)
        return out

    def _check(self, points: list, runner, guards: list | None = None) -> tuple[int, list]:
        """THE verification loop, of exact and class kernels alike: the kernel against eager
        on the inputs of every point (``(signature, input seed, at)``: an exact kernel's
        random trials, with ``at`` None; a class kernel's sampled shapes, ``at`` their
        symbol values) at every intra-op thread count it may be served at
        (:func:`verify_thread_counts`, the kernel's and eager's alike), then the
        adversarial cases (:mod:`aoti_farm.compile.adversarial`) of the first point at the first
        thread count.  CompileRefused on any disagreement; on random inputs where one side
        raises, an exact kernel must raise as eager does (:func:`check_case`), and a class
        kernel is refused (eager and the kernel must both accept every shape of the
        range).  ``guards`` (the kernel's index guards, exact or class): the adversarial cases they
        send to eager are not run on the kernel.  Returns (the number of adversarial cases
        run, the edge notes)."""
        sig0 = points[0][0]
        op = S.resolve_op(sig0.op)
        threads = verify_thread_counts(sig0.device)
        saved = torch.get_num_threads()
        n_cases = 0
        notes: list[dict] = []
        try:
            for i, (sig, seed, at) in enumerate(points):
                args, kwargs = S.materialize(sig, seed=seed)
                for t in threads or [None]:
                    if t is not None:
                        torch.set_num_threads(t)   # the kernel's and eager's alike
                    expected, e_err = _raises(lambda: op(*args, **kwargs))
                    got, k_err = _raises(lambda: runner.run(flat_tensors(sig, args, kwargs)))
                    if (e_err is not None or k_err is not None) and at is not None:
                        if e_err is not None:
                            raise dyncompile.DynamicUnsupported(f"eager rejects the sampled shape {at}: "
                                                     f"{type(e_err).__name__}: {_first_line(e_err)}")
                        raise dyncompile.DynamicUnsupported(f"kernel raised at {at}: {_first_line(k_err)}")
                    if e_err is not None or k_err is not None:
                        check_case(sig, op, runner, f"random inputs {i}" + (f" at {t} threads" if t else ""),
                                   args, kwargs, (expected, e_err), (got, k_err))
                        continue
                    extra = stated_tolerance(sig, args, kwargs, expected)
                    bad = compare(expected, got, extra)
                    if bad is not None and bad.get("problem") == "sign of zero":
                        _note(notes, edge_note("sign of zero", f"random inputs {i}", bad))
                        bad = compare(expected, got, extra, zero_sign=False)
                    if bad is not None:
                        if at is None:
                            bad["trial"] = i
                        else:
                            bad["at"] = at
                        if t is not None:
                            bad["threads"] = t
                        if extra != (0.0, 0.0):
                            bad["length_tolerance"] = list(extra)
                        where = "" if at is None else f" at {at}"
                        tat = f" at {t} intra-op threads" if t is not None and t != 1 else ""
                        raise CompileRefused(f"kernel disagrees with eager{where}{tat}", bad)
            # adversarial inputs (aoti_farm.compile.adversarial), at the first verified thread count
            if threads:
                torch.set_num_threads(threads[0])
            args, kwargs = S.materialize(sig0, seed=points[0][1])
            for name, cargs, ckwargs in adversarial.cases(sig0, args, kwargs):
                if guards and adversarial.violates(guards, flat_tensors(sig0, cargs, ckwargs)):
                    continue   # served by eager (the index guard): the kernel never runs it
                n_cases += 1
                if name in adversarial.PRECISION_CASES:
                    check_precision(sig0, op, runner, name, cargs, ckwargs)
                else:
                    check_case(sig0, op, runner, name, cargs, ckwargs, notes=notes)
        finally:
            if threads:
                torch.set_num_threads(saved)
        return n_cases, notes


def _time_served_call(sig: S.Signature, kernel_path: str, guards) -> dict | None:
    """:func:`aoti_farm.speedgate.speed.time_served_call`, or None where it fails (the runner's
    measurement then stands; a kernel that fails only here would fail the hook's trial)."""
    from aoti_farm.speedgate.speed import time_served_call

    try:
        return time_served_call(sig, kernel_path, guards, 1000)
    except Exception:  # noqa: BLE001
        return None


def _time_against_eager(runner, sig: S.Signature, seed: int, **kw) -> dict:
    """The speed gate's compile-time half (``runtime/gate.py``): the kernel against eager
    on the same inputs (``sig``'s at ``seed``), interleaved rounds; ``kw``:
    :func:`aoti_farm.speedgate.speed.time_against_eager`'s (``budget_s``)."""
    from aoti_farm.speedgate.speed import time_against_eager

    op = S.resolve_op(sig.op)
    args, kwargs = S.materialize(sig, seed=seed)
    tensors = flat_tensors(sig, args, kwargs)
    m = time_against_eager(lambda: runner.run(tensors), lambda: op(*args, **kwargs),
                           "cuda" if sig.device == "cuda" else "cpu", **kw)
    m.pop("calls", None)
    m["via"] = "runner"
    return m


def _abort_message(err: str) -> str | None:
    """The message of the C++ exception that terminated a verification child (``what():``
    in its stderr), or None (a crash of another kind: the loader, a segfault)."""
    for line in (err or "").splitlines():
        if "what():" in line:
            return line.split("what():", 1)[1].strip()[:300] or None
    return None


#: How the reasons of verification's refusals begin: the kernel was built and checked, and
#: it is not eager's (values, errors, a crash where eager raises) or cannot be checked as
#: serving needs (``unsupported``).  Eager serves such a signature; ``warm`` reports these
#: apart and they do not fail it (a signature eager rejects, an Inductor error or a bug of
#: ours still does).
VERIFICATION_REFUSALS = ("kernel disagrees with eager", "kernel does not raise where eager raises",
                         "kernel raises where eager does not", "kernel aborts the process where eager raises",
                         "kernel crashed its loader", "kernel less accurate than eager", "unsupported")


def is_verification_refusal(reason: str | None) -> bool:
    return bool(reason) and str(reason).startswith(VERIFICATION_REFUSALS)


def eager_raises_on_adversarial(sig: S.Signature, only: tuple[str, ...] = (), guards: list | None = None) -> bool:
    """Whether eager raises on one of ``sig``'s adversarial cases (an index out of range):
    then the kernel's verification runs in the verification child (see ``verify``).
    ``only``: the cases whose names start with one of these (none run eager otherwise);
    ``guards`` (:func:`adversarial.index_guards`): the cases they send to eager do not count
    (the kernel never runs them)."""
    op = S.resolve_op(sig.op)
    args, kwargs = S.materialize(sig, seed=1000)
    for name, cargs, ckwargs in adversarial.cases(sig, args, kwargs):
        if only and not name.startswith(only):
            continue
        if guards and adversarial.violates(guards, flat_tensors(sig, cargs, ckwargs)):
            continue
        if _raises(lambda: op(*cargs, **ckwargs))[1] is not None:
            return True
    return False


def class_index_guards(points: list) -> list | None:
    """The index guards of a class kernel (:func:`adversarial.index_guards`), where they are
    the same at every sampled point; else None.

    A guard's bound is a size of one of the call's inputs (the table an index selects
    from).  Where that size is fixed across the class (a vocabulary, a position table: the
    index's length is what varies), the exact guard holds for every member, and the class
    kernel is served behind it as an exact kernel is.  Where the bound is a symbol, the
    samples include both ends of its range, so their guards differ: None, and the class
    falls back to exact members (:func:`refuse_class_where_eager_raises`)."""
    first = None
    for sig, seed, _at in points:
        g = adversarial.index_guards(sig, *S.materialize(sig, seed=seed))
        if g is None or (first is not None and g != first):
            return None
        first = g
    return first


def refuse_class_where_eager_raises(points: list) -> list | None:
    """A class kernel is never verified in the verification child: where eager raises on an
    adversarial input of its first sampled shape that the class's index guards
    (:func:`class_index_guards`) do not send to eager, its members are compiled exactly
    (DynamicUnsupported).  Returns the guards (None: none)."""
    guards = class_index_guards(points)
    if eager_raises_on_adversarial(points[0][0], guards=guards):
        raise dyncompile.DynamicUnsupported("eager raises on an adversarial input (an index out of range) "
                                            "that no fixed index guard covers: verified per member")
    return guards


def verify_thread_counts(device: str) -> list[int]:
    """The intra-op thread counts a CPU kernel is verified at (sorted): 1, 2 and this
    host's core count.  A ``cpp.dynamic_threads`` kernel runs on the caller's thread count,
    and a parallel reduction's code differs from the inline one: a kernel right at 1
    thread can be wrong at 2.  Empty for CUDA."""
    if device != "cpu":
        return []
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return sorted({1, 2, max(1, n)})
