"""Making room for the compiler (runtime/room.py and the native side in fastpath.cpp):
serving threads lower their intra-op thread count while the hook compiles and get their
own count back afterwards, unless the program changed it meanwhile.  The end-to-end case
(a real worker compiling while the hook serves) is in test_runtime.py's two-process test.

The tests of this module that compile, start Ray or start processes are in tests/e2e/test_room.py.
"""

from __future__ import annotations

import threading

import pytest
import torch

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


def test_python_kernels_lower_and_restore(threads):
    torch.set_num_threads(4)
    room = _room(4)
    room.follow()
    assert torch.get_num_threads() == 4           # nothing compiles: untouched
    room.set_compiles(1)
    room.follow()
    assert torch.get_num_threads() == 3 and room.stats()["threads_lowered_now"] == 1
    assert _new_thread_count() == 4               # only this thread was lowered
    room.set_compiles(2)                          # a second compile: one core fewer again
    room.follow()
    # the thread keeps its first lowering (it is restored to 4 once, not stacked)
    assert torch.get_num_threads() == 3
    room.set_compiles(0)
    room.follow()
    assert torch.get_num_threads() == 4
    st = room.stats()
    assert (st["lowered"], st["restored"], st["threads_lowered_now"], st["errors"]) == (1, 1, 0, 0)


def test_a_thread_at_or_below_the_limit_is_left_alone(threads):
    torch.set_num_threads(2)
    room = _room(4)
    room.set_compiles(1)
    room.follow()
    assert torch.get_num_threads() == 2 and room.stats()["lowered"] == 0


def test_the_programs_own_change_wins(threads):
    torch.set_num_threads(4)
    room = _room(4)
    room.set_compiles(1)
    room.follow()
    assert torch.get_num_threads() == 3
    torch.set_num_threads(1)                      # the program decides meanwhile
    room.set_compiles(0)
    room.follow()
    assert torch.get_num_threads() == 1


def test_each_thread_lowers_itself(threads):
    torch.set_num_threads(4)
    room = _room(4)
    room.set_compiles(1)
    seen = {}

    def serve(name):
        torch.set_num_threads(4)
        room.follow()
        seen[name] = torch.get_num_threads()

    t = threading.Thread(target=serve, args=("other",))
    t.start()
    t.join()
    assert seen["other"] == 3
    assert torch.get_num_threads() == 4           # this thread has not called yet
    assert room.stats()["threads_lowered_now"] == 1


def test_disabled_by_argument_env_or_one_core(threads, monkeypatch):
    torch.set_num_threads(4)
    for room in (ThreadRoom(False), _room(1)):
        room.set_compiles(1)
        room.follow()
        assert room.limit == 0 and torch.get_num_threads() == 4
    # the environment is read once, where settings are resolved (runtime/settings.py), and
    # only for what the caller left unset: it never overrides an explicit value
    from aoti_farm.runtime.settings import resolve

    monkeypatch.setenv("AOTI_FARM_YIELD_CORE", "0")
    assert resolve().yield_core is False and resolve(yield_core=True).yield_core is True
    room = ThreadRoom(True)
    room.cores = 4
    room.set_compiles(1)
    room.follow()
    assert room.enabled and torch.get_num_threads() == 3


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
