"""`aoti-farm run` and `install()` resolve the same settings: a real `aoti-farm run` (its
parent resolves, its child's sitecustomize installs the hook with what the parent handed
over) prints the settings its hook was installed with; this process resolves the same
environment and TOML file the way `install()` does.  One subprocess, no compile (an empty
cache, misses ignored, the native path off)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from aoti_farm.runtime import settings

EXE = os.path.join(os.path.dirname(sys.executable), "aoti-farm")

PRINT = ("import dataclasses, json; from aoti_farm.runtime import launch; "
         "print('SETTINGS=' + json.dumps(dataclasses.asdict(launch.BOOTED)))")


def test_run_and_install_resolve_the_same_settings(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"fleet-secret\n")
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[hook]\nserve = "always"\npoll_interval = 0.5\nwiden = "off"\ninstall_trial = 0\n'
                    f'devices = ["cpu"]\nsigning_key_file = "{key}"\non_miss = "compile"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    env.update({"AOTI_FARM_CONFIG": str(toml), "AOTI_FARM_ON_MISS": "ignore", "AOTI_FARM_NATIVE": "0",
                "AOTI_FARM_CACHE_DIR": str(tmp_path / "cache"), "AOTI_FARM_EXPLAIN_MISSES": "1",
                "PYTHONWARNINGS": "ignore"})
    r = subprocess.run([EXE, "run", "--", sys.executable, "-c", PRINT], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [line] = [x for x in r.stdout.splitlines() if x.startswith("SETTINGS=")]
    by_run = json.loads(line[len("SETTINGS="):])
    by_install = json.loads(json.dumps(dataclasses.asdict(settings.resolve(env=env).config)))
    assert by_run == by_install
    # the environment over the file, the file over the defaults, for both
    assert (by_run["on_miss"], by_run["explain_misses"], by_run["serve"], by_run["poll_interval"],
            by_run["signing_key_file"]) == ("ignore", True, "always", 0.5, str(key))
    assert "fleet-secret" not in r.stdout + r.stderr
