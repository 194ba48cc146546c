"""The cache directory: publish/open, crash safety, corruption, failure records, gc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import KERNEL, BadEntry, Cache
from aoti_farm.cli import main
from aoti_farm.compile.job import compile_and_publish

from conftest import sig_add_alpha

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_publish_open_round_trip(kernels, tmp_path):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    e = cache.open_entry(kernels.fp, sig.key)
    assert e.signature == sig and e.manifest["fingerprint_id"] == kernels.fp.id
    assert e.manifest["compile_seconds"] > 0 and e.manifest["verification"]["ok"] is True
    # Inductor's CPU seconds, its own and its compilers' (the benchmark's breakdown)
    cpu = e.manifest["cpu"]
    assert set(cpu) == {"inductor_own", "inductor_compilers"} and cpu["inductor_own"] > 0
    assert 0 <= cpu["inductor_compilers"] and cpu["inductor_own"] < e.manifest["phases"]["inductor"] * 4
    # the kernel really is the op: run it through the runner
    from aoti_farm.compile.tolerance import compare
    from aoti_farm.compile.runner import flat_tensors
    from aoti_farm.compile.compiler import load_runner

    args, kwargs = S.materialize(sig, seed=7)
    got = load_runner(e.kernel_path, "cpu").run(flat_tensors(sig, args, kwargs))
    assert compare(torch.ops.aten.add.Tensor(*args, **kwargs), got) is None
    # republishing keeps the existing entry (first writer wins)
    before = (e.path / "manifest.msgpack").read_bytes()
    cache.publish(kernels.fp, sig, {KERNEL: e.kernel_path}, {"compile_seconds": 0.0})
    assert (e.path / "manifest.msgpack").read_bytes() == before


_KILL_CHILD = r"""
import os, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {tests!r})
import aoti_farm.cache.store as C
from aoti_farm.cache.store import Cache
from aoti_farm.fingerprint import fingerprint
from conftest import sig_add_alpha

point, marker = sys.argv[1], sys.argv[2]
real = {{"rename": C.os.rename}}

def block(*a, **k):
    open(marker, "w").close()      # tell the parent we are mid-publish
    while True:
        time.sleep(1)

if point == "copy":                 # killed in the middle of copying kernel.so
    def copy_hashed(src, dst):
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read(1000)); g.flush()
            block()
    C._copy_hashed = copy_hashed
else:                               # killed with the entry fully staged, before the rename
    C.os.rename = lambda a, b: block() if "stage-" in str(a) else real["rename"](a, b)
Cache(sys.argv[3]).publish(fingerprint("cpu"), sig_add_alpha(), {{"kernel.so": sys.argv[4]}}, {{}})
print("published")                  # never reached
"""


@pytest.mark.parametrize("point", ["copy", "rename"])
def test_killed_publish_leaves_no_entry_and_repair_cleans_the_orphan(kernels, tmp_path, capsys, point):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    src = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    root, marker = tmp_path / "c", tmp_path / "marker"
    script = tmp_path / "child.py"
    script.write_text(_KILL_CHILD.format(tests=TESTS))
    p = subprocess.Popen([sys.executable, str(script), point, str(marker), str(root), src],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a hang guard only: fails rather than hangs
        while not marker.exists():
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "child never reached the kill point"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL
    cache = Cache(root)
    assert not cache.has_entry(kernels.fp.id, sig.key)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(kernels.fp, sig.key)
    assert ei.value.kind == "missing"
    orphans = os.listdir(root / "tmp")
    assert len(orphans) == 1 and orphans[0].startswith("stage-")
    # a young orphan may be a publish in progress: verify leaves it alone
    rc, out, _ = _cli(capsys, "cache", "verify", "--repair", "--cache-dir", str(root))
    assert rc == 0 and os.listdir(root / "tmp") == orphans
    # once it is over an hour old it is an orphan: reported, then removed by --repair
    old = time.time() - 2 * 3600
    os.utime(root / "tmp" / orphans[0], (old, old))
    rc, out, _ = _cli(capsys, "cache", "verify", "--cache-dir", str(root), "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["by_kind"] == {"orphan": 1}
    rc, out, _ = _cli(capsys, "cache", "verify", "--repair", "--cache-dir", str(root))
    assert rc == 0 and "repaired 1" in out
    assert os.listdir(root / "tmp") == []
    # and the cache still works: the publish that was killed can now succeed
    cache.publish(kernels.fp, sig, {KERNEL: src}, {"compile_seconds": 1.0})
    assert cache.open_entry(kernels.fp, sig.key).key == sig.key


def test_flipped_byte_is_corrupt_a_miss_and_repaired(kernels, tmp_path, capsys):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    others = len(cache.list_keys(kernels.fp.id)) - 1  # what other tests compiled into the session cache
    so = cache.entry_dir(kernels.fp.id, sig.key) / KERNEL
    data = bytearray(so.read_bytes())
    data[len(data) // 3] ^= 0x40
    so.write_bytes(bytes(data))
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(kernels.fp, sig.key)
    assert ei.value.kind == "corrupt" and "sha256" in str(ei.value)
    rc, out, _ = _cli(capsys, "cache", "verify", "--cache-dir", str(cache.root), "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["by_kind"] == {"corrupt": 1} and rep["bad"][0]["key"] == sig.key
    rc, out, _ = _cli(capsys, "cache", "verify", "--repair", "--cache-dir", str(cache.root))
    assert rc == 0 and "(removed)" in out
    assert not cache.has_entry(kernels.fp.id, sig.key)  # a miss now: it will be recompiled
    rc, out, _ = _cli(capsys, "cache", "verify", "--cache-dir", str(cache.root))
    assert rc == 0 and f"verified {others} good entries" in out


class _MustNotCompile:
    """A recorded failure must stop the job before any compiler is called."""

    name = "must-not-compile"

    def options(self):
        return {}

    def compile(self, sig, workdir):
        raise AssertionError("compile called for a signature with a failure record")


def test_failure_records_and_rm_failed(kernels, tmp_path, capsys):
    cache = Cache(tmp_path / "c")
    sig = S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(3, 5), torch.empty(3, 5)), {})
    cache.record_failure(kernels.fp, sig, "compile error: boom", evidence={"x": 1}, attempts=2)
    rec = cache.failure(kernels.fp.id, sig.key)
    assert rec["reason"] == "compile error: boom" and rec["attempts"] == 2 and rec["evidence"] == {"x": 1}
    out = compile_and_publish(cache, _MustNotCompile(), kernels.fp, sig, owner="t")
    assert out.status == "failed" and out.error == "compile error: boom"
    rc, out_, _ = _cli(capsys, "cache", "stats", "--cache-dir", str(cache.root), "--json")
    assert rc == 0 and json.loads(out_)["failures"] == 1
    rc, out_, _ = _cli(capsys, "cache", "ls", "--failed", "--cache-dir", str(cache.root))
    assert "FAILED" in out_ and "boom" in out_
    # an unreadable failure record is reported and repaired
    other = sig_add_alpha((2, 2))
    cache.record_failure(kernels.fp, other, "x")
    cache.failure_path(kernels.fp.id, other.key).write_bytes(b"\xc1garbage")
    rc, out_, _ = _cli(capsys, "cache", "verify", "--repair", "--cache-dir", str(cache.root), "--json")
    rep = json.loads(out_)
    assert rc == 0 and [b["key"] for b in rep["bad"]] == [other.key] and rep["bad"][0]["what"] == "failure-record"
    assert cache.failed_keys(kernels.fp.id) == {sig.key}
    rc, out_, _ = _cli(capsys, "cache", "rm", "--failed", "--cache-dir", str(cache.root))
    assert rc == 0 and "1 failure records" in out_
    assert cache.failure(kernels.fp.id, sig.key) is None and cache.failed_keys(kernels.fp.id) == set()


def _fake_entries(kernels, root, n):
    """n entries of distinct signatures sharing one real kernel file (gc only counts bytes)."""
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    src = kernels.cache.open_entry(kernels.fp, sig.key).kernel_path
    cache = Cache(root)
    sigs = [sig_add_alpha((i + 2, 3)) for i in range(n)]
    for s in sigs:
        cache.publish(kernels.fp, s, {KERNEL: src}, {"compile_seconds": 1.0})
    return cache, sigs, os.path.getsize(src)


def test_gc_evicts_least_recently_used(kernels, tmp_path, capsys):
    cache, sigs, size = _fake_entries(kernels, tmp_path / "c", 4)
    now = time.time()
    # used order, oldest first: sigs[2], sigs[0], sigs[3], sigs[1]; sigs[3] has no `used`
    # file, so its manifest's mtime counts
    for s, age in ((sigs[2], 400), (sigs[0], 300), (sigs[1], 100)):
        e = cache.open_entry(kernels.fp, s.key)
        cache.touch_used(e)
        os.utime(e.path / "used", (now - age, now - age))
    d3 = cache.entry_dir(kernels.fp.id, sigs[3].key) / "manifest.msgpack"
    os.utime(d3, (now - 200, now - 200))
    rc, out, _ = _cli(capsys, "cache", "gc", "--max-size", f"{(2 * size + 4096) // 1024}K",
                      "--cache-dir", str(cache.root), "--json")
    rep = json.loads(out)
    assert rc == 0
    assert [e["key"] for e in rep["evicted"]] == [sigs[2].key, sigs[0].key]
    assert cache.list_keys(kernels.fp.id) == {sigs[3].key, sigs[1].key}
    assert rep["bytes_after"] <= rep["max_bytes"]
    # nothing to do under the limit
    rc, out, _ = _cli(capsys, "cache", "gc", "--max-size", "2G", "--cache-dir", str(cache.root))
    assert rc == 0 and "evicted 0" in out and len(cache.list_keys(kernels.fp.id)) == 2


def test_rm_by_key_prefix_and_all(kernels, tmp_path, capsys):
    cache, sigs, _ = _fake_entries(kernels, tmp_path / "c", 3)
    rc, out, _ = _cli(capsys, "cache", "rm", sigs[0].key[:12], "--cache-dir", str(cache.root))
    assert rc == 0 and cache.list_keys(kernels.fp.id) == {sigs[1].key, sigs[2].key}
    rc, _, err = _cli(capsys, "cache", "rm", "ab" * 8, "--cache-dir", str(cache.root))
    assert rc == 2 and "no entry" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, "cache", "rm", "--cache-dir", str(cache.root))
    assert rc == 2 and "nothing to remove" in err
    rc, out, _ = _cli(capsys, "cache", "rm", "--all", "--cache-dir", str(cache.root), "--json")
    assert rc == 0 and sorted(json.loads(out)["removed"]) == sorted([sigs[1].key, sigs[2].key])
    assert cache.list_keys(kernels.fp.id) == set()


def test_stats_and_ls(kernels, tmp_path, capsys):
    from aoti_farm.cache import leases, queue as missq

    cache, sigs, size = _fake_entries(kernels, tmp_path / "c", 2)
    queued = sig_add_alpha((9, 9))
    assert missq.enqueue(cache, kernels.fp.id, queued)
    lease = leases.try_acquire(cache, kernels.fp.id, queued.key, "t")
    try:
        rc, out, _ = _cli(capsys, "cache", "stats", "--cache-dir", str(cache.root), "--json")
        st = json.loads(out)
        assert rc == 0 and st["entries"] == 2 and st["queue"] == 1 and st["leases"] == 1
        assert st["bytes"] >= 2 * size and kernels.fp.id in st["fingerprints"]
    finally:
        lease.release()
    rc, out, _ = _cli(capsys, "cache", "ls", "--cache-dir", str(cache.root), "--json")
    rows = json.loads(out)
    assert sorted(r["key"] for r in rows) == sorted(s.key for s in sigs)
    assert all(r["op"] == "aten::add.Tensor" and r["compile_seconds"] == 1.0 and r["bytes"] >= size for r in rows)
    assert {r["description"] for r in rows} == {S.describe(s) for s in sigs}
