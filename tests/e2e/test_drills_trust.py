"""Drills 3, 6 and 9 at the cache level: corruption, foreign fingerprints, trust.

Each damaged entry must be refused by ``Cache.open_entry`` -- which runs before any
library is dlopen'ed -- with the right kind, and ``cache verify --repair`` must remove it.
The serving-side half (counted, re-queued, eager meanwhile) is in test_drills_runtime.py.
"""

from __future__ import annotations

import os
import shutil

import msgpack
import pytest

from aoti_farm.cache.store import KERNEL, MANIFEST, BadEntry, Cache, check_key, sign
from aoti_farm.errors import FarmError
from aoti_farm.fingerprint import Fingerprint

from conftest import sig_add_alpha


@pytest.fixture()
def entry(kernels, tmp_path):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = kernels.copy_to(tmp_path / "c")
    cache.open_entry(kernels.fp, sig.key)  # the pristine copy is fine
    return cache, kernels.fp, sig.key, cache.entry_dir(kernels.fp.id, sig.key)


def _manifest(d):
    return msgpack.unpackb((d / MANIFEST).read_bytes(), raw=False)


def _write_manifest(d, m):
    (d / MANIFEST).write_bytes(msgpack.packb(m, use_bin_type=True))


def _damage(kind, d):
    so = d / KERNEL
    if kind == "truncate":
        with open(so, "r+b") as f:
            f.truncate(os.path.getsize(so) // 2)
    elif kind == "flip":
        data = bytearray(so.read_bytes())
        data[len(data) // 2] ^= 0x01
        so.write_bytes(bytes(data))
    elif kind == "garbage-manifest":
        (d / MANIFEST).write_bytes(os.urandom(300))
    elif kind == "delete":
        so.unlink()
    elif kind == "path-outside":
        m = _manifest(d)
        m["files"]["../../../../etc/passwd"] = m["files"].pop(KERNEL)
        m["files"][KERNEL] = m["files"]["../../../../etc/passwd"]
        _write_manifest(d, m)
    elif kind == "changed-not-hash":
        with open(so, "ab") as f:
            f.write(b"\0" * 16)
    else:
        raise AssertionError(kind)


EXPECTED = {"truncate": "corrupt", "flip": "corrupt", "garbage-manifest": "corrupt",
            "delete": "missing", "path-outside": "corrupt", "changed-not-hash": "corrupt"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_corruption_detected_before_load(entry, kind):
    cache, fp, key, d = entry
    _damage(kind, d)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == EXPECTED[kind], str(ei.value)
    print(f"drill corruption/{kind}: refused as {ei.value.kind}: {ei.value}")


def test_foreign_fingerprint_is_refused(entry):
    cache, fp, key, d = entry
    m = _manifest(d)
    m["fingerprint"] = dict(m["fingerprint"], cpu_isa="neon")  # built for another ISA
    _write_manifest(d, m)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "foreign"
    # and an entry of another torch build in its own namespace is simply never looked at
    other = Fingerprint(tuple(sorted({**fp.as_dict(), "torch": "9.9.9"}.items())))
    assert other.id != fp.id
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(other, key)
    assert ei.value.kind == "missing"


def test_signed_cache_refuses_unsigned_and_forged(entry):
    cache, fp, key, d = entry
    signed = Cache(cache.root, signing_key=b"k1")
    with pytest.raises(BadEntry) as ei:
        signed.open_entry(fp, key)
    assert ei.value.kind == "unsigned"
    m = _manifest(d)
    m["hmac"] = sign(m, b"attacker-key")
    _write_manifest(d, m)
    with pytest.raises(BadEntry) as ei:
        signed.open_entry(fp, key)
    assert ei.value.kind == "forged"
    m["hmac"] = sign(m, b"k1")
    _write_manifest(d, m)
    assert signed.open_entry(fp, key).key == key
    # a valid signature does not make a changed manifest pass
    m["compile_seconds"] = 0.0
    _write_manifest(d, m)
    with pytest.raises(BadEntry) as ei:
        signed.open_entry(fp, key)
    assert ei.value.kind == "forged"


def test_world_writable_refused_unless_allowed(entry):
    cache, fp, key, d = entry
    os.chmod(d, 0o777)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure"
    assert Cache(cache.root, allow_insecure=True).open_entry(fp, key).key == key


def test_symlinked_kernel_refused(entry, tmp_path):
    cache, fp, key, d = entry
    real = tmp_path / "elsewhere.so"
    shutil.move(d / KERNEL, real)
    os.symlink(real, d / KERNEL)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure"


@pytest.mark.parametrize("bad", ["../" * 3 + "etc", "a" * 63 + "/", "/etc/passwd", "..", "ZZ" * 32])
def test_keys_cannot_escape(bad, tmp_path):
    with pytest.raises(FarmError):
        check_key(bad)
    with pytest.raises(FarmError):
        Cache(tmp_path).entry_dir("0" * 24, bad)
    with pytest.raises(FarmError):
        Cache(tmp_path).ns("../" + "0" * 21)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_file_owned_by_another_user_refused(entry):
    cache, fp, key, d = entry
    os.chown(d / KERNEL, 65534, 65534)
    with pytest.raises(BadEntry) as ei:
        cache.open_entry(fp, key)
    assert ei.value.kind == "insecure" and "owned by uid 65534" in str(ei.value)
    assert Cache(cache.root, allow_insecure=True).open_entry(fp, key).key == key


def configured_key():
    from aoti_farm.config import FarmConfig, resolve, signing_key

    return signing_key(resolve(FarmConfig))   # AOTI_FARM_SIGNING_KEY_FILE, through resolve()


def test_signing_key_from_environment_signs_every_publish(entry, tmp_path, monkeypatch):
    cache, fp, key, d = entry
    for name in ("fleet", "another"):
        (tmp_path / f"{name}.key").write_bytes(f"{name}-secret".encode())
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY_FILE", str(tmp_path / "fleet.key"))
    signed = Cache(tmp_path / "signed", signing_key=configured_key())   # the environment's key, resolved once
    assert signed.signing_key == b"fleet-secret"
    sig = cache.open_entry(fp, key).signature
    signed.publish(fp, sig, {KERNEL: d / KERNEL}, {"compile_seconds": 1.0})
    m = _manifest(signed.entry_dir(fp.id, key))
    assert m["hmac"] == sign(m, b"fleet-secret")
    assert signed.open_entry(fp, key).key == key
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY_FILE", str(tmp_path / "another.key"))
    with pytest.raises(BadEntry) as ei:
        Cache(tmp_path / "signed", signing_key=configured_key()).open_entry(fp, key)
    assert ei.value.kind == "forged"


def test_a_built_kernel_asks_for_no_executable_stack(entry):
    """AOTInductor links its constants from an assembly file without a ``.note.GNU-stack``,
    so its libraries ask ``dlopen`` for an executable stack (for every thread of the serving
    process).  The compiler clears that request before verification; the published library
    is plain ``RW`` (aoti_farm/cache/elfstack.py), and a library that still asks is refused."""
    from aoti_farm.cache import elfstack

    cache, fp, key, d = entry
    fd = os.open(d / KERNEL, os.O_RDONLY)
    try:
        assert elfstack.exec_stack_request(fd) is None
    finally:
        os.close(fd)
    assert cache.open_entry(fp, key).manifest["build"].get("exec_stack") == "cleared"
