"""Running a loaded kernel from Python without AOTI's cross-call wait.

``torch._C._aoti.AOTIModelContainerRunnerCpu/Cuda`` call the model container the default
way (``AOTInductorModelContainerRun``): with one model instance, each call waits until
the previous call's work has finished on the device, so on CUDA the CPU never runs ahead
of the GPU (measured on an H100: add 8192x1024, eager 37.1 us, container
run 49.5 us, single-threaded run 36.4 us).  The single-threaded entry point
(``AOTInductorModelContainerRunSingleThreaded``) skips that, but a container run so is not
thread-safe, and torch's Python binding does not expose it.

:class:`PooledRunner` calls the library's C interface (the one upstream's runner calls)
through ``ctypes``: the library is loaded once, from the path given, and keeps a pool of
containers; each call takes one (``list.pop``, atomic under the GIL), runs it with the GIL
released, and puts it back.  A call that finds the pool empty creates another container
from the library already loaded, so the path is needed only at load time.  Kernels from
the cache have no proxy-executor JSON beside them (upstream's runner would use none
either).  The native hit path (``runtime/fastpath.cpp``) does the same in C++.
"""

from __future__ import annotations

import ctypes
import os

import torch

from aoti_farm import signature as S

#: Model instances per CPU kernel that ``compiler.load_runner`` loads with torch's runner
#: (threads that may run it at once; on CPU a model is free again once its call returns).
CPU_MODELS = max(1, min(os.cpu_count() or 1, 16))
#: Most idle containers kept per kernel (more threads at once create more, freed on return).
MAX_IDLE = 64

_vp = ctypes.c_void_p
_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = _vp
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [_vp, ctypes.c_char_p, _vp]
_capsules: bool | None = None   # torch's tensor-handle helpers take capsules (2.13) or ints


def _uses_capsules() -> bool:
    global _capsules
    if _capsules is None:
        probe = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors([torch.empty(0)])
        torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(probe)  # frees the handle
        _capsules = not isinstance(probe[0], int)
    return _capsules


class PooledRunner:
    """A kernel library and its pool of single-threaded model containers.  ``run(tensors)``
    returns the output tensors, like ``AOTIModelContainerRunner.run``; thread-safe."""

    def __init__(self, kernel_path: str, device: str):
        self.device = torch.device(device)
        self._dev = str(self.device).encode()
        lib = ctypes.CDLL(kernel_path, mode=os.RTLD_LOCAL)
        try:
            self._create = lib.AOTInductorModelContainerCreateWithDevice
            self._delete = lib.AOTInductorModelContainerDelete
            nout = lib.AOTInductorModelContainerGetNumOutputs
            self._run = lib.AOTInductorModelContainerRunSingleThreaded
        except AttributeError as e:
            raise RuntimeError(f"{kernel_path} lacks the AOTInductor container interface: {e}") from None
        self._create.argtypes = [ctypes.POINTER(_vp), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p]
        self._delete.argtypes = [_vp]
        nout.argtypes = [_vp, ctypes.POINTER(ctypes.c_size_t)]
        self._run.argtypes = [_vp, ctypes.POINTER(_vp), ctypes.c_size_t, ctypes.POINTER(_vp), ctypes.c_size_t,
                              _vp, _vp]
        for f in (self._create, self._delete, nout, self._run):
            f.restype = ctypes.c_int32
        self._lib = lib
        self._capsules = _uses_capsules()
        self._free: list[int] = []
        self.containers = 0
        h = self._new()
        n = ctypes.c_size_t(0)
        if nout(h, ctypes.byref(n)) != 0:
            self._delete(h)
            raise RuntimeError("AOTInductorModelContainerGetNumOutputs failed")
        self.n_outputs = n.value
        self._free.append(h)

    def _new(self) -> int:
        h = _vp()
        if self._create(ctypes.byref(h), 1, self._dev, None) != 0 or not h.value:
            raise RuntimeError("AOTInductorModelContainerCreateWithDevice failed")
        self.containers += 1
        return h.value

    def run(self, inputs: list) -> list:
        caps = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(inputs)
        ptrs = [_api.PyCapsule_GetPointer(c, None) for c in caps] if self._capsules else caps
        n_in, n_out = len(ptrs), self.n_outputs
        ins = (_vp * n_in)(*ptrs)
        outs = (_vp * n_out)()
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else None
        try:
            h = self._free.pop()
        except IndexError:
            h = self._new()
        try:
            rc = self._run(h, ins, n_in, outs, n_out, stream, None)
        except BaseException:
            self._delete(h)  # never reuse a container left in an unknown state
            raise
        if rc != 0:
            self._delete(h)
            raise RuntimeError("AOTInductorModelContainerRunSingleThreaded failed")
        if len(self._free) < MAX_IDLE:
            self._free.append(h)
        else:
            self._delete(h)
        got = [_api.PyCapsule_New(p, None, None) for p in outs] if self._capsules else list(outs)
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs(got)

    def __del__(self) -> None:
        # no call is running: each holds a reference to this object
        free, self._free = getattr(self, "_free", []), []
        for h in free:
            try:
                self._delete(h)
            except Exception:  # noqa: BLE001 -- interpreter shutdown
                pass


def flat_tensors(sig: S.Signature, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The runner's inputs: every tensor argument in schema order (lists flattened).  Every
    non-tensor argument is baked into the kernel (and is part of the key).  Arguments are
    bound as ``encode_call`` binds them: positional ones by position, the rest (keyword-only
    ones such as ``searchsorted``'s ``sorter`` among them) by name."""
    info = sig.info()
    n = len(args)
    out = []
    for i, j in S.tensor_positions(sig):
        v = args[i] if i < n and not info.kwarg_only[i] else kwargs[info.arg_names[i]]
        out.append(v if j is None else v[j])
    return out
