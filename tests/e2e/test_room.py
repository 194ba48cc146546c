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
    r = ThreadRoom()
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
    for room in (ThreadRoom(), _room(4)):
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


def test_the_retired_setting_is_refused_by_name(tmp_path, monkeypatch):
    """``yield_core`` had no effect (the hook never changes the program's thread count): it is
    retired, and refused by name wherever it is given, never silently ignored."""
    from aoti_farm.config import HookConfig, resolve
    from aoti_farm.errors import UserError
    from aoti_farm.runtime import install

    with pytest.raises(UserError, match="environment AOTI_FARM_YIELD_CORE: no longer read"):
        resolve(HookConfig, env={"AOTI_FARM_YIELD_CORE": "0"})
    cfg = tmp_path / "c.toml"
    cfg.write_text("[hook]\nyield_core = false\n")
    with pytest.raises(UserError, match=r"\[hook\] yield_core is retired"):
        resolve(HookConfig, env={}, config_path=str(cfg))
    monkeypatch.delenv("AOTI_FARM_CONFIG", raising=False)
    with pytest.raises(UserError, match=r"install\(yield_core=...\): retired"):
        install(cache_dir=str(tmp_path / "cache"), yield_core=False)
    assert not hasattr(HookConfig(), "yield_core")
