"""The signing key travels by path, end to end: a real `aoti-farm warm` (real Ray, a real
compile in a compile actor) signs what it publishes with the key the actor read from
``[farm] signing_key_file``; the hook's real compile worker signs with the key it read
from ``--signing-key-file``.  Neither process has the key in its arguments or environment
(checked in /proc while it runs, where it can be)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import BadEntry, Cache
from aoti_farm.fingerprint import fingerprint

KEY = b"fleet-secret-e2e"


def _key_file(tmp_path):
    f = tmp_path / "fleet.key"
    f.write_bytes(KEY + b"\n")
    os.chmod(f, 0o600)
    return f


def _procs_holding_the_key() -> list[str]:
    """Processes of this user whose command line or environment holds the key."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if KEY in f.read():
                        found.append(f"{pid}:{part}")
            except OSError:
                pass
    return found


def test_a_signed_warm_signs_with_the_key_the_actor_read(tmp_path):
    sig = S.from_call(torch.ops.aten.relu.default, (torch.empty(7, 3),), {})
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"format": "aoti-farm-trace", "version": 1,
                                 "entries": [{"order": 0, "count": 1, "op": sig.op, "args": sig.to_obj()["args"]}]}))
    key = _key_file(tmp_path)
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[farm]\nsigning_key_file = "{key}"\n')
    cache = tmp_path / "cache"
    ray_tmp = tempfile.mkdtemp(prefix="afk", dir="/tmp")   # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    env.update({"TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONWARNINGS": "ignore", "RAY_TMPDIR": ray_tmp})
    try:
        p = subprocess.Popen([sys.executable, "-m", "aoti_farm", "warm", "--model", str(trace), "--cache-dir",
                              str(cache), "--cpu-workers", "1", "--config", str(toml)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        holders = set()
        while p.poll() is None:
            holders.update(_procs_holding_the_key())
            time.sleep(0.5)
        out, err = p.communicate(timeout=900)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, err[-3000:]
    assert not holders, f"processes with the key in their arguments or environment: {holders}"
    fp = fingerprint("cpu")
    assert Cache(cache, signing_key=KEY).open_entry(fp, sig.key).key == sig.key   # signed with the file's key
    with pytest.raises(BadEntry) as e:
        Cache(cache, signing_key=b"another-key").open_entry(fp, sig.key)
    assert e.value.kind == "forged"


def test_the_hooks_compile_worker_signs_with_the_key_file_it_was_named(tmp_path, monkeypatch):
    from aoti_farm.runtime import Settings, install

    for v in [k for k in os.environ if k.startswith("AOTI_FARM_")]:
        monkeypatch.delenv(v)
    key = _key_file(tmp_path)
    cache = tmp_path / "cache"
    a, b = torch.randn(5, 9), torch.randn(9)
    fp = fingerprint("cpu")
    sig = S.from_call(torch.ops.aten.sub.Tensor, (a, b), {})
    with install(cache_dir=cache, ops=["aten::sub.Tensor"], on_miss="compile", serve="always",
                 signing_key_file=str(key), settings=Settings(native="off")) as hook:
        torch.sub(a, b)                         # a miss: the worker compiles it
        holders = set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not Cache(cache).has_entry(fp.id, sig.key):
            holders.update(_procs_holding_the_key())
            time.sleep(0.5)
        worker = hook.worker
    assert Cache(cache).has_entry(fp.id, sig.key), "the worker published nothing"
    assert not holders, f"processes with the key in their arguments or environment: {holders}"
    assert worker is None or f"--signing-key-file {key}" in " ".join(worker.args)
    assert Cache(cache, signing_key=KEY).open_entry(fp, sig.key).key == sig.key
    with pytest.raises(BadEntry):
        Cache(cache, signing_key=b"another-key").open_entry(fp, sig.key)
