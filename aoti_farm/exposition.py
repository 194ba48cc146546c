"""Exposing a ``prometheus_client`` registry over HTTP: the one helper that the serving
hook's metrics (``aoti_farm.runtime.metrics``) and ``aoti-farm serve``'s pool metrics
(``aoti_farm.workers.metrics``) share.

Several processes per host: each serves its own registry on the first free port of
``port .. port+span-1`` (``AOTI_FARM_METRICS_PORTS``, default 64; 0 takes any free port),
and with ``AOTI_FARM_METRICS_SD_DIR`` writes a Prometheus ``file_sd_configs`` target file
``<dir>/aoti-farm-<pid>.json`` naming its port (removed on close or at exit).  Those
variables are read by the command layer (``aoti_farm.config.metrics_endpoint``) and the
hook's settings, never here.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
from dataclasses import dataclass

from aoti_farm.errors import UserError

log = logging.getLogger("aoti_farm.metrics")

DEFAULT_PORT_RANGE = 64


class Exporter:
    """An HTTP server of one registry on one port (plus the service-discovery file)."""

    def __init__(self, server, thread, port: int, sd_file: str | None):
        self.server, self.thread, self.port, self.sd_file = server, thread, port, sd_file
        self._closed = False
        atexit.register(self.close)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.sd_file:
            try:
                os.unlink(self.sd_file)
            except OSError:
                pass
        try:
            self.server.shutdown()
            self.server.server_close()
        except Exception:  # noqa: BLE001
            pass


def parse_port(value, where: str) -> int:
    try:
        p = int(value)
    except (TypeError, ValueError):
        p = -1
    if not 0 <= p <= 65535:
        raise UserError(f"{where}: {value!r} is not a port number (0-65535; 0 takes any free port)")
    return p


#: Where an endpoint listens unless told otherwise: op names and integrity counters are for
#: this host's scraper, not the network (``--metrics-addr`` / ``AOTI_FARM_METRICS_ADDR``
#: opens it wider, e.g. ``0.0.0.0``).
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Endpoint:
    """Where to serve a registry (resolved by the command layer, ``config.metrics_endpoint``,
    from ``--metrics-port`` / ``AOTI_FARM_METRICS_PORT``, ``_ADDR``, ``_PORTS``, ``_SD_DIR``)."""

    port: int
    addr: str = LOOPBACK
    span: int = DEFAULT_PORT_RANGE
    sd_dir: str | None = None


def serve_http(registry, port: int, *, addr: str = LOOPBACK, span: int = DEFAULT_PORT_RANGE,
               sd_dir: str | None = None, labels: dict | None = None) -> Exporter:
    """Serve ``registry`` on the first free port of ``port .. port+span-1`` (``port`` 0:
    any free port).  ``sd_dir``: also write a Prometheus file_sd target file there.
    Raises OSError when every port is taken."""
    from prometheus_client import start_http_server

    span = span or DEFAULT_PORT_RANGE
    last: OSError | None = None
    for p in ([0] if port == 0 else range(port, min(65536, port + max(1, span)))):
        try:
            server, thread = start_http_server(p, addr=addr, registry=registry)
        except OSError as e:
            last = e
            continue
        real = server.server_address[1]
        sd_file = None
        if sd_dir:
            sd_file = _write_sd(sd_dir, real, labels or {})
        return Exporter(server, thread, real, sd_file)
    raise OSError(f"no free port in {port}..{port + span - 1}: {last}")


def _write_sd(sd_dir: str, port: int, labels: dict) -> str | None:
    try:
        os.makedirs(sd_dir, exist_ok=True)
        path = os.path.join(sd_dir, f"aoti-farm-{os.getpid()}.json")
        doc = [{"targets": [f"{socket.gethostname()}:{port}"],
                "labels": {"job": "aoti-farm", "pid": str(os.getpid()), **{k: str(v) for k, v in labels.items()}}}]
        from aoti_farm import private

        private.atomic_write(path, json.dumps(doc).encode())   # O_EXCL temp: the directory may be shared
        return path
    except OSError as e:
        log.warning("metrics service-discovery file in %s: %s", sd_dir, e)
        return None
