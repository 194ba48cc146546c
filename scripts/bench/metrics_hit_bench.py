"""Does exporting metrics cost the hit path anything? (the aim: metrics
cost nothing on the hit path).

One process, one hook serving add(64,128)+(64,128) from a real kernel (compiled into
--dir on first use), three conditions interleaved round by round (the order rotates):

* ``eager``: with no hook installed (its rounds run before install and after uninstall);
* ``hook``: hits with no metrics endpoint being scraped;
* ``hook+scrape``: the same hook while its metrics endpoint (``metrics_port``) is scraped
  over HTTP every --scrape-interval seconds by a thread of this process (Prometheus's
  default is 15 s; 1 s is a stress setting).

Prints per-call medians (µs) and the ratios hook/eager, (hook+scrape)/hook.

    .venv/bin/python scripts/bench/metrics_hit_bench.py [--rounds 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import compile_into, machine  # noqa: E402


def per_call(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--scrape-interval", type=float, default=0.5)
    ap.add_argument("--dir", default=None, help="where the bench cache is built (default: a fresh temporary directory)")
    import common
    common.add_output_args(ap, "metrics-hit")
    a = ap.parse_args(argv)
    import torch

    from aoti_farm import signature as S

    x, y = torch.randn(64, 128), torch.randn(64, 128)
    sig = S.from_call(torch.ops.aten.add.Tensor, (x, y), {})
    cache = os.path.join(a.dir or tempfile.mkdtemp(prefix="aoti-metrics-hit-bench-"), "cache")
    res = compile_into(cache, [sig])
    assert res[0]["status"] in ("compiled", "cached"), res
    add = torch.ops.aten.add.Tensor
    fn = lambda: add(x, y)  # noqa: E731
    eager = []
    for _ in range(a.rounds):
        fn()
        eager.append(per_call(fn, a.calls))

    from aoti_farm.runtime import Settings, install

    hook = install(cache_dir=cache, ops=["aten::add.Tensor"], on_miss="ignore", route="all", serve="always",
                   settings=Settings(metrics_port=0))
    try:
        for _ in range(100):
            fn()
        st = hook.stats()
        assert st["hits"] > 0, st
        port = st["metrics"]["port"]
        stop = threading.Event()
        scrapes = [0]

        def scraper():
            while not stop.wait(a.scrape_interval):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    r.read()
                scrapes[0] += 1

        plain, scraped = [], []
        for r in range(a.rounds):
            order = ("hook", "scrape") if r % 2 == 0 else ("scrape", "hook")
            for which in order:
                if which == "scrape":
                    stop.clear()
                    t = threading.Thread(target=scraper, daemon=True)
                    t.start()
                    scraped.append(per_call(fn, a.calls))
                    stop.set()
                    t.join()
                else:
                    plain.append(per_call(fn, a.calls))
        st = hook.stats()
    finally:
        hook.uninstall()
    for _ in range(a.rounds):
        eager.append(per_call(fn, a.calls))
    med = statistics.median
    out = {"bench": "metrics_hit", "machine": machine(), "calls_per_round": a.calls, "rounds": a.rounds,
           "scrape_interval_s": a.scrape_interval, "scrapes": scrapes[0], "native": st["native"].get("active"),
           "eager_us": [round(v, 3) for v in eager], "hook_us": [round(v, 3) for v in plain],
           "hook_scrape_us": [round(v, 3) for v in scraped],
           "median_us": {"eager": round(med(eager), 3), "hook": round(med(plain), 3),
                         "hook+scrape": round(med(scraped), 3)},
           "ratio_hook_to_eager": round(med(plain) / med(eager), 3),
           "ratio_scrape_to_hook": round(med(scraped) / med(plain), 3),
           "paired_scrape_to_hook": [round(s / p, 3) for s, p in zip(scraped, plain)]}
    print(json.dumps(out, indent=1))
    common.write_output(a, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
