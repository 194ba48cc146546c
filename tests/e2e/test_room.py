"""The tests split from tests/unit/test_room.py that compile, start Ray or start processes; that
file's docstring describes the topic, and it holds the unit tests."""

from __future__ import annotations

import threading

import pytest
import torch

from aoti_farm.runtime import native
from aoti_farm.runtime.room import ThreadRoom


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def _room(cores: int) -> ThreadRoom:
    r = ThreadRoom(True)
    r.cores = cores   # as if this host had ``cores`` usable cores
    return r


def _new_thread_count() -> int:
    """The intra-op thread count a thread starting now gets."""
    out = []
    t = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    t.start()
    t.join()
    return out[0]


@pytest.mark.skipif(native.disabled(), reason="AOTI_FARM_NATIVE=0")
def test_native_side_takes_over_lowered_threads(threads):
    mod = native.load()
    assert mod is not None, native.error()
    torch.set_num_threads(4)
    room = _room(4)
    room.set_compiles(1)
    room.follow()                                 # lowered by the Python kernels
    assert torch.get_num_threads() == 3
    try:
        room.attach_native(mod)                   # the switch to the native path
        assert mod.thread_limit_state()["limit"] == 3 and room.stats()["threads_lowered_now"] == 1
        mod.follow_thread_limit()                 # what every native kernel call does first
        assert torch.get_num_threads() == 3       # still lowered once, not twice
        room.set_compiles(0)
        mod.follow_thread_limit()
        room.set_compiles(1)
        mod.follow_thread_limit()                 # lowered by the native side itself
        assert torch.get_num_threads() == 3 and _new_thread_count() == 4
        room.set_compiles(0)
        mod.follow_thread_limit()
        assert torch.get_num_threads() == 4       # restored by the native side
        room.set_compiles(1)
        mod.follow_thread_limit()
        assert torch.get_num_threads() == 3
        room.close()                              # uninstall restores the calling thread
        assert torch.get_num_threads() == 4
        st = mod.thread_limit_state()
        assert st["limit"] == 0 and not st["saved"] and st["errors"] == 0
    finally:
        mod.set_thread_limit(0)
        mod.follow_thread_limit()
