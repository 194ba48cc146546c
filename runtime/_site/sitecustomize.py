"""Installed into programs started by ``aoti-farm run`` / ``aoti-farm record``.

The launcher puts this directory first on PYTHONPATH; Python imports this module at
start-up.  It does nothing unless AOTI_FARM_HOOK (the hook's arguments) or
AOTI_FARM_RECORD_DIR is set, and it never stops the program: a failure is one line on
stderr.

The hook (or the recorder) boots once the process has imported torch, not at start-up.
Every Python process of the program inherits this directory, including the helpers that
torch starts for itself.  Inductor's ISA load check (``python -c`` that only ``dlopen``s a
test library) imports no torch on Linux.  Booting the hook there made each check install
a hook of its own, whose fingerprint waited for the ISA lock that its parent held: every
check ran into its 60 s bound, and the ISA was then taken as unsupported.  A process that
never imports torch has nothing to serve or record.  Torch's own scripts that do import
torch (Inductor's compile-worker pool, ``torchrun``) and the load check of a torch whose
check still imports torch are skipped (:func:`_torch_helper`), and so are the children
the farm starts for itself from the program (:func:`_farm_helper`).

When: after the import *statement* that brought torch in has returned (the outermost
``import`` of this thread, seen through ``builtins.__import__``), not inside torch's own
import.  There this thread still holds torch's import lock, so the hook's threads that
import from torch would wait for it while it waits for them, and the program's module that
imported torch (``aoti_farm.runtime.launch`` itself, say) is only half made.  A finder
(:class:`_AfterTorch`) says when torch has run to its end.  Torch imported by
``importlib.import_module`` alone boots at the program's next ``import`` statement.
"""

import builtins
import os
import sys
import threading

_real_import = builtins.__import__
_local = threading.local()
_torch_done = False   # torch's module has run to its end
_booted = False
_boot_lock = threading.Lock()


def _boot() -> None:
    global _booted
    with _boot_lock:   # two threads' outermost imports may return at once
        if _booted:
            return
        _booted = True
    if builtins.__import__ is _import:   # every later import at full speed
        builtins.__import__ = _real_import
    if _torch_helper() or _farm_helper():
        return
    try:
        from aoti_farm.runtime import launch as _aoti_farm_launch

        _aoti_farm_launch.boot()
    except Exception as _e:  # noqa: BLE001
        print(f"aoti-farm: hook not installed in pid {os.getpid()}: {type(_e).__name__}: {_e}", file=sys.stderr)


def _torch_helper(argv=None, orig_argv=None, torch_file=None) -> bool:
    """Whether this process is one torch started for itself, not the program's: a main
    script inside torch's package, or an ISA load check (``-c`` code that imports and
    loads a library, nothing else)."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    torch_file = getattr(sys.modules.get("torch"), "__file__", None) if torch_file is None else torch_file
    main = argv[0] if argv else ""
    if _module(orig_argv).split(".")[0] == "torch":   # `-m` before runpy names its file
        return True
    if torch_file and main not in ("", "-c", "-m"):
        here = os.path.dirname(os.path.abspath(torch_file))
        if os.path.abspath(main).startswith(here + os.sep):
            return True
    if main == "-c":
        code = orig_argv[orig_argv.index("-c") + 1] if "-c" in orig_argv[:-1] else ""
        lines = [x.strip() for x in code.strip().splitlines()]
        return bool(lines) and lines[-1].startswith("cdll.LoadLibrary(") and all(
            x.startswith(("import ", "from ", "if sys.platform")) for x in lines[:-1])
    return False


def _module(orig_argv) -> str:
    """The module ``python -m MODULE`` runs ('' for a script or ``-c``)."""
    args = iter(orig_argv[1:])
    for a in args:
        if a == "-m":
            return next(args, "")
        if a in ("-W", "-X"):   # the options that take the next word
            next(args, None)
        elif a == "-c" or a == "-" or not a.startswith("-"):
            return ""
    return ""


def _farm_helper(argv=None, orig_argv=None, farm_dirs=None, probe=None) -> bool:
    """Whether this process is one the farm started for itself from the program (its
    verification child and server, host preparation, the loader probe, the ``aoti-farm``
    command): a hook there would route the eager reference that a kernel is checked
    against.  Its main script is in the farm's packages, or it runs ``aoti-farm``, or
    its ``-c`` code is the loader probe (``aoti_farm.startup.loadenv``)."""
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    main = argv[0] if argv else ""
    if main == "-c":
        if probe is None:
            try:
                from aoti_farm.startup.loadenv import _PROBE as probe
            except Exception:  # noqa: BLE001 -- no farm to ask: not its probe
                return False
        return "-c" in orig_argv[:-1] and orig_argv[orig_argv.index("-c") + 1] == probe
    if _module(orig_argv).split(".")[0] == "aoti_farm":   # `-m` before runpy names its file
        return True
    if main in ("", "-m"):
        return False
    if os.path.basename(main) == "aoti-farm":
        return True
    if farm_dirs is None:
        import importlib.util

        farm_dirs = []
        for name in ("aoti_farm", "aoti_farm.runtime", "aoti_farm.workers"):
            try:
                farm_dirs += list(importlib.util.find_spec(name).submodule_search_locations or [])
            except Exception:  # noqa: BLE001 -- not importable: nothing of it runs here
                pass
    path = os.path.abspath(main)
    return any(path.startswith(os.path.abspath(d) + os.sep) for d in farm_dirs)


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """``builtins.__import__`` until the boot: the boot runs when this thread's outermost
    import returns with torch imported."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        return _real_import(name, globals, locals, fromlist, level)
    finally:
        _local.depth = depth
        if depth == 0 and _torch_done and not _booted:
            _boot()


class _AfterTorch:
    """A finder that notes when ``torch``'s module has run to its end, then leaves
    ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.util

        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            global _torch_done
            try:
                run(module)
            finally:
                try:
                    del loader.exec_module   # the loader's own method again
                except AttributeError:
                    pass
            _torch_done = True

        loader.exec_module = exec_module
        return spec


if os.environ.get("AOTI_FARM_HOOK", "0") != "0" or os.environ.get("AOTI_FARM_RECORD_DIR"):
    if "torch" in sys.modules:   # imported before this module (a .pth file)
        _boot()
    else:
        sys.meta_path.insert(0, _AfterTorch())
        builtins.__import__ = _import
