"""This host's identity for its memos, readable without importing torch.

The ISA memo (:func:`aoti_farm.fingerprint.host_isa_memo`) is named by the CPU (model and
flags) and torch's git version.  ``warm`` asks whether it exists before anything has
imported torch (5 s on a many-core host's first start), to start a fresh host's ISA probe
at once and no probe on a known host (:func:`aoti_farm.workers.warm.start_isa_probe`).
:func:`torch_git_version` reads ``torch/version.py`` as text for that; where it cannot,
callers treat the memo as unknown, which only costs the probe child's start.  The memo
is read here too (:func:`read_isa_memo`), for both: the same rule of what a memo is.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re


def cpu_id() -> str:
    """The CPU's model and flags, hashed: memos of one host and one kind of CPU."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name", "Features")):
                    flags += line
                    if line.startswith(("flags", "Features")):
                        break
    except OSError:
        pass
    return hashlib.sha256((platform.machine() + flags).encode()).hexdigest()[:16]


def isa_memo_path(git_version: str) -> str:
    """The ISA memo's path in this user's memo directory, for torch of ``git_version``
    (raises where that directory is not private: :func:`aoti_farm.security.fsutil.memo_dir`)."""
    from aoti_farm.security.fsutil import memo_dir

    return os.path.join(memo_dir(), f"isa-{cpu_id()}-{git_version[:12]}.json")


#: The most bytes of an ISA memo read (a memo is a few KiB: the ISA and its check answers).
MAX_MEMO_BYTES = 1 << 20


def read_isa_memo(path: str) -> dict | None:
    """The ISA memo at ``path`` (bounded read), or None where there is none or it is not
    one (no ``"isa"`` string)."""
    try:
        with open(path, "rb") as f:
            memo = json.loads(f.read(MAX_MEMO_BYTES))
        return memo if isinstance(memo, dict) and isinstance(memo.get("isa"), str) else None
    except (OSError, ValueError, TypeError):
        return None


_GIT = re.compile(r"""^git_version\s*=\s*['"]([^'"\n]{1,64})['"]\s*$""", re.M)


def torch_git_version() -> str | None:
    """torch's ``torch.version.git_version`` without importing torch: torch already
    imported, else read from the ``version.py`` of the torch that ``import torch`` would
    load (bounded read).  None where it cannot tell."""
    import sys

    mod = sys.modules.get("torch.version")
    if mod is not None:
        v = getattr(mod, "git_version", None)
        return v if isinstance(v, str) else None
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        where = list(spec.submodule_search_locations or []) if spec is not None else []
        if len(where) != 1:
            return None
        with open(os.path.join(where[0], "version.py"), encoding="utf-8") as f:
            m = _GIT.search(f.read(64 * 1024))
        return m.group(1) if m else None
    except (OSError, ValueError, ImportError, UnicodeDecodeError):
        return None
