"""aoti-farm: a compile farm for PyTorch's AOTInductor eager kernels."""

__version__ = "0.1.0"


def record(path, **kwargs):
    """``with aoti_farm.record("trace.json"): model(x)`` -- see aoti_farm.runtime.recorder."""
    from aoti_farm.runtime.recorder import record as _record

    return _record(path, **kwargs)
