"""Compiling one signature: a small interface and its one real implementation.

``Compiler.compile(sig, workdir)`` returns the files of a kernel that torch's AOTI
model-container runner loads, *already checked against eager* on fresh random inputs (a
CPU kernel at every intra-op thread count it may be served at: 1, 2 and the host's cores;
a shape class's kernel at sampled shapes across its range, :mod:`aoti_farm.dynamic.dyncompile`)
and on adversarial inputs (:mod:`aoti_farm.compile.adversarial`: special values, extremes,
indices eager rejects, where the kernel must raise like eager), or raises
:class:`CompileRefused` for a deterministic failure (an ineligible op, an Inductor error,
a disagreement with eager).  An exception of aoti-farm's own code is a bug
(:func:`own_code_error`: recorded once with its traceback by ``job.compile_and_publish``).
Any other exception is an infrastructure failure that the farm may retry.

This is the only module that touches private torch APIs:

* ``torch._inductor.aot_compile`` -- AOTInductor's entry point that writes a .so to
  ``aot_inductor.output_path``.  Upstream's own ``aoti_compile_with_persistent_cache``
  goes through ``torch._export.aot_compile``, which wraps the same function.
* ``torch._C._aoti.AOTIModelContainerRunnerCpu/Cuda`` -- the runner upstream's C++
  ``AOTIPythonKernelHolder`` uses; we load kernels the same way it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from aoti_farm.build import abortscan, serialsmall, splitbuild, tritonscan
from aoti_farm.compile import adversarial
from aoti_farm.dynamic import dyncompile, stridesym
from aoti_farm.startup import loadenv
from aoti_farm.dynamic import shapes as SH
from aoti_farm import signature as S
from aoti_farm.cache import elfstack
from aoti_farm.errors import CompileRefused, FarmError
from aoti_farm.compile.tolerance import TOLERANCES, compare, flag_tolerance, length_tolerance, precision  # noqa: F401 -- re-exported
from aoti_farm.fingerprint import effective_options, seed_inductor_vec_isa
from aoti_farm.compile.runner import flat_tensors  # noqa: F401 -- re-exported (the runner's inputs)

#: How many fresh random input sets a kernel must match eager on.
VERIFY_TRIALS = 2

#: aoti-farm's own options among the Inductor options (in the fingerprint, never passed on).
FARM_OPTION_PREFIX = "aoti_farm."


class CompileInfraError(FarmError):
    """A compile that failed for a reason outside the signature (disk full, the C++ compiler
    killed, out of memory): never recorded as a refusal; the farm retries it."""


@dataclass
class CompileResult:
    files: dict[str, str]              # name in the entry -> path on disk
    seconds: float                     # wall time of the compile alone
    verification: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)   # export/inductor/verify seconds
    cpu: dict = field(default_factory=dict)      # Inductor's CPU seconds, own and its compilers' (cpu_seconds)
    build: dict = field(default_factory=dict)    # how the wrapper was built (splitbuild)
    speed: dict | None = None          # kernel against eager on this device (runtime/gate.py)
    threads: str | None = None         # how a CPU kernel threads: "dynamic" or "fixed:N"
    verified_threads: list | None = None   # intra-op thread counts a CPU kernel was verified at
    speed_samples: list | None = None  # a class kernel's speed at each sampled shape (aoti_farm.dynamic.dyncompile.gate)


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's): around Inductor's part of a
    compile, how much went to Python and how much to the C++ compilers it ran (a child's
    seconds count once the child is reaped, with those of the processes it reaped).  Wall
    time above their sum was spent waiting: for a core, the disk, a lock."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), ru.ru_utime + ru.ru_stime


def thread_mode(options: dict, device: str) -> str | None:
    """The manifest's ``threads`` field: "dynamic" when the kernel follows the calling
    thread's intra-op thread count (``cpp.dynamic_threads``), else "fixed:N" with the
    count this process would bake in; None for CUDA kernels."""
    if device != "cpu":
        return None
    if options.get("cpp.dynamic_threads"):
        return "dynamic"
    n = options.get("cpp.threads")
    return f"fixed:{n if isinstance(n, int) and n >= 1 else torch.get_num_threads()}"


class Compiler(Protocol):
    name: str

    def options(self) -> dict:
        """Inductor options that change the generated code (part of the fingerprint)."""

    def compile(self, sig: "S.Signature | SH.ShapeClass", workdir: str) -> CompileResult:
        """Compile and verify ``sig`` into ``workdir``; see the module docstring.  ``sig`` is
        a signature, or a shape class (one kernel for its range; the job publishes it as
        the class's entry): every compile, exact or shape-general, comes through here."""


def load_runner(kernel_path: str, device: str):
    """Load a kernel for serving: ``.run(tensors)`` is thread-safe and has no cross-call
    wait.  CUDA: :class:`aoti_farm.compile.runner.PooledRunner` (single-threaded containers, one per
    concurrent call; the default container run makes each call wait for the previous
    one's GPU work).  CPU: torch's runner with one model instance per core (the default
    run waits only for a free instance; on CPU an instance is free once its call returns),
    which costs less per call here than the ctypes pool (1.4 us vs 5.6 us, 2-core VM)."""
    from aoti_farm.compile.runner import CPU_MODELS, PooledRunner

    if device.startswith("cuda"):
        return PooledRunner(kernel_path, device)
    return torch._C._aoti.AOTIModelContainerRunnerCpu(kernel_path, CPU_MODELS)


def _output_strides(out) -> list | None:
    """Per output of eager's result, its strides (None for a non-tensor)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(o.stride()) if isinstance(o, torch.Tensor) else None for o in outs]


def _only_size1_differ(sizes, have, want) -> bool:
    return len(have) == len(want) and all(h == w or n == 1 for n, h, w in zip(sizes, have, want))


class _OpModule(torch.nn.Module):
    """forward(*tensors) -> op(*args) with every non-tensor argument baked in.

    ``eager_strides`` (exact kernels): eager's output strides.  Where the traced output's
    strides differ from them only in size-1 dims (the op's meta function lays a
    channels-last ``[N, C, 1, 1]`` result out as its input, eager's TensorIterator
    contiguously), the output is restrided to eager's: the same elements at the same
    addresses (a size-1 dim's stride addresses nothing), so no copy, and the memory
    format torch later suggests for the result is eager's (:func:`tolerance.compare`
    checks it)."""

    def __init__(self, sig: S.Signature, args: tuple, kwargs: dict, eager_strides: list | None = None,
                 upcast: list | None = None, out_of_range: list | None = None):
        super().__init__()
        self.eager_strides = eager_strides
        self.upcast = upcast   # eager's output dtypes: computed in float64, returned in these
        # (input position, bound): a negative index becomes ``bound``, which the kernel's
        # own index assert rejects as eager's CUDA kernel rejects the negative one
        # (adversarial.cuda_index_bounds)
        self.out_of_range = out_of_range or []
        self.op = S.resolve_op(sig.op)
        self.positions = S.tensor_positions(sig)
        self.template_args = list(args)
        self.template_kwargs = dict(kwargs)
        self.n_pos = len(args)
        self.names = sig.info().arg_names

    def forward(self, *tensors):
        if self.out_of_range:
            tensors = list(tensors)
            for pos, bound in self.out_of_range:
                t = tensors[pos]
                tensors[pos] = torch.where(t < 0, torch.full_like(t, bound), t)
            tensors = tuple(tensors)
        if self.upcast:   # computed in float64, returned in eager's dtypes (see AOTICompiler.compile)
            tensors = tuple(t.to(torch.float64) if t.dtype in _NARROW_FLOATS else t for t in tensors)
        args = [list(a) if isinstance(a, list) else a for a in self.template_args]
        kwargs = {k: (list(v) if isinstance(v, list) else v) for k, v in self.template_kwargs.items()}
        for t, (i, j) in zip(tensors, self.positions):
            if i < self.n_pos:
                if j is None:
                    args[i] = t
                else:
                    args[i][j] = t
            else:
                name = self.names[i]
                if j is None:
                    kwargs[name] = t
                else:
                    kwargs[name][j] = t
        out = self.op(*args, **kwargs)
        if self.upcast:
            out = _narrow_back(out, self.upcast)
        if not self.eager_strides:
            return out
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for n, (o, want) in enumerate(zip(outs, self.eager_strides)):
            if (isinstance(o, torch.Tensor) and want is not None and tuple(o.stride()) != want
                    and _only_size1_differ(o.shape, o.stride(), want)):
                outs[n] = o.as_strided(o.shape, want, o.storage_offset())
        return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


#: Floating dtypes narrower than float64: an exact kernel refused as less accurate than
#: eager is built again computing in float64 (:meth:`AOTICompiler.compile`).
_NARROW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _narrow_back(out, dtypes: list):
    """``out`` with each float64 output cast to eager's dtype for it."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    outs = [o.to(d) if isinstance(o, torch.Tensor) and d is not None and o.dtype != d else o
            for o, d in zip(outs, dtypes)]
    return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


class _NotUpcastable(Exception):
    """The float64 build does not apply to this signature (:func:`upcast_dtypes`)."""


def upcast_dtypes(tensors, eager_out) -> list | None:
    """Eager's output dtypes where the float64 build of a precision refusal applies: every
    floating input of one narrow dtype (float32, float16, bfloat16), every output a tensor;
    else None."""
    dts = {t.dtype for t in tensors if t.is_floating_point()}
    if len(dts) != 1 or next(iter(dts)) not in _NARROW_FLOATS:
        return None
    outs = eager_out if isinstance(eager_out, (tuple, list)) else (eager_out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    return [o.dtype for o in outs]


def before_compile(info: S.OpInfo, device: str, workdir: str, what: str) -> None:
    """What every compile checks and prepares first (exact and shape-general alike)."""
    if info.ineligible:
        raise CompileRefused(f"ineligible: {info.ineligible}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"CUDA {what} on a worker without a GPU")
    os.makedirs(workdir, exist_ok=True)
    if device == "cpu":
        seed_inductor_vec_isa()   # once per process: skip Inductor's ISA probe when we know its answer


class AOTICompiler:
    """Compiles one op call with AOTInductor, in this process, and verifies it."""

    name = "aoti"

    def __init__(self, inductor_options: dict | None = None, verify_trials: int = VERIFY_TRIALS,
                 measure_speed: bool = True, *, builds: bool = True):
        """``builds=False``: a verifier that only loads kernels and runs them (a verification
        child, :func:`_verify_request`).  It builds nothing, so it only sets and checks the
        private Inductor cache and does not import Inductor to patch it: that import
        (``torch._inductor`` pulls in ``torch._dynamo``) was most of such a child's start,
        paid again by every replacement after a kernel that aborts."""
        from aoti_farm.security import private

        # never $TMPDIR/torchinductor_<user>: see aoti_farm/security/private.py
        private.use_inductor_cache(patch_torch=builds)
        self._options = effective_options(inductor_options)
        self.verify_trials = verify_trials
        self.measure_speed = measure_speed

    def options(self) -> dict:
        return dict(self._options)

    def compile(self, job, workdir: str) -> CompileResult:
        """Compile and verify ``job``: a Signature (an exact kernel) or a
        :class:`~aoti_farm.dynamic.shapes.ShapeClass` (one kernel for the class's range, its varying
        dims symbolic: :mod:`aoti_farm.dynamic.dyncompile`).  Both take the same build block and the
        same verification loop (:meth:`_check`); a class is verified at sampled shapes
        across its range instead of random inputs of one shape.

        An exact kernel refused as less accurate than eager (eager's CPU reductions such as
        ``var`` and ``group_norm`` accumulate in float64, Inductor's in the input's dtype)
        is built once more computing in float64: its narrow floating inputs cast up inside
        the graph, its outputs cast back to eager's dtypes.  That kernel goes through the
        same verification, precision included; if it too is refused, the first refusal
        stands.  The manifest's verification says ``computed_in: float64``."""
        t0 = time.perf_counter()
        try:
            return self._compile(job, workdir)
        except CompileRefused as first:
            return self._compile_float64(job, workdir, first, t0)
        finally:   # what this compile went without (its verification done), built now
            splitbuild.start_pch_build()

    def _compile_float64(self, job, workdir: str, first: CompileRefused, t0: float) -> CompileResult:
        """The precision refusal ``first`` of ``job``, built again in float64 (see
        :meth:`compile`); raises ``first`` where that is no kernel either."""
        if isinstance(job, SH.ShapeClass) or refusal_class(first.reason, first.evidence) != "precision":
            raise first
        narrow_s = time.perf_counter() - t0
        try:
            # its own directory: a library path the verifying process loaded already
            # would be the narrow kernel again (dlopen hands back a loaded path's handle)
            res = self._compile(job, os.path.join(workdir, "float64"), upcast=True)
        except (CompileRefused, _NotUpcastable):
            raise first from None
        res.verification = {**(res.verification or {}), "computed_in": "float64",
                            "narrow_refusal": first.reason}
        res.seconds += narrow_s   # the refused narrow build is part of this compile's cost
        res.phases = {**res.phases, "narrow_attempt": narrow_s}
        return res

    def _compile(self, job, workdir: str, upcast: bool = False) -> CompileResult:
        cls = job if isinstance(job, SH.ShapeClass) else None
        sig = job if cls is None else dyncompile.export_signature(cls)
        device = sig.device
        before_compile(sig.info(), device, workdir, "signature" if cls is None else "class")
        if cls is None and not loadenv.load_safe():   # its verification child imports torch while this compiles
            from aoti_farm.compile import verifyserver

            verifyserver.prestart()
        refused = CompileRefused if cls is None else dyncompile.DynamicUnsupported
        if known_proxy_op(sig.op, device):   # found by an earlier compile here: refused before Inductor runs
            raise CompileRefused(PROXY_EXECUTOR_REFUSAL, {"found": "an earlier compile of this op on this host",
                                                          "before_compile": True})
        t0 = time.perf_counter()
        stage = "export"
        build = os.path.join(workdir, "build")
        try:
            args, kwargs = S.materialize(sig, seed=0)
            why = adversarial.unverifiable(sig, args, kwargs, exact=cls is None)
            if why is not None:   # before compiling: it could never be published
                raise CompileRefused(why)
            # a CUDA index op: negative indices mapped out of range, the asserts read back
            cuda_bounds = adversarial.cuda_index_bounds(sig, args, kwargs) if cls is None else None
            if cls is not None:   # before compiling too: verify_class would refuse it
                _refuse_class_where_eager_raises(dyncompile.verify_points(cls))
            tensors = flat_tensors(sig, args, kwargs)
            with torch.no_grad():
                # eager must accept the example inputs, or the signature itself is bad
                try:
                    eager_out = S.resolve_op(sig.op)(*args, **kwargs)
                except Exception as e:
                    what = "the example inputs" if cls is None else "the export's example shape"
                    raise refused(f"eager rejects {what}: {type(e).__name__}: {_first_line(e)}") from None
                # a kernel that would end its verification where eager rejects an index is
                # refused before its C++ build (aoti_farm/build/abortscan.py)
                # (not where index guards send every bad index to eager: its checks never fire)
                scan = (abortscan.check_before_build if cls is None and device == "cpu" and abortscan.enabled()
                        and set(sig.info().arg_names) & set(adversarial.INDEX_ARGS)
                        and adversarial.index_guards(sig, args, kwargs) is None
                        and eager_raises_on_adversarial(sig, only=adversarial.BAD_INDEX_CASES) else None)
                up = upcast_dtypes(tensors, eager_out) if upcast else None
                if upcast and up is None:
                    raise _NotUpcastable()
                mod = _OpModule(sig, args, kwargs, _output_strides(eager_out) if cls is None else None, up,
                                cuda_bounds)
                if cls is not None and cls.stride_symbols:
                    # a stride no size implies: symbolic input strides (aoti_farm/dynamic/stridesym.py)
                    try:
                        graph, inputs = stridesym.trace(cls, mod, tensors)
                    except stridesym.Unsupported as e:
                        raise dyncompile.DynamicUnsupported(f"symbolic strides: {e}") from None
                else:
                    dynamic = {} if cls is None else {"dynamic_shapes": dyncompile.dynamic_spec(cls)}
                    ep = torch.export.export(mod, tuple(tensors), strict=False, **dynamic)
                    graph, inputs = ep.module(), tuple(tensors)
                stage = "inductor"
                t1 = time.perf_counter()
                opts = {k: v for k, v in self._options.items() if not k.startswith(FARM_OPTION_PREFIX)}
                opts["aot_inductor.output_path"] = os.path.join(build, "kernel.so")
                if device == "cuda" and hasattr(torch._inductor.config.aot_inductor, "embed_kernel_binary"):
                    # CUDA kernels otherwise load their .cubin files from the build
                    # directory at run time; a published entry must be self-contained.
                    opts.setdefault("aot_inductor.embed_kernel_binary", True)
                c1 = cpu_seconds()
                with splitbuild.active(before_wrapper=scan), \
                        serialsmall.active(self._options.get(serialsmall.OPTION, 0)), \
                        (tritonscan.capture() if cuda_bounds else contextlib.nullcontext()) as triton_sources:
                    built = torch._inductor.aot_compile(graph, inputs, options=opts)
                    build_info = splitbuild.last_build()
                    if device == "cpu":   # loop nests made serial (the manifest's build says so)
                        build_info["serial_nests"] = serialsmall.serialized()
                c2 = cpu_seconds()
                if cls is not None and cls.stride_symbols:   # what Inductor assumed of them, too
                    try:
                        stridesym.check(cls, inputs)
                    except stridesym.Unsupported as e:
                        raise dyncompile.DynamicUnsupported(f"symbolic strides: {e}") from None
        except (CompileRefused, _NotUpcastable):
            raise
        except Exception as e:
            predicted = abortscan.find(e)
            if predicted is not None:
                shutil.rmtree(build, ignore_errors=True)
                raise CompileRefused(abortscan.refusal(str(predicted)),
                                     {"abort": str(predicted), "before_build": True}) from None
            if own_code_error(e) is not None:
                raise   # a bug of ours: recorded by job.compile_and_publish, never a refusal or a retry
            if cls is None and not isinstance(e, _compile_errors()):
                raise
            infra = infrastructure_error(e)
            if infra is not None:
                # the host, not the signature: retried by the farm, never recorded
                raise CompileInfraError(f"{'export' if cls is not None and stage == 'export' else 'compile'} failed "
                                        f"on this host ({infra}): {type(e).__name__}: {_first_line(e)}") from e
            # Export/Inductor errors are deterministic for a given signature (class) + toolchain.
            what = ("compile error" if cls is None else "export with symbolic sizes failed" if stage == "export"
                    else "Inductor failed on symbolic sizes")
            raise refused(f"{what}: {type(e).__name__}: {_first_line(e)}") from None
        t2 = time.perf_counter()
        if not isinstance(built, str) or not os.path.exists(built):
            raise refused(f"AOTInductor produced no library (got {built!r})")
        if cuda_bounds:
            why = tritonscan.check(triton_sources)
            if why is not None:
                shutil.rmtree(build, ignore_errors=True)
                raise CompileRefused(f"unsupported on CUDA: {why}", {"index_bounds": [list(b) for b in cuda_bounds]})
        if needs_proxy_executor(os.path.dirname(built)):
            remember_proxy_op(sig.op, device)
            shutil.rmtree(build, ignore_errors=True)
            raise CompileRefused(PROXY_EXECUTOR_REFUSAL, {"found": "aoti_torch_proxy_executor_call_function"})
        # Verify exactly what will be published: the library alone, away from every
        # other file the build left (a kernel that still needs them fails here).
        path = os.path.join(workdir, "kernel.so")
        os.replace(built, path)
        shutil.rmtree(build, ignore_errors=True)
        try:   # AOTI's constants object asks for an executable stack: never publish that
            if elfstack.clear_exec_stack(path):
                build_info = {**(build_info or {}), "exec_stack": "cleared"}
        except (OSError, ValueError) as e:
            raise CompileRefused(f"unsupported: the built library cannot be loaded without an executable stack: {e}")
        speed_samples = None
        if cls is None:
            verification = self.verify(sig, path)
            speed = verification.pop("speed", None)
            verified_threads = verification.pop("threads", None)
        else:
            samples, verification = self.verify_class(cls, path)
            from aoti_farm.speedgate.speed import GATE_RATIO

            speed = dyncompile.gate(cls, samples, GATE_RATIO)
            speed_samples = samples   # {at, speed} per sampled shape
            verified_threads = verify_thread_counts(device) or None
        if cuda_bounds:   # what stands for the bad-index cases a CUDA process cannot run
            verification = {**verification, "index_asserts": [list(b) for b in cuda_bounds]}
        t3 = time.perf_counter()
        return CompileResult(files={"kernel.so": path}, seconds=t2 - t0, verification=verification,
                             phases={"export": t1 - t0, "inductor": t2 - t1, "verify": t3 - t2},
                             cpu={"inductor_own": round(c2[0] - c1[0], 3), "inductor_compilers": round(c2[1] - c1[1], 3)},
                             build=build_info, speed=speed, threads=thread_mode(self._options, device),
                             verified_threads=verified_threads, speed_samples=speed_samples)

    def load(self, kernel_path: str, device: str):
        """The runner the verification checks (a seam for tests)."""
        return load_runner(kernel_path, "cuda:0" if device == "cuda" else "cpu")

    def _probe(self, device: str, kernel_path: str, timing: dict) -> None:
        """The first kernel built on a host (per torch build) is first loaded in a child
        process (:func:`aoti_farm.startup.loadenv.probe`)."""
        t0 = time.perf_counter()
        if loadenv.needs_probe():
            # one prober per host: the others wait for its memo -- except a process that has
            # the preload itself, which loads kernels here whatever the memo will say
            # (load_safe): it probes only if nobody is probing, and never waits (16 first
            # verifications at once would otherwise wait for the host preparation's probe)
            wait = not loadenv.preloaded()
            with _probe_lock(wait=wait) as held:
                if held is not False and loadenv.needs_probe():
                    loadenv.probe(kernel_path, "cuda:0" if device == "cuda" else "cpu")
            timing["probe"] = time.perf_counter() - t0

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
        input, the class is refused and its members are compiled exactly (their
        verification runs those cases in the child)."""
        timing: dict = {}
        self._probe(cls.device, kernel_path, timing)
        if not loadenv.load_safe():
            raise dyncompile.DynamicUnsupported("this process cannot load kernels safely (libstdc++ preload): "
                                                "exact kernels")
        points = dyncompile.verify_points(cls)
        _refuse_class_where_eager_raises(points)
        t0 = time.perf_counter()
        runner = self.load(kernel_path, cls.device)
        n_cases, notes = self._check(points, runner)
        timing["check"] = time.perf_counter() - t0
        samples = [{"at": env} for _sig, _seed, env in points]
        if self.measure_speed:
            t1 = time.perf_counter()
            for one, (sig, seed, _env) in zip(samples, points):
                one["speed"] = _time_against_eager(runner, sig, seed, budget_s=dyncompile.SAMPLE_SPEED_BUDGET_S)
            timing["speed"] = time.perf_counter() - t1
        verification = {"ok": True, "samples": len(samples), "shapes": [s["at"] for s in samples],
                        "adversarial_cases": n_cases, **({"edge_notes": notes} if notes else {}),
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
        range).  ``guards`` (an exact kernel's index guards): the adversarial cases they
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
                    extra = _tolerance(sig, args, kwargs, expected)
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


# The named classes of refusals live with the failure records (torch-free readers count them).
from aoti_farm.cache.failures import REFUSAL_CLASSES, refusal_class  # noqa: E402,F401


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


def _refuse_class_where_eager_raises(points: list) -> None:
    """A class kernel is never verified in the verification child: where eager raises on an
    adversarial input of its first sampled shape (an index out of range), its members are
    compiled exactly (DynamicUnsupported)."""
    if eager_raises_on_adversarial(points[0][0]):
        raise dyncompile.DynamicUnsupported("eager raises on an adversarial input (an index out of range): "
                                            "verified per member")


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


def eager_flags() -> dict:
    """The global flags that change what eager's CUDA convolutions and matmuls return
    (recorded in the manifest's verification as ``flags``; tolerance.flag_tolerance reads them)."""
    return {"matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


def _tolerance(sig: S.Signature, args: tuple, kwargs: dict, expected) -> tuple[float, float]:
    """Extra (rtol, atol) of one comparison: the length-scaled one (sums, scans, matrix
    products) plus, on CUDA, TF32's where eager ran with it allowed."""
    a = length_tolerance(sig, args, kwargs, expected)
    b = flag_tolerance(sig, args, kwargs, eager_flags() if sig.device == "cuda" else None)
    return a[0] + b[0], a[1] + b[1]


from aoti_farm.cache.failures import PROXY_EXECUTOR_REFUSAL  # noqa: E402,F401


#: The host's memo of ops whose kernels need the proxy executor, per torch build.
_PROXY_MEMO_MAX = 1 << 20


def _proxy_memo_path() -> str:
    from aoti_farm.security.fsutil import memo_dir

    return os.path.join(memo_dir(), f"proxy-ops-{torch.version.git_version[:12]}.json")


def known_proxy_op(op: str, device: str) -> bool:
    """Whether an earlier compile on this host (same torch build) found that ``op``'s kernel
    on ``device`` needs AOTInductor's proxy executor: then a new signature of it is refused
    before Inductor runs (a 2.5 s compile for nothing otherwise: every shape of a U-Net's
    ``cudnn_convolution``).  Whether an op falls back to a shim-less kernel depends on
    Inductor's lowerings, decompositions and the device, which only a compile settles, so
    the first signature of such an op is compiled and its generated source decides
    (:func:`needs_proxy_executor`); the memo is private (:mod:`aoti_farm.security.private`) and read
    bounded.  Unreadable or absent: False."""
    from aoti_farm.security.safeio import read_bounded

    try:
        d = json.loads(read_bounded(_proxy_memo_path(), max_bytes=_PROXY_MEMO_MAX, uids=(os.getuid(),)))
    except Exception:  # noqa: BLE001 -- no memo (or an unreadable one): compile and see
        return False
    return isinstance(d, dict) and op in (d.get(device) or [])


def remember_proxy_op(op: str, device: str) -> None:
    """Add ``op`` on ``device`` to the memo (:func:`known_proxy_op`); never raises."""
    try:
        from aoti_farm.security.safeio import read_bounded
        from aoti_farm.security.private import atomic_write

        path = _proxy_memo_path()
        try:
            d = json.loads(read_bounded(path, max_bytes=_PROXY_MEMO_MAX, uids=(os.getuid(),)))
        except Exception:  # noqa: BLE001
            d = {}
        if not isinstance(d, dict):
            d = {}
        ops = [o for o in (d.get(device) or []) if isinstance(o, str)]
        if op not in ops:
            d[device] = sorted(ops + [op])
            atomic_write(path, json.dumps(d).encode())
    except Exception:  # noqa: BLE001 -- a memo is an optimisation
        pass


def needs_proxy_executor(build_dir: str) -> bool:
    """Whether the wrapper AOTInductor generated calls its proxy executor: an op without a
    C shim (``_logcumsumexp``, ``cudnn_convolution`` on torch 2.11-2.13) becomes such a call,
    which a bare ``kernel.so`` cannot make.  On CPU the call then raises; on CUDA the shim
    logs the error and the kernel returns whatever its output buffer held, so the
    generated source, not the kernel's behaviour, is what tells it."""
    try:
        names = [n for n in os.listdir(build_dir) if n.endswith(".cpp") and ".wrapper" in n]
    except OSError:
        return False
    for n in names:
        try:
            with open(os.path.join(build_dir, n), "rb") as f:
                if b"aoti_torch_proxy_executor_call_function" in f.read(64 << 20):
                    return True
        except OSError:
            continue
    return False


def _raises(fn) -> tuple[object, BaseException | None]:
    try:
        with torch.no_grad():
            return fn(), None
    except Exception as e:  # noqa: BLE001 -- eager's or the kernel's error is the result here
        return None, e


def check_case(sig: S.Signature, op, runner, name: str, args: tuple, kwargs: dict,
               eager: tuple | None = None, kernel: tuple | None = None, notes: list | None = None) -> None:
    """One case (adversarial, or random inputs on which one side raised): eager and the
    kernel must both raise, or both return the same thing; CompileRefused otherwise
    (evidence names the case and the error).  ``eager``/``kernel``: (result, error) already
    run.

    ``notes`` (the verification's edge notes, docs/verification.md "The contract"): a
    difference the finite contract does not call one is appended there instead of refused:
    on an edge case (:func:`edge_class`: non-finite inputs, or magnitudes whose sum of
    squares overflows a reduction's accumulation), any difference; on any case, the sign of
    a zero result (the values are then compared without it)."""
    if notes is not None:
        cls = edge_class(sig, name, args, kwargs)
        if cls is not None:
            try:
                check_case(sig, op, runner, name, args, kwargs, eager, kernel)
            except CompileRefused as e:
                if e.reason == PROXY_EXECUTOR_REFUSAL:
                    raise
                _note(notes, edge_note(cls, name, e.evidence or {}, e.reason))
            return
    expected, e_err = eager or _raises(lambda: op(*args, **kwargs))
    got, k_err = kernel or _raises(lambda: runner.run(flat_tensors(sig, args, kwargs)))
    if e_err is not None and k_err is not None:
        return
    if e_err is not None:
        raise CompileRefused(f"kernel does not raise where eager raises: {name}",
                             {"case": name, "eager_error": f"{type(e_err).__name__}: {_first_line(e_err)}"})
    if k_err is not None and "proxy executor" in str(k_err):
        # an op without a C shim compiles to a call of AOTInductor's proxy executor, which a
        # bare kernel.so has no way to run: unsupported, recorded once (never infrastructure)
        remember_proxy_op(sig.op, sig.device)
        raise CompileRefused(PROXY_EXECUTOR_REFUSAL,
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    if k_err is not None:
        raise CompileRefused(f"kernel raises where eager does not: {name}",
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    extra = _tolerance(sig, args, kwargs, expected)
    bad = compare(expected, got, extra)
    if bad is not None and notes is not None and bad.get("problem") == "sign of zero":
        _note(notes, edge_note("sign of zero", name, bad))
        bad = compare(expected, got, extra, zero_sign=False)
    if bad is not None:
        bad["case"] = name
        raise CompileRefused(f"kernel disagrees with eager on adversarial inputs: {name}", bad)


#: The classes of edge notes (docs/verification.md, "The contract"): differences the finite
#: contract does not call differences, recorded on the entry; ``contract="strict"`` serves
#: no kernel that has one.
EDGE_CLASSES = ("sign of zero", "non-finite inputs", "overflowing magnitudes")


def edge_class(sig: S.Signature, case: str, args: tuple, kwargs: dict) -> str | None:
    """The edge class of adversarial case ``case`` of this call, or None (an ordinary case,
    where every difference is refused): the cases whose inputs are not finite, and the
    magnitudes case where the op reduces or normalises and the sum of squares of a
    floating input overflows its dtype (a result eager itself gets only by accumulating
    otherwise: a Welford mean against a sum, float64 against float32)."""
    if case in adversarial.NONFINITE_CASES:
        return "non-finite inputs"
    if case != "magnitudes":
        return None
    ins = [t for t in flat_tensors(sig, args, kwargs) if t.is_floating_point() and t.numel()]
    name = sig.op.split("::")[-1].split(".")[0]
    reduces = "norm" in name or name in adversarial.REDUCING_OPS
    for t in ins:
        if reduces and float(t.detach().double().square().sum()) > torch.finfo(t.dtype).max:
            return "overflowing magnitudes"
    return None


def edge_note(cls: str, case: str, evidence: dict, reason: str | None = None) -> dict:
    """One edge note: its class, the case, and the difference (the evidence's problem and
    first values: small enough for a manifest)."""
    keep = {k: evidence[k] for k in ("output", "problem", "flat_index", "first_index", "eager", "kernel")
            if k in evidence}
    return {"class": cls, "case": case, **keep, **({"reason": reason} if reason else {})}


def _note(notes: list, note: dict) -> None:
    """At most one note per (class, case)."""
    if not any(n["class"] == note["class"] and n["case"] == note["case"] for n in notes):
        notes.append(note)


def _widened(x):
    """``x`` with every narrow float tensor as a float64 copy (lists too)."""
    if isinstance(x, torch.Tensor):
        return x.double() if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_widened(v) for v in x)
    return x


def check_precision(sig: S.Signature, op, runner, name: str, args: tuple, kwargs: dict) -> None:
    """A precision case (ill-conditioned finite inputs: :data:`adversarial.PRECISION_CASES`):
    the kernel must be at least as accurate as eager against the same call in float64,
    wherever eager is (:func:`tolerance.precision`).  A case eager or the float64 call
    rejects is skipped (raising is the edge cases' to check); the kernel raising where
    eager does not is refused as anywhere."""
    wide_args, wide_kwargs = _widened(args), _widened(kwargs)
    expected, e_err = _raises(lambda: op(*args, **kwargs))
    if e_err is not None:
        return
    got, k_err = _raises(lambda: runner.run(flat_tensors(sig, args, kwargs)))
    if k_err is not None:
        raise CompileRefused(f"kernel raises where eager does not: {name}",
                             {"case": name, "kernel_error": f"{type(k_err).__name__}: {_first_line(k_err)}"})
    truth, t_err = _raises(lambda: op(*wide_args, **wide_kwargs))
    if t_err is not None:
        return
    bad = precision(expected, got, truth, _tolerance(sig, args, kwargs, expected))
    if bad is not None:
        bad["case"] = name
        raise CompileRefused(f"kernel less accurate than eager on ill-conditioned inputs: {name}", bad)


#: Words of a C++ compiler's output that say the host failed it, not the code.
_INFRA_OUTPUT = ("No space left on device", "Disk quota exceeded", "Cannot allocate memory",
                 "virtual memory exhausted", "out of memory", "Killed signal terminated program",
                 "terminated signal", "Read-only file system", "Input/output error", "Too many open files",
                 "No working C++ compiler found")


def infrastructure_error(e: BaseException) -> str | None:
    """Why ``e`` (raised by a compile) is a failure of this host rather than of the
    signature, or None.  Walks Inductor's wrappers (``InductorError.inner_exception``,
    ``__cause__``/``__context__``): an ``OSError`` anywhere (disk full, quota, EIO, too many
    open files, the compiler binary gone), ``MemoryError``, a C++ compiler killed by a
    signal (OOM killer, a timeout) or reporting such a condition in its output."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return f"OSError errno {x.errno}" if x.errno else "OSError"
        if isinstance(x, MemoryError):
            return "out of memory"
        if isinstance(x, subprocess.CalledProcessError) and isinstance(x.returncode, int) and x.returncode < 0:
            return f"compiler killed by signal {-x.returncode}"
        if isinstance(x, subprocess.TimeoutExpired):
            return "compiler timed out"
        out = getattr(x, "output", None)
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        for text in (out if isinstance(out, str) else "", str(x)):
            hit = next((w for w in _INFRA_OUTPUT if w in text), None)
            if hit:
                return hit
        todo += [getattr(x, "inner_exception", None), x.__cause__, x.__context__]
    return None


#: Directories of aoti-farm's own code (the package; workers/ and runtime/ are mapped into it
#: as aoti_farm.workers and aoti_farm.runtime, see docs/DESIGN.md).
_OWN_DIRS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), d) + os.sep
                  for d in ("aoti_farm", "workers", "runtime"))

#: Longest traceback kept in a failure record.
TRACEBACK_MAX = 8000


def own_code_error(e: BaseException) -> dict | None:
    """Evidence that ``e`` (raised during a compile) is a bug of aoti-farm, or None.

    A bug: an exception whose innermost Python frame is aoti-farm's own code, that is not
    one of aoti-farm's deliberate errors (:class:`FarmError`: a refusal, an ineligible
    call) nor a failure of the host (:func:`infrastructure_error`).  An exception raised
    inside torch, Inductor or the C++ compiler is theirs (a refusal or an infrastructure
    failure), whoever called them.  A bug is deterministic: it is recorded once with its
    traceback and counted, never retried as infrastructure (a retry fails the same way
    and hides it).  Evidence: ``bug`` (True), ``exception`` ("KeyError: 0"), ``where``
    (file:line in function, relative to the checkout) and ``traceback`` (bounded)."""
    import traceback

    if (isinstance(e, (FarmError, RuntimeError)) or not isinstance(e, Exception)
            or infrastructure_error(e) is not None):
        # RuntimeError from our frame is torch's C++ (an op, a runner) or a deliberate
        # host condition ("CUDA ... on a worker without a GPU"): not a bug of ours
        return None
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    path = os.path.abspath(last.filename)
    if not path.startswith(_OWN_DIRS) or last.name == "forward":
        return None   # not ours; or _OpModule.forward, where the op itself raised
    root = os.path.dirname(os.path.dirname(_OWN_DIRS[0]))
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"bug": True, "exception": f"{type(e).__name__}: {_first_line(e)}",
            "where": f"{os.path.relpath(path, root)}:{last.lineno} in {last.name}",
            "traceback": tb[-TRACEBACK_MAX:]}


def _compile_errors() -> tuple:
    """What export and Inductor raise for a signature they cannot compile (a refusal,
    unless :func:`infrastructure_error` blames the host)."""
    import torch._dynamo.exc
    import torch._inductor.exc

    return (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError, torch._inductor.exc.InductorError,
            NotImplementedError, AssertionError, TypeError, ValueError, RuntimeError, OSError, MemoryError)


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


#: Modules an AOTInductor compile imports lazily the first time (measured with torch 2.13:
#: ~370 modules, ~1.5 s of CPU on the 2-core VM).  The "light" warm-up imports them while
#: the actor waits for work instead of during its first compile.
COMPILE_PATH_MODULES = (
    "torch._inductor.compile_fx", "torch._inductor.graph", "torch._inductor.scheduler",
    "torch._inductor.lowering", "torch._inductor.select_algorithm", "torch._inductor.kernel.mm",
    "torch._inductor.fx_passes.pre_grad", "torch._inductor.fx_passes.joint_graph",
    "torch._inductor.fx_passes.post_grad", "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.cpp_wrapper_cpu", "torch._inductor.cpp_builder",
    "torch._inductor.async_compile", "torch.utils.cpp_extension", "aoti_farm.compile.job",
)


@contextlib.contextmanager
def _probe_lock(timeout: float = 300.0, wait: bool = True):
    """Held while this host's loader probe runs (:func:`aoti_farm.startup.loadenv.probe`: two
    children that import torch): when 16 actors verify their first kernels on a fresh
    host at once, one of them probes and the rest read its memo, instead of 32 children
    importing torch together.  Without the lock (no filelock, a read-only home, a
    timeout), each probes as before.  Yields True (held), None (no lock: probe anyway),
    or, with ``wait=False`` while another process holds it, False."""
    lock = held = None
    try:
        from filelock import FileLock, Timeout

        from aoti_farm.security.fsutil import memo_dir

        path = os.path.join(memo_dir(), "loadenv-probe.lock")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = FileLock(path, timeout=timeout if wait else 0)
        try:
            lock.acquire()
            held = True
        except Timeout:
            lock = None
            held = None if wait else False
    except Exception:  # noqa: BLE001 -- probe without it
        lock = None
    try:
        yield held
    finally:
        if lock is not None:
            lock.release()


def import_compile_path() -> None:
    """Import :data:`COMPILE_PATH_MODULES` now (the actors' warm-up, the warm driver's host
    preparation), so the first compile does not pay for them."""
    import importlib

    for name in COMPILE_PATH_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- a module another torch version lacks: imported on demand
            pass


def _verify_request(req: dict) -> dict:
    """One verification request of a child: the result, or ``{"refused", "evidence"}``."""
    sig = S.parse_signature(req["sig"])
    try:
        return AOTICompiler(verify_trials=req["trials"], measure_speed=req.get("speed", True),
                            builds=False)._verify_here(sig, req["path"],
                                                       [tuple(g) for g in req.get("guards") or ()] or None)
    except CompileRefused as e:
        return {"refused": e.reason, "evidence": e.evidence}


def _verify_child_main() -> int:
    """``python -m aoti_farm.compile.compiler``: verify one kernel (request on stdin) and print
    the result as one JSON line.  Used where the parent cannot load AOTI libraries.
    ``--serve``: one request per line for as long as stdin is open (the long-lived child
    of :mod:`aoti_farm.compile.verifyserver`)."""
    if "--serve" in sys.argv[1:]:
        from aoti_farm.compile import verifyserver

        return verifyserver.serve(_verify_request)
    print(json.dumps(_verify_request(json.loads(sys.stdin.read())), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(_verify_child_main())
