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

The compile path is split by concern: this module builds (:class:`AOTICompiler`'s
``compile``) and loads; :mod:`aoti_farm.compile.verify` is the verification loop (the
``verify``/``verify_class`` methods, a mixin); :mod:`aoti_farm.compile.checks` one case's
checks; :mod:`aoti_farm.compile.faults` sorts exceptions (the host's, ours, the
signature's); :mod:`aoti_farm.compile.child` is the verification child's entry point.

This is the only module that touches private torch APIs:

* ``torch._inductor.aot_compile`` -- AOTInductor's entry point that writes a .so to
  ``aot_inductor.output_path``.  Upstream's own ``aoti_compile_with_persistent_cache``
  goes through ``torch._export.aot_compile``, which wraps the same function.
* ``torch._C._aoti.AOTIModelContainerRunnerCpu/Cuda`` -- the runner upstream's C++
  ``AOTIPythonKernelHolder`` uses; we load kernels the same way it does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from aoti_farm import signature as S
from aoti_farm.build import abortscan, serialsmall, splitbuild, tritonscan
from aoti_farm.cache import elfstack
from aoti_farm.cache.failures import PROXY_EXECUTOR_REFUSAL, refusal_class
from aoti_farm.compile import adversarial, verify
from aoti_farm.compile.checks import known_proxy_op, needs_proxy_executor, remember_proxy_op
from aoti_farm.compile.faults import CompileInfraError, _compile_errors, _first_line, infrastructure_error, own_code_error
from aoti_farm.compile.runner import flat_tensors
from aoti_farm.compile.graph import SUBSTITUTED, NotUpcastable, OpModule, output_strides, upcast_dtypes
from aoti_farm.compile.verify import Verifier, eager_raises_on_adversarial, refuse_class_where_eager_raises
from aoti_farm.dynamic import dyncompile, stridesym
from aoti_farm.dynamic import shapes as SH
from aoti_farm.errors import CompileRefused
from aoti_farm.fingerprint import effective_options, seed_inductor_vec_isa
from aoti_farm.startup import loadenv

#: How many fresh random input sets a kernel must match eager on.
VERIFY_TRIALS = 2

#: aoti-farm's own options among the Inductor options (in the fingerprint, never passed on).
FARM_OPTION_PREFIX = "aoti_farm."


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


def before_compile(info: S.OpInfo, device: str, workdir: str, what: str) -> None:
    """What every compile checks and prepares first (exact and shape-general alike)."""
    if info.ineligible:
        raise CompileRefused(f"ineligible: {info.ineligible}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"CUDA {what} on a worker without a GPU")
    os.makedirs(workdir, exist_ok=True)
    if device == "cpu":
        seed_inductor_vec_isa()   # once per process: skip Inductor's ISA probe when we know its answer


class AOTICompiler(Verifier):
    """Compiles one op call with AOTInductor, in this process, and verifies it (the
    verification methods: :class:`aoti_farm.compile.verify.Verifier`)."""

    name = "aoti"

    def __init__(self, inductor_options: dict | None = None, verify_trials: int = VERIFY_TRIALS,
                 measure_speed: bool = True, *, builds: bool = True):
        """``builds=False``: a verifier that only loads kernels and runs them (a verification
        child, :func:`aoti_farm.compile.child._verify_request`).  It builds nothing, so it only sets and checks the
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
        stands.  The manifest's verification says ``computed_in: float64``.

        Likewise an exact kernel refused because an output's strides differ from eager's
        (Inductor lays out some results as their input, where eager's op returns a fresh
        contiguous tensor: ``cat`` of an empty tensor and a transposed one) is built once
        more with every output forced into eager's strides
        (``prims.inductor_force_stride_order``: a copy only where the layout differs), and
        verified as usual; its manifest's verification says ``layout: eager's strides``."""
        t0 = time.perf_counter()
        try:
            return self._compile(job, workdir)
        except CompileRefused as first:
            return self._compile_again(job, workdir, first, t0)

    def _compile_again(self, job, workdir: str, first: CompileRefused, t0: float) -> CompileResult:
        """The precision refusal ``first`` of ``job`` built again in float64, or its stride
        refusal with eager's strides forced (see :meth:`compile`); raises ``first`` where
        neither applies or the second build is refused too."""
        if isinstance(job, SH.ShapeClass):
            raise first
        cls = refusal_class(first.reason, first.evidence)
        layout = cls == "layout" and (first.evidence or {}).get("problem") in ("strides", "memory format")
        if cls != "precision" and not layout:
            raise first
        first_s = time.perf_counter() - t0
        try:
            # its own directory: a library path the verifying process loaded already
            # would be the refused kernel again (dlopen hands back a loaded path's handle)
            if layout:
                res = self._compile(job, os.path.join(workdir, "strided"), force_strides=True)
            else:
                res = self._compile(job, os.path.join(workdir, "float64"), upcast=True)
        except (CompileRefused, NotUpcastable):
            raise first from None
        extra = ({"layout": "eager's strides", "layout_refusal": first.reason} if layout
                 else {"computed_in": "float64", "narrow_refusal": first.reason})
        res.verification = {**(res.verification or {}), **extra}
        res.seconds += first_s   # the refused first build is part of this compile's cost
        res.phases = {**res.phases, ("layout_attempt" if layout else "narrow_attempt"): first_s}
        return res

    def _compile(self, job, workdir: str, upcast: bool = False, force_strides: bool = False) -> CompileResult:
        cls = job if isinstance(job, SH.ShapeClass) else None
        sig = job if cls is None else dyncompile.export_signature(cls)
        device = sig.device
        before_compile(sig.info(), device, workdir, "signature" if cls is None else "class")
        if cls is None and not loadenv.load_safe():   # its verification child imports torch while this compiles
            from aoti_farm.compile import verifyserver

            verifyserver.prestart()
        refused = CompileRefused if cls is None else dyncompile.DynamicUnsupported
        if known_proxy_op(sig.op, device) and (sig.op, device) not in SUBSTITUTED:
            # found by an earlier compile here: refused before Inductor runs
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
                refuse_class_where_eager_raises(dyncompile.verify_points(cls))
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
                    raise NotUpcastable()
                mod = OpModule(sig, args, kwargs, output_strides(eager_out) if cls is None else None, up,
                                cuda_bounds, force_strides)
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
                if mod.traced_as:
                    # a substituted convolution runs on eager's layout, so cuDNN picks eager's
                    # algorithm (Inductor's channels-last choice picked another, TF32 where eager's was not)
                    opts["layout_optimization"] = False
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
                    if mod.traced_as:   # graph.substitute(): the op the kernel runs
                        build_info = {**(build_info or {}), "traced_as": mod.traced_as}
                    if device == "cpu":   # loop nests made serial (the manifest's build says so)
                        build_info["serial_nests"] = serialsmall.serialized()
                c2 = cpu_seconds()
                if cls is not None and cls.stride_symbols:   # what Inductor assumed of them, too
                    try:
                        stridesym.check(cls, inputs)
                    except stridesym.Unsupported as e:
                        raise dyncompile.DynamicUnsupported(f"symbolic strides: {e}") from None
        except (CompileRefused, NotUpcastable):
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
            verified_threads = verify.verify_thread_counts(device) or None
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
