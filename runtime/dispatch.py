"""torch.library registration shared by the serving hook and the recorder.

Both see exactly the same calls: a :class:`Registration` registers one Python kernel per
served op at the ``CPU`` key (and ``CUDA`` where the op has a CUDA kernel), with
``torch.library.Library("aten", "IMPL").impl(op, fn, key, with_keyset=True)``.  The
original kernel is captured first with ``torch.library.get_kernel(op, key)``;
:func:`call_original` runs it (``orig.call_boxed(keyset, ...)``), which is exactly eager.
``uninstall()`` is ``lib._destroy()``, which puts the originals back.

Re-entrancy: a thread-local flag per registration.  A call made while this thread is
already inside one of our kernels (an op dispatched by the original kernel, by the AOTI
runner, by our own bookkeeping) goes straight to the original kernel.

Wrapped numbers: a Python number that a C++ caller passed as a Tensor (``x * 2.5``,
``torch.allclose``) reaches a Python kernel as a plain ``float``/``int``/``bool``, which
``call_boxed`` refuses.  :func:`call_original` makes it a wrapped number again (see
:func:`_wrapped_number`), so the original kernel gets the very call eager would: a 0-dim
tensor of any dtype instead would change type promotion and the scalar's precision.

Private torch APIs used here (checked against torch 2.13.0; each goes when torch offers a
public equivalent): ``Library._destroy()`` (torch.library has no public way to remove one
library's registrations and restore the kernels they replaced),
``torch._C._dispatch_get_all_op_names`` (no public list of registered operators) and
``torch._C._dispatch_has_kernel_for_dispatch_key`` (no public "has a kernel at this key";
``torch.library.get_kernel`` raises instead).  None of them patches torch: they read the
dispatcher or undo our own registrations.

``ops=None`` means every aten op whose ``op_info(op).ineligible`` is None, that has a
kernel at the key, takes a tensor (no factories: ``empty``, ``zeros``...) and is not tagged
``nondeterministic_bitwise`` (about 480 ops on CPU with torch 2.13).  Enumerating them costs about
150 ms the first time per torch build, so the list of names is memoised on disk
(``fsutil.memo_dir()/ops-<torch git>.json``); after that registering all of them
costs about 25 ms (see ``Registration.install_seconds``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from typing import Any, Callable, Iterable

import torch

from aoti_farm import signature as S
from aoti_farm.security.fsutil import memo_dir

#: handler(info, device, orig, keyset, args, kwargs) -> result
Handler = Callable[[S.OpInfo, str, Any, Any, tuple, dict], Any]

KEYS = {"cpu": "CPU", "cuda": "CUDA"}


# --- which ops ------------------------------------------------------------------------------


def _memo_path() -> str:
    return os.path.join(memo_dir(), f"ops-v3-{torch.version.git_version[:12]}-{torch.__version__}.json")


_TENSOR_KINDS = ("tensor", "opt_tensor", "tensor_list", "opt_tensor_list")


def _compute_eligible(key: str) -> list[str]:
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        try:
            op = S.resolve_op(name)
        except ValueError:
            continue
        if torch.Tag.nondeterministic_bitwise in op.tags:
            continue  # empty_like() etc.: uninitialised memory, nothing to serve
        info = S.op_info(op)
        if not any(k in _TENSOR_KINDS for k in info.kinds):
            continue  # factories (empty, zeros, arange): nothing to gain, empty() is garbage
        if info.ineligible is None and torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            out.append(S.op_name(op))
    return sorted(out)


def eligible_op_names(device: str = "cpu") -> list[str]:
    """Names of every servable aten op with a kernel for ``device`` (memoised on disk)."""
    key = KEYS[device]
    path = _memo_path()
    try:
        with open(path) as f:
            memo = json.load(f)
        if isinstance(memo.get(key), list):
            return memo[key]
    except (OSError, ValueError, AttributeError):
        memo = {}
    names = _compute_eligible(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        memo = dict(memo) if isinstance(memo, dict) else {}
        memo[key] = names
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, path)
    except OSError:
        pass  # read-only home: recomputed next time
    return names


def resolve_ops(ops: Iterable | None, device: str = "cpu") -> list[torch._ops.OpOverload]:
    """``ops``: None (every eligible op), or names ('aten::add.Tensor') / OpOverloads.
    Names that are unknown or ineligible raise ValueError naming them."""
    if ops is None:
        names: Iterable = eligible_op_names(device)
    else:
        names = ops
    out = []
    for o in names:
        op = o if isinstance(o, torch._ops.OpOverload) else S.resolve_op(str(o))
        reason = S.op_info(op).ineligible
        if reason and ops is not None:
            raise ValueError(f"op {S.op_name(op)} cannot be served ({reason}); remove it from ops")
        if not reason:
            out.append(op)
    return out


# --- calling the original kernel ----------------------------------------------------------


def _wrapped_number(v: Any) -> torch.Tensor:
    """``v`` as the wrapped number C++ made of it: a 0-dim CPU tensor of the widest dtype
    of its kind whose ``is_wrapped_number`` flag is set, so type promotion ranks it below
    every tensor and kernels read its exact value (``x_f16 * 1e5`` stays finite, ``x_i8 +
    200`` wraps), exactly as in eager.

    Python cannot set that flag, but torch's Python argument parser sets it on a number it
    converts for a Tensor parameter of an op that admits numbers (``torch.mul``), and
    ``out=`` hands that very tensor back: ``torch.mul(t, True, out=v)`` returns the
    wrapped number, and ``copy_`` then writes ``v``'s exact bits into it (mul.out and
    copy_ mutate, so they are never routed: no re-entry).  Checked on torch 2.13 by
    :func:`_wrapping_works` at import (before any op is routed: the check calls ``mul``);
    torch offers no public way to build a wrapped number (this goes when it does).
    """
    if isinstance(v, bool):
        dt = torch.bool
    elif isinstance(v, int):
        dt = torch.int64
    elif isinstance(v, float):
        dt = torch.float64
    elif isinstance(v, complex):
        dt = torch.complex128
    else:
        raise TypeError(f"cannot pass {type(v).__name__} as a tensor")
    t = torch.tensor(v, dtype=dt)
    w = torch.mul(t, True, out=v)
    w.copy_(t)
    return w


def _check_wrapping() -> bool:
    """Whether :func:`_wrapped_number` yields a wrapped number on this torch (a float16
    0-dim tensor times it stays float16, which no plain float64 tensor does)."""
    try:
        w = _wrapped_number(1e5)
        h = torch.tensor(0.001, dtype=torch.float16)
        ok = torch.mul(h, w).dtype is torch.float16 and w.dtype is torch.float64 and w.item() == 1e5
    except Exception:  # noqa: BLE001
        ok = False
    if not ok:
        warnings.warn("aoti-farm: this torch build does not hand back wrapped numbers; a hooked op "
                      "called with a Python number for a Tensor argument raises", RuntimeWarning)
    return ok


_WRAPPING = _check_wrapping()


def _fix_numbers(info: S.OpInfo, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Python numbers found in Tensor slots made wrapped numbers again; None if none."""
    slots = []
    for i, (name, kind) in enumerate(zip(info.arg_names, info.kinds)):
        if kind not in ("tensor", "opt_tensor"):
            continue
        if i < len(args) and not info.kwarg_only[i]:
            v = args[i]
        else:
            v = kwargs.get(name)
        if isinstance(v, (bool, int, float, complex)):
            slots.append((i, name))
    if not slots or not _WRAPPING:
        return None
    args, kwargs = list(args), dict(kwargs)
    for i, name in slots:
        if i < len(args) and not info.kwarg_only[i]:
            args[i] = _wrapped_number(args[i])
        else:
            kwargs[name] = _wrapped_number(kwargs[name])
    return tuple(args), kwargs


def call_original(info: S.OpInfo, orig: Any, keyset: Any, args: tuple, kwargs: dict) -> Any:
    """Exactly eager: the kernel that was registered before ours."""
    try:
        return orig.call_boxed(keyset, *args, **kwargs)
    except RuntimeError:
        fixed = _fix_numbers(info, args, kwargs)
        if fixed is None:
            raise
    return orig.call_boxed(keyset, *fixed[0], **fixed[1])


# --- the registration -------------------------------------------------------------------------


class Registration:
    """Python kernels for ``ops`` on ``devices``; ``handler`` decides what each call does.

    The handler runs with this thread's re-entrancy flag set; it must call
    :func:`call_original` itself for the eager result.  ``enabled`` may be flipped to make
    every call go straight to the original kernel.
    """

    def __init__(self, ops: Iterable | None, handler: Handler, devices: Iterable[str] = ("cpu",)):
        self._handler = handler
        self._tls = threading.local()
        self.enabled = True
        self.ops: list[str] = []
        t0 = time.perf_counter()
        self._lib = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                for device in devices:
                    if device not in KEYS:
                        raise ValueError(f"device {device!r} is not 'cpu' or 'cuda'")
                    key = KEYS[device]
                    for op in resolve_ops(ops, device):
                        name = op._schema.name + (f".{op._schema.overload_name}" if op._schema.overload_name else "")
                        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
                            continue
                        orig = torch.library.get_kernel(op, key)
                        self._lib.impl(op, self._kernel(S.op_info(op), device, orig), key, with_keyset=True)
                        if device == "cpu" or name not in self.ops:
                            self.ops.append(name)
        except BaseException:
            self._lib._destroy()
            raise
        self.install_seconds = time.perf_counter() - t0

    def inside(self) -> bool:
        return getattr(self._tls, "active", False)

    def _kernel(self, info: S.OpInfo, device: str, orig: Any):
        tls, handler = self._tls, self._handler

        def kernel(keyset, *args, **kwargs):
            if getattr(tls, "active", False) or not self.enabled:
                return call_original(info, orig, keyset, args, kwargs)
            tls.active = True
            try:
                return handler(info, device, orig, keyset, args, kwargs)
            finally:
                tls.active = False

        kernel.__name__ = f"aoti_farm_{info.name.replace('::', '_').replace('.', '_')}"
        return kernel

    def uninstall(self) -> None:
        """Restore the original kernels (idempotent)."""
        self.enabled = False
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()


def requires_grad_input(args: tuple, kwargs: dict) -> bool:
    """True if grad mode is on and a tensor input requires grad (never served)."""
    if not torch.is_grad_enabled():
        return False
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
                return True
    return False
