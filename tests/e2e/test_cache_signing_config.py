"""The cache commands honour a configured signing key (``[farm] signing_key_file``), as
``warm`` and ``serve`` do: ``cache verify`` and ``export-upstream`` check entries with it,
``import-upstream`` signs what it adopts, and every cache command fails closed (exit 2) on
a configured key file that is empty.  Before, they read only the environment's key.

One real kernel (the session's ``mul``), published into a cache signed with the key.
"""

from __future__ import annotations

import json

import pytest

from aoti_farm.cache.store import KERNEL, BadEntry, Cache
from aoti_farm.cli import main
from conftest import sig_mul

KEY = b"fleet-secret"


@pytest.fixture
def signed(kernels, tmp_path, monkeypatch):
    for v in ("AOTI_FARM_SIGNING_KEY", "AOTI_FARM_SIGNING_KEY_FILE", "AOTI_FARM_CONFIG", "AOTI_FARM_CACHE_DIR"):
        monkeypatch.delenv(v, raising=False)
    sig = sig_mul()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    e = kernels.cache.open_entry(kernels.fp, sig.key)
    root = tmp_path / "signed"
    Cache(root, signing_key=KEY).publish(kernels.fp, sig, {KERNEL: e.kernel_path}, dict(e.manifest))
    tomls = {}
    for name, content in (("good", KEY), ("wrong", b"another-secret"), ("empty", b"")):
        (tmp_path / f"{name}.key").write_bytes(content)
        t = tmp_path / f"{name}.toml"
        t.write_text(f'[farm]\nsigning_key_file = "{tmp_path / f"{name}.key"}"\n')
        tomls[name] = str(t)
    return root, tomls, sig, kernels.fp


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_verify_and_export_check_with_the_configured_key(signed, tmp_path, capsys):
    root, tomls, sig, _ = signed
    rc, out, _ = _cli(capsys, "cache", "verify", "--cache-dir", str(root), "--config", tomls["good"], "--json")
    assert rc == 0 and json.loads(out)["ok"] == 1, out
    rc, out, _ = _cli(capsys, "cache", "verify", "--cache-dir", str(root), "--config", tomls["wrong"], "--json")
    assert rc == 1 and json.loads(out)["by_kind"] == {"forged": 1}, out
    rc, out, _ = _cli(capsys, "cache", "export-upstream", "--to", str(tmp_path / "up-wrong"),
                      "--cache-dir", str(root), "--config", tomls["wrong"], "--json")
    assert rc == 1 and [b["kind"] for b in json.loads(out)["bad"]] == ["forged"], out
    rc, out, _ = _cli(capsys, "cache", "export-upstream", "--to", str(tmp_path / "up"),
                      "--cache-dir", str(root), "--config", tomls["good"], "--json")
    assert rc == 0 and len(json.loads(out)["exported"]) == 1, out
    # what import-upstream adopts is signed with the configured key
    dst = tmp_path / "imported"
    rc, out, err = _cli(capsys, "cache", "import-upstream", "--from", str(tmp_path / "up"),
                        "--cache-dir", str(dst), "--config", tomls["good"], "--json")
    assert rc == 0 and len(json.loads(out)["adopted"]) == 1, out + err
    [ns] = Cache(dst).fingerprint_ids()       # upstream's Inductor options: a namespace of their own
    assert Cache(dst, signing_key=KEY).open_entry(ns, sig.key).key == sig.key
    with pytest.raises(BadEntry) as e:
        Cache(dst, signing_key=b"another-secret").open_entry(ns, sig.key)
    assert e.value.kind == "forged"


@pytest.mark.parametrize("argv", [("cache", "ls"), ("cache", "stats"), ("cache", "rm", "--failed"),
                                  ("cache", "gc", "--max-size", "1G"), ("cache", "verify")])
def test_every_cache_command_fails_closed_on_an_empty_key_file(signed, capsys, argv):
    root, tomls, _, _ = signed
    rc, out, err = _cli(capsys, *argv, "--cache-dir", str(root), "--config", tomls["empty"])
    assert rc == 2 and "signing key file" in err and "Traceback" not in err, (out, err)
