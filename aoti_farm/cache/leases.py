"""Leases: at most one compiler per signature, fleet-wide, on a shared filesystem.

A lease is the file ``<root>/<fp>/leases/<key>.lease``.  Taking one is an exclusive create
(``O_CREAT|O_EXCL``), which is atomic on local filesystems and on NFSv3+ -- no ``flock`` or
``fcntl`` locks, whose semantics NFS does not keep.  The holder heartbeats by touching
the file (``os.utime``) every ``ttl/4`` seconds.  A lease whose mtime is older than ``ttl``
is stale: its holder died.  Another worker takes it over: it takes the breaker
``<key>.lease.break`` (an exclusive create, so one contender at a time), judges the lease
again under it, removes it if still stale and still the very file it judged (its inode:
a name found gone may hold, a moment later, the fresh lease of the contender that broke
it first), drops the breaker and creates its own lease (again an exclusive create: one
winner).  The one window left: a stale holder that comes
back and releases its lease between the breaker's judgement and its removal; that costs a
duplicate compile, never a wrong entry.

What this assumes of the filesystem, written down:
  * exclusive create and rename are atomic (POSIX local disks; NFSv3/v4 servers);
  * the clocks of the hosts that share the cache agree to within ``ttl/2`` (NTP), since
    staleness is judged from the file's mtime, set by the server on NFS;
  * a directory listing may lag on NFS (attribute caching); correctness does not depend
    on it, only how fast a new entry is noticed.

Leases only prevent duplicate *work*.  Correctness never depends on them: publishing is
an atomic rename that the first writer wins, and every entry is verified.

A lease is read bounded and schema-checked (:mod:`aoti_farm.cache.records`): ``owner``,
``host`` strings, ``pid`` an integer, ``taken`` a finite number, ``ttl`` a finite number
in ``(0, MAX_TTL]``.  A lease that breaks that -- ``"ttl": Infinity`` or NaN, a FIFO, a
link, a directory, a huge file -- is *bad*: it counts as expired (so it can never block a
key), is counted, and ``cache verify --repair`` removes it.  A lease that is not JSON yet
(a holder that crashed between its create and its write) is judged by its mtime alone;
one whose mtime lies more than its TTL in the future is bad too.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import json

from aoti_farm.cache import records
from aoti_farm.cache.store import Cache, check_key
from aoti_farm.errors import FarmError
from aoti_farm.cache.records import BadRecord

DEFAULT_TTL = 30.0
#: The longest TTL a lease may carry (a longer one is bad: it would block a key for long).
MAX_TTL = 3600.0
SUFFIX = ".lease"


def _good_ttl(x) -> bool:
    return records.is_number(x) and 0 < x <= MAX_TTL


_SCHEMA = {"owner": lambda x: isinstance(x, str) and 0 < len(x) <= 512, "host": records.short_str(256),
           "pid": records.nonneg_int, "taken": records.is_number, "ttl": _good_ttl}


def bounded_ttl(ttl: float) -> float:
    """The TTL a lease is taken with: ``ttl`` within ``(0, MAX_TTL]`` (else the default)."""
    if not records.is_number(ttl) or ttl <= 0:
        return DEFAULT_TTL
    return float(min(ttl, MAX_TTL))


@dataclass
class LeaseState:
    """What a lease file says: ``stale`` (expired, bad or gone), ``info`` (the decoded
    lease, when good), ``problem`` (a :class:`BadRecord`, when bad), ``age`` (seconds)."""

    stale: bool
    info: dict | None = None
    problem: BadRecord | None = None
    age: float = 0.0
    exists: bool = True
    ino: int | None = None      # the judged file's inode (None: gone)


def _judge(cache: Cache, dir_fd: int, name: str, ttl: float, what: str) -> LeaseState:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return LeaseState(True, exists=False)
    age, ino = time.time() - st.st_mtime, st.st_ino
    try:
        raw = records.read(cache, dir_fd, name, what)
    except FileNotFoundError:
        return LeaseState(True, exists=False)
    except BadRecord as e:      # FIFO, device, link, directory, huge file: expired
        return LeaseState(True, problem=e, age=age, ino=ino)
    if age < -bounded_ttl(ttl):
        return LeaseState(True, problem=BadRecord("corrupt", f"{what}: mtime {-age:.0f} s in the future"), age=age,
                          ino=ino)
    try:
        obj = records.decode_json(raw, what)
    except BadRecord as e:      # half-written by a crashed holder (or garbage): by mtime alone
        stale = age > bounded_ttl(ttl)
        return LeaseState(stale, problem=e if raw.strip() or stale else None, age=age, ino=ino)
    try:
        info = records.check_schema(obj, _SCHEMA, what)
    except BadRecord as e:      # hostile or broken (ttl Infinity, NaN, huge, ...): expired
        return LeaseState(True, problem=e, age=age, ino=ino)
    return LeaseState(age > info["ttl"], info=info, age=age, ino=ino)


def _remove_if_same(dir_fd: int, name: str, ino: int) -> None:
    """Remove ``name`` if it is still the file judged stale (inode ``ino``).  A name that
    is gone, or is another file by now (a contender that broke the stale lease before us
    has created its own in its place), is left alone."""
    try:
        if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino != ino:
            return
    except FileNotFoundError:
        return
    records.remove_name(dir_fd, name)


class Lease:
    def __init__(self, cache: Cache, fp_id: str, key: str, owner: str, ttl: float):
        self.cache, self.fp_id, self.key = cache, fp_id, key
        self.name = f"{key}{SUFFIX}"
        self.path = lease_path(cache, fp_id, key)
        self.owner, self.ttl = owner, ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def start_heartbeat(self) -> "Lease":
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.key[:8]}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if self.holder() != self.owner:
                    self.lost = True
                    return
                fd = records.open_subdir(self.cache, self.fp_id, "leases")
                try:
                    os.utime(self.name, dir_fd=fd, follow_symlinks=False)
                finally:
                    os.close(fd)
            except (OSError, FarmError):
                self.lost = True
                return

    def holder(self) -> str | None:
        try:
            return read_lease(self.cache, self.fp_id, self.key)["owner"]
        except (OSError, FarmError):
            return None

    def release(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        try:
            if self.holder() == self.owner:
                fd = records.open_subdir(self.cache, self.fp_id, "leases")
                try:
                    os.unlink(self.name, dir_fd=fd)
                finally:
                    os.close(fd)
        except (OSError, FarmError):
            pass

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lease_path(cache: Cache, fp_id: str, key: str) -> Path:
    return cache.ns(fp_id) / "leases" / f"{check_key(key)}{SUFFIX}"


def new_owner(label: str = "") -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{label}:{uuid.uuid4().hex[:8]}"


#: A breaker older than this was left by a process that died while breaking a stale lease.
BREAK_TTL = 10.0


def _take_breaker(dir_fd: int, name: str) -> str | None:
    """Exclusive right to break the stale lease ``name``, or None when another contender
    holds it (one left behind by a dead process is removed once older than BREAK_TTL)."""
    brk = f"{name}.break"
    try:
        records.write_new(dir_fd, brk, b"")
        return brk
    except FileExistsError:
        try:
            age = time.time() - os.stat(brk, dir_fd=dir_fd, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return None
        if age > BREAK_TTL:
            records.remove_name(dir_fd, brk)
        return None


def try_acquire(cache: Cache, fp_id: str, key: str, owner: str, ttl: float = DEFAULT_TTL) -> Lease | None:
    """Take the lease on ``key`` or return None if someone live holds it.  Raises
    :class:`BadRecord` when the leases directory is unsafe (a link, writable by others)."""
    name = f"{check_key(key)}{SUFFIX}"
    what = f"lease {lease_path(cache, fp_id, key)}"
    ttl = bounded_ttl(ttl)
    body = json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
                       "taken": time.time(), "ttl": ttl}).encode()
    dfd = records.open_subdir(cache, fp_id, "leases", create=True)
    try:
        for _ in range(3):
            try:
                records.write_new(dfd, name, body)
            except FileExistsError:
                state = _judge(cache, dfd, name, ttl, what)
                if state.problem is not None:
                    records.count_bad("lease", state.problem.kind)
                if not state.stale:
                    return None
                # Stale or bad.  Breaking it is serialised by a breaker file: a contender
                # that judged the old lease stale must never remove the fresh lease another
                # contender has created in its place (with a bare rename, three contenders
                # could end up with two holders).
                brk = _take_breaker(dfd, name)
                if brk is None:
                    return None         # another contender is breaking it and takes the key
                try:
                    again = _judge(cache, dfd, name, ttl, what)       # judged again, under it
                    if again.stale and again.ino is not None:
                        # only the very file judged stale: one that was gone when judged, or
                        # replaced since, may be a fresh lease another contender has just
                        # created after breaking the stale one (8 contenders got two holders)
                        _remove_if_same(dfd, name, again.ino)
                finally:
                    records.remove_name(dfd, brk)
                continue
            return Lease(cache, fp_id, key, owner, ttl).start_heartbeat()
        return None
    finally:
        os.close(dfd)


def read_lease(cache: Cache, fp_id: str, key: str) -> dict:
    """The lease on ``key``, schema-checked; FileNotFoundError or :class:`BadRecord`."""
    name = f"{check_key(key)}{SUFFIX}"
    what = f"lease {lease_path(cache, fp_id, key)}"
    fd = records.open_subdir(cache, fp_id, "leases")
    try:
        return records.check_schema(records.decode_json(records.read(cache, fd, name, what), what), _SCHEMA, what)
    finally:
        os.close(fd)


def inspect(cache: Cache, fp_id: str, key: str, ttl: float = DEFAULT_TTL) -> LeaseState:
    """The state of the lease on ``key`` (see :class:`LeaseState`); BadRecord when the
    leases directory is unsafe."""
    name = f"{check_key(key)}{SUFFIX}"
    try:
        fd = records.open_subdir(cache, fp_id, "leases")
    except FileNotFoundError:
        return LeaseState(True, exists=False)
    try:
        return _judge(cache, fd, name, ttl, f"lease {lease_path(cache, fp_id, key)}")
    finally:
        os.close(fd)


def holder_info(cache: Cache, fp_id: str, key: str) -> dict | None:
    """The lease's fields with its ``age`` and ``stale``; None when gone or bad."""
    try:
        st = inspect(cache, fp_id, key)
    except FarmError:
        return None
    if st.info is None:
        return None
    return {**st.info, "age": st.age, "stale": st.stale}


def scan(cache: Cache, fp_id: str) -> records.Listing:
    """Lease files by key, and junk names; BadRecord when the directory is unsafe."""
    try:
        fd = records.open_subdir(cache, fp_id, "leases")
    except FileNotFoundError:
        return records.Listing()
    try:
        return records.list_dir(fd, SUFFIX, records.is_key)
    finally:
        os.close(fd)


def list_leases(cache: Cache, fp_id: str) -> list[str]:
    try:
        return sorted(scan(cache, fp_id).keys)
    except BadRecord:
        return []


def remove(cache: Cache, fp_id: str, name: str) -> bool:
    """Remove the lease entry ``name`` (a bad one, a junk name), never following a link."""
    return records.remove_in(cache, fp_id, "leases", name, "lease")
