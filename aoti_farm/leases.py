"""Leases: at most one compiler per signature, fleet-wide, on a shared filesystem.

A lease is the file ``<root>/<fp>/leases/<key>.lease``.  Taking one is an exclusive create
(``O_CREAT|O_EXCL``), which is atomic on local filesystems and on NFSv3+ -- no ``flock`` or
``fcntl`` locks, whose semantics NFS does not keep.  The holder heartbeats by touching
the file (``os.utime``) every ``ttl/4`` seconds.  A lease whose mtime is older than ``ttl``
is stale: its holder died.  Another worker takes it over by *renaming* it aside (a rename
succeeds for exactly one contender) and then creating its own.

What this assumes of the filesystem, written down:
  * exclusive create and rename are atomic (POSIX local disks; NFSv3/v4 servers);
  * the clocks of the hosts that share the cache agree to within ``ttl/2`` (NTP), since
    staleness is judged from the file's mtime, set by the server on NFS;
  * a directory listing may lag on NFS (attribute caching); correctness does not depend
    on it, only how fast a new entry is noticed.

Leases only prevent duplicate *work*.  Correctness never depends on them: publishing is
an atomic rename that the first writer wins, and every entry is verified.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from aoti_farm.cache import Cache, check_key

DEFAULT_TTL = 30.0


class Lease:
    def __init__(self, path: Path, owner: str, ttl: float):
        self.path, self.owner, self.ttl = path, owner, ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def start_heartbeat(self) -> "Lease":
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.path.stem[:8]}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self.holder() != self.owner:
                    self.lost = True
                    return
                os.utime(self.path)
            except OSError:
                self.lost = True
                return

    def holder(self) -> str | None:
        try:
            return json.loads(self.path.read_text()).get("owner")
        except (OSError, ValueError, AttributeError):
            return None

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        try:
            if self.holder() == self.owner:
                self.path.unlink()
        except OSError:
            pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lease_path(cache: Cache, fp_id: str, key: str) -> Path:
    return cache.ns(fp_id) / "leases" / f"{check_key(key)}.lease"


def new_owner(label: str = "") -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{label}:{uuid.uuid4().hex[:8]}"


def try_acquire(cache: Cache, fp_id: str, key: str, owner: str, ttl: float = DEFAULT_TTL) -> Lease | None:
    """Take the lease on ``key`` or return None if someone live holds it."""
    p = lease_path(cache, fp_id, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
                       "taken": time.time(), "ttl": ttl}).encode()
    for _ in range(3):
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _is_stale(p, ttl):
                return None
            # Stale: move it aside; exactly one contender's rename succeeds.
            aside = p.with_name(f"{p.name}.stale-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(p, aside)
            except FileNotFoundError:
                continue
            try:
                # The file moved aside could be a fresh lease someone took between our
                # staleness check and the rename; give it back if so.
                if not _is_stale(aside, ttl):
                    try:
                        os.link(aside, p)
                    except FileExistsError:
                        pass
                    return None
            finally:
                try:
                    os.unlink(aside)
                except FileNotFoundError:
                    pass
            continue
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        return Lease(p, owner, ttl).start_heartbeat()
    return None


def _is_stale(p: Path, ttl: float) -> bool:
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return True
    try:
        ttl = float(json.loads(p.read_text()).get("ttl", ttl))
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # half-written by a crashed holder: judged by mtime alone
    return time.time() - st.st_mtime > ttl


def holder_info(cache: Cache, fp_id: str, key: str) -> dict | None:
    p = lease_path(cache, fp_id, key)
    try:
        info = json.loads(p.read_text())
        info["age"] = time.time() - os.stat(p).st_mtime
        info["stale"] = _is_stale(p, info.get("ttl", DEFAULT_TTL))
        return info
    except (OSError, ValueError):
        return None


def list_leases(cache: Cache, fp_id: str) -> list[str]:
    try:
        return [e.name[:-6] for e in os.scandir(cache.ns(fp_id) / "leases") if e.name.endswith(".lease")]
    except FileNotFoundError:
        return []
