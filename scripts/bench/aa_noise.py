#!/usr/bin/env python
"""A/A noise of a launch-bound model on CUDA: eager against eager, in the payoff
benchmark's phases (5 batches of ~120 ms, median; an idle gap of 0.5 s between phases),
16 phases free and 16 with the process pinned to one core.  The ratio of two consecutive
eager phases is what a hook/eager ratio of one payoff round cannot resolve below.

    python scripts/bench/aa_noise.py          # needs transformers and a CUDA GPU
"""
import os, time, statistics, gc, sys, torch
from transformers import BertConfig, BertModel
torch.manual_seed(2)
cfg = BertConfig(vocab_size=1000, max_position_embeddings=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
m = BertModel(cfg).eval().cuda()
ids = torch.randint(0, 1000, (2, 32)).cuda(); att = torch.ones(2, 32, dtype=torch.long).cuda()
f = lambda: m(input_ids=ids, attention_mask=att).last_hidden_state
def batch(n):
    torch.cuda.synchronize(); gc.disable(); t = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); d = time.perf_counter() - t; gc.enable(); return d / n * 1e6
with torch.no_grad():
    for _ in range(50): f()
    n = max(1, int(0.12 / (batch(20) / 1e6)))
    print('n', n, flush=True)
    for label in ('free', 'pinned'):
        if label == 'pinned':
            os.sched_setaffinity(0, {2})
        phases = []
        for p in range(16):
            phases.append(statistics.median(batch(n) for _ in range(5)))
            time.sleep(0.5)   # an idle gap, as between payoff phases
        r = [phases[i + 1] / phases[i] for i in range(0, 16, 2)]
        print(label, 'phase us', [round(x) for x in phases], flush=True)
        print(label, 'pair ratios', [round(x, 3) for x in r], 'median', round(statistics.median(r), 3), flush=True)
