"""aoti-farm: a compile farm for PyTorch's AOTInductor eager kernels."""

import os as _os
import sys as _sys
import time as _time

__version__ = "0.1.0"

#: When this package was first imported: a command's process imports it first thing, so
#: its start is at most a moment before this (see aoti_farm.report.progress.command_start_time).
IMPORTED_AT = _time.time()


#: The subpackages whose source lives beside this folder in a checkout (``workers/``,
#: ``runtime/``: pyproject's ``package-dir``) and inside it once installed.
SIBLINGS = ("workers", "runtime")


def _map_checkout_subpackages() -> None:
    """In a source checkout, import ``aoti_farm.workers`` and ``aoti_farm.runtime`` from the
    sibling folders ``workers/`` and ``runtime/``, as pyproject's ``package-dir`` does when
    the package is installed.

    Needed whenever this checkout's ``aoti_farm/`` is imported instead of an installed copy:
    Ray puts the driver's working directory on its workers' ``sys.path``, and
    ``scripts/bench`` puts the checkout root there, so with a regular (non-editable)
    install every Ray actor died with ``No module named 'aoti_farm.workers'``. An editable
    install maps the same names with setuptools' own meta-path finder; this is that
    finder for the checkout, for exactly these two names and only for those folders.

    Guarded: an installed package has ``workers/`` inside itself and is left alone, so a
    site-packages directory never ends up on any package's path."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    root = _os.path.dirname(here)
    if _os.path.isdir(_os.path.join(here, "workers")):
        return                                   # an installed package: nothing to map
    dirs = {f"{__name__}.{name}": _os.path.join(root, name) for name in SIBLINGS}
    if not (_os.path.isfile(_os.path.join(root, "pyproject.toml"))
            and all(_os.path.isfile(_os.path.join(d, "__init__.py")) for d in dirs.values())):
        return                                   # not this project's checkout
    if any(getattr(f, "aoti_farm_checkout", None) == root for f in _sys.meta_path):
        return                                   # already mapped (a reload)

    import importlib.util

    class CheckoutFinder:
        aoti_farm_checkout = root

        @staticmethod
        def find_spec(fullname, path=None, target=None):
            d = dirs.get(fullname)
            if d is None:
                return None
            return importlib.util.spec_from_file_location(
                fullname, _os.path.join(d, "__init__.py"), submodule_search_locations=[d])

    _sys.meta_path.insert(0, CheckoutFinder)


_map_checkout_subpackages()


def record(path, **kwargs):
    """``with aoti_farm.record("trace.json"): model(x)`` -- see aoti_farm.runtime.recorder."""
    from aoti_farm.runtime.recorder import record as _record

    return _record(path, **kwargs)
