"""Process checks shared by the tests that start processes of their own."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Running (an exited process left unreaped by this sandbox's init is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    """True once ``pid`` is not running, False if it still runs after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False
