"""Drills 3, 6, 8 and 9, serving half: a damaged, foreign, unsigned/forged or insecure
entry is refused before dlopen, counted, queued again, and the call returns eager's
result; a cache that turns read-only, full or vanishes never raises into the caller.

The cache-level half (the right ``BadEntry`` kind for every damage) is test_drills_trust.py.
"Before dlopen" is checked on /proc/self/maps: the damaged entry's kernel.so is never
mapped into the process (and the control case shows the check sees a served kernel).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import msgpack
import pytest
import torch

from aoti_farm.cache import queue as missq
from aoti_farm.cache.store import KERNEL, Cache, sign
from aoti_farm.cli import main

from conftest import sig_add_alpha
from e2e.test_drills_trust import EXPECTED, _damage, _manifest, _write_manifest
from e2e.test_drills_util import ro_bind, small_tmpfs, fill


def install(*args, **kw):
    from aoti_farm.runtime import install as _install

    return _install(*args, **kw)


def Settings(**fields):   # noqa: N802 -- the settings object, imported on first use as install() is
    from aoti_farm.runtime import Settings as _Settings

    return _Settings(**fields)


# --- counters ----------------------------------------------------------------------------

def _flat(d, prefix=""):
    out = {}
    if hasattr(d, "__dataclass_fields__"):
        import dataclasses
        d = dataclasses.asdict(d)
    for k, v in (d or {}).items():
        if isinstance(v, dict) or hasattr(v, "__dataclass_fields__"):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def stat(stats, name: str) -> float:
    """A counter of ``hook.stats()`` by its exact (flattened) name."""
    f = _flat(stats)
    assert name in f, f"hook.stats() has no counter {name!r}: {sorted(f)}"
    return f[name]


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture()
def served(kernels, tmp_path):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    cache = Cache(cache.root, signing_key=None)
    return cache, kernels.fp, sig, cache.entry_dir(kernels.fp.id, sig.key)


def _inputs():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, generator=g)
    return a, b, torch.add(a, b, alpha=2)  # eager, before any hook


def _maps() -> set[str]:
    with open("/proc/self/maps") as f:
        return set(f)


def _mapped(st: dict, entry_dir) -> bool:
    """Whether ``serve_once`` (whose stats are ``st``) mapped a library of this entry: the
    shared file itself, or the sealed private copy the hook loads (memfd
    ``aoti-farm-<key[:16]>``), among the mappings that appeared while it was installed."""
    marks = (os.path.realpath(entry_dir / KERNEL), f"memfd:aoti-farm-{entry_dir.name[:16]}")
    return any(m in line for line in st["_new_maps"] for m in marks)


def serve_once(root, flush=False, **kw):
    """Install the hook, make the call twice, uninstall; returns (results, stats).
    ``flush``: wait until the misses have been written (or refused) before taking stats."""
    a, b, expected = _inputs()
    before = _maps()
    hook = install(cache_dir=str(root), on_miss=kw.pop("on_miss", "queue"), settings=Settings(**kw))
    try:
        got = [torch.add(a, b, alpha=2) for _ in range(2)]
        if flush:
            hook.flush()
        stats = hook.stats()
        stats["_new_maps"] = _maps() - before
    finally:
        hook.uninstall()
    for g in got:
        torch.testing.assert_close(g, expected, rtol=0, atol=1e-6)
    return got, stats


# --- drill 3: corruption ------------------------------------------------------------------

FIG3: dict[str, str] = {}


def test_control_good_entry_is_served(served):
    cache, fp, sig, d = served
    _, st = serve_once(cache.root)
    assert stat(st, "hits") >= 1 and _mapped(st, d)
    print(f"drill 3 control: hits={stat(st, 'hits')} mapped=1")


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_corrupt_entry_refused_counted_requeued(served, kind):
    cache, fp, sig, d = served
    _damage(kind, d)
    assert missq.pending(cache, fp.id) == []
    _, st = serve_once(cache.root)
    bad = stat(st, "integrity_failures")
    assert bad >= 1, st
    assert stat(st, "hits") == 0
    assert sig.key in missq.pending(cache, fp.id)
    assert not _mapped(st, d)
    print(f"drill 3 corruption/{kind}: integrity_failures={bad} hits=0 requeued=1 dlopened=0 result=eager")


def test_repair_then_warm_rebuilds(served, tmp_path, capsys):
    cache, fp, sig, d = served
    _damage("flip", d)
    capsys.readouterr()
    rc = main(["cache", "verify", "--repair", "--cache-dir", str(cache.root)])
    out = capsys.readouterr().out
    assert rc == 0 and "repaired 1" in out, out
    assert not cache.has_entry(fp.id, sig.key)
    from aoti_farm.trace import Trace, TraceEntry, save_trace

    trace = tmp_path / "t.json"
    save_trace(Trace([TraceEntry(sig, 1, 0)]), trace)
    from e2e.test_drills_util import EXE, env

    p = subprocess.run([EXE, "warm", "--model", str(trace), "--cache-dir", str(cache.root), "--cpu-workers", "1"],
                       capture_output=True, text=True, env=env(), timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    cache.open_entry(fp, sig.key)
    assert main(["cache", "verify", "--cache-dir", str(cache.root)]) == 0
    _, st = serve_once(cache.root)
    assert stat(st, "hits") >= 1
    print(f"drill 3 repair: removed=1 warm_exit=0 rebuilt=1 verify=clean hits_after={stat(st, 'hits')}")


# --- drill 6: foreign fingerprints --------------------------------------------------------

@pytest.mark.parametrize("field, value", [("torch", "2.99.0+cu999"), ("cpu_isa", "neon sve"),
                                          ("cuda_arch", "sm_90")])
def test_foreign_entry_never_served(served, field, value):
    cache, fp, sig, d = served
    m = _manifest(d)
    m["fingerprint"] = dict(m["fingerprint"], **{field: value})
    _write_manifest(d, m)
    _, st = serve_once(cache.root)
    assert stat(st, "foreign") >= 1 and stat(st, "hits") == 0 and not _mapped(st, d)
    print(f"drill 6 foreign/{field}: foreign={stat(st, 'foreign')} hits=0 dlopened=0")


def test_entry_moved_from_another_namespace(served):
    """An entry copied in from another fingerprint's namespace (fingerprint_id disagrees)."""
    cache, fp, sig, d = served
    m = _manifest(d)
    m["fingerprint_id"] = "f" * 24
    _write_manifest(d, m)
    _, st = serve_once(cache.root)
    assert stat(st, "foreign") >= 1 and stat(st, "hits") == 0
    print(f"drill 6 foreign/namespace: foreign={stat(st, 'foreign')} hits=0")


# --- drill 9: trust -------------------------------------------------------------------------

def test_signed_serving_refuses_unsigned_and_forged(served, monkeypatch, tmp_path):
    cache, fp, sig, d = served
    (tmp_path / "fleet.key").write_bytes(b"fleet-secret")
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY_FILE", str(tmp_path / "fleet.key"))
    _, st = serve_once(cache.root)                      # the entry is unsigned
    unsigned = stat(st, "integrity_failures")
    assert unsigned >= 1 and stat(st, "hits") == 0 and not _mapped(st, d)
    m = _manifest(d)
    m["hmac"] = sign(m, b"attacker-key")
    _write_manifest(d, m)
    _, st = serve_once(cache.root)
    forged = stat(st, "integrity_failures")
    assert forged >= 1 and stat(st, "hits") == 0 and not _mapped(st, d)
    m["hmac"] = sign(m, b"fleet-secret")                 # control: properly signed is served
    _write_manifest(d, m)
    _, st = serve_once(cache.root)
    assert stat(st, "hits") >= 1
    print(f"drill 9 signing: unsigned_refused={unsigned} forged_refused={forged} signed_hits={stat(st, 'hits')}")


def test_world_writable_entry_refused_unless_allowed(served):
    cache, fp, sig, d = served
    os.chmod(d, 0o777)
    _, st = serve_once(cache.root)
    refused = stat(st, "integrity_failures")
    assert refused >= 1 and stat(st, "hits") == 0 and not _mapped(st, d)
    _, st2 = serve_once(cache.root, allow_insecure=True)
    assert stat(st2, "hits") >= 1
    print(f"drill 9 insecure: refused={refused} hits_with_allow_insecure={stat(st2, 'hits')}")


def test_hostile_queue_items_stay_inside(served, tmp_path):
    """Queue files with hostile names, symlinks out of the cache, endless devices and other
    signatures: every one is refused as a FarmError without reading or writing outside."""
    from aoti_farm.errors import FarmError

    cache, fp, sig, d = served
    q = missq.queue_dir(cache, fp.id)
    q.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.msgpack"
    secret.write_bytes(msgpack.packb({"signature": sig.to_obj(), "key": sig.key}))
    (q / "..%2f..%2fevil.msgpack").write_bytes(b"x")
    (q / "evil.msgpack").write_bytes(msgpack.packb({"signature": sig.to_obj()}))
    os.symlink(secret, q / f"{'1' * 64}.msgpack")              # a symlink out of the cache
    os.symlink("/dev/zero", q / f"{'2' * 64}.msgpack")         # an endless device
    os.mkfifo(q / f"{'3' * 64}.msgpack")                       # a FIFO nobody writes
    (q / f"{'4' * 64}.msgpack").write_bytes(msgpack.packb({"signature": sig.to_obj()}))  # another sig
    before = sorted(os.listdir(outside))
    refused = 0
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from aoti_farm.cache import queue as missq\nfrom aoti_farm.cache.store import Cache\nfrom aoti_farm.errors import FarmError\n"
            f"c = Cache({str(cache.root)!r}, signing_key=None)\nn = 0\n"
            f"for k in missq.pending(c, {fp.id!r}):\n"
            "    try:\n        missq.read(c, %r, k)\n    except FarmError:\n        n += 1\n"
            "print(n)\n" % fp.id)
    # in a child with a liveness bound: a FIFO or /dev/zero must not hang or exhaust it
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert p.returncode == 0, p.stderr[-2000:]
    refused = int(p.stdout.split()[-1])
    assert refused == 4, p.stdout              # every listed item refused
    assert "..%2f..%2fevil" not in missq.pending(cache, fp.id)  # a dot-file is never even listed
    assert "evil" not in missq.pending(cache, fp.id)            # nor a name that is no key
    assert missq.scan(cache, fp.id).junk == ["evil.msgpack"]    # (left for `cache verify --repair`)
    for bad in ("../../x", "..", "/etc/passwd", "0" * 63 + "/"):
        with pytest.raises(FarmError):
            missq.done(cache, fp.id, bad)
        with pytest.raises(FarmError):
            missq.read(cache, fp.id, bad)
    assert sorted(os.listdir(outside)) == before and secret.exists()
    print(f"drill 9 hostile queue: queue_items_refused={refused}/4 non_key_name_unlisted=1 dotfile_ignored=1 "
          f"hostile_keys_refused=4 outside_touched=0")
    # and a manifest naming ../../x.so is refused by the hook before anything is opened
    m = _manifest(d)
    m["files"]["../../x.so"] = m["files"][KERNEL]
    _write_manifest(d, m)
    _, st = serve_once(cache.root)
    assert stat(st, "integrity_failures") >= 1 and stat(st, "hits") == 0
    print(f"drill 9 hostile manifest: manifest_path_refused={stat(st, 'integrity_failures')} hits=0")


# --- drill 8: resource trouble while serving ------------------------------------------------

def test_cache_vanishes_mid_serving(served):
    cache, fp, sig, d = served
    a, b, expected = _inputs()
    hook = install(cache_dir=str(cache.root), on_miss="queue", settings=Settings(poll_interval=0.1))
    try:
        first = torch.add(a, b, alpha=2)
        shutil.rmtree(cache.root)
        after = [torch.add(a, b, alpha=2) for _ in range(3)]
        x = torch.randn(4, 4)
        extra = torch.mul(x, x)         # a miss whose enqueue hits a missing directory
        st = hook.stats()
    finally:
        hook.uninstall()
    for g in [first, *after]:
        torch.testing.assert_close(g, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(extra, x * x)
    print(f"drill 8 vanished cache: calls_after=4 exceptions=0 stats={_flat(st)}")


def test_read_only_and_full_cache_while_serving(served, tmp_path):
    cache, fp, sig, d = served
    shutil.rmtree(d)  # a miss: the hook wants to enqueue it
    with ro_bind(cache.root, tmp_path / "ro") as ro:
        _, st = serve_once(ro, flush=True)
        # no entry, so no hit: what can go wrong is the enqueue, refused and counted
        assert stat(st, "misses") == 2 and stat(st, "queue_errors") >= 1, _flat(st)
        assert missq.pending(Cache(ro, signing_key=None), fp.id) == []
        ro_figs = _flat(st)
    with small_tmpfs(tmp_path / "full", "1m") as mnt:
        # the layout without entries (other tests' kernels would not fit in 1 MiB)
        shutil.copytree(cache.root, mnt / "c", ignore=lambda _, names: [n for n in names if n == "entries"])
        fill(mnt)
        _, st = serve_once(mnt / "c", flush=True)
        assert stat(st, "misses") == 2 and stat(st, "queue_errors") >= 1, _flat(st)
        full_figs = _flat(st)
    print(f"drill 8 serving on read-only cache: exceptions=0 stats={ro_figs}")
    print(f"drill 8 serving on full cache: exceptions=0 stats={full_figs}")
