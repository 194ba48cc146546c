"""Security drills of the kernel path: a process loads exactly the bytes that were verified.

* the race: a swapper process waits for each read of an entry's ``kernel.so`` to end (the
  hash pass) and renames a wrong (valid) kernel or a foreign library over it at once, while
  this process verifies and loads the entry over and over: every kernel that loads is the verified one, and the foreign library's
  constructor never runs here (signed and unsigned caches);
* unsafe directories: a shard, ``entries/``, the namespace or the root writable by others,
  the root's parent writable and not sticky, a symlinked shard or ``entries/``: refused, and
  ``cache verify`` reports them;
* special files: a FIFO, a huge sparse file, a directory or a link to /dev/zero in place
  of ``kernel.so`` or the manifest: refused at once (nothing hangs or reads gigabytes); the
  served call returns eager at once; ``cache verify`` finishes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import KERNEL, MANIFEST, BadEntry, Cache
from aoti_farm.compile.compiler import load_runner
from aoti_farm.compile.job import compile_and_publish
from aoti_farm.runtime import Settings, install

from _runtime_helpers import build_evil_so
from conftest import sig_add_alpha, sig_mul

SWAPPER = r"""
# The attacker: waits (inotify) until a reader has read kernel.so and closed it -- the hash
# pass -- then at once renames a wrong kernel or a foreign library over it, and puts the
# good one back a moment later, so the next verification passes again.
import ctypes, os, select, shutil, struct, sys, time
d, stop, good, bads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(ino, d.encode(), 0x10) >= 0      # IN_CLOSE_NOWRITE
kernel = os.path.join(d, "kernel.so")

def stage(src, name):
    tmp = os.path.join(d, name)
    shutil.copyfile(src, tmp)
    return tmp

swaps, end = 0, time.monotonic() + 300
bad = stage(bads[0], ".bad")
while not os.path.exists(stop) and time.monotonic() < end:
    if not select.select([ino], [], [], 0.1)[0]:
        continue
    buf, hit = os.read(ino, 65536), False
    while buf:
        wd, mask, cookie, n = struct.unpack_from("iIII", buf)
        hit = hit or buf[16:16 + n].rstrip(b"\0") == b"kernel.so"
        buf = buf[16 + n:]
    if not hit:
        continue
    os.rename(bad, kernel)                       # right after the reader's hash pass
    swaps += 1
    time.sleep(0.005)
    os.rename(stage(good, ".good"), kernel)      # and back: the next check passes
    bad = stage(bads[swaps % len(bads)], ".bad")
    while select.select([ino], [], [], 0)[0]:    # our own renames are not readers
        os.read(ino, 65536)
print(swaps)
"""


def sig_add_alpha3(shape=(8, 16)):
    """Same inputs as ``sig_add_alpha``, another result: a wrong kernel that loads and runs."""
    a, b = torch.empty(shape), torch.empty(shape[-1:])
    return S.from_call(torch.ops.aten.add.Tensor, (a, b), {"alpha": 3})


@pytest.fixture(scope="module")
def race_files(kernels, tmp_path_factory):
    good, wrong = sig_add_alpha(), sig_add_alpha3()
    assert kernels.ensure(good).status in ("compiled", "cached")
    d = tmp_path_factory.mktemp("race-files")
    # the wrong kernel goes to a cache of its own: in the session cache it would be a hit
    # for other tests' alpha=3 calls
    own = Cache(d / "wrong-cache", signing_key=None)
    assert compile_and_publish(own, kernels.compiler, kernels.fp, wrong, owner="pytest").status == "compiled"
    shutil.copyfile(kernels.cache.entry_dir(kernels.fp.id, good.key) / KERNEL, d / "good.so")
    shutil.copyfile(own.entry_dir(kernels.fp.id, wrong.key) / KERNEL, d / "wrong.so")
    marker = d / "constructor-ran"
    build_evil_so(str(d / "evil.so"), str(marker))
    return d, marker


def _cache_with_good_entry(kernels, root, signing_key):
    cache = Cache(root, signing_key=signing_key)
    src = kernels.cache.open_entry(kernels.fp, sig_add_alpha().key)
    cache.publish(kernels.fp, src.signature, {KERNEL: src.kernel_path}, {"compile_seconds": 0.0})
    return cache


@pytest.mark.parametrize("signing_key", [None, b"fleet-key"], ids=["unsigned", "signed"])
def test_swapped_kernel_is_never_loaded(kernels, race_files, tmp_path, signing_key):
    files, marker = race_files
    cache = _cache_with_good_entry(kernels, tmp_path / "c", signing_key)
    key = sig_add_alpha().key
    d = cache.entry_dir(kernels.fp.id, key)
    a, b = torch.randn(8, 16), torch.randn(16)
    expected = torch.add(a, b, alpha=2)
    stop = tmp_path / "stop"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(d), str(stop), str(files / "good.so"),
                                str(files / "wrong.so"), str(files / "evil.so")], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)   # the swapper is watching (if not yet, the drill is weaker, not wrong)
    served, refused = 0, 0
    try:
        for _ in range(300):
            try:
                entry = cache.open_entry(kernels.fp, key, private=True)
            except BadEntry as e:
                assert e.kind in ("corrupt", "missing"), e
                refused += 1
                continue
            try:
                runner = load_runner(entry.load_path, "cpu")
            finally:
                entry.close()
            got = runner.run([a, b])[0]
            assert torch.equal(got, expected), "a kernel other than the verified one was loaded"
            served += 1
        # the production path too: fresh hooks while the swapper runs
        for _ in range(10):
            with install(cache_dir=cache.root, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                         settings=Settings(signing_key=signing_key, native="off")) as hook:
                assert torch.equal(torch.add(a, b, alpha=2), expected)
                st = hook.stats()
            assert st["load_errors"] == 0 and st["kernel_errors"] == 0, st
    finally:
        stop.touch()
        out, _ = swapper.communicate(timeout=60)
    assert int(out) > 20, "the swapper hardly ran: the drill proved nothing"
    assert refused > 0 and served > 0, (refused, served)
    assert not marker.exists(), f"foreign code ran: {marker.read_text()}"


# --- unsafe directories -----------------------------------------------------------------------


def _verify_cli(root, timeout=120):
    """``aoti-farm cache verify`` in a child: a hang fails the test instead of blocking it."""
    r = subprocess.run([sys.executable, "-m", "aoti_farm", "cache", "verify", "--cache-dir", str(root)],
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture()
def entry_copy(kernels, tmp_path):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    base = tmp_path / "parent"
    base.mkdir(mode=0o755)
    cache = kernels.copy_to(base / "c")
    cache.open_entry(kernels.fp, sig.key)   # pristine: fine
    return cache, kernels.fp, sig.key, cache.entry_dir(kernels.fp.id, sig.key)


@pytest.mark.parametrize("where", ["shard", "entries", "namespace", "root"])
def test_directory_writable_by_others_is_refused_and_reported(entry_copy, where):
    cache, fp, key, d = entry_copy
    target = {"shard": d.parent, "entries": d.parent.parent, "namespace": d.parent.parent.parent,
              "root": cache.root}[where]
    os.chmod(target, 0o777)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure" and "writable by others" in str(ei.value)
    rc, out = _verify_cli(cache.root)
    assert rc == 1 and "BAD directory insecure" in out and str(target) in out, out


def test_parent_of_root_must_be_safe(entry_copy):
    cache, fp, key, d = entry_copy
    parent = cache.root.parent
    os.chmod(parent, 0o777)          # anyone may rename the cache away and put another there
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure" and "above the cache" in str(ei.value)
    os.chmod(parent, 0o1777)         # sticky, like /tmp: others cannot rename what is ours
    assert cache.open_entry(fp, key).key == key


@pytest.mark.parametrize("what", ["shard", "entries"])
def test_symlinked_directory_is_not_followed(entry_copy, tmp_path, what):
    cache, fp, key, d = entry_copy
    link = d.parent if what == "shard" else d.parent.parent
    outside = tmp_path / f"outside-{what}"
    shutil.move(link, outside)
    os.symlink(outside, link)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure" and "symbolic link" in str(ei.value)
    with install(cache_dir=cache.root, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="off")) as hook:
        a, b = torch.randn(8, 16), torch.randn(16)
        assert torch.equal(torch.add(a, b, alpha=2), torch.ops.aten.add.Tensor(a, b, alpha=2))
        st = hook.stats()
    assert st["hits"] == 0 and st["kernels_loaded"] == 0


# --- special files ----------------------------------------------------------------------------


def _replace(path, how):
    os.unlink(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "huge":
        with open(path, "wb") as f:
            f.truncate(40 << 30)      # sparse: 40 GB that cost nothing to make
    elif how == "directory":
        os.mkdir(path)
    elif how == "devzero":
        os.symlink("/dev/zero", path)
    else:
        raise AssertionError(how)


def _bounded(fn, timeout=60):
    """Run ``fn`` in a thread; a hang fails the test (no timing is asserted)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung"
    return box


@pytest.mark.parametrize("name", [KERNEL, MANIFEST])
@pytest.mark.parametrize("how", ["fifo", "huge", "directory", "devzero"])
def test_special_file_in_an_entry_is_refused_at_once(entry_copy, name, how):
    cache, fp, key, d = entry_copy
    _replace(d / name, how)
    box = _bounded(lambda: cache.open_entry(fp, key, private=True))
    err = box.get("error")
    assert isinstance(err, BadEntry), box
    assert err.kind in ("corrupt", "insecure"), err


@pytest.mark.parametrize("how", ["fifo", "huge"])
def test_served_call_returns_eager_at_once(entry_copy, how):
    cache, fp, key, d = entry_copy
    _replace(d / KERNEL, how)
    a, b = torch.randn(8, 16), torch.randn(16)
    with install(cache_dir=cache.root, ops=["aten::add.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(native="off")) as hook:
        box = _bounded(lambda: torch.add(a, b, alpha=2))
        st = hook.stats()
    assert torch.equal(box["value"], torch.ops.aten.add.Tensor(a, b, alpha=2))
    assert st["hits"] == 0 and st["integrity_failures_by_kind"].get("corrupt") == 1, st


def test_verify_finishes_on_special_files(kernels, tmp_path):
    sigs = [sig_add_alpha(), sig_mul()]
    for s in sigs:
        assert kernels.ensure(s).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    _replace(cache.entry_dir(kernels.fp.id, sigs[0].key) / KERNEL, "fifo")
    _replace(cache.entry_dir(kernels.fp.id, sigs[1].key) / MANIFEST, "huge")
    rc, out = _verify_cli(cache.root)
    assert rc == 1, out
    assert sigs[0].key[:16] in out and sigs[1].key[:16] in out, out


# --- churn: serving threads beside gc, verify --repair and republishing ----------------------


def test_serving_threads_beside_gc_repair_and_republish(kernels, tmp_path):
    """Eight serving threads call two served ops while another thread evicts everything
    (`cache gc --max-size 1K`), republishes both entries, and runs `cache verify --repair`,
    over and over: no call raises, every result equals eager's, no kernel errors."""
    from aoti_farm.cli import main as cli

    sigs = [sig_add_alpha(), sig_mul()]
    for s in sigs:
        assert kernels.ensure(s).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    for key in cache.list_keys(kernels.fp.id) - {s.key for s in sigs}:
        cache.remove(kernels.fp.id, key)
    good = {}
    for s in sigs:   # the verified kernels, kept aside to publish again
        shutil.copyfile(cache.entry_dir(kernels.fp.id, s.key) / KERNEL, tmp_path / f"{s.key}.so")
        good[s.key] = tmp_path / f"{s.key}.so"
    g = torch.Generator().manual_seed(7)
    a, b, c = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(8, 16, generator=g)
    exp_add, exp_mul = torch.ops.aten.add.Tensor(a, b, alpha=2), torch.ops.aten.mul.Tensor(a, c)
    stop, errors, rounds = threading.Event(), [], {"serve": 0, "churn": 0}

    def serve():
        try:
            while not stop.is_set():
                torch.testing.assert_close(torch.add(a, b, alpha=2), exp_add, rtol=0, atol=1e-6)
                torch.testing.assert_close(torch.mul(a, c), exp_mul, rtol=0, atol=1e-6)
                rounds["serve"] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def churn():
        try:
            while not stop.is_set():
                cli(["cache", "gc", "--max-size", "1K", "--cache-dir", str(cache.root)])
                for s in sigs:
                    cache.publish(kernels.fp, s, {KERNEL: good[s.key]}, {"compile_seconds": 0.0})
                cli(["cache", "verify", "--repair", "--cache-dir", str(cache.root)])
                rounds["churn"] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    with install(cache_dir=cache.root, ops=["aten::add.Tensor", "aten::mul.Tensor"], on_miss="ignore", route="all",
                 settings=Settings(poll_interval=0.05)) as hook:
        threads = [threading.Thread(target=serve) for _ in range(8)] + [threading.Thread(target=churn)]
        for t in threads:
            t.start()
        time.sleep(10)
        stop.set()
        for t in threads:
            t.join(60)
        st = hook.stats()
    assert not errors, errors[:3]
    assert rounds["churn"] >= 3 and rounds["serve"] > 100, rounds
    assert st["hits"] > 0 and st["kernel_errors"] == 0 and st["load_errors"] == 0, st
    print(f"drill churn: serve_rounds={rounds['serve']} churn_rounds={rounds['churn']} hits={st['hits']} "
          f"misses={st['misses']} kernels_loaded={st['kernels_loaded']} kernel_errors=0 wrong_results=0")
