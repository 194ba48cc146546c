"""A test double for :class:`aoti_farm.compile.compiler.Compiler` (scheduler and job unit tests only).

``ScriptedCompiler`` never runs Inductor.  What it does for a signature is read from a
script file (JSON ``{key: action}``) named by ``$AOTI_FARM_TEST_SCRIPT`` or the
``script`` argument; actions:

* ``"ok"``        -- write a small placeholder ``kernel.so`` (not a loadable library);
* ``"refuse"``    -- raise :class:`CompileRefused` (a deterministic failure);
* ``"crash"``     -- raise RuntimeError (an infrastructure failure);
* ``"hang-once"`` -- the first call for the key sleeps for an hour, later calls are "ok";
* ``"sleep:S"``   -- sleep S seconds, then "ok";
* ``"timed"``     -- "ok", with a speed record and ``threads="dynamic"`` (as a real compile).

Every call appends ``start <key> <pid>`` / ``end <key> <pid>`` lines to ``<script>.log``
(with O_APPEND), so tests can count compiles and check concurrency from the order of
lines, without timing anything.
"""

from __future__ import annotations

import json
import os
import time

from aoti_farm.compile.compiler import CompileResult
from aoti_farm.errors import CompileRefused


#: The speed record of a "timed" compile (the manifest's ``speed`` field).
TIMED_SPEED = {"kernel_us": 5.0, "eager_us": 10.0, "ratio": 0.5, "rounds": 7, "threads": 1, "device": "cpu"}


class ScriptedCompiler:
    name = "scripted-test-double"

    def __init__(self, inductor_options: dict | None = None, script: str | None = None):
        self._options = dict(inductor_options or {})
        self.script = script or os.environ["AOTI_FARM_TEST_SCRIPT"]

    def options(self) -> dict:
        return dict(self._options)

    def _log(self, what: str, key: str) -> None:
        fd = os.open(self.script + ".log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{what} {key} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    def compile(self, sig, workdir: str) -> CompileResult:
        with open(self.script) as f:
            action = json.load(f).get(sig.key, "ok")
        self._log("start", sig.key)
        try:
            if action == "refuse":
                raise CompileRefused("scripted refusal", {"script": True})
            if action == "crash":
                raise RuntimeError("scripted crash")
            if action == "hang-once":
                marker = f"{self.script}.{sig.key}.seen"
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    time.sleep(3600)
                except FileExistsError:
                    pass
            if action.startswith("sleep:"):
                time.sleep(float(action.split(":", 1)[1]))
            path = os.path.join(workdir, "kernel.so")
            with open(path, "wb") as f:
                f.write(b"placeholder for " + sig.key.encode())
            timed = action == "timed"
            return CompileResult(files={"kernel.so": path}, seconds=0.0, verification={"double": True},
                                 speed=TIMED_SPEED if timed else None, threads="dynamic" if timed else None)
        finally:
            self._log("end", sig.key)
