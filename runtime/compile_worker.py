"""The serving process's background compile worker (``python -m aoti_farm.runtime.compile_worker``).

Started by the hook (``on_miss="compile"``) as a separate, niced process so serving keeps
its cores and its GIL.  It drains the miss queue of one cache namespace: for each pending
key, ``job.compile_and_publish`` (which takes the fleet-wide lease, so a signature is
compiled once however many workers race), then ``missq.done`` once the signature is
compiled, cached or recorded as failing.  A key leased elsewhere (``busy``) stays queued
and is looked at again.  It exits after ``--idle`` seconds with nothing to do.

Every event is printed as one JSON line on stdout with the worker's pid (the hook sends it
to its worker log and follows it with :func:`read_events`): ``start``, ``ready`` (warm-up
done), ``compile`` (a compile begins), ``outcome`` / ``error`` (it ended), ``bad-item``,
``idle-exit``, ``terminated`` (SIGTERM: its parent ended), ``already-running``.  A bad queue item (unsafe, oversized, garbage, wrong schema; see
:mod:`aoti_farm.cache.queue`) is one ``bad-item`` event, skipped, never fatal.  Exit status: 0
when idle, 2 on bad arguments (an empty signing key too) or a fingerprint that is not
this host's.  Exit status 0 also when another worker already holds this host's lock for
the same device and namespace (``already-running``: one worker per host, shared;
``runtime/supervisor.py``).  It ends with the process that started it (``--parent-pid``):
``PR_SET_PDEATHSIG`` (SIGTERM) and, where that is missing or was set too late, a thread
that watches the parent's pid; on SIGTERM it takes its process group (its compiler
children) along.  It compiles in this user's private Inductor cache
(:func:`aoti_farm.security.private.use_inductor_cache`); an unsafe one is a one-line error, exit 2.
Its settings are its arguments (``--memory-budget``: the hook's resolved
budget; ``--signing-key-file``: the file it reads the signing key from, checked as every
key file is, so the key itself is never on a command line or in an environment).
"""

from __future__ import annotations

import os

os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # before torch is imported

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

POLL = 0.1
#: Seconds before a bad queue item is read again (it may have been repaired meanwhile).
BAD_ITEM_RETRY = 30.0


#: Events after which the worker is compiling (or warming up) until its next event.
BUSY_EVENTS = frozenset({"start", "compile"})
#: Most bytes of the log :func:`read_events` reads in one go (the rest is skipped).
READ_LIMIT = 1 << 20


def _out(obj: dict) -> None:
    print(json.dumps({**obj, "pid": os.getpid()}), flush=True)


def read_events(path: str, pos: int, partial: bytes = b"") -> tuple[list[dict], int, bytes]:
    """The worker events appended to the log ``path`` since byte ``pos``:
    ``(events, new pos, unfinished last line)``.  Other lines (a compiler's messages, a
    native build's output) are skipped; a truncated log is read from its start."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < pos:
                pos, partial = 0, b""
            if size - pos > READ_LIMIT:
                pos, partial = size - READ_LIMIT, b""
            f.seek(pos)
            data = partial + f.read(size - pos)
    except OSError:
        return [], pos, partial
    lines = data.split(b"\n")
    events = []
    for line in lines[:-1]:
        if line.startswith(b'{"event"'):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                events.append(ev)
    return events, size, lines[-1][-65536:]


def worker_lock_path(device: str, cache_root: str, fp_id: str) -> str:
    """The lock a compile worker holds for its life (one per host, device and namespace)."""
    import hashlib

    from aoti_farm.security import private

    ns = hashlib.sha256(f"{os.path.abspath(str(cache_root))}\0{fp_id}".encode()).hexdigest()[:16]
    return os.path.join(private.subdir("workers"), f"{device}-{ns}.lock")


def _end_with_group(signum, frame) -> None:  # noqa: ARG001
    """SIGTERM (the parent's death, or ``stop()``): end the compiler children too."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _out({"event": "terminated"})   # its parent ended (or stopped it): the queue stays
    except Exception:  # noqa: BLE001 -- a closed log: it ends all the same
        pass
    try:
        if os.getpgrp() == os.getpid():   # started in its own group (the supervisor does)
            os.killpg(os.getpid(), signal.SIGTERM)
    except OSError:
        pass
    os._exit(143)


def _set_parent_death(parent: int | None) -> None:
    """Exit when ``parent`` does: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (Linux), then a
    daemon thread that watches the parent's pid (``pidfd_open`` where there is one, else
    ``getppid`` every second) for hosts without it and for a parent that died before the
    prctl."""
    import signal
    import threading

    signal.signal(signal.SIGTERM, _end_with_group)
    if not parent:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)   # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 -- the watch below still ends it
        pass
    if os.getppid() != parent:   # it died before the prctl took effect
        _end_with_group(signal.SIGTERM, None)

    def watch() -> None:
        pidfd = -1
        try:
            pidfd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            pass
        if pidfd >= 0:
            import select

            select.select([pidfd], [], [])   # readable when the parent exits
        else:
            while os.getppid() == parent:
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="aoti-farm-parent-watch", daemon=True).start()


def _hold_lock(path: str):
    """The host's worker lock for this device and namespace (None: another worker has it)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd   # held until the process exits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="aoti_farm.runtime.compile_worker")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--fp-id", required=True, help="the namespace to drain (must be this host's)")
    p.add_argument("--idle", type=float, default=20.0, help="exit after this many idle seconds")
    p.add_argument("--inductor-options", default="{}", help="JSON object")
    p.add_argument("--allow-insecure", action="store_true")
    p.add_argument("--memory-budget", default=None,
                   help="bytes per compile (6G, 512M); unset: a quarter of the host's memory")
    p.add_argument("--signing-key-file", default=None, help="the signing key's file (unset: no signing)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    ns = p.parse_args(argv)
    _set_parent_death(ns.parent_pid)

    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    from aoti_farm.compile import job, widen
    from aoti_farm.cache import leases, queue as missq, records
    from aoti_farm.budget import parse_size
    from aoti_farm.cache.store import Cache, load_signing_key
    from aoti_farm.compile.compiler import AOTICompiler
    from aoti_farm.errors import FarmError, UserError
    from aoti_farm.fingerprint import fingerprint

    try:
        opts = json.loads(ns.inductor_options)
        assert isinstance(opts, dict)
    except (ValueError, AssertionError):
        print(f"compile_worker: --inductor-options {ns.inductor_options!r} is not a JSON object", file=sys.stderr)
        return 2
    try:
        memory_budget = parse_size(ns.memory_budget) if ns.memory_budget is not None else None
    except ValueError as e:
        print(f"compile_worker: --memory-budget: {e}", file=sys.stderr)
        return 2
    from aoti_farm.security import private

    try:
        private.use_inductor_cache()   # before anything builds (the ISA probe of fingerprint())
    except OSError as e:
        print(f"compile_worker: {e}", file=sys.stderr)
        return 2
    fp = fingerprint(ns.device, opts)
    if fp.id != ns.fp_id:
        print(f"compile_worker: --fp-id {ns.fp_id} is not this host's fingerprint {fp.id}; "
              f"start the worker with the hook's inductor options", file=sys.stderr)
        return 2
    try:
        # the key's file, read here: never the key itself in argv or the environment
        key = load_signing_key(path=ns.signing_key_file, source="--signing-key-file") if ns.signing_key_file else None
        cache = Cache(ns.cache_dir, signing_key=key, allow_insecure=ns.allow_insecure)
    except UserError as e:   # an empty or unreadable signing key: never "no signing"
        print(f"compile_worker: {e}", file=sys.stderr)
        return 2
    try:
        lock = _hold_lock(worker_lock_path(ns.device, str(cache.root), fp.id))
    except OSError as e:
        print(f"compile_worker: {e}", file=sys.stderr)
        return 2
    if lock is None:
        _out({"event": "already-running"})
        return 0
    compiler = AOTICompiler(opts)
    owner = leases.new_owner("hook-worker")
    idle_since = time.monotonic()
    retry_at: dict[str, float] = {}
    _out({"event": "start", "fp": fp.id})
    # warm up before the first miss: what a first compile would import anyway
    t0 = time.monotonic()
    import torch._inductor.codecache  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch.export  # noqa: F401
    if ns.device == "cpu":
        # Inductor's vector-ISA checks build test programs on a cold Inductor cache
        # (about 1.5 s here): pay them now, not inside the first miss's compile
        try:
            from torch._inductor import cpu_vec_isa

            from aoti_farm.fingerprint import seed_inductor_vec_isa

            seed_inductor_vec_isa()
            cpu_vec_isa.pick_vec_isa()
        except Exception as e:  # noqa: BLE001 -- the compile pays it instead
            _out({"event": "warmup-error", "error": f"{type(e).__name__}: {e}"})
    _out({"event": "ready", "warmup_s": round(time.monotonic() - t0, 3)})
    idle_since = time.monotonic()   # idle time counts from here: the queue is looked at first
    reported: set[str] = set()

    def bad_item(name: str, err: object) -> None:
        """A bad queue item (or an unsafe queue directory): never compiled, left for
        `cache verify --repair`; one event per item per worker (the count is the events')."""
        if name not in reported:
            reported.add(name)
            _out({"event": "bad-item", "key": name, "error": str(err)})

    while time.monotonic() - idle_since < ns.idle:
        try:
            listing = missq.scan(cache, fp.id)
        except (OSError, FarmError) as e:
            bad_item("queue", e)
            listing = records.Listing()
        for name in listing.junk:
            bad_item(name, "not a queue item name")
        now = time.monotonic()
        todo = [k for k in sorted(listing.keys, key=lambda k: (listing.keys[k], k)) if retry_at.get(k, 0) <= now]
        if not todo:
            time.sleep(POLL)
            continue
        for key in todo:
            try:
                sig, wid = missq.read_item(cache, fp.id, key)   # wid: a widened class asked for (aoti_farm/compile/widen.py)
            except FileNotFoundError:
                continue
            except Exception as e:  # noqa: BLE001 -- unreadable/hostile item: skipped, looked at again later
                bad_item(key, e)
                retry_at[key] = time.monotonic() + BAD_ITEM_RETRY
                continue
            try:
                out = widen.compile_queued(cache, compiler, fp, sig, wid, owner=owner,
                                           memory_budget=memory_budget,
                                           on_start=lambda k=key: _out({"event": "compile", "key": k}))
            except Exception as e:  # noqa: BLE001 -- infrastructure trouble: retry later
                _out({"event": "error", "key": key, "error": f"{type(e).__name__}: {e}"})
                retry_at[key] = time.monotonic() + 30
                continue
            _out({"event": "outcome", **out.to_dict()})
            if out.status == job.BUSY:   # leased elsewhere: not work done here (idle time runs on)
                retry_at[key] = time.monotonic() + 1.0
                continue
            try:
                missq.done(cache, fp.id, key)
            except (OSError, FarmError):
                pass
            idle_since = time.monotonic()
    _out({"event": "idle-exit"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
