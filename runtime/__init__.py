"""The serving-side hook (imported as aoti_farm.runtime). Never imports Ray.

``install(...)`` is :func:`aoti_farm.runtime.hook.install`, ``Settings`` its settings object
(:class:`aoti_farm.runtime.settings.Settings`); ``record(path)`` is
:func:`aoti_farm.runtime.recorder.record`; ``enable_upstream_backend(cache_dir)`` is
:func:`aoti_farm.runtime.upstream.enable_upstream_backend`.

This folder is the package ``aoti_farm.runtime``: pyproject's ``package-dir`` installs it
there, and in a source checkout ``aoti_farm/__init__.py`` maps the name to this folder.
Imports of this package's own modules are relative (``from .room import ThreadRoom``), so
a reader or a tool resolves them from the folder; imports of the core are absolute
(``from aoti_farm.compile import runner``).  ``_site/`` is not part of the package: the
launcher puts it on a child's ``PYTHONPATH``, and its imports stay absolute.
"""


def install(*args, **kwargs):
    """Install the serving hook; see :mod:`aoti_farm.runtime.hook`."""
    from .hook import install as _install

    return _install(*args, **kwargs)


def __getattr__(name):
    if name == "Settings":   # imported on first use, as install() is
        from .settings import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def record(path, **kwargs):
    """Record op signatures into a trace; see :mod:`aoti_farm.runtime.recorder`."""
    from .recorder import record as _record

    return _record(path, **kwargs)


def enable_upstream_backend(*args, **kwargs):
    """Register aoti-farm as torch's aoti_eager compile backend; see
    :mod:`aoti_farm.runtime.upstream`."""
    from .upstream import enable_upstream_backend as _enable

    return _enable(*args, **kwargs)


__all__ = ["install", "Settings", "record", "enable_upstream_backend"]
