"""Exposing a ``prometheus_client`` registry over HTTP: the one helper that the serving
hook's metrics (``aoti_farm.runtime.metrics``) and ``aoti-farm serve``'s pool metrics
(``aoti_farm.workers.metrics``) share.

Several processes per host: each serves its own registry on the first free port of
``port .. port+span-1`` (``AOTI_FARM_METRICS_PORTS``, default 64; 0 takes any free port),
and with ``AOTI_FARM_METRICS_SD_DIR`` writes a Prometheus ``file_sd_configs`` target file
``<dir>/aoti-farm-<pid>.json`` naming its port (removed on close or at exit).  Those
variables are read by the command layer (``aoti_farm.config.metrics_endpoint``) and the
hook's settings, never here.

Squatted ports.  Any local user may bind a port of the span first and answer scrapes
with numbers of their own; binding cannot be prevented (ports are first come, first
served), so it is made visible and routed around:

* at start, every listening socket on a port of the span that belongs to *another* uid
  (Linux lists each socket's owner in ``/proc/net/tcp`` and ``/proc/net/tcp6``:
  :func:`foreign_listeners`) is logged as a warning naming the port and the uid, and
  counted (``Exporter.held``: ``stats()["metrics"]["ports_held_by_others"]``,
  ``aoti_farm_hook_metrics_ports_held_by_others``); the same when no port is free;
* the port really bound is written to a file only this user can write,
  ``<private root>/metrics/<pid>.json`` (``aoti_farm.security.private``, a 0700 directory;
  ``Exporter.port_file``, removed on close): a scraper running as this user (or root)
  reads the port from there, or from the ``file_sd`` file when that directory is
  private, never by probing the span.  Ports held by this user's other processes are
  the normal case (several serving processes) and not reported.
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
    """An HTTP server of one registry on one port (plus the service-discovery file and
    the private port file).  ``held``: ``[(port, uid), ...]``, the ports of the span
    another user listened on when it started."""

    def __init__(self, server, thread, port: int, sd_file: str | None, held=(), port_file: str | None = None):
        self.server, self.thread, self.port, self.sd_file = server, thread, port, sd_file
        self.held, self.port_file = list(held), port_file
        self._closed = False
        atexit.register(self.close)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for f in (self.sd_file, self.port_file):
            if f:
                try:
                    os.unlink(f)
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


class PortsHeld(OSError):
    """No port of the span could be bound; ``held``: those another user listens on."""

    def __init__(self, msg: str, held):
        super().__init__(msg)
        self.held = list(held)


def serve_http(registry, port: int, *, addr: str = LOOPBACK, span: int = DEFAULT_PORT_RANGE,
               sd_dir: str | None = None, labels: dict | None = None) -> Exporter:
    """Serve ``registry`` on the first free port of ``port .. port+span-1`` (``port`` 0:
    any free port).  ``sd_dir``: also write a Prometheus file_sd target file there.
    Ports of the span another user listens on are logged and counted (module docstring);
    the port bound is written to the private port file.  Raises :class:`PortsHeld` (an
    OSError) when every port is taken."""
    from prometheus_client import start_http_server

    span = span or DEFAULT_PORT_RANGE
    ports = [0] if port == 0 else list(range(port, min(65536, port + max(1, span))))
    held = [] if port == 0 else foreign_listeners(ports)
    last: OSError | None = None
    for p in ports:
        try:
            server, thread = start_http_server(p, addr=addr, registry=registry)
        except OSError as e:
            last = e
            continue
        real = server.server_address[1]
        port_file = _write_port_file(real, addr, held, labels or {})
        _warn_held(held, f"this process serves its metrics on port {real}"
                         + (f" (written to {port_file})" if port_file else ""))
        sd_file = None
        if sd_dir:
            sd_file = _write_sd(sd_dir, real, labels or {})
        return Exporter(server, thread, real, sd_file, held, port_file)
    _warn_held(held, "no port of the span is free: metrics are not exposed")
    raise PortsHeld(f"no free port in {port}..{port + span - 1}: {last}"
                    + (f"; {len(held)} held by other users" if held else ""), held)


# --- ports another user holds --------------------------------------------------------------------

_TCP_LISTEN = "0A"


def parse_proc_net_tcp(text: str) -> list[tuple[str, int, int, int]]:
    """``(address, port, uid, inode)`` of every listening socket in the text of
    ``/proc/net/tcp`` or ``/proc/net/tcp6`` (address in the kernel's hex form; a line
    that does not parse is skipped)."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8 or f[3] != _TCP_LISTEN:
            continue
        addr, _, hexport = f[1].rpartition(":")
        try:
            out.append((addr, int(hexport, 16), int(f[7]), int(f[9]) if len(f) > 9 else 0))
        except ValueError:
            continue
    return out


def foreign_listeners(ports, *, uid: int | None = None, proc: str = "/proc/net") -> list[tuple[int, int]]:
    """``[(port, owner uid), ...]``, sorted: the ports of ``ports`` that a socket of a uid
    other than ``uid`` (default ours) listens on, on any address, IPv4 or IPv6.  Empty
    where ``/proc/net`` cannot be read (not Linux): nothing is claimed then."""
    uid = os.getuid() if uid is None else uid
    want = set(ports)
    found: set[tuple[int, int]] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, name)) as f:
                text = f.read()
        except OSError:
            continue
        found.update((p, u) for _, p, u, _ in parse_proc_net_tcp(text) if p in want and u != uid)
    return sorted(found)


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _warn_held(held, then: str) -> None:
    """One warning line per owner, naming its ports (the first 8)."""
    by: dict[int, list[int]] = {}
    for p, u in held:
        by.setdefault(u, []).append(p)
    for u, ps in sorted(by.items()):
        more = f" and {len(ps) - 8} more" if len(ps) > 8 else ""
        log.warning("metrics port%s %s held by %s, not this user: scrapes there do not reach aoti-farm and may "
                    "be forged; %s", "s" if len(ps) > 1 else "", ", ".join(map(str, ps[:8])) + more, _owner(u), then)


def port_file_path(pid: int | None = None) -> str:
    """Where a process writes the port it serves its metrics on (private, 0700 directory)."""
    from aoti_farm.security import private

    return os.path.join(private.subdir("metrics"), f"{pid or os.getpid()}.json")


def _write_port_file(port: int, addr: str, held, labels: dict) -> str | None:
    try:
        from aoti_farm.security import private

        path = port_file_path()
        doc = {"pid": os.getpid(), "port": port, "addr": addr, "uid": os.getuid(),
               "held_by_others": [{"port": p, "uid": u} for p, u in held],
               "labels": {k: str(v) for k, v in labels.items()}}
        private.atomic_write(path, json.dumps(doc).encode())
        return path
    except OSError as e:   # no private directory: the port is still logged and in stats()
        log.warning("metrics port file: %s", e)
        return None


def _write_sd(sd_dir: str, port: int, labels: dict) -> str | None:
    try:
        os.makedirs(sd_dir, exist_ok=True)
        path = os.path.join(sd_dir, f"aoti-farm-{os.getpid()}.json")
        doc = [{"targets": [f"{socket.gethostname()}:{port}"],
                "labels": {"job": "aoti-farm", "pid": str(os.getpid()), **{k: str(v) for k, v in labels.items()}}}]
        from aoti_farm.security import private

        private.atomic_write(path, json.dumps(doc).encode())   # O_EXCL temp: the directory may be shared
        return path
    except OSError as e:
        log.warning("metrics service-discovery file in %s: %s", sd_dir, e)
        return None
