"""The serving-side hook (imported as aoti_farm.runtime). Never imports Ray.

``install(...)`` is :func:`aoti_farm.runtime.hook.install`, ``Settings`` its settings object
(:class:`aoti_farm.runtime.settings.Settings`); ``record(path)`` is
:func:`aoti_farm.runtime.recorder.record`; ``enable_upstream_backend(cache_dir)`` is
:func:`aoti_farm.runtime.upstream.enable_upstream_backend`.
"""


def install(*args, **kwargs):
    """Install the serving hook; see :mod:`aoti_farm.runtime.hook`."""
    from aoti_farm.runtime.hook import install as _install

    return _install(*args, **kwargs)


def __getattr__(name):
    if name == "Settings":   # imported on first use, as install() is
        from aoti_farm.runtime.settings import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def record(path, **kwargs):
    """Record op signatures into a trace; see :mod:`aoti_farm.runtime.recorder`."""
    from aoti_farm.runtime.recorder import record as _record

    return _record(path, **kwargs)


def enable_upstream_backend(*args, **kwargs):
    """Register aoti-farm as torch's aoti_eager compile backend; see
    :mod:`aoti_farm.runtime.upstream`."""
    from aoti_farm.runtime.upstream import enable_upstream_backend as _enable

    return _enable(*args, **kwargs)


__all__ = ["install", "Settings", "record", "enable_upstream_backend"]
