"""Interop with torch's own AOTI-eager cache and holder (aoti_farm/interop/upstream.py,
runtime/upstream.py).

Upstream's C++ holder is real in every test: it runs in a fresh subprocess (registering
``Library("aten", "IMPL")._impl_with_aoti_compile`` and compile backends is process-wide).
Kernels come from the session cache (``kernels``): add(alpha=2), mul and div(trunc) --
one real compile each per session -- plus one compile by upstream itself (module fixture
``upstream_dir``) to check our metadata against what upstream writes.

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_upstream.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.interop import upstream as U
from aoti_farm.cli import upstream_cmds
from aoti_farm.cache.store import Cache

from conftest import sig_add_alpha, sig_mul

REPO = Path(__file__).resolve().parents[2]


def sig_div_trunc(shape=(8, 16)):
    a, b = torch.empty(shape), torch.empty(shape)
    return S.from_call(torch.ops.aten.div.Tensor_mode, (a, b), {"rounding_mode": "trunc"})


def run_py(code: str, env_extra: dict | None = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON document as its last line."""
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONWARNINGS": "ignore",
           **(env_extra or {})}
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"subprocess failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warmed(kernels):
    for sig in (sig_add_alpha(), sig_mul(), sig_div_trunc()):
        out = kernels.ensure(sig)
        assert out.status in ("compiled", "cached"), out
    return kernels


@pytest.fixture(scope="module")
def upstream_dir(tmp_path_factory):
    """A cache written by upstream's own holder + aoti_compile_with_persistent_cache for
    one call, add(f32[8,16], f32[16], alpha=2)."""
    d = tmp_path_factory.mktemp("upstream-written")
    out = run_py("""
        import json, torch
        a, b = torch.randn(8, 16), torch.randn(16)
        expected = torch.ops.aten.add.Tensor(a, b, alpha=2)
        lib = torch.library.Library("aten", "IMPL")
        lib._impl_with_aoti_compile("add.Tensor", "CPU")
        got = torch.ops.aten.add.Tensor(a, b, alpha=2)
        lib._destroy()
        print(json.dumps({"ok": bool(torch.allclose(got, expected))}))
    """, {"TORCHINDUCTOR_CACHE_DIR": str(d)})
    assert out["ok"]
    return d


# --- upstream's own cache ------------------------------------------------------------------


def test_upstream_written_json_equals_ours_and_imports(upstream_dir, tmp_path):
    data = json.loads((upstream_dir / "aoti_eager/aten/cpu/add.Tensor.json").read_text())
    assert [it["meta_info"] for it in data] == [U.meta_info(sig_add_alpha())]

    cache = Cache(tmp_path / "c", signing_key=None)
    rep = U.import_upstream(cache, upstream_dir)
    assert [r["key"] for r in rep["adopted"]] == [sig_add_alpha().key], rep
    assert not rep["rejected"] and not rep["skipped"]
    fp_id, = cache.fingerprint_ids()
    entry = cache.open_entry(fp_id, sig_add_alpha().key)
    assert entry.manifest["compiler"] == "aoti" and entry.manifest["verification"]["ok"]   # built here
    again = U.import_upstream(cache, upstream_dir)
    assert len(again["present"]) == 1 and not again["adopted"]


# --- export: upstream's holder serves our kernels without compiling ------------------------


def test_export_is_served_by_upstream_holder_with_zero_compiles(warmed, tmp_path):
    cache = warmed.copy_to(tmp_path / "cache")
    out_dir = tmp_path / "inductor"
    rep = U.export_upstream(cache, out_dir)
    keys = {e["key"] for e in rep["exported"]}
    assert {sig_add_alpha().key, sig_mul().key, sig_div_trunc().key} <= keys, rep
    assert not rep["bad"]
    item = json.loads((out_dir / "aoti_eager/aten/cpu/add.Tensor.json").read_text())[0]
    assert (out_dir / "aoti_eager/aten/cpu" / item["kernel_path"]).is_file()
    assert not Path(item["kernel_path"]).is_absolute()

    res = run_py("""
        import json, torch
        import torch._inductor.aoti_eager as AE, torch._inductor.utils as IU
        calls = []
        def refuse(*a, **k):
            calls.append(str(a[1]))
            raise RuntimeError("COMPILE-REFUSED-BY-TEST")
        AE.aoti_compile_with_persistent_cache = refuse
        if hasattr(IU, "aoti_compile_with_persistent_cache"):
            IU.aoti_compile_with_persistent_cache = refuse
        g = torch.Generator().manual_seed(7)
        a, b, c = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(8, 16, generator=g)
        ops = torch.ops.aten
        exp = [ops.add.Tensor(a, b, alpha=2), ops.mul.Tensor(a, c), ops.div.Tensor_mode(a, c, rounding_mode="trunc")]
        lib = torch.library.Library("aten", "IMPL")
        for name in ("add.Tensor", "mul.Tensor", "div.Tensor_mode"):
            lib._impl_with_aoti_compile(name, "CPU")
        got = [ops.add.Tensor(a, b, alpha=2), ops.mul.Tensor(a, c), ops.div.Tensor_mode(a, c, rounding_mode="trunc")]
        served_calls = list(calls)
        try:  # a call nobody exported must reach the (refusing) compile: the holder is live
            ops.mul.Tensor(torch.randn(3, 5), torch.randn(3, 5))
            miss = "served"
        except Exception as e:
            miss = "COMPILE-REFUSED-BY-TEST" in str(e) or bool(calls)
        lib._destroy()
        ok = [bool(torch.allclose(x, y)) for x, y in zip(got, exp)] + [bool(torch.equal(got[2], exp[2]))]
        print(json.dumps({"ok": ok, "compiles": served_calls, "miss_reached_compile": miss}))
    """, {"TORCHINDUCTOR_CACHE_DIR": str(out_dir)})
    assert res["compiles"] == []
    assert res["ok"] == [True, True, True, True]
    assert res["miss_reached_compile"] is True


# --- the runtime backend: upstream's holder asks the farm ---------------------------------


def test_backend_serves_warm_cache_and_waits_for_fleet_compile(warmed, tmp_path):
    cache = warmed.copy_to(tmp_path / "cache")
    keep = {sig_add_alpha().key, sig_mul().key, sig_div_trunc().key}
    for key in cache.list_keys(warmed.fp.id) - keep:  # other tests' kernels: not part of this count
        cache.remove(warmed.fp.id, key)
    mul_dir = cache.entry_dir(warmed.fp.id, sig_mul().key)
    aside = tmp_path / "mul-entry"
    os.rename(mul_dir, aside)  # "another worker" publishes it while upstream waits
    res = run_py(f"""
        import json, os, threading, time, torch
        from aoti_farm.cache import leases
        from aoti_farm.compile.compiler import AOTICompiler
        from aoti_farm.runtime import enable_upstream_backend
        compiles = []
        orig = AOTICompiler.compile
        def counting(self, sig, workdir):
            compiles.append(sig.op)
            return orig(self, sig, workdir)
        AOTICompiler.compile = counting
        from aoti_farm.compile import job
        statuses = []
        orig_cap = job.compile_and_publish
        def recording(*a, **k):
            out = orig_cap(*a, **k)
            statuses.append(out.status)
            return out
        job.compile_and_publish = recording

        backend = enable_upstream_backend({str(cache.root)!r}, devices=("cpu",))
        lease = leases.try_acquire(backend.cache, {warmed.fp.id!r}, {sig_mul().key!r}, "other-worker", 600)
        assert lease is not None

        def other_worker():
            while "busy" not in statuses:   # upstream's request found the lease held
                time.sleep(0.02)
            os.rename({str(aside)!r}, {str(mul_dir)!r})
            lease.release()
        t = threading.Thread(target=other_worker, daemon=True)
        t.start()

        g = torch.Generator().manual_seed(3)
        a, b, c = torch.randn(8, 16, generator=g), torch.randn(16, generator=g), torch.randn(8, 16, generator=g)
        ops = torch.ops.aten
        exp = [ops.add.Tensor(a, b, alpha=2), ops.div.Tensor_mode(a, c, rounding_mode="trunc"), ops.mul.Tensor(a, c)]
        lib = torch.library.Library("aten", "IMPL")
        for name in ("add.Tensor", "div.Tensor_mode", "mul.Tensor"):
            lib._impl_with_aoti_compile(name, "CPU")
        after_load = backend.stats()
        got = [ops.add.Tensor(a, b, alpha=2), ops.div.Tensor_mode(a, c, rounding_mode="trunc"), ops.mul.Tensor(a, c)]
        again = ops.mul.Tensor(a, c)  # now in the holder's memory: no second request
        lib._destroy()
        t.join(5)
        backend.disable()
        import torch._inductor.aoti_eager as AE
        print(json.dumps({{"ok": [bool(torch.allclose(x, y)) for x, y in zip(got + [again], exp + [exp[2]])],
                          "after_load": after_load, "stats": backend.stats(), "compiles": compiles,
                          "unregistered": "cpu" not in AE._aoti_compile_backends}}))
    """)
    assert res["compiles"] == []
    assert res["ok"] == [True, True, True, True]
    assert res["after_load"]["loads"] == 3 and res["after_load"]["loaded_kernels"] == 2
    st = res["stats"]
    assert (st["compile_requests"], st["waited"], st["compiled"], st["failed"]) == (1, 1, 0, 0), st
    assert res["unregistered"]
    assert cache.list_keys(warmed.fp.id) == keep  # nothing new was published


# --- import: the signatures, compiled here; no foreign library is ever opened ------------------


def _sha256(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_import_compiles_the_signatures_and_never_uses_the_libraries(warmed, tmp_path, capsys):
    """An upstream cache whose mul "kernel" computes div (same inputs, other values) and
    whose add list also names a library outside the cache: the farm reads only the
    metadata, compiles each signature itself, and what it publishes is its own build."""
    src = warmed.copy_to(tmp_path / "src")
    exp_dir = tmp_path / "inductor"
    U.export_upstream(src, exp_dir)
    dev = exp_dir / "aoti_eager/aten/cpu"
    mul_item = json.loads((dev / "mul.Tensor.json").read_text())[0]
    div_item = json.loads((dev / "div.Tensor_mode.json").read_text())[0]
    shutil.copyfile(dev / div_item["kernel_path"], dev / mul_item["kernel_path"])
    add_items = json.loads((dev / "add.Tensor.json").read_text())
    (dev / "add.Tensor.json").write_text(json.dumps(
        add_items + [{"meta_info": add_items[0]["meta_info"], "kernel_path": "../../../../escape.so"},
                     "not an item", {"meta_info": [{"bogus": 1}], "kernel_path": "x.so"}]))
    foreign = {_sha256(p) for p in dev.rglob("*.so")}

    ns = argparse.Namespace(cache_dir=str(tmp_path / "dst"), src=str(exp_dir), json=True)
    rc = upstream_cmds.import_command(ns)
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and len(rep["skipped"]) == 2, rep   # the two malformed items, named
    adopted = {r["key"] for r in rep["adopted"]}
    assert {sig_add_alpha().key, sig_mul().key, sig_div_trunc().key} <= adopted, rep
    assert not rep["rejected"], rep
    dst = Cache(tmp_path / "dst")
    fp_id, = dst.fingerprint_ids()
    assert fp_id == warmed.fp.id   # the farm's own namespace: it built them as any warm does
    for key in adopted:
        entry = dst.open_entry(fp_id, key)
        assert entry.manifest["compiler"] == "aoti" and entry.manifest["verification"]["ok"]
        assert _sha256(entry.kernel_path) not in foreign
    mul = dst.open_entry(fp_id, sig_mul().key)
    assert mul.signature == sig_mul()


def test_drill_14_a_foreign_library_is_never_loaded_signed_or_believed(warmed, tmp_path, monkeypatch):
    """Drill 14: an upstream cache whose "kernels" are libraries with a constructor that
    steals the signing key through its parent's environment, prints a passing verdict and
    exits.  Importing it with the fleet's key configured runs that code in no process; what
    is published and signed is the farm's own build, and ``cache verify`` calls it good."""
    from _runtime_helpers import build_evil_so

    src = warmed.copy_to(tmp_path / "src")
    exp_dir = tmp_path / "inductor"
    U.export_upstream(src, exp_dir)
    dev = exp_dir / "aoti_eager/aten/cpu"
    marker = tmp_path / "constructor-ran"
    evil = set()
    for item in json.loads((dev / "add.Tensor.json").read_text()):   # every add kernel is foreign code now
        evil.add(_sha256(build_evil_so(str(dev / item["kernel_path"]), str(marker), forge=True)))
    (tmp_path / "fleet.key").write_bytes(b"fleet-secret")
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY_FILE", str(tmp_path / "fleet.key"))
    from aoti_farm.config import load_signing_key

    dst = Cache(tmp_path / "dst", signing_key=load_signing_key())   # the environment's key file
    assert dst.signing_key == b"fleet-secret"
    rep = U.import_upstream(dst, exp_dir)
    assert not marker.exists(), f"foreign code ran: {marker.read_text()}"
    assert sig_add_alpha().key in {r["key"] for r in rep["adopted"]}, rep
    entry = dst.open_entry(dst.fingerprint_ids()[0], sig_add_alpha().key)
    assert entry.manifest["compiler"] == "aoti" and _sha256(entry.kernel_path) not in evil
    r = subprocess.run([str(REPO / ".venv/bin/aoti-farm"), "cache", "verify", "--cache-dir", str(dst.root)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not marker.exists()


def test_drill_14_an_entry_an_earlier_import_signed_is_refused(warmed, tmp_path):
    """A cache written by the earlier import-upstream holds signed entries whose library
    the farm never built: opening one refuses it (``unbuilt``) whatever its HMAC says, so
    the hook never loads it; ``cache verify`` reports it and ``--repair`` removes it."""
    from aoti_farm.cache.store import BadEntry

    key = b"fleet-secret"
    cache = Cache(tmp_path / "c", signing_key=key)
    good = warmed.cache.open_entry(warmed.fp, sig_add_alpha().key)
    cache.publish(warmed.fp, sig_add_alpha(), {"kernel.so": good.kernel_path},
                  {"compiler": "upstream-import", "imported_from": "/elsewhere/add.so", "verification": {"ok": True}})
    with pytest.raises(BadEntry) as e:
        cache.open_entry(warmed.fp, sig_add_alpha().key)
    assert e.value.kind == "unbuilt"
    (tmp_path / "k").write_bytes(key)
    exe = str(REPO / ".venv/bin/aoti-farm")
    env = {**os.environ, "AOTI_FARM_SIGNING_KEY_FILE": str(tmp_path / "k")}
    r = subprocess.run([exe, "cache", "verify", "--cache-dir", str(cache.root), "--json"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["by_kind"] == {"unbuilt": 1}, r.stdout + r.stderr
    r = subprocess.run([exe, "cache", "verify", "--cache-dir", str(cache.root), "--repair"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0 and not cache.has_entry(warmed.fp.id, sig_add_alpha().key), r.stdout + r.stderr
