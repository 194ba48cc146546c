"""The per-host preparation builds the serving hit path's extension from its start, beside
its own compile, and returns only once that build is whole (aoti_farm/hostprep.py)."""

from __future__ import annotations

import threading
import time

from aoti_farm import hitpath, hostprep


def test_prepare_builds_the_missing_extension_beside_its_compile(tmp_path, monkeypatch):
    lib = tmp_path / "native" / "ext.so"
    seen = {}

    def build():
        seen["thread"] = threading.current_thread().name
        time.sleep(0.2)   # still building when the compile part returns
        lib.parent.mkdir(parents=True)
        lib.write_bytes(b"x")
        return lib

    monkeypatch.setattr(hitpath, "library_path", lambda: lib)
    monkeypatch.setattr(hitpath, "build", build)
    monkeypatch.setattr(hitpath, "disabled", lambda: False)
    monkeypatch.setattr(hostprep, "_prepare", lambda options, factory, t0: {"status": "prepared"})
    assert hostprep.prepare()["status"] == "prepared"
    assert lib.exists() and seen["thread"] == "aoti-farm-hitpath-build"   # built, whole, in its thread

    calls = []
    monkeypatch.setattr(hitpath, "build", lambda: calls.append(1))
    assert hostprep.prepare()["status"] == "prepared" and calls == []     # built already: nothing
    lib.unlink()
    monkeypatch.setattr(hitpath, "disabled", lambda: True)
    assert hostprep.prepare()["status"] == "prepared" and calls == []     # AOTI_FARM_NATIVE=0: nothing
