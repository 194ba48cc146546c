"""The command lines of `aoti-farm warm` and `aoti-farm serve` (the work itself is
:mod:`aoti_farm.workers.warm` and :mod:`aoti_farm.workers.serve`)."""

from __future__ import annotations

import argparse
import os

from aoti_farm.cli import flags
from aoti_farm.config import FarmConfig, resolve
from aoti_farm.errors import UserError


def _pool_args(p: argparse.ArgumentParser) -> None:
    flags.common(p, js=False, table="farm")
    p.add_argument("--address", default=None, help="Ray cluster: 'auto' or host:port (default: $RAY_ADDRESS, "
                   "else an embedded local Ray)")
    p.add_argument("--cpu-workers", type=int, default=None, metavar="N", help="CPU compile actors (default: cluster CPUs)")
    p.add_argument("--gpu-workers", type=int, default=None, metavar="N",
                   help="GPU compile actors (default: cluster GPUs / --gpus-per-worker)")
    p.add_argument("--gpus-per-worker", type=float, default=None, metavar="F",
                   help="fraction of a GPU per GPU actor (default 0.25: four actors share a GPU)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="per-signature compile timeout (default 600)")
    p.add_argument("--retries", type=int, default=None, metavar="K",
                   help="retries after infrastructure failures (default 2); compile errors are never retried")
    p.add_argument("--max-in-flight", type=int, default=None, metavar="N", help="compile calls in flight (default 2 x workers)")
    p.add_argument("--lease-ttl", type=float, default=None, metavar="S", help="lease time-to-live (default 30)")
    flags.memory_budget(p)


def add_warm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", required=True, metavar="TRACE",
                   help="trace.json to warm (repeatable; duplicates across traces are compiled once)")
    _pool_args(p)
    p.add_argument("--report", default=None, metavar="FILE",
                   help="write a JSON report: per signature key, op, status, seconds, worker, attempts, error")
    p.add_argument("--dynamic", default=None, choices=("auto", "off"),
                   help="auto: one shape-general kernel per shape class with >= 2 distinct shapes, exact kernels "
                        "for the rest (default: $AOTI_FARM_DYNAMIC, [farm] dynamic, else off)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    _pool_args(p)
    p.add_argument("--poll-interval", type=float, default=None, metavar="S", help="miss-queue polling (default 1)")
    p.add_argument("--metrics-port", default=None, metavar="PORT",
                   help="serve the farm's counters in the Prometheus format on PORT (the first free of "
                        "PORT..PORT+63; 0: any free port; default $AOTI_FARM_METRICS_PORT, else none)")
    p.add_argument("--metrics-addr", default=None, metavar="ADDR",
                   help="the address the metrics endpoint listens on (default $AOTI_FARM_METRICS_ADDR, else "
                        "127.0.0.1: this host only; 0.0.0.0 opens it to the network, unauthenticated)")


def config_from(ns: argparse.Namespace) -> FarmConfig:
    names = ("cache_dir", "address", "cpu_workers", "gpu_workers", "gpus_per_worker", "timeout", "retries",
             "max_in_flight", "lease_ttl", "poll_interval", "memory_budget", "dynamic")
    cfg = resolve(FarmConfig, cli={n: getattr(ns, n, None) for n in names}, config_path=getattr(ns, "config", None))
    if cfg.cpu_workers == 0 and cfg.gpu_workers == 0:
        raise UserError("--cpu-workers 0 and --gpu-workers 0: no workers; allow at least one")
    return cfg


def warm_command(ns: argparse.Namespace) -> int:
    from aoti_farm.config import signing_key
    from aoti_farm.workers.warm import warm

    cfg = config_from(ns)
    if ns.report:
        _check_writable(ns.report)
    return warm(cfg, ns.model, report=ns.report, signing_key=signing_key(cfg))


def serve_command(ns: argparse.Namespace) -> int:
    from aoti_farm.config import metrics_endpoint, signing_key
    from aoti_farm.workers.serve import serve

    endpoint = metrics_endpoint(ns.metrics_port, addr=ns.metrics_addr)
    cfg = config_from(ns)
    return serve(cfg, install_signals=True, metrics=endpoint, signing_key=signing_key(cfg))


def _check_writable(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise UserError(f"--report {path}: directory {d} does not exist; create it or pass another path")
    if os.path.isdir(path):
        raise UserError(f"--report {path}: is a directory; pass a file path")
    if not os.access(d, os.W_OK):
        raise UserError(f"--report {path}: directory {d} is not writable; pass another path")
