"""Shape-general kernels: one AOTInductor kernel for a whole shape class.

:class:`ClassCompiler` exports the op with the class's varying dims symbolic
(``torch.export.Dim`` with the class's observed ``[lo, hi]``; dims of size 0/1 are in
the class's layout and stay exact), compiles it with AOTInductor like
:class:`aoti_farm.compiler.AOTICompiler` (same options, split wrapper, thread mode), and
verifies it against eager at sampled shapes (:func:`aoti_farm.shapes.sample_points`:
both ends of every range, an odd size, random interior points and every observed
shape).  One disagreement refuses the kernel.

The speed gate is timed at every sample (``manifest["speed_samples"]``).  The entry is
always the whole verified class; ``manifest["speed"]["serve_range"]`` is where the gate
lets it serve: the whole range when it won at every sample, for a class of one symbol the
widest run of consecutive winning samples, else None.  Under ``serve="faster"`` the hook
matches a call to the class only inside ``serve_range`` (elsewhere the call is a miss
that queues its exact signature, whose own kernel may win); under ``"always"`` the whole
verified range is served.

Where the export with symbolic dims fails (an op whose meta function guards on a size,
a divisibility the range does not satisfy), Inductor cannot compile the graph, or the
verification refuses the kernel, :class:`DynamicUnsupported` says why and the farm
compiles the class's members exactly.  No failure record is written for a class.

:func:`compile_and_publish_class` is :func:`aoti_farm.job.compile_and_publish` for a
class: lease on the class key, compile, publish (``manifest["shape_class"]``), and a hint
``<root>/<fp>/classes/<group key>/<class key>`` for the serving hook's index.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass

import torch

from aoti_farm import adversarial, leases, loadenv, splitbuild, stridesym
from aoti_farm import shapes as SH
from aoti_farm import signature as S
from aoti_farm.cache import Cache
from aoti_farm.compiler import (FARM_OPTION_PREFIX, before_compile, CompileInfraError, CompileResult, _first_line, _OpModule,
                                compare, flat_tensors, infrastructure_error, length_tolerance, load_runner,
                                check_case, eager_raises_on_adversarial, thread_mode, verify_thread_counts)
from aoti_farm.errors import CompileRefused
from aoti_farm.fingerprint import Fingerprint, effective_options
from aoti_farm.job import BUSY, CACHED, COMPILED, FAILED, Outcome

#: Seconds of the speed measurement per sampled shape.
SAMPLE_SPEED_BUDGET_S = 0.15
CLASSES_DIR = "classes"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@contextlib.contextmanager
def _num_threads(n: int | None):
    """torch's intra-op thread count set to ``n`` (None: unchanged) for the block, then restored."""
    if n is None:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


class DynamicUnsupported(CompileRefused):
    """This class gets no shape-general kernel (the reason says why): compile its members
    exactly."""


@dataclass(frozen=True)
class ClassEntry:
    """What :meth:`aoti_farm.cache.Cache.publish` needs: the class key, and as the
    manifest's ``signature`` the class's example (a member; ``shape_class`` carries the
    class itself)."""

    cls: SH.ShapeClass

    @property
    def key(self) -> str:
        return self.cls.key

    def to_obj(self) -> dict:
        return self.cls.example.to_obj()


class ClassCompiler:
    """Compiles and verifies one shape class's kernel."""

    name = "aoti-dynamic"

    def __init__(self, inductor_options: dict | None = None, measure_speed: bool = True, n_random: int = 3,
                 gate_ratio: float | None = None):
        from aoti_farm import private
        from aoti_farm.speed import GATE_RATIO

        private.use_inductor_cache()   # see aoti_farm/private.py
        self._options = effective_options(inductor_options)
        self.measure_speed = measure_speed
        self.n_random = n_random
        self.gate_ratio = GATE_RATIO if gate_ratio is None else gate_ratio

    def options(self) -> dict:
        return dict(self._options)

    # -- compile
    def compile(self, cls: SH.ShapeClass, workdir: str) -> tuple[SH.ShapeClass, CompileResult]:
        """(the class to publish -- ``cls`` or its winning sub-range --, its kernel)."""
        if not cls.varies:
            raise DynamicUnsupported("no varying size: an exact kernel")
        device = cls.device
        before_compile(cls.example.info(), device, workdir, "class")
        t0 = time.perf_counter()
        sig = cls.point(SH.export_point(cls))
        args, kwargs = S.materialize(sig, seed=0)
        tensors = flat_tensors(sig, args, kwargs)
        with torch.no_grad():
            try:
                S.resolve_op(sig.op)(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                raise DynamicUnsupported(f"eager rejects the export's example shape: {type(e).__name__}: "
                                         f"{_first_line(e)}") from None
            if cls.stride_symbols:   # a stride no size implies: symbolic input strides (aoti_farm/stridesym.py)
                try:
                    graph, inputs = stridesym.trace(cls, _OpModule(sig, args, kwargs), tensors)
                except stridesym.Unsupported as e:
                    raise DynamicUnsupported(f"symbolic strides: {e}") from None
            else:
                dims = {n: torch.export.Dim(n, min=lo, max=hi) for n, (lo, hi) in cls.symbols.items()}
                spec = tuple({d: dims[p] for d, p in enumerate(pat) if isinstance(p, str)} or None
                             for pat in cls.dims)
                try:
                    ep = torch.export.export(_OpModule(sig, args, kwargs), tuple(tensors), dynamic_shapes=(spec,),
                                             strict=False)
                except Exception as e:  # noqa: BLE001 -- a constraint violation, a guard on a size, ...
                    infra = infrastructure_error(e)
                    if infra is not None:
                        raise CompileInfraError(f"export failed on this host ({infra})") from e
                    raise DynamicUnsupported(f"export with symbolic sizes failed: {type(e).__name__}: "
                                             f"{_first_line(e)}") from None
                graph, inputs = ep.module(), tuple(tensors)
            t1 = time.perf_counter()
            build = os.path.join(workdir, "build")
            opts = {k: v for k, v in self._options.items() if not k.startswith(FARM_OPTION_PREFIX)}
            opts["aot_inductor.output_path"] = os.path.join(build, "kernel.so")
            if device == "cuda" and hasattr(torch._inductor.config.aot_inductor, "embed_kernel_binary"):
                opts.setdefault("aot_inductor.embed_kernel_binary", True)
            try:
                with splitbuild.active():
                    built = torch._inductor.aot_compile(graph, inputs, options=opts)
                    build_info = splitbuild.last_build()
                if cls.stride_symbols:   # what Inductor assumed of them, too
                    stridesym.check(cls, inputs)
            except stridesym.Unsupported as e:
                raise DynamicUnsupported(f"symbolic strides: {e}") from None
            except Exception as e:  # noqa: BLE001
                infra = infrastructure_error(e)
                if infra is not None:
                    raise CompileInfraError(f"compile failed on this host ({infra}): {_first_line(e)}") from e
                raise DynamicUnsupported(f"Inductor failed on symbolic sizes: {type(e).__name__}: "
                                         f"{_first_line(e)}") from None
        t2 = time.perf_counter()
        if not isinstance(built, str) or not os.path.exists(built):
            raise DynamicUnsupported(f"AOTInductor produced no library (got {built!r})")
        path = os.path.join(workdir, "kernel.so")
        os.replace(built, path)
        shutil.rmtree(build, ignore_errors=True)
        samples = self.verify(cls, path)
        t3 = time.perf_counter()
        served, speed = self.gate(cls, samples)
        verification = {"ok": True, "samples": len(samples), "shapes": [s["at"] for s in samples]}
        res = CompileResult(files={"kernel.so": path}, seconds=t2 - t0, verification=verification,
                            phases={"export": t1 - t0, "inductor": t2 - t1, "verify": t3 - t2},
                            build=build_info, speed=speed, threads=thread_mode(self._options, device),
                            verified_threads=verify_thread_counts(device) or None)
        res.speed_samples = [{"at": s["at"], **({"speed": s["speed"]} if "speed" in s else {})} for s in samples]
        return served, res

    # -- verification across the range
    def load(self, kernel_path: str, device: str):
        """The runner used to verify (a seam for tests)."""
        return load_runner(kernel_path, "cuda:0" if device == "cuda" else "cpu")

    def verify(self, cls: SH.ShapeClass, kernel_path: str) -> list[dict]:
        """Kernel against eager at every sampled shape; DynamicUnsupported naming the first
        disagreement.  Returns one dict per sample (``at``: symbol values, ``speed``)."""
        if loadenv.needs_probe():
            loadenv.probe(kernel_path, "cuda:0" if cls.device == "cuda" else "cpu")
        if not loadenv.load_safe():
            raise DynamicUnsupported("this process cannot load kernels safely (libstdc++ preload): exact kernels")
        runner = self.load(kernel_path, cls.device)
        op = S.resolve_op(cls.op)
        threads = verify_thread_counts(cls.device)
        out = []
        for i, env in enumerate(SH.sample_points(cls, self.n_random, seed=len(cls.key))):
            sig = cls.point(env)
            args, kwargs = S.materialize(sig, seed=1000 + i)
            tensors = flat_tensors(sig, args, kwargs)
            # at every thread count it may be served at, kernel and eager alike (compiler.verify_thread_counts)
            for t in threads or [None]:
                with _num_threads(t), torch.no_grad():
                    try:
                        expected = op(*args, **kwargs)
                    except Exception as e:  # noqa: BLE001
                        raise DynamicUnsupported(f"eager rejects the sampled shape {env}: {type(e).__name__}: "
                                                 f"{_first_line(e)}") from None
                    try:
                        got = runner.run(tensors)
                    except Exception as e:  # noqa: BLE001
                        raise DynamicUnsupported(f"kernel raised at {env}: {_first_line(e)}") from None
                extra = length_tolerance(sig, args, kwargs, expected)
                bad = compare(expected, got, extra)
                if bad is not None:
                    bad["at"] = env
                    if t is not None:
                        bad["threads"] = t
                    at = f" at {t} intra-op threads" if t is not None and t != 1 else ""
                    raise DynamicUnsupported(f"kernel disagrees with eager at {env}{at}", bad)
            if i == 0:
                self._adversarial(sig, op, runner, threads)
            one = {"at": env}
            if self.measure_speed:
                from aoti_farm.speed import time_against_eager

                m = time_against_eager(lambda: runner.run(tensors), lambda: op(*args, **kwargs),
                                       "cuda" if cls.device == "cuda" else "cpu", budget_s=SAMPLE_SPEED_BUDGET_S)
                m.pop("calls", None)
                one["speed"] = m
            out.append(one)
        return out

    def _adversarial(self, sig: S.Signature, op, runner, threads: list) -> None:
        """The adversarial cases of one sampled shape (aoti_farm.adversarial), as an exact
        kernel's.  Where eager raises on one, the members are compiled exactly: their
        verification runs those cases in the verification child (a kernel's check that
        throws inside an OpenMP region aborts the process that runs it)."""
        if eager_raises_on_adversarial(sig):
            raise DynamicUnsupported("eager raises on an adversarial input (an index out of range): "
                                     "verified per member")
        args, kwargs = S.materialize(sig, seed=1000)
        with _num_threads(threads[0] if threads else None):
            for name, cargs, ckwargs in adversarial.cases(sig, args, kwargs):
                try:
                    check_case(sig, op, runner, name, cargs, ckwargs)
                except CompileRefused as e:
                    raise DynamicUnsupported(e.reason, e.evidence) from None

    def gate(self, cls: SH.ShapeClass, samples: list[dict]) -> tuple[SH.ShapeClass, dict | None]:
        """(the class, its manifest ``speed``).  The class published is always the whole
        verified class; the speed gate's part is ``speed["serve_range"]``: where the kernel
        won at every sample (the whole range), for one symbol the widest run of
        consecutive winning samples (at least two), else None (it wins nowhere it can be
        trusted to).  ``speed``'s ratio is the worst sample inside ``serve_range`` (the
        worst overall when None), so the gate's usual checks apply to it."""
        timed = [s for s in samples if "speed" in s]
        if not timed:
            return cls, None
        worst = max(timed, key=lambda s: s["speed"]["ratio"])
        full = {n: [lo, hi] for n, lo, hi in cls.ranges}
        if worst["speed"]["ratio"] <= self.gate_ratio:
            return cls, {**_speed(worst), "serve_range": full, "worst_ratio": worst["speed"]["ratio"]}
        if len(cls.ranges) != 1:
            return cls, {**_speed(worst), "serve_range": None, "worst_ratio": worst["speed"]["ratio"]}
        name = cls.ranges[0][0]
        pts = sorted(timed, key=lambda s: s["at"][name])
        best, run = [], []
        for s in pts:
            run = run + [s] if s["speed"]["ratio"] <= self.gate_ratio else []
            if len(run) > len(best):
                best = run
        if len(best) < 2:
            return cls, {**_speed(worst), "serve_range": None, "worst_ratio": worst["speed"]["ratio"]}
        w = max(best, key=lambda s: s["speed"]["ratio"])
        return cls, {**_speed(w), "serve_range": {name: [best[0]["at"][name], best[-1]["at"][name]]},
                     "worst_ratio": worst["speed"]["ratio"]}


def _speed(sample: dict) -> dict:
    return {**sample["speed"], "at": sample["at"]}


# --- publishing ------------------------------------------------------------------------------------


def write_hint(cache: Cache, fp: Fingerprint, cls: SH.ShapeClass) -> None:
    """``<root>/<fp>/classes/<group key>/<class key>``: an empty file telling the serving
    hook which class entries exist for a group.  Only a hint: the entry itself is verified
    (key, hashes, HMAC) before it is used."""
    d = cache.root / fp.id / CLASSES_DIR / cls.group_key
    d.mkdir(parents=True, exist_ok=True)
    p = d / cls.key
    if not p.exists():
        tmp = d / f".{cls.key}.{uuid.uuid4().hex[:8]}"
        tmp.touch()
        os.replace(tmp, p)


def hinted_keys(cache: Cache, fp_id: str, gkey: str) -> list[str]:
    """The class keys hinted for a group (names checked; nothing else trusted)."""
    try:
        names = os.listdir(cache.root / fp_id / CLASSES_DIR / gkey)
    except OSError:
        return []
    return sorted(n for n in names if _HEX64.match(n))


def compile_and_publish_class(cache: Cache, compiler: ClassCompiler, fp: Fingerprint, cls: SH.ShapeClass, *,
                              owner: str, lease_ttl: float = leases.DEFAULT_TTL,
                              workroot: str | None = None) -> Outcome:
    """Lease, compile, verify across the range, publish.  ``failed`` with the reason when
    the class gets no shape-general kernel (the caller compiles the members exactly);
    ``evidence["ranges"]`` are the published ranges."""
    key = cls.key
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if cache.has_entry(fp.id, key):
        write_hint(cache, fp, cls)
        return Outcome(key, CACHED, worker=worker, evidence={"ranges": _ranges(cls), "serve_range": _serve_range(
            cache, fp, key)})
    cache.ensure(fp)
    lease = leases.try_acquire(cache, fp.id, key, owner, lease_ttl)
    if lease is None:
        return Outcome(key, BUSY, worker=worker)
    t0 = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix=f"aoti-farm-class-{key[:12]}-", dir=workroot)
    try:
        if cache.has_entry(fp.id, key):
            return Outcome(key, CACHED, worker=worker, evidence={"ranges": _ranges(cls)})
        try:
            served, res = compiler.compile(cls, workdir)
        except CompileRefused as e:
            return Outcome(key, FAILED, time.perf_counter() - t0, worker, e.reason, e.evidence or {})
        cache.publish(fp, ClassEntry(served), res.files, {
            "shape_class": served.to_obj(), "compile_seconds": res.seconds, "phases": res.phases,
            "verification": res.verification, "worker": worker, "compiler": compiler.name, "attempts": 1,
            "build": res.build or {}, "speed_samples": getattr(res, "speed_samples", []),
            **({"speed": res.speed} if res.speed else {}),
            **({"threads": res.threads} if res.threads else {}),
            **({"verified_threads": res.verified_threads} if res.verified_threads else {}),
        })
        write_hint(cache, fp, served)
        ev = {"ranges": _ranges(served), "serve_range": (res.speed or {}).get("serve_range")}
        return Outcome(served.key, COMPILED, time.perf_counter() - t0, worker, phases=res.phases,
                       build=res.build or {}, evidence=ev)
    finally:
        lease.release()
        shutil.rmtree(workdir, ignore_errors=True)


def _serve_range(cache: Cache, fp: Fingerprint, key: str):
    try:
        sp = cache.read_manifest(cache.entry_dir(fp.id, key)).get("speed")
        return sp.get("serve_range") if isinstance(sp, dict) else None
    except Exception:  # noqa: BLE001 -- a report detail only
        return None


def _ranges(cls: SH.ShapeClass) -> dict:
    return {n: [lo, hi] for n, lo, hi in cls.ranges}


__all__ = ["ClassCompiler", "ClassEntry", "DynamicUnsupported", "compile_and_publish_class", "write_hint",
           "hinted_keys", "CLASSES_DIR"]
