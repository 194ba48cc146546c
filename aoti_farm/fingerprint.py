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

``pick_vec_isa`` builds test programs (about 2 s), so its answer is remembered per host
and torch build in ``$XDG_CACHE_HOME/aoti-farm/isa-<host>.json`` (a serving process then
starts in milliseconds).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from dataclasses import dataclass
from functools import lru_cache

import msgpack
import torch

FINGERPRINT_VERSION = 1

#: Inductor options aoti-farm compiles with unless the user overrides them (none today).
#: Measured and rejected, 2-core VM, 2026-11-26: building the AOTI wrapper at -O0
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
#: (``torch.set_num_threads``, yield_core's lowered count), on any host.  Being an option,
#: it is part of the fingerprint: kernels built without it live in another namespace and
#: are never served as if they scaled.  The manifest says ``threads: "dynamic"``.
#:
#: ``aoti_farm.parallel_min_work`` (aoti-farm's own, not passed to Inductor; see
#: ``compiler.parallel_like_eager``): with dynamic threads Inductor opens a parallel region
#: in every kernel, however small, which costs a fork/join per call (and a stall on a busy
#: host) where eager runs inline.  A kernel loop is parallel only for at least this many
#: elements, ATen's own grain size (``at::internal::GRAIN_SIZE``).  Part of the
#: fingerprint, so a change of it is a new namespace.
DEFAULT_INDUCTOR_OPTIONS: dict = {"cpp.dynamic_threads": True, "aoti_farm.parallel_min_work": 32768}


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


def _cpu_id() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name", "Features")):
                    flags += line
                    if line.startswith(("flags", "Features")):
                        break
    except OSError:
        pass
    return hashlib.sha256((platform.machine() + flags).encode()).hexdigest()[:16]


def _isa_memo_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "aoti-farm", f"isa-{_cpu_id()}-{torch.version.git_version[:12]}.json")


def _read_isa_memo(path: str) -> str | None:
    try:
        with open(path) as f:
            return json.load(f)["isa"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@lru_cache(maxsize=1)
def cpu_isa() -> str:
    """Inductor's chosen CPU vector ISA, e.g. 'avx512 avx512_vnni' ('' for none).

    Probed once per host and torch build, remembered in a memo file; processes that need
    it while another one probes (the farm's planner and its actors start together) wait
    for that probe under a file lock instead of running their own."""
    path = _isa_memo_path()
    isa = _read_isa_memo(path)
    if isa is not None:
        return isa
    lock = None
    try:
        from filelock import FileLock

        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = FileLock(path + ".lock", timeout=600)
        lock.acquire()
    except Exception:  # noqa: BLE001 -- read-only home, lock timeout: probe without it
        lock = None
    try:
        isa = _read_isa_memo(path) if lock is not None else None
        if isa is not None:
            return isa   # probed by another process while this one waited
        from torch._inductor import cpu_vec_isa

        _probe_candidates_at_once(cpu_vec_isa)
        isa = str(cpu_vec_isa.pick_vec_isa())
        try:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"isa": isa}, f)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs the probe again next time
        return isa
    finally:
        if lock is not None:
            lock.release()


def _probe_candidates_at_once(cpu_vec_isa) -> None:
    """Inductor probes its candidate ISAs one after another (a g++ build and a loader
    subprocess each: 8.4 s in all on the 2-core VM with a cold Inductor cache).  Run the
    same probes, Inductor's own code, for every candidate at once, so :func:`pick_vec_isa`
    then only reads their cached answers.  x86 only; any trouble leaves it to Inductor."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        if platform.machine() not in ("x86_64", "AMD64") or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
            return
        flags = cpu_vec_isa.x86_isa_checker()
        cands = [isa for isa in cpu_vec_isa.supported_vec_isa_list
                 if all(f in flags for f in str(isa).split())]
        if len(cands) > 1:
            with ThreadPoolExecutor(len(cands), thread_name_prefix="aoti-farm-isa") as ex:
                list(ex.map(bool, cands))
    except Exception:  # noqa: BLE001
        pass


_SEEDED: list = []


def seed_inductor_vec_isa() -> bool:
    """Let this process's Inductor reuse the remembered ISA instead of probing again.

    Inductor's first CPU compile in a process picks the vector ISA by building and
    loading a test program per candidate ISA (``cpu_vec_isa.valid_vec_isa_list``: about
    10 s of g++ on the 2-core VM when its cache directory is cold, and a Python
    subprocess per candidate even when warm).  :func:`cpu_isa` already knows the answer
    for this host and torch build (remembered from a real probe).  When that answer is
    exactly what Inductor picks if it trusts the CPU flags (``config.cpp.vec_isa_ok``),
    trusting them gives the same ISA, so the same generated code, without the probe.
    Otherwise (a candidate failed its real probe, or the user set ``vec_isa_ok``, or this
    process already probed) nothing changes.  Returns True when it seeded."""
    if _SEEDED:
        return _SEEDED[0]
    ok = False
    try:
        from torch._inductor import config, cpu_vec_isa

        if config.cpp.vec_isa_ok is None and not config.is_fbcode() \
                and cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:
            want = cpu_isa()   # the memo, or a real probe (which then fills Inductor's own cache)
            if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:
                with config.patch({"cpp.vec_isa_ok": True}):
                    trusted = cpu_vec_isa.valid_vec_isa_list.__wrapped__()
                    if config.cpp.simdlen is None:
                        pick = cpu_vec_isa.get_isa_from_cpu_capability(
                            os.getenv("ATEN_CPU_CAPABILITY"), trusted, cpu_vec_isa.invalid_vec_isa) \
                            if trusted else cpu_vec_isa.invalid_vec_isa
                    else:
                        pick = next((i for i in trusted if i.bit_width() == config.cpp.simdlen),
                                    cpu_vec_isa.invalid_vec_isa)
                    same = str(pick) == want
                if same:
                    config.cpp.vec_isa_ok = True
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
