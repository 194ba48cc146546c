"""The toolchain fingerprint: what must match for a kernel to be served.

A kernel built under one fingerprint is never served under another.  The cache is
namespaced by the fingerprint id, so a foreign kernel is not even looked at; a manifest
whose recorded fingerprint disagrees with its namespace is counted as *foreign*.

Fields (all reused from torch, nothing re-derived):
  * torch version and git revision (the build), debug flag;
  * Triton version, when Triton is installed;
  * CPU: Inductor's own choice of vector ISA (``torch._inductor.cpu_vec_isa.pick_vec_isa``);
  * CUDA: ``torch.version.cuda``, the GPU name and compute capability;
  * the Inductor options the farm compiles with.

``pick_vec_isa`` builds and loads a test program per candidate ISA and extension, so its
answer is remembered per host and torch build in ``$XDG_CACHE_HOME/aoti-farm-private/isa-<host>.json``
(a serving process then starts in milliseconds), together with the answer of every
Inductor check build and the compiler they were built with: a compile actor replays
those answers into its own Inductor (:func:`seed_inductor_vec_isa`) instead of running
the checks again, one process at a time behind their file locks.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import threading
import time
from dataclasses import dataclass
from functools import lru_cache

import msgpack
import torch

from aoti_farm.startup import hostid

#: Raised when what the farm builds under the same torch and options changes in a way an
#: older entry must not stand for: 2 = libraries no longer ask for an executable stack
#: (aoti_farm/cache/elfstack.py; the reader refuses the older ones, which all ask).
FINGERPRINT_VERSION = 2

#: Inductor options aoti-farm compiles with unless the user overrides them (none today).
#: Measured and rejected on a 2-core VM: building the AOTI wrapper at -O0
#: (``aot_inductor.compile_wrapper_opt_level``) cuts a single-op compile from about 6.3 s
#: to 5.1 s, but the runner's call of a 64x128 add went from about 2.8 us to 5.6 us; a
#: kernel is compiled once and called millions of times, so the hit path wins.
#:
#: ``cpp.dynamic_threads``: without it Inductor writes the compiling process's intra-op
#: thread count into the generated C++ (``#pragma omp parallel num_threads(N)``, reduction
#: buffers sized N, and no parallel region at all when N is 1), so a kernel built by a Ray
#: actor with ``num_cpus=1`` ran on one thread wherever it was served.  With it every CPU
#: kernel opens a plain ``#pragma omp parallel`` and sizes its buffers with
#: ``omp_get_max_threads()``: it runs on the calling thread's intra-op thread count
#: (``torch.set_num_threads``), on any host.  Being an option,
#: it is part of the fingerprint: kernels built without it live in another namespace and
#: are never served as if they scaled.  The manifest says ``threads: "dynamic"``.
#:
#: No aoti-farm patch of Inductor's parallel-depth decision: one was tried (loops parallel
#: only above ATen's grain size, decided as for 64 threads) and generated a Welford
#: reduction (``var_mean`` over [2,32,64,64], dims (2,3)) whose variance was 1/4095 of
#: eager's at 2 threads when built at 1; it failed the reduction-corpus differential test
#: (tests/e2e/test_verify.py) and went.  Small kernels pay a fork/join per call instead;
#: the speed gate decides whether they are served.
#:
#: ``aoti_farm.serial_nests_below``: a loop nest of fewer elements outside an open parallel
#: region gets no parallel scope (:mod:`aoti_farm.build.serialsmall`): serial code, as Inductor
#: writes at one thread.  (A first version also made nests inside an open region serial,
#: without the ``omp single`` Inductor writes only when it builds at several threads; built
#: at 1 and run at 2 such a nest ran twice: ``var`` over [8, 4096] was wrong.)
DEFAULT_INDUCTOR_OPTIONS: dict = {"cpp.dynamic_threads": True, "aoti_farm.serial_nests_below": 4096}


def effective_options(inductor_options: dict | None) -> dict:
    """The options a compile really uses: aoti-farm's defaults under the user's."""
    return {**DEFAULT_INDUCTOR_OPTIONS, **(inductor_options or {})}


@dataclass(frozen=True)
class Fingerprint:
    fields: tuple  # ((name, value), ...) sorted by name

    @property
    def id(self) -> str:
        return hashlib.sha256(msgpack.packb([list(f) for f in self.fields], use_bin_type=True)).hexdigest()[:24]

    def as_dict(self) -> dict:
        return dict(self.fields)

    def diff(self, other: dict) -> dict:
        """Fields that differ: {name: (ours, theirs)}."""
        mine = self.as_dict()
        return {k: (mine.get(k), other.get(k)) for k in sorted(set(mine) | set(other))
                if mine.get(k) != other.get(k)}


def _triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def _isa_memo_path() -> str:
    return hostid.isa_memo_path(torch.version.git_version)


_read_memo = hostid.read_isa_memo


#: Per-host steps this process ran, and how long it waited for another process's
#: (``isa_probe``: the full probe, once per host and torch build; ``isa_checks_run``:
#: Inductor check builds really run here; ``isa_checks_replayed``: answered from the
#: memo; ``isa_lock_wait_s``: waiting for another process's probe).  Shown per actor in
#: the warm report's timeline.
_host_steps = {"isa_probe": 0, "isa_checks_run": 0, "isa_checks_s": 0.0, "isa_checks_replayed": 0,
               "isa_lock_wait_s": 0.0, "isa_loads_fast": 0, "isa_loads_fallback": 0}
_steps_lock = threading.Lock()


def host_steps() -> dict:
    with _steps_lock:
        return dict(_host_steps)


def _step(name: str, n: float = 1) -> None:
    with _steps_lock:
        _host_steps[name] = _host_steps.get(name, 0) + n


@lru_cache(maxsize=1)
def _compiler_id() -> str:
    """The C++ compiler Inductor's ISA checks build with, as Inductor keys them."""
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    return hashlib.sha256(get_compiler_version_info(get_cpp_compiler()).encode()).hexdigest()[:16]


def _check_key(isa, code: str) -> str:
    """The key of one Inductor check build, as the host's memo records its answer: the
    ISA's class, its flags at call time (AVX512's bf16 check adds one), the flags the
    build uses (they follow earlier answers) and the code."""
    return hashlib.sha256(f"{type(isa).__name__}|{isa._arch_flags}|{isa.build_arch_flags()}|{code}".encode()
                          ).hexdigest()[:24]


def _check_jobs(cpu_vec_isa) -> list[tuple]:
    """``[(isa, code)]``: every (candidate, extension) check the CPU's flags allow.  Each
    ``isa`` is a copy of Inductor's candidate, set up as Inductor's own sequence would
    have it at that step: the flags it adds, and the BF16 answer that later builds'
    flags follow, predicted from the CPU's flags.  x86 only (else ``[]``)."""
    import copy

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = cpu_vec_isa.x86_isa_checker()
    cands = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
    tcpu = torch.cpu
    bf16 = bool(getattr(tcpu, "_is_avx512_bf16_supported", lambda: False)())
    jobs: list = []

    def job(isa, code, suffix: str, bf16_state: bool) -> None:
        cp = copy.copy(isa)
        cp._arch_flags = type(isa)._arch_flags + suffix
        if hasattr(cp, "_is_avx512_bf16_supported"):
            cp._is_avx512_bf16_supported = bf16_state
        if hasattr(cp, "_is_amx_fp16_supported"):
            cp._is_amx_fp16_supported = False
        jobs.append((cp, code))

    for isa in cands:
        cls = type(isa)
        job(isa, cpu_vec_isa.VecISA._avx_code, "", False)
        if isinstance(isa, cpu_vec_isa.VecAVX512) and bf16 and hasattr(cls, "_avx512_bf16_code"):
            job(isa, cls._avx512_bf16_code, " -mavx512bf16", False)
        if hasattr(cls, "_avx512_vnni_code") and getattr(tcpu, "_is_vnni_supported", lambda: False)():
            job(isa, cls._avx512_vnni_code, "", bf16)
        if hasattr(cls, "_amx_code"):
            job(isa, cls._amx_code, "", bf16)
            if hasattr(cls, "_amx_fp16_code") and getattr(tcpu, "_is_amx_fp16_supported", lambda: False)():
                job(isa, cls._amx_fp16_code, " -mamx-fp16", bf16)
    return jobs


@contextlib.contextmanager
def _checks(cpu_vec_isa, record: dict | None = None, replay: dict | None = None):
    """Within this block, Inductor's ISA check builds (``VecISA.check_build``: a g++
    build and a loader subprocess, under a per-check file lock) are recorded into
    ``record``, or answered from ``replay`` (a recorded answer of this host, torch build
    and compiler); a check without a recorded answer runs for real.

    Patch of a torch internal: ``torch._inductor.cpu_vec_isa.VecISA.check_build``, replaced
    while the block runs (and ``valid_vec_isa_list``'s cache read); checked against torch
    2.11 and 2.13.0.  Why: every process re-runs these checks, serialised by a host-wide
    lock, and Inductor offers no way to seed them.  It can go when Inductor caches its ISA
    answer across processes.  ``AOTI_FARM_DEV=isa_replay=0`` turns the replay off."""
    orig = cpu_vec_isa.VecISA.check_build

    def check_build(self, code):
        key = _check_key(self, code)
        if replay is not None and key in replay:
            _step("isa_checks_replayed")
            return bool(replay[key])
        t0 = time.perf_counter()
        ok = orig(self, code)
        _step("isa_checks_run")
        _step("isa_checks_s", time.perf_counter() - t0)
        if record is not None:
            with _steps_lock:
                record[key] = bool(ok)
        return ok

    from aoti_farm.startup.isaload import fast_loads

    cpu_vec_isa.VecISA.check_build = check_build
    try:
        with fast_loads(cpu_vec_isa) as stand:   # torch < 2.13: the load checks skip `import torch`
            try:
                yield
            finally:
                if stand is not None:
                    _step("isa_loads_fast", stand.fast)
                    _step("isa_loads_fallback", stand.fallback)
    finally:
        cpu_vec_isa.VecISA.check_build = orig


def host_isa_memo(need_checks: bool = False) -> dict:
    """This host's ISA memo ``{"isa", "checks", "compiler"}``, probing once per host and
    torch build (under a file lock: processes that need it while another one probes wait
    for that probe instead of running their own).  ``need_checks``: a memo without the
    recorded check answers for this compiler (written by an older aoti-farm, or before
    the compiler changed) is probed again."""
    path = _isa_memo_path()
    memo = _read_memo(path)
    if memo is not None and (not need_checks or _has_checks(memo)):
        return memo
    lock = None
    try:
        from filelock import FileLock

        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = FileLock(path + ".lock", timeout=600)
        t0 = time.perf_counter()
        lock.acquire()
        _step("isa_lock_wait_s", time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 -- read-only home, lock timeout: probe without it
        lock = None
    try:
        memo = _read_memo(path) if lock is not None else None
        if memo is not None and (not need_checks or _has_checks(memo)):
            return memo   # probed by another process while this one waited
        from torch._inductor import cpu_vec_isa

        _step("isa_probe")
        record: dict = {}
        from aoti_farm.security import private

        with private.inductor_cache_scope():   # its test programs never build in a shared directory
            with _checks(cpu_vec_isa, record=record):
                _prefetch_checks(cpu_vec_isa)
            with _checks(cpu_vec_isa, record=record, replay=dict(record)):
                isa = str(cpu_vec_isa.pick_vec_isa())
        memo = {"isa": isa, "compiler": _compiler_id(), "checks": record}
        try:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(memo, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs the probe again next time
        return memo
    finally:
        if lock is not None:
            lock.release()


def _has_checks(memo: dict) -> bool:
    try:
        return isinstance(memo.get("checks"), dict) and memo.get("compiler") == _compiler_id()
    except Exception:  # noqa: BLE001 -- no compiler: nothing to replay
        return False


@lru_cache(maxsize=1)
def cpu_isa() -> str:
    """Inductor's chosen CPU vector ISA, e.g. 'avx512 avx512_vnni' ('' for none), from
    the host memo (:func:`host_isa_memo`)."""
    return host_isa_memo()["isa"]


def _prefetch_checks(cpu_vec_isa) -> None:
    """Run Inductor's ISA check builds all at once, so that :func:`pick_vec_isa` then
    replays their answers instead of running them one after another.

    Inductor checks its candidate ISAs in turn, and within one candidate its extensions
    in turn (AMX: the base check, AVX512-BF16, VNNI, AMX, AMX-FP16), each a g++ build and
    a loader subprocess (which imports torch on torch < 2.13: 3-5 s each on the 16-core
    host).  Here every (candidate, extension) check the CPU's flags allow runs at once,
    Inductor's own ``check_build`` on a copy of the candidate set up as Inductor's
    sequence would have it at that step (the flags it adds, and the BF16 answer that later
    builds' flags follow, predicted from the CPU's flags).  Answers are recorded by the
    exact key of each check; a prediction that turns out wrong leaves its check without a
    recorded answer, and Inductor runs it for real.  x86 only; any trouble leaves it to
    Inductor."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        if platform.machine() not in ("x86_64", "AMD64") or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
            return
        jobs = _check_jobs(cpu_vec_isa)
        if jobs:
            with ThreadPoolExecutor(len(jobs), thread_name_prefix="aoti-farm-isa") as ex:
                list(ex.map(lambda j: j[0].check_build(j[1]), jobs))
    except Exception:  # noqa: BLE001
        pass


_SEEDED: list = []
#: ``AOTI_FARM_DEV=isa_replay=0``: each process runs Inductor's ISA checks itself (A/B only).
REPLAY_DEV = "isa_replay"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)


def seed_inductor_vec_isa() -> bool:
    """Give this process's Inductor the host's ISA answers instead of probing again.

    Inductor's first CPU compile in a process picks the vector ISA by building and
    loading a test program per candidate ISA and extension (``VecISA.check_build``, each
    under a file lock shared by every process of the host, with a loader subprocess that
    imports torch on older torch builds).  Every compile actor repeating them waits its
    turn at those locks: on a 16-core host (torch 2.11) actors became ready one after
    another, seconds apart.  The probe ran once on this host already (:func:`host_isa_memo`),
    recording each check's answer; here the same checks are answered from that record
    while Inductor computes its ISA list the usual way, so it reaches exactly the answer
    its own probes gave on this host, torch build and compiler.  A check the record lacks
    runs for real.  Returns True when every check was answered from the record."""
    if _SEEDED:
        return _SEEDED[0]
    ok = False
    from aoti_farm.config import dev as _dev

    if _dev(REPLAY_DEV) == "0":   # A/B: every process runs Inductor's own checks
        _SEEDED.append(ok)
        return ok
    try:
        from torch._inductor import config, cpu_vec_isa

        if not config.is_fbcode() and cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:
            memo = host_isa_memo(need_checks=True)
            if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:   # not this process's own probe
                before = host_steps()["isa_checks_run"]
                with _checks(cpu_vec_isa, replay=memo.get("checks") or {}):
                    cpu_vec_isa.pick_vec_isa()
                ok = host_steps()["isa_checks_run"] == before
            else:
                ok = True
    except Exception:  # noqa: BLE001 -- an Inductor without these internals: it probes as before
        ok = False
    _SEEDED.append(ok)
    return ok


@lru_cache(maxsize=8)
def _cuda_fields(index: int) -> tuple:
    if not torch.cuda.is_available():
        return (("cuda", torch.version.cuda), ("gpu", None), ("gpu_cc", None))
    cc = torch.cuda.get_device_capability(index)
    return (("cuda", torch.version.cuda), ("gpu", torch.cuda.get_device_name(index)),
            ("gpu_cc", f"{cc[0]}.{cc[1]}"))


def fingerprint(device: str, inductor_options: dict | None = None) -> Fingerprint:
    """The fingerprint for compiling/serving on ``device`` ('cpu' or 'cuda[:N]')."""
    base = [
        ("fingerprint_version", FINGERPRINT_VERSION),
        ("torch", torch.__version__),
        ("torch_git", torch.version.git_version),
        ("torch_debug", bool(torch.version.debug)),
        ("triton", _triton_version()),
        ("device_type", device.split(":")[0]),
        ("inductor_options", sorted(effective_options(inductor_options).items())),
    ]
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        base += list(_cuda_fields(idx))
    else:
        base += [("cpu_isa", cpu_isa()), ("machine", platform.machine())]
    return Fingerprint(tuple(sorted(((k, _freeze(v)) for k, v in base), key=lambda kv: kv[0])))


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v
