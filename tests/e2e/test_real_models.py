"""A real model nobody on the project wrote, served by `aoti-farm run` with the hook's
defaults: Hugging Face GPT-2 (2 layers, 4 heads, width 128, vocab 1,000, random weights,
no hub) generating greedily.  Its trace is recorded, a few of its signatures are warmed
for real (to keep the test short on a small host), then the program runs under the hook:

* its tokens equal eager's, with the defaults and with ``serve="always"`` (where kernels
  run inside generation);
* the program's own ``torch.set_num_threads(2)`` still reads 2 after generation, although
  the hook's compile worker started (on_miss="compile", the default) while it served;
* the stats written at exit describe the hook as it served (ops routed, the summary).

No timing here: that is scripts/bench/real_models.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

GEN = r"""
import json, sys, torch
torch.set_num_threads(2)
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, bos_token_id=0, eos_token_id=None)
m = GPT2LMHeadModel(cfg).eval()
m.generation_config.eos_token_id = None
m.generation_config.pad_token_id = 0
ids = torch.randint(1, 1000, (2, 8))
if len(sys.argv) > 1:
    import aoti_farm
    ctx = aoti_farm.record(sys.argv[1])
else:
    import contextlib
    ctx = contextlib.nullcontext()
with ctx, torch.no_grad():
    out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
print(json.dumps({"tokens": out.tolist(), "threads": torch.get_num_threads()}))
"""

KEEP = ("aten::native_layer_norm", "aten::tanh")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    env.update(kw)
    return env


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    from aoti_farm.trace import Trace, load_trace, save_trace

    d = tmp_path_factory.mktemp("gpt2")
    (d / "gen.py").write_text(GEN)
    full = d / "full.json"
    p = subprocess.run([sys.executable, str(d / "gen.py"), str(full)], capture_output=True, text=True,
                       timeout=600, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    eager = _last_json(p.stdout)
    part = Trace([e for e in load_trace(full) if e.sig.op in KEEP])
    assert len(part) >= 2
    save_trace(part, d / "part.json")
    cli = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    w = subprocess.run([cli, "warm", "--model", str(d / "part.json"), "--cache-dir", str(d / "cache")],
                       capture_output=True, text=True, timeout=1500, env=_env())
    assert w.returncode == 0, (w.stdout + w.stderr)[-3000:]
    return d, eager, len(part)


@pytest.mark.parametrize("serve", ["faster", "always"])
def test_gpt2_generation_served_with_identical_tokens_and_threads(warmed, serve):
    d, eager, n = warmed
    stats = d / f"stats-{serve}"
    stats.mkdir()
    cli = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    env = _env(AOTI_FARM_HOOK_STATS=str(stats), **({"AOTI_FARM_SERVE": "always"} if serve == "always" else {}))
    p = subprocess.run([cli, "run", "--cache-dir", str(d / "cache"), "--", sys.executable, str(d / "gen.py")],
                       capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = _last_json(p.stdout)
    assert got["tokens"] == eager["tokens"]
    assert got["threads"] == 2 == eager["threads"]          # the program's own count, untouched
    assert "previously registered kernel" not in p.stderr, p.stderr[-2000:]
    (f,) = list(stats.iterdir())
    st = json.loads(f.read_text())
    sm = st["summary"]
    assert st["uninstalled"] and st["route"] == "paying" and st["yield_core"]["lowered"] == 0
    assert sm["calls"] == sm["served"] + sum(sm["not_served"].values()) > 0, sm
    if serve == "always":
        assert st["routed_ops"] > 0 and sm["served"] > 0, sm   # kernels ran inside generation
        assert st["native"]["active"] or st["native"].get("reason") != "no op routed", st["native"]
