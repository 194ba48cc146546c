"""cache/queue.py: the runtime miss queue, on a real directory (no hook, no compiles).

Enqueue once per signature across writers, oldest first, the signature read back as it
was written, and every kind of bad item refused (named, bounded, schema-checked).
"""

from __future__ import annotations

import os
import threading
import time

import msgpack
import pytest
import torch

from aoti_farm.cache import queue as missq
from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.errors import FarmError
from aoti_farm.cache.records import BadRecord

FP = "e" * 24


@pytest.fixture()
def cache(tmp_path):
    (tmp_path / "cache").mkdir()
    return Cache(tmp_path / "cache", signing_key=None)


def sig(n: int, alpha: int = 1) -> S.Signature:
    return S.from_call(torch.ops.aten.add.Tensor, (torch.empty(n, 4), torch.empty(4)), {"alpha": alpha})


def _item(cache, key):
    return missq.queue_dir(cache, FP) / f"{key}{missq.SUFFIX}"


def _write(cache, key, obj):
    p = _item(cache, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(msgpack.packb(obj, use_bin_type=True) if not isinstance(obj, bytes) else obj)
    return p


def test_enqueue_read_done_round_trip(cache):
    s = sig(2, alpha=3)
    assert missq.pending(cache, FP) == []            # no queue directory yet
    assert missq.enqueue(cache, FP, s) is True
    assert missq.pending(cache, FP) == [s.key]
    back = missq.read(cache, FP, s.key)
    assert back == s and back.key == s.key and back.args == s.args
    assert missq.done(cache, FP, s.key) is True
    assert missq.pending(cache, FP) == []
    assert missq.done(cache, FP, s.key) is False     # already gone
    with pytest.raises(FileNotFoundError):
        missq.read(cache, FP, s.key)


def test_hints_travel_with_the_signature(cache):
    s = S.parse_signature({**sig(3).to_obj(), "hints": {"self": {"range": [0, 9]}}})
    missq.enqueue(cache, FP, s)
    assert missq.read(cache, FP, s.key).hints == {"self": {"range": [0, 9]}}


def test_enqueue_is_once_per_signature(cache):
    s = sig(4)
    assert missq.enqueue(cache, FP, s) is True
    assert missq.enqueue(cache, FP, s) is False
    assert missq.enqueue(cache, FP, sig(5)) is True
    assert sorted(missq.pending(cache, FP)) == sorted([s.key, sig(5).key])


def test_concurrent_writers_add_it_exactly_once(cache):
    s = sig(6)
    added, start = [], threading.Barrier(8)

    def writer():
        start.wait()
        added.append(missq.enqueue(cache, FP, s))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert added.count(True) == 1 and added.count(False) == 7
    names = os.listdir(missq.queue_dir(cache, FP))
    assert names == [f"{s.key}{missq.SUFFIX}"]            # no temporary files left


def test_pending_is_oldest_first(cache):
    sigs = [sig(10 + i) for i in range(3)]
    for s in sigs:
        missq.enqueue(cache, FP, s)
    by_name = sorted(s.key for s in sigs)
    now = time.time()
    for age, key in zip((10, 20, 30), by_name):       # the last name is the oldest item
        os.utime(_item(cache, key), (now - age, now - age))
    assert missq.pending(cache, FP) == by_name[::-1]


def test_item_of_another_key_is_refused(cache):
    a, b = sig(20), sig(21)
    missq.enqueue(cache, FP, a)
    os.rename(_item(cache, a.key), _item(cache, b.key))     # a's item under b's name
    with pytest.raises(BadRecord, match="names the key"):
        missq.read(cache, FP, b.key)


def test_item_whose_signature_hashes_elsewhere_is_refused(cache):
    a, b = sig(22), sig(23)
    _write(cache, b.key, {"signature": a.to_obj(), "key": b.key, "time": time.time()})
    with pytest.raises(BadRecord, match="another signature"):
        missq.read(cache, FP, b.key)


@pytest.mark.parametrize("obj,match", [
    (b"\xc1 not msgpack", "corrupt|decode|msgpack"),
    ({"key": "x", "time": 0.0}, "signature"),
    ({"signature": [], "key": None, "time": 0.0}, "signature|key"),
    ({"signature": {}, "time": float("nan")}, "time"),
])
def test_malformed_items_are_refused(cache, obj, match):
    s = sig(24)
    if isinstance(obj, dict) and "key" not in obj:
        obj = {**obj, "key": s.key}
    _write(cache, s.key, obj)
    with pytest.raises(BadRecord, match=match):
        missq.read(cache, FP, s.key)


def test_bad_signature_in_a_well_formed_item_is_refused(cache):
    s = sig(25)
    _write(cache, s.key, {"signature": {"op": "aten::no_such_op", "args": []}, "key": s.key, "time": 0.0})
    with pytest.raises(BadRecord, match="bad signature"):
        missq.read(cache, FP, s.key)


def test_oversized_item_is_refused_unread(cache):
    s = sig(26)
    _write(cache, s.key, b"\x00" * (missq.MAX_ITEM_BYTES + 1))
    with pytest.raises(BadRecord):
        missq.read(cache, FP, s.key)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_an_item_that_is_no_regular_file_is_refused(cache, tmp_path, kind):
    s = sig(27)
    p = _item(cache, s.key)
    p.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(p)
    else:
        target = tmp_path / "elsewhere.msgpack"
        target.write_bytes(msgpack.packb({"signature": s.to_obj(), "key": s.key, "time": 0.0}))
        p.symlink_to(target)
    with pytest.raises(BadRecord):
        missq.read(cache, FP, s.key)             # returns at once: a FIFO is never opened blocking
    assert missq.done(cache, FP, s.key) is True     # --repair removes it, not its target
    if kind == "symlink":
        assert target.exists()


def test_junk_names_are_never_listed(cache):
    s = sig(28)
    missq.enqueue(cache, FP, s)
    q = missq.queue_dir(cache, FP)
    (q / "evil.msgpack").write_bytes(b"x")
    (q / f".{s.key}.1234.tmp").write_bytes(b"x")
    (q / (s.key.upper() + missq.SUFFIX)).write_bytes(b"x")
    assert missq.pending(cache, FP) == [s.key]
    assert "evil.msgpack" in missq.scan(cache, FP).junk
    assert missq.remove(cache, FP, "evil.msgpack") is True
    assert "evil.msgpack" not in os.listdir(q)


@pytest.mark.parametrize("bad", ["../../x", "..", "/etc/passwd", "0" * 63 + "/"])
def test_names_that_are_no_key_are_refused(cache, bad):
    with pytest.raises(FarmError):
        missq.read(cache, FP, bad)
    with pytest.raises(FarmError):
        missq.done(cache, FP, bad)


def test_an_unsafe_queue_directory_is_refused(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.ns(FP).mkdir(parents=True)
    os.symlink(elsewhere, missq.queue_dir(cache, FP))
    with pytest.raises(BadRecord):
        missq.enqueue(cache, FP, sig(29))
    with pytest.raises(BadRecord):
        missq.scan(cache, FP)
    assert os.listdir(elsewhere) == []
