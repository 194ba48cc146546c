"""Record configs/examples/mlp_trace.json from a small real model.

    .venv/bin/python scripts/make_example_trace.py [OUT]

The model is an embedding + 2-layer MLP (layernorm, gelu, relu) + softmax, run in
inference mode on a batch of 4 token sequences.  The trace is kept small (about a
dozen unique signatures) because the README's first command compiles all of it.
"""

from __future__ import annotations

import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

import aoti_farm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "configs", "examples", "mlp_trace.json")


class TinyMLP(torch.nn.Module):
    def __init__(self, vocab=64, dim=32, hidden=64, classes=10):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, tokens):
        x = self.emb(tokens).mean(dim=1)          # [B, dim]
        x = self.norm(x)
        x = torch.nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return torch.softmax(x, dim=-1)


def main(out: str = DEFAULT_OUT) -> int:
    torch.manual_seed(0)
    model = TinyMLP().eval()
    tokens = torch.randint(0, 64, (4, 8))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with torch.inference_mode(), aoti_farm.record(out):
        for _ in range(3):  # three identical batches: counts of 3
            model(tokens)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:2]))
