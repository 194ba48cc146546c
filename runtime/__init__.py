"""The serving-side hook (imported as aoti_farm.runtime). Never imports Ray.

``install(...)`` is :func:`aoti_farm.runtime.hook.install`; ``record(path)`` is
:func:`aoti_farm.runtime.recorder.record`.
"""


def install(*args, **kwargs):
    """Install the serving hook; see :mod:`aoti_farm.runtime.hook`."""
    from aoti_farm.runtime.hook import install as _install

    return _install(*args, **kwargs)


def record(path, **kwargs):
    """Record op signatures into a trace; see :mod:`aoti_farm.runtime.recorder`."""
    from aoti_farm.runtime.recorder import record as _record

    return _record(path, **kwargs)


__all__ = ["install", "record"]
