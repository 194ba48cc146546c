"""Library notices that the farm's own processes drop: messages a user cannot act on,
each named by its logger and the start of its text.  Only these exact messages are
dropped; every other warning of those loggers still shows.

:data:`TORCH_NOTICES` applies in the processes the farm runs for itself (``warm``,
``serve`` and the compile actors), never in a serving process with the hook, whose
logging is the user's.  The Ray notices dropped for an embedded Ray are
:data:`aoti_farm.workers.raysetup.EMBEDDED_RAY_NOTICES`.
"""

from __future__ import annotations

import logging

#: torch's CUDA build, imported on a host without a GPU, logs at WARNING, once per process
#: that imports ``torch.utils.cpp_extension`` (Inductor does): "No CUDA runtime is found,
#: using CUDA_HOME=...".  A farm process builds no CUDA extension there, and CUDA
#: signatures on such a host are reported by the farm itself.  The logger is torch's
#: module logger (checked against torch 2.11 and 2.13).
TORCH_NOTICES = {
    "torch.utils.cpp_extension": ("No CUDA runtime is found",),
}


class DropNotices:
    """A logging filter that drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple):
        self.prefixes = prefixes

    def filter(self, record) -> bool:
        try:
            return not str(record.getMessage()).startswith(self.prefixes)
        except Exception:  # noqa: BLE001 -- a record that cannot format: keep it
            return True


def drop(notices: dict) -> None:
    """Drop ``notices`` ({logger name: message prefixes}) in this process, once per logger.
    Call it before the library logs them (a logger's filters apply from then on)."""
    for name, prefixes in notices.items():
        lg = logging.getLogger(name)
        if not any(isinstance(f, DropNotices) and f.prefixes == prefixes for f in lg.filters):
            lg.addFilter(DropNotices(prefixes))
