"""One serving process of the several-processes metrics test (no tests here).

``python tests/_metrics_helpers.py CACHE N GO_FILE``: installs the hook (its metrics port
comes from ``AOTI_FARM_METRICS_PORT``), makes N hits and N+1 misses, prints
``{"port": P, "pid": ...}``, waits for GO_FILE, then prints ``{"stats": hook.stats()}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402


def main(cache: str, n: int, go: str) -> None:
    from aoti_farm.runtime import Settings, install

    hook = install(cache_dir=cache, ops=["aten::add.Tensor"], on_miss="ignore", route="all", serve="always",
                   settings=Settings(poll_interval=0.2))
    a, b = torch.randn(8, 16), torch.randn(16)
    for _ in range(n):
        torch.add(a, b, alpha=2)                       # published: hits
    for _ in range(n + 1):
        torch.add(torch.randn(5, 16), b, alpha=2)      # not published: misses
    s = hook.stats()
    print(json.dumps({"port": s["metrics"]["port"], "pid": os.getpid()}), flush=True)
    end = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.02)
    print(json.dumps({"stats": hook.stats()}, default=str), flush=True)
    hook.uninstall()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
