"""The signing key reaches child processes by the path of its file, never as an argument
or an environment variable: the hook's compile worker gets ``--signing-key-file``, a Ray
compile actor gets ``signing_key_file`` and reads the key itself.  A key file is checked
as the cache's own files are (owner this user or root, not world-writable).  No compile,
no Ray, no subprocess."""

from __future__ import annotations

import inspect
import os
import stat
import threading
from types import SimpleNamespace

import pytest

from aoti_farm import config
from aoti_farm.cache.store import Cache
from aoti_farm.config import FarmConfig, key_file_for_children, load_signing_key
from aoti_farm.errors import UserError
from aoti_farm.runtime.room import ThreadRoom
from aoti_farm.runtime.supervisor import WorkerSupervisor, worker_env

KEY = b"fleet-secret"


def _supervisor(tmp_path, key, key_file):
    return WorkerSupervisor(Cache(tmp_path / "c", signing_key=key), {"cpu": SimpleNamespace(id="0" * 24)}, {},
                            str(tmp_path / "log"), 1.0, ThreadRoom(), threading.Event(), None, key_file)


def test_a_world_writable_key_file_is_refused(tmp_path):
    f = tmp_path / "key"
    f.write_bytes(KEY)
    os.chmod(f, 0o600)
    assert load_signing_key(path=str(f)) == KEY
    os.chmod(f, 0o666)
    with pytest.raises(UserError, match=f"signing key file {f}: is writable by others; fix signing_key_file"):
        load_signing_key(path=str(f))


def test_the_key_in_the_environment_is_refused_not_ignored(monkeypatch):
    """Fail closed: a key that used to be read from AOTI_FARM_SIGNING_KEY is an error that
    names the key file variable, never "no signing"."""
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY", "fleet-secret")
    with pytest.raises(UserError, match="AOTI_FARM_SIGNING_KEY: no longer read.*AOTI_FARM_SIGNING_KEY_FILE"):
        load_signing_key()
    with pytest.raises(UserError, match="AOTI_FARM_SIGNING_KEY_FILE"):
        config.resolve(FarmConfig)


def test_the_compile_worker_gets_the_keys_path_never_the_key(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_bytes(KEY + b"\n")
    monkeypatch.setenv("AOTI_FARM_SIGNING_KEY_FILE", str(f))
    cmd = _supervisor(tmp_path, KEY, str(f)).command("cpu")
    assert cmd[cmd.index("--signing-key-file") + 1] == str(f)
    assert not any(KEY.decode() in a for a in cmd)
    env = worker_env()
    assert not any(k.startswith("AOTI_FARM_SIGNING_KEY") for k in env)
    assert not any(KEY.decode() in v for v in env.values())
    assert "--signing-key-file" not in _supervisor(tmp_path, None, None).command("cpu")


def test_a_key_given_as_bytes_reaches_the_worker_as_a_private_file(tmp_path):
    """install(settings=Settings(signing_key=b"...")) has no file: the hook writes one of its own, 0600 in a
    0700 directory, and names that."""
    cmd = _supervisor(tmp_path, KEY, None).command("cpu")
    path = cmd[cmd.index("--signing-key-file") + 1]
    assert not any(KEY.decode() in a for a in cmd)
    st, dst = os.stat(path), os.stat(os.path.dirname(path))
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_IMODE(dst.st_mode) == 0o700
    assert st.st_uid == os.getuid() and load_signing_key(path=path) == KEY
    assert _supervisor(tmp_path, KEY, None).command("cpu") == cmd   # one file per key


def test_a_compile_actor_takes_the_keys_path(tmp_path, monkeypatch):
    from aoti_farm.workers import raysetup
    from aoti_farm.workers.compile_actor import CompileActor

    params = inspect.signature(CompileActor.__init__).parameters
    assert "signing_key_file" in params and "signing_key" not in params
    f = tmp_path / "key"
    f.write_bytes(KEY)
    signed = SimpleNamespace(signing_key=KEY)
    assert raysetup._key_file(FarmConfig(signing_key_file=str(f)), signed) == str(f)
    assert raysetup._key_file(FarmConfig(), SimpleNamespace(signing_key=None)) is None
    # one rule for every child: a key travels by path; a key given as bytes gets a private
    # file of this process, which an embedded Ray's actors (this host's processes) read ...
    monkeypatch.setattr(raysetup, "_EMBEDDED_ENV", {})
    path = raysetup._key_file(FarmConfig(), signed)
    assert load_signing_key(path=path) == KEY and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path == key_file_for_children(KEY, None)                  # the hook's worker gets the same file
    # ... and a cluster's actors (other hosts) cannot: refused, not dropped
    monkeypatch.setattr(raysetup, "_EMBEDDED_ENV", None)
    with pytest.raises(UserError, match="signing_key_file"):
        raysetup._key_file(FarmConfig(), signed)
    # the actor reads the file itself when it builds its cache (no compile here: doubles
    # for the compiler and the fingerprint, the real key read)
    import aoti_farm.cache.store
    import aoti_farm.fingerprint

    built = {}

    class SpyCache:
        def __init__(self, root, signing_key=None):
            built["key"] = signing_key

    monkeypatch.setattr(aoti_farm.cache.store, "Cache", SpyCache)
    monkeypatch.setattr(aoti_farm.fingerprint, "fingerprint", lambda device, options: SimpleNamespace(id="0" * 24))
    factory = lambda options: SimpleNamespace(options=lambda: {})   # noqa: E731
    CompileActor(str(tmp_path / "c"), signing_key_file=str(f), compiler_factory=factory)._setup()
    assert built["key"] == KEY


@pytest.mark.parametrize("env", [{"AOTI_FARM_SIGNING_KEY_FILE": ""}, {"AOTI_FARM_SIGNING_KEY_FILE": " "}])
def test_a_key_file_variable_set_but_empty_fails_closed(env):
    from aoti_farm.runtime import settings

    with pytest.raises(UserError, match="AOTI_FARM_SIGNING_KEY_FILE: set but empty"):
        config.signing_key(config.resolve(FarmConfig, env=env), env)
    with pytest.raises(UserError, match="AOTI_FARM_SIGNING_KEY_FILE: set but empty"):
        settings.resolve(env=env)
