"""What the dispatcher routes to the serving hook: which ops, through which kernels.

One registration at a time: the native kernels (``runtime/native.py``, C++ replays what
Python decided) when the extension loads, else the Python kernels
(``runtime/dispatch.py``), or nothing (:class:`NoRegistration`).

* ``native="require"`` builds the extension first and fails with a UserError if it does
  not serve; ``"auto"`` serves from Python at once, starts the build in the background
  when the extension is not built, and switches (:meth:`Routes.switch_if_built`, from the
  poller) when it is; ``"off"`` never uses it.
* :meth:`Routes.route` re-registers for another set of ops (the hook routes only ops it
  can serve, see ``Hook``).  The old registration goes first, so the new one captures
  eager's kernels, not ours; calls in between run eager.  A native registration's
  counters are kept when it goes (:func:`add_native_stats`), its kernel ids are not
  (``reset`` is called: kernels are loaded again on their next hit).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

from aoti_farm.errors import UserError
from . import dispatch
from . import native as native_mod
from .room import ThreadRoom

log = logging.getLogger("aoti_farm.hook")

#: Seconds an op stays routed after it lost its last servable entry (see Routes.route).
DROP_AFTER_S = 30.0
#: Native counters that describe the registration now, not a count (not summed over registrations).
_GAUGES = ("remembered", "kernels", "containers")


class NoRegistration:
    """What a hook that routes no op registers: nothing."""

    ops: list = []
    install_seconds = 0.0

    def uninstall(self) -> None:
        pass


def add_native_stats(a: dict | None, b: dict) -> dict:
    """The counters of two native registrations added (``a`` the earlier ones)."""
    if a is None:
        return dict(b)
    out = dict(b)
    for k, v in a.items():
        if k in _GAUGES:
            continue
        w = out.get(k)
        if isinstance(v, dict):
            merged = dict(w or {})
            for kk, vv in v.items():
                old = merged.get(kk)
                merged[kk] = (tuple(x + y for x, y in zip(old, vv)) if isinstance(vv, tuple) and old is not None
                              else vv if old is None else old + vv)
            out[k] = merged
        elif isinstance(v, int):
            out[k] = (w or 0) + v
    return out


_QUIET = []   # set once the one-time override warning is consumed


def quiet_override_warning() -> None:
    """Consume torch's one-time "Overriding a previously registered kernel for the same
    operator and the same dispatch key" warning on an op of our own, so that registering
    the hook's kernels on aten ops does not print it in the user's process.

    torch prints it once per process, for the first kernel registered over another
    (``OperatorEntry::registerKernel``); from the native path (a pybind call) it goes to
    stderr, where no Python filter reaches.  Registered through ``torch.library`` it is a
    Python warning, which is filtered here: a private namespace's op gets a CPU kernel
    twice, and both registrations go again at once.  Overriding aten's kernels is this
    hook's purpose, not something the user can act on.  Any failure leaves the warning as
    it was."""
    if _QUIET:
        return
    _QUIET.append(True)
    import warnings

    import torch

    libs = []
    try:
        d = torch.library.Library("aoti_farm_quiet", "DEF")
        libs.append(d)
        d.define("noop(Tensor x) -> Tensor")
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*previously registered kernel")
                warnings.filterwarnings("ignore", message=".*Warning only once for all operators")
                lib = torch.library.Library("aoti_farm_quiet", "IMPL")
                libs.append(lib)
                lib.impl("noop", lambda x: x, "CPU")
    except Exception as e:  # noqa: BLE001 -- the warning then prints, nothing else changes
        log.debug("override warning not consumed: %s", e)
    finally:
        for lib in reversed(libs):
            try:
                lib._destroy()
            except Exception:  # noqa: BLE001
                pass


def cannot_load_reason() -> str | None:
    """Why no AOTI kernel can be loaded into this process, or None when it can."""
    from aoti_farm.startup import loadenv

    if loadenv.load_safe():
        return None
    return ("this process cannot load AOTI kernels safely: start it with "
            f"LD_PRELOAD={loadenv.system_libstdcxx()} (aoti-farm run does)")


def native_code(mod, d: tuple, ineligible_ids: dict) -> int:
    """The native path's code for the hook's eager decision ``d`` (see ``Hook._decide``),
    remembered natively where the decision cannot change until the index does."""
    if d[0] == "gated" and d[2] and hasattr(mod, "EAGER_GATED"):
        return mod.EAGER_GATED   # remembered: later calls run eager without asking
    if d[0] == "fallback" and len(d) > 2 and hasattr(mod, "EAGER_INELIGIBLE_BASE"):
        # Ineligible follows from the call's metadata, which the native key holds in
        # full: remembered, later calls run eager without asking (counted per reason)
        rid = ineligible_ids.get(d[2])
        if rid is None and len(ineligible_ids) < mod.INELIGIBLE_REASONS:
            rid = ineligible_ids.setdefault(d[2], len(ineligible_ids))
        if rid is not None:
            return mod.EAGER_INELIGIBLE_BASE - rid
    return mod.EAGER_MISS if d[0] == "miss" else mod.EAGER_FAILED if d[0] == "failed" else mod.EAGER_ONCE


class Routes:
    """The hook's registration.  ``handler`` serves Python kernel calls, ``decide`` /
    ``on_error`` answer the native path, ``reset()`` is called when native kernel ids
    become invalid, ``attached(nreg)`` when the native registration changes."""

    def __init__(self, ops_arg, devices: list[str], handler: Callable, decide: Callable, on_error: Callable,
                 mode: str, room: ThreadRoom, attached: Callable, build_log: str | None = None):
        if native_mod.disabled():
            mode = "off"
        quiet_override_warning()
        self.ops_arg, self.devices = ops_arg, devices
        self._handler, self._decide, self._on_error = handler, decide, on_error
        self._room, self._attached, self._build_log = room, attached, build_log
        self.mode = mode
        self.reg = NoRegistration()
        self.nreg: native_mod.NativeRegistration | None = None
        self.error: str | None = None
        self.build = None                      # the background build (a Popen) while it runs
        self._mod = None                       # the native extension once it loads
        self._past: dict | None = None         # counters of native registrations that went
        self.routed = None                     # the ops routed now (None: every requested op)
        self._requested: set[str] | None = None
        self._left_out: dict[str, float] = {}   # routed op -> when it was first left out

    # -- set-up ------------------------------------------------------------------------------
    def start(self, ops) -> None:
        """The first registration (``ops`` as :meth:`route`); raises UserError for bad ``ops``
        or an unmet ``native="require"``."""
        try:
            if self.mode == "require":
                try:
                    native_mod.build()
                except Exception as e:  # noqa: BLE001
                    raise UserError(f"native=require: {e}; use native='auto' to serve from Python meanwhile") from None
                if not self._load_native():
                    raise UserError(f"native=require: {self.error}; use native='auto' to serve from Python")
            elif self.mode == "auto" and not self._load_native():
                if native_mod.error() and native_mod.error().startswith("not built"):
                    self.build = native_mod.build_in_background(self._build_log)
            for d in self.devices:   # bad `ops` are an error even where none is routed
                dispatch.resolve_ops(self.ops_arg, d)
            self._register(ops)
        except ValueError as e:
            raise UserError(f"ops: {e}") from None

    def serve_nothing(self, reason: str) -> None:
        """Register nothing (``reason`` in ``stats()["native"]``); bad ``ops`` still raise."""
        self.error, self.mode = reason, "off"
        self.start([])

    def _load_native(self) -> bool:
        mod = native_mod.load()
        if mod is None:
            self.error = native_mod.error()
            return False
        self._mod, self.error = mod, None
        try:
            self._room.attach_native(mod)
        except Exception as e:  # noqa: BLE001 -- serving goes on without the thread limit
            log.warning("native thread limit: %s", e)
        return True

    def _register(self, ops) -> None:
        self.routed = ops
        nreg = None
        if ops is not None and not ops:
            reg = NoRegistration()
        else:
            target = ops if ops is not None else self.ops_arg
            if self._mod is not None:
                # each native registration asks with itself named: its kernel ids mean
                # nothing to another one (calls in flight across a re-registration)
                me: list = []
                try:
                    nreg = native_mod.NativeRegistration(
                        self._mod, target, lambda *a: self._decide(me[0], *a),
                        lambda kid, msg: self._on_error(me[0], kid, msg), self.devices)
                    me.append(nreg)
                except ValueError:
                    raise
                except Exception as e:  # noqa: BLE001 -- never leave the ops unserved
                    self.error = f"registration failed: {type(e).__name__}: {e}"
                    if self.mode == "require":
                        raise UserError(f"native=require: {self.error}; use native='auto' to serve from Python") from None
                    self._mod, self.mode = None, "off"
            reg = nreg if nreg is not None else dispatch.Registration(target, self._handler, self.devices)
        self.reg, self.nreg = reg, nreg
        self._attached(nreg)

    def _unregister(self) -> None:
        old, self.reg = self.reg, NoRegistration()
        old.uninstall()
        if self.nreg is not None:
            self._past = add_native_stats(self._past, self.nreg.stats())
            self.nreg = None
            self._attached(None)

    def requested(self) -> set[str]:
        """The names of every op the hook was asked to serve (resolved once).  ``install()``
        asks for them before :meth:`start` (to pick the ops to route), so a bad ``ops`` is
        turned into the same :class:`UserError` here."""
        if self._requested is None:
            from aoti_farm.signature import op_name

            try:
                self._requested = {op_name(o) for d in self.devices for o in dispatch.resolve_ops(self.ops_arg, d)}
            except ValueError as e:
                raise UserError(f"ops: {e}") from None
        return self._requested

    # -- changes -----------------------------------------------------------------------------
    def route(self, ops, now: float | None = None, at_once: bool = False) -> bool:
        """Register for ``ops`` (a list of op names; None: every requested op) if that is
        not what is registered; True when it changed.  An op added is routed at once; an
        op dropped stays routed until it has been left out for :data:`DROP_AFTER_S`
        (entries replaced by gc, republishing or ``verify --repair`` come back quickly, and
        every re-registration costs the loaded kernels), unless ``at_once`` (``install()``'s
        own trials, ``runtime/pretrial.py``)."""
        if ops is not None and self.routed is not None and not at_once:
            now = time.monotonic() if now is None else now
            keep = set(ops)
            for op in set(self.routed) - keep:
                if now - self._left_out.setdefault(op, now) < DROP_AFTER_S:
                    keep.add(op)
            for op in list(self._left_out):
                if op in ops or op not in self.routed:
                    del self._left_out[op]
            ops = sorted(keep)
        if ops == self.routed or (ops is not None and self.routed is not None and sorted(ops) == sorted(self.routed)):
            return False
        self._left_out = {op: t for op, t in self._left_out.items() if ops is None or op in ops}
        self._unregister()
        self._register(ops)
        return True

    def switch_if_built(self) -> None:
        """From the poller: once the background build has finished, serve natively."""
        if self.mode != "auto" or self._mod is not None or self.build is None or self.build.poll() is None:
            return
        self.build = None
        if not native_mod.library_path().exists():
            self.mode = "off"  # the build failed; its log is the worker log
            self.error = "background build failed (see the worker log)"
            return
        if not self._load_native():
            self.mode = "off"
            return
        self._unregister()
        self._register(self.routed)
        self.mode = "active" if self._mod is not None else "off"

    # -- serving -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def bypassed(self):
        """This thread's calls of served ops go straight to eager (no hit, miss or count)."""
        nreg, reg = self.nreg, self.reg
        if nreg is not None:
            prev = nreg.mod.set_inside(True)
            try:
                yield
            finally:
                nreg.mod.set_inside(prev)
        elif isinstance(reg, dispatch.Registration):
            tls = reg._tls
            prev = getattr(tls, "active", False)
            tls.active = True
            try:
                yield
            finally:
                tls.active = prev
        else:
            yield

    def native_stats(self) -> dict | None:
        """The native path's counters over every native registration so far (None: never)."""
        nreg = self.nreg
        if nreg is None:
            return self._past
        return add_native_stats(self._past, nreg.stats())

    def uninstall(self) -> None:
        self._unregister()
