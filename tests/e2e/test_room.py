"""The hook's compiles and the program's thread count (runtime/room.py and the native side
in fastpath.cpp): the count the program set is never changed, while a compile runs or
after.  The thread count of a served call is in test_gate.py."""

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


def test_compiles_never_change_the_programs_thread_count(threads):
    """The program set 2 threads; a compile of the hook runs; every serving call follows
    the room: the count stays 2, in this thread and in threads started meanwhile."""
    torch.set_num_threads(2)
    for room in (ThreadRoom(True), _room(4), ThreadRoom(False)):
        room.set_compiles(1)
        room.follow()
        assert torch.get_num_threads() == 2 and _new_thread_count() == 2
        room.set_compiles(0)
        room.follow()
        room.close()
        assert torch.get_num_threads() == 2
        st = room.stats()
        assert st["enabled"] is False and st["lowered"] == 0 and st["threads_lowered_now"] == 0
        assert "never changes" in st["note"]
    # the setting is still accepted (an explicit value is never overridden by the environment)
    from aoti_farm.runtime.settings import resolve

    assert resolve(yield_core=True).yield_core is True
    assert ThreadRoom(True).stats()["requested"] is True


@pytest.mark.skipif(native.disabled(), reason="AOTI_FARM_NATIVE=0")
def test_native_side_never_lowers(threads):
    mod = native.load()
    assert mod is not None, native.error()
    torch.set_num_threads(2)
    room = _room(4)
    try:
        room.attach_native(mod)                   # the switch to the native path
        room.set_compiles(1)
        mod.follow_thread_limit()                 # what every native kernel call does first
        assert mod.thread_limit_state()["limit"] == 0
        assert torch.get_num_threads() == 2 and _new_thread_count() == 2
        room.close()
        assert torch.get_num_threads() == 2 and not mod.thread_limit_state()["saved"]
    finally:
        mod.set_thread_limit(0)
        mod.follow_thread_limit()


def test_config_field_reaches_the_hook(tmp_path):
    """`[hook] yield_core = false` (or AOTI_FARM_YIELD_CORE=0) turns it off for `aoti-farm run`."""
    from aoti_farm.config import HookConfig, resolve
    from aoti_farm.errors import UserError

    assert resolve(HookConfig, env={}).yield_core is True
    assert resolve(HookConfig, env={"AOTI_FARM_YIELD_CORE": "0"}).yield_core is False
    cfg = tmp_path / "c.toml"
    cfg.write_text("[hook]\nyield_core = false\n")
    assert resolve(HookConfig, env={}, config_path=str(cfg)).yield_core is False
    with pytest.raises(UserError, match="yield_core"):
        resolve(HookConfig, env={"AOTI_FARM_YIELD_CORE": "sometimes"})
