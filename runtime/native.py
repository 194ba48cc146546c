"""The serving hook's native hit path (``runtime/fastpath.cpp``): its registration of the
served ops (:class:`NativeRegistration`), the background build ``warm`` and the hook
start, and ``python -m aoti_farm.runtime.native build|status``.

Building and loading the extension is the core's :mod:`aoti_farm.speedgate.hitpath` (the compiler
times kernels through it too); its names are re-exported here.  The extension keeps, per
exact call metadata, what the Python hook decided (run this kernel / eager) and replays it
without entering Python.  See fastpath.cpp for what the key holds and why it is never
coarser than a signature.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from aoti_farm.startup import spawn
from aoti_farm.speedgate.hitpath import (  # noqa: F401 -- re-exported: the hook's and the CLI's names
    BUILD_TIMEOUT, MODULE, SOURCE, build, build_id, command, compiler, disabled, error, library_path, load,
    native_dir, typed_entry)
from aoti_farm.startup.spawn import lowest_priority

#: The launcher's variables (``runtime/launch.py``): set, a Python child installs the hook.
_LAUNCHER_VARS = ("AOTI_FARM_HOOK", "AOTI_FARM_RECORD_DIR")


def build_in_background(log_path: str | None = None) -> subprocess.Popen | None:
    """Start ``python -m aoti_farm.runtime.native build`` at idle priority, unless built or
    disabled."""
    if disabled() or library_path().exists():
        return None
    from aoti_farm.startup import loadenv
    from aoti_farm.security import private

    log = (os.fdopen(private.open_append(log_path), "ab") if log_path and log_path != os.devnull
           else open(os.devnull, "ab"))
    try:
        # not a hooked program: without the launcher's variables, the build (and the
        # Python children it starts) installs no hook and starts no compile worker of its own
        env = {k: v for k, v in loadenv.child_env().items() if k not in _LAUNCHER_VARS}
        return subprocess.Popen(spawn.python("-m", "aoti_farm.runtime.native", "build"),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                preexec_fn=lowest_priority, start_new_session=True)
    finally:
        log.close()


class NativeRegistration:
    """The native kernels for ``ops`` on ``devices``: the native counterpart of
    :class:`aoti_farm.runtime.dispatch.Registration`.

    ``decide(info, device, args, kwargs) -> int`` is asked about every call whose metadata
    the native side has not seen: it returns a kernel id from :meth:`load`, or one of
    ``mod.EAGER_MISS`` / ``EAGER_FAILED`` (remembered until :meth:`forget_eager`) /
    ``EAGER_ONCE`` (not remembered).  ``on_error(kernel_id, message)`` hears of a kernel
    that raised (the call got eager's result)."""

    def __init__(self, mod, ops, decide, on_error, devices=("cpu",)):
        import time
        import warnings

        from aoti_farm import signature as S
        from . import dispatch

        self.mod = mod
        self._decide = decide
        self.slots: list[tuple] = []
        self.ops: list[str] = []
        t0 = time.perf_counter()
        typed = typed_entry()
        self.fp = mod.FastPath(self._ask, on_error)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                for device in devices:
                    key = dispatch.KEYS[device]
                    for op in dispatch.resolve_ops(ops, device):
                        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
                            continue
                        s = op._schema
                        info = S.op_info(op)
                        slot = self.fp.add_op(s.name, s.overload_name, key, typed)
                        assert slot == len(self.slots)
                        self.slots.append((info, device, info.kwarg_only))
                        if info.name not in self.ops:
                            self.ops.append(info.name)
        except BaseException:
            self.fp.destroy()
            raise
        self.install_seconds = time.perf_counter() - t0

    def _ask(self, slot: int, vals: list) -> int:
        info, device, kwo = self.slots[slot]
        args = tuple(v for v, k in zip(vals, kwo) if not k)
        kwargs = {n: v for n, v, k in zip(info.arg_names, vals, kwo) if k}
        return self._decide(info, device, args, kwargs)

    def load(self, path: str, device: str, guards=()) -> int:
        """Load a kernel; ``guards``: its index guards ``(input position, lo, hi)``
        (``manifest.index_guards``): a call with an index outside one runs eager."""
        return self.fp.load(path, device, [tuple(int(x) for x in g) for g in guards])

    def unload(self, kernel_id: int) -> None:
        self.fp.unload(kernel_id)

    def forget_eager(self) -> None:
        self.fp.forget_eager()

    def stats(self) -> dict:
        return self.fp.stats()

    def uninstall(self) -> None:
        self.fp.destroy()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    what = argv[0] if argv else "status"
    if what == "build":
        try:
            p = build(verbose="-v" in argv)
        except Exception as e:  # noqa: BLE001
            print(f"aoti-farm native: {e}", file=sys.stderr)
            return 1
        print(p)
        return 0
    if what == "status":
        p = library_path()
        print(json.dumps({"path": str(p), "built": p.exists(), "disabled": disabled()}))
        return 0
    print("usage: python -m aoti_farm.runtime.native [build [-v] | status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
