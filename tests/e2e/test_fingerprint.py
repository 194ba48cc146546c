"""The host fingerprint's CPU ISA: aoti-farm probes Inductor's candidate ISAs at once
(fingerprint._prefetch_checks); the answer must be what Inductor itself picks
when it probes them one after another, on a cold host memo and a cold Inductor cache."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import sys, warnings
warnings.filterwarnings("ignore")
from torch._inductor import cpu_vec_isa
if sys.argv[1] == "farm":
    from aoti_farm.fingerprint import cpu_isa
    print(cpu_isa())
else:
    print(str(cpu_vec_isa.pick_vec_isa()))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the parallel probe is x86 only")
def test_parallel_isa_probe_picks_what_inductor_picks(tmp_path):
    def run(who, ind):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / ind), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
        p = subprocess.run([sys.executable, "-c", PROBE, who], env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout.strip().splitlines()[-1]

    farm = run("farm", "ind-farm")
    inductor = run("inductor", "ind-inductor")   # its own sequential probes, cold cache too
    assert farm == inductor, (farm, inductor)
    memo = list((tmp_path / "xdg" / "aoti-farm-private").glob("isa-*.json"))
    assert len(memo) == 1 and farm in memo[0].read_text()
