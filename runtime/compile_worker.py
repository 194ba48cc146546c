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
``idle-exit``.  A bad queue item (unsafe, oversized, garbage, wrong schema; see
:mod:`aoti_farm.missq`) is one ``bad-item`` event, skipped, never fatal.  Exit status: 0
when idle, 2 on bad arguments (an empty signing key too) or a fingerprint that is not
this host's.  Its settings are its arguments (``--memory-budget``: the hook's resolved
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
    ns = p.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    from aoti_farm import job, leases, missq, records, widen
    from aoti_farm.budget import parse_size
    from aoti_farm.cache import Cache, load_signing_key
    from aoti_farm.compiler import AOTICompiler
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
                sig, wid = missq.read_item(cache, fp.id, key)   # wid: a widened class asked for (aoti_farm/widen.py)
            except FileNotFoundError:
                continue
            except Exception as e:  # noqa: BLE001 -- unreadable/hostile item: skipped, looked at again later
                bad_item(key, e)
                retry_at[key] = time.monotonic() + BAD_ITEM_RETRY
                continue
            try:
                out = widen.compile_queued(cache, compiler, fp, sig, wid, inductor_options=opts, owner=owner,
                                           memory_budget=memory_budget,
                                           on_start=lambda k=key: _out({"event": "compile", "key": k}))
            except Exception as e:  # noqa: BLE001 -- infrastructure trouble: retry later
                _out({"event": "error", "key": key, "error": f"{type(e).__name__}: {e}"})
                retry_at[key] = time.monotonic() + 30
                continue
            _out({"event": "outcome", **out.to_dict()})
            if out.status == job.BUSY:
                retry_at[key] = time.monotonic() + 1.0
                idle_since = time.monotonic()
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
