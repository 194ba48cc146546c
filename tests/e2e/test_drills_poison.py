"""Drill 10: poisoned shared records, and a signing key that must fail closed.

Someone with write access to parts of the cache plants, in place of queue items, leases,
failure records and ``fingerprint.json``: a FIFO nobody writes, a link to ``/dev/zero``,
a directory, a sparse multi-GB file, garbage, a junk name, a well-formed record with
hostile values (``"ttl": Infinity``, NaN, another key).  Each must be counted and skipped
by ``aoti-farm serve``, by the hook's compile worker and by ``cache verify`` -- never a
hang, a blown-up process or a crash -- reported by ``verify`` and removed by ``verify
--repair``.  Linked ``queue/``, ``leases/`` and ``failed/`` directories never make anyone
write outside the cache.  An empty, whitespace-only or unreadable signing key is exit 2,
never "no signing".

Every child runs under a watchdog: a timeout (a hang fails the test, it never blocks the
suite) and a resident-memory ceiling (reading ``/dev/zero`` fails the test long before it
could exhaust the machine).  The only real compile is in the worker drill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from aoti_farm.cache import leases, queue as missq
from aoti_farm.cache.store import Cache
from aoti_farm.errors import FarmError, UserError

from conftest import sig_add_alpha, sig_mul

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1",
       "PYTHONWARNINGS": "ignore"}
for _v in ("AOTI_FARM_SIGNING_KEY", "AOTI_FARM_SIGNING_KEY_FILE", "AOTI_FARM_CONFIG"):
    ENV.pop(_v, None)
#: Resident memory a child may reach before the watchdog kills it (it needs ~0.5 GB).
RSS_LIMIT = 2 << 30
HUGE = 4 << 30      # sparse: costs no disk


# --- a watched child -------------------------------------------------------------------------

class Watched:
    """A child process under a watchdog: killed (and the test failed) past its timeout or
    past RSS_LIMIT resident bytes.  Its output goes to files (no pipe to fill)."""

    def __init__(self, argv: list[str], tmp: Path, name: str, env: dict | None = None):
        self.out_path, self.err_path = tmp / f"{name}.out", tmp / f"{name}.err"
        self._out, self._err = open(self.out_path, "w"), open(self.err_path, "w")
        self.p = subprocess.Popen(argv, stdout=self._out, stderr=self._err, env=env or ENV, cwd=ROOT,
                                  start_new_session=True)
        self.peak_rss, self.killed_for = 0, None

    def _rss(self) -> int:
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _kill(self, why: str) -> None:
        self.killed_for = why
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()

    def wait(self, timeout: float, until=None) -> bool:
        """Watch until the child exits (or ``until()`` is true); False on a kill."""
        deadline = time.monotonic() + timeout
        while True:
            self.peak_rss = max(self.peak_rss, self._rss())
            if self.peak_rss > RSS_LIMIT:
                self._kill(f"memory: {self.peak_rss >> 20} MiB resident")
                return False
            if until is not None and until():
                return True
            if self.p.poll() is not None:
                return True
            if time.monotonic() > deadline:
                self._kill(f"timeout: still running after {timeout:.0f} s")
                return False
            time.sleep(0.05)

    def stop(self, timeout: float = 120) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            if not self.wait(timeout):
                return -9
        return self.p.returncode

    @property
    def out(self) -> str:
        return self.out_path.read_text()

    @property
    def err(self) -> str:
        return self.err_path.read_text()

    def close(self) -> None:
        if self.p.poll() is None:
            self._kill("test ended")
        self._out.close()
        self._err.close()


def aoti(tmp: Path, name: str, *args: str, env: dict | None = None, timeout: float = 120) -> Watched:
    w = Watched([sys.executable, "-m", "aoti_farm", *args], tmp, name, env)
    try:
        w.wait(timeout)
    finally:
        w.close()
    assert w.killed_for is None, f"{name}: killed ({w.killed_for}); stderr: {w.err[-2000:]}"
    return w


# --- the poison ------------------------------------------------------------------------------

def _k(h: str) -> str:
    return h * 32


Q_DIR, Q_FIFO, Q_ZERO, Q_HUGE, Q_SCHEMA, Q_GARBAGE, Q_OTHER = (_k(f"a{i}") for i in range(1, 8))
L_FIFO, L_INF, L_NAN, L_GARBAGE, L_NEG, L_BIG, L_FUTURE = (_k(f"b{i}") for i in range(1, 8))
QUEUE_BAD = ["garbage.msgpack", Q_DIR, Q_FIFO, Q_ZERO, Q_HUGE, Q_SCHEMA, Q_GARBAGE, Q_OTHER]
LEASE_BAD = ["garbage.lease", L_FIFO, L_INF, L_NAN, L_GARBAGE, L_NEG, L_BIG, L_FUTURE]
FAILED_BAD = [Q_DIR, Q_FIFO, Q_ZERO, Q_HUGE, Q_SCHEMA, "zz", f"{Q_DIR[:2]}/garbage.msgpack"]


def _lease_text(ttl: str) -> str:
    return '{"owner": "h:1:x:deadbeef", "host": "h", "pid": 1, "taken": 0, "ttl": %s}' % ttl


def _sparse(p: Path, size: int = HUGE) -> None:
    with open(p, "wb") as f:
        f.truncate(size)


def plant_queue(ns: Path, sig) -> None:
    """Bad queue items next to good ones (``sig``'s item, planted by the caller)."""
    q = ns / "queue"
    q.mkdir(exist_ok=True)
    (q / "garbage.msgpack").write_bytes(b"\x93garbage")
    (q / f"{Q_DIR}.msgpack").mkdir()
    (q / f"{Q_DIR}.msgpack" / "x").write_bytes(b"x")
    os.mkfifo(q / f"{Q_FIFO}.msgpack")
    os.symlink("/dev/zero", q / f"{Q_ZERO}.msgpack")
    _sparse(q / f"{Q_HUGE}.msgpack")
    (q / f"{Q_SCHEMA}.msgpack").write_bytes(msgpack.packb({"signature": "add", "key": Q_SCHEMA, "time": "now"}))
    (q / f"{Q_GARBAGE}.msgpack").write_bytes(os.urandom(200))
    (q / f"{Q_OTHER}.msgpack").write_bytes(msgpack.packb({"signature": sig.to_obj(), "key": Q_OTHER, "time": 1.0}))


def plant_leases(ns: Path) -> None:
    d = ns / "leases"
    d.mkdir(exist_ok=True)
    (d / "garbage.lease").write_text("{}")
    os.mkfifo(d / f"{L_FIFO}.lease")
    (d / f"{L_INF}.lease").write_text(_lease_text("Infinity"))
    (d / f"{L_NAN}.lease").write_text(_lease_text("NaN"))
    (d / f"{L_GARBAGE}.lease").write_bytes(b"\x00\xffnot json")
    (d / f"{L_NEG}.lease").write_text(_lease_text("-5"))
    (d / f"{L_BIG}.lease").write_text(_lease_text("1e12"))
    (d / f"{L_FUTURE}.lease").write_text(_lease_text("30"))
    future = time.time() + 10 * 365 * 86400
    os.utime(d / f"{L_FUTURE}.lease", (future, future))
    old = time.time() - 3600          # garbage is judged by its mtime: an hour old is stale
    os.utime(d / f"{L_GARBAGE}.lease", (old, old))


def plant_failures(ns: Path) -> None:
    def rec(key):
        d = ns / "failed" / key[:2]
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{key}.msgpack"

    rec(Q_DIR).mkdir()
    os.mkfifo(rec(Q_FIFO))
    os.symlink("/dev/zero", rec(Q_ZERO))
    _sparse(rec(Q_HUGE))
    rec(Q_SCHEMA).write_bytes(msgpack.packb({"format": 1, "key": Q_OTHER, "reason": "x", "evidence": {},
                                             "attempts": 1, "time": 0.0, "host": "h", "signature": {}}))
    (ns / "failed" / "zz").mkdir()
    (ns / "failed" / Q_DIR[:2] / "garbage.msgpack").write_bytes(b"x")


def plant_all(cache: Cache, fp_id: str, sig) -> None:
    ns = cache.ns(fp_id)
    plant_queue(ns, sig)
    plant_leases(ns)
    plant_failures(ns)
    fj = ns / "fingerprint.json"
    fj.unlink()
    os.mkfifo(fj)


@pytest.fixture()
def poisoned(kernels, tmp_path):
    """A copy of the session cache (``sig_add_alpha`` compiled), its queue holding that
    signature (cached: a drainer just removes it) among the poison."""
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = Cache(kernels.copy_to(tmp_path / "c").root, signing_key=None)
    fp_id = kernels.fp.id
    for key in cache.list_keys(fp_id) - {sig.key}:   # other tests' kernels: not part of these counts
        cache.remove(fp_id, key)
    assert missq.enqueue(cache, fp_id, sig)
    plant_all(cache, fp_id, sig)
    return cache, fp_id, sig


def _bad_items(report: dict) -> set[tuple[str, str]]:
    return {(b["what"], b.get("key", b.get("path"))) for b in report["bad"]}


EXPECTED = ({("queue-item", n) for n in QUEUE_BAD} | {("lease", n) for n in LEASE_BAD}
            | {("failure-record", n) for n in FAILED_BAD} | {("fingerprint-file", "fingerprint.json")})


# --- verify ------------------------------------------------------------------------------------

def test_verify_reports_each_poisoned_record_and_repair_removes_it(poisoned, tmp_path):
    cache, fp_id, sig = poisoned
    w = aoti(tmp_path, "verify", "cache", "verify", "--cache-dir", str(cache.root), "--json")
    rep = json.loads(w.out)
    assert w.p.returncode == 1, w.err
    assert EXPECTED <= _bad_items(rep), sorted(EXPECTED - _bad_items(rep))
    assert rep["ok"] == 1, rep                 # the good entry still verifies
    assert w.peak_rss < RSS_LIMIT
    kinds = {(b["what"], b["key"]): b["kind"] for b in rep["bad"] if "key" in b}
    assert kinds[("queue-item", Q_FIFO)] == "not_regular" and kinds[("queue-item", Q_HUGE)] == "too_large"
    assert kinds[("lease", L_INF)] == "corrupt" and "ttl" in next(
        b["detail"] for b in rep["bad"] if b.get("key") == L_INF)
    # the table form names each one too (no traceback)
    t = aoti(tmp_path, "verify-text", "cache", "verify", "--cache-dir", str(cache.root))
    assert t.p.returncode == 1 and "Traceback" not in t.err
    assert sum(line.startswith("BAD ") for line in t.out.splitlines()) == len(rep["bad"])

    r = aoti(tmp_path, "repair", "cache", "verify", "--repair", "--cache-dir", str(cache.root), "--json")
    rep2 = json.loads(r.out)
    assert r.p.returncode == 0, r.err
    assert EXPECTED <= {(b["what"], b.get("key")) for b in rep2["bad"] if b.get("repaired")}
    ns = cache.ns(fp_id)
    assert sorted(os.listdir(ns / "queue")) == [f"{sig.key}.msgpack"]       # the good item stays
    assert os.listdir(ns / "leases") == []
    assert sorted(os.listdir(ns / "failed")) == [Q_DIR[:2]] + sorted(
        {k[:2] for k in (Q_FIFO, Q_ZERO, Q_HUGE, Q_SCHEMA)})
    assert all(os.listdir(ns / "failed" / s) == [] for s in os.listdir(ns / "failed"))
    assert os.path.exists("/dev/zero")

    c = aoti(tmp_path, "clean", "cache", "verify", "--cache-dir", str(cache.root), "--json")
    rep3 = json.loads(c.out)
    assert c.p.returncode == 0 and rep3["bad"] == [] and rep3["ok"] == 1, rep3
    print(f"drill 10 verify: bad_reported={len(rep['bad'])} expected={len(EXPECTED)} repaired={rep2['repaired']} "
          f"after_repair_bad=0 good_entry_ok=1 good_queue_item_kept=1 peak_rss_mib={w.peak_rss >> 20}")


def test_stats_and_ls_finish_on_poisoned_cache(poisoned, tmp_path):
    cache, fp_id, sig = poisoned
    s = aoti(tmp_path, "stats", "cache", "stats", "--cache-dir", str(cache.root), "--json")
    st = json.loads(s.out)
    assert s.p.returncode == 0, s.err
    assert st["fingerprints"][fp_id]["fingerprint"] == "fingerprint.json unreadable"   # a FIFO: not read
    assert st["queue"] == 1 + 7 and st["leases"] == 7 and st["entries"] == 1
    ls = aoti(tmp_path, "ls", "cache", "ls", "--failed", "--cache-dir", str(cache.root))
    assert ls.p.returncode == 0 and "Traceback" not in ls.err, ls.err
    # `cache rm` of a poisoned record (a directory) and of all of them (a FIFO, links, huge)
    rm1 = aoti(tmp_path, "rm1", "cache", "rm", Q_DIR[:12], "--cache-dir", str(cache.root), "--json")
    assert rm1.p.returncode == 0 and json.loads(rm1.out)["failure_records_removed"] == 1, rm1.err
    rm = aoti(tmp_path, "rm", "cache", "rm", "--failed", "--cache-dir", str(cache.root), "--json")
    assert rm.p.returncode == 0 and json.loads(rm.out)["failure_records_removed"] == 4, rm.err
    left = {str(p.relative_to(cache.ns(fp_id) / "failed")) for p in (cache.ns(fp_id) / "failed").rglob("*")}
    assert not any(k in name for name in left for k in (Q_DIR, Q_FIFO, Q_ZERO, Q_HUGE, Q_SCHEMA)), left
    assert os.path.exists("/dev/zero")
    print(f"drill 10 stats/ls/rm: exit=0,0,0,0 queue={st['queue']} leases={st['leases']} failures={st['failures']} "
          f"rm_removed=1+4")


# --- serve -------------------------------------------------------------------------------------

def test_serve_skips_each_bad_queue_item_and_keeps_draining(poisoned, tmp_path):
    """`aoti-farm serve` on the poisoned queue: each bad item (and the failure record poison
    under the same keys, read first) is logged and counted once; the good item is drained;
    SIGTERM stops it with exit 0."""
    cache, fp_id, sig = poisoned
    good = cache.ns(fp_id) / "queue" / f"{sig.key}.msgpack"
    w = Watched([sys.executable, "-m", "aoti_farm", "serve", "--cache-dir", str(cache.root), "--cpu-workers", "1",
                 "--poll-interval", "0.2"], tmp_path, "serve")
    try:
        def drained() -> bool:
            return not good.exists() and w.err.count("skipping bad queue item") >= len(QUEUE_BAD)

        assert w.wait(300, until=drained) and w.p.poll() is None, (w.killed_for, w.err[-3000:])
        time.sleep(1.0)       # a few more polls: each bad item is still skipped, not re-logged
        assert w.p.poll() is None, w.err[-3000:]
        rc = w.stop()
    finally:
        w.close()
    err = w.err
    assert w.killed_for is None, w.killed_for
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err
    for name in QUEUE_BAD:
        assert f"/queue/{name[:16]}" in err, name
    assert f"bad queue items skipped {len(QUEUE_BAD)}" in err, err[-1500:]
    assert w.peak_rss < RSS_LIMIT
    # serve leaves bad items to `cache verify --repair`
    assert len(os.listdir(cache.ns(fp_id) / "queue")) == len(QUEUE_BAD)
    print(f"drill 10 serve: bad_items_skipped={len(QUEUE_BAD)} good_item_drained=1 sigterm_exit={rc} "
          f"peak_rss_mib={w.peak_rss >> 20}")


# --- the hook's compile worker -----------------------------------------------------------------

def test_compile_worker_skips_bad_items_and_compiles_past_poisoned_lease_and_record(kernels, tmp_path):
    """The worker drains a poisoned queue: one ``bad-item`` event per bad item; the good
    signature -- whose lease is a FIFO and whose failure record links to /dev/zero -- is
    compiled (one real compile) and published; then the worker exits idle."""
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = Cache(kernels.copy_to(tmp_path / "c").root, signing_key=None)
    fp_id = kernels.fp.id
    cache.remove(fp_id, sig.key)
    ns = cache.ns(fp_id)
    assert missq.enqueue(cache, fp_id, sig)
    plant_queue(ns, sig)
    (ns / "leases").mkdir(exist_ok=True)
    os.mkfifo(ns / "leases" / f"{sig.key}.lease")
    (ns / "failed" / sig.key[:2]).mkdir(parents=True, exist_ok=True)
    os.symlink("/dev/zero", ns / "failed" / sig.key[:2] / f"{sig.key}.msgpack")
    w = Watched([sys.executable, "-m", "aoti_farm.runtime.compile_worker", "--cache-dir", str(cache.root),
                 "--fp-id", fp_id, "--idle", "3"], tmp_path, "worker")
    try:
        w.wait(400)
    finally:
        w.close()
    assert w.killed_for is None, (w.killed_for, w.out[-3000:], w.err[-3000:])
    assert w.p.returncode == 0, w.err[-3000:]
    events = [json.loads(line) for line in w.out.splitlines() if line.startswith('{"event"')]
    bad = [e["key"] for e in events if e["event"] == "bad-item"]
    assert sorted(bad) == sorted(QUEUE_BAD), bad            # each once
    outcomes = [e for e in events if e["event"] == "outcome"]
    assert [(o["key"], o["status"]) for o in outcomes] == [(sig.key, "compiled")], outcomes
    assert events[-1]["event"] == "idle-exit"
    assert cache.open_entry(fp_id, sig.key).key == sig.key
    assert not os.path.lexists(ns / "leases" / f"{sig.key}.lease")              # taken over, released
    assert not os.path.lexists(ns / "failed" / sig.key[:2] / f"{sig.key}.msgpack")  # obsolete: removed
    assert w.peak_rss < RSS_LIMIT
    print(f"drill 10 compile worker: bad_items={len(bad)} compiled=1 fifo_lease_taken_over=1 "
          f"dev_zero_failure_record_skipped=1 exit={w.p.returncode} peak_rss_mib={w.peak_rss >> 20}")


# --- leases and failure records, record by record ----------------------------------------------

_CHILD = r"""
import json, os, sys, time
from aoti_farm.cache import leases, records
from aoti_farm.cache.store import Cache
root, fp_id, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
c = Cache(root, signing_key=None)
out = {}
for k in keys:
    l = leases.try_acquire(c, fp_id, k, "drill", 5)
    out[k] = l is not None
    if l is not None:
        l.release()
out["failures"] = {k: c.failure(fp_id, k) for k in keys}
out["counts"] = records.bad_counts()
print(json.dumps(out))
"""


def test_each_poisoned_lease_counts_as_expired_and_records_are_skipped(poisoned, tmp_path):
    """In a watched child (a FIFO must not hang it): every bad lease is taken over at once
    (never blocks its key) and counted; a live, well-formed lease is respected; each
    poisoned failure record reads as "none" and is counted."""
    cache, fp_id, sig = poisoned
    live = leases.try_acquire(cache, fp_id, sig.key, "live-holder", 30)
    assert live is not None
    try:
        keys = [L_FIFO, L_INF, L_NAN, L_GARBAGE, L_NEG, L_BIG, L_FUTURE, sig.key, Q_FIFO, Q_ZERO, Q_HUGE, Q_DIR]
        w = Watched([sys.executable, "-c", _CHILD, str(cache.root), fp_id, *keys], tmp_path, "child")
        try:
            w.wait(120)
        finally:
            w.close()
        assert w.killed_for is None and w.p.returncode == 0, (w.killed_for, w.err[-2000:])
        out = json.loads(w.out.splitlines()[-1])
    finally:
        live.release()
    for k in (L_FIFO, L_INF, L_NAN, L_GARBAGE, L_NEG, L_BIG, L_FUTURE):
        assert out[k] is True, k                      # bad: expired, taken over
    assert out[sig.key] is False                       # a live lease still holds its key
    assert all(v is None for v in out["failures"].values())
    counts = out["counts"]
    assert sum(v for k, v in counts.items() if k.startswith("lease/")) >= 7, counts
    assert sum(v for k, v in counts.items() if k.startswith("failure-record/")) >= 4, counts
    # a fresh garbage lease (perhaps a holder's torn write) blocks for at most one TTL
    d = cache.ns(fp_id) / "leases"
    (d / f"{L_GARBAGE}.lease").write_bytes(b"{\"owner\": \"h")
    assert leases.try_acquire(cache, fp_id, L_GARBAGE, "x", 5) is None
    old = time.time() - 6
    os.utime(d / f"{L_GARBAGE}.lease", (old, old))
    lease = leases.try_acquire(cache, fp_id, L_GARBAGE, "x", 5)
    assert lease is not None
    lease.release()
    # a lease asked for with an unbounded TTL is written with a bounded one
    lease = leases.try_acquire(cache, fp_id, _k("c1"), "x", float("inf"))
    assert leases.read_lease(cache, fp_id, _k("c1"))["ttl"] == leases.DEFAULT_TTL
    lease.release()
    poisoned_records = sum(out["failures"][k] is None for k in (Q_FIFO, Q_ZERO, Q_HUGE, Q_DIR))
    print(f"drill 10 leases: bad_leases_taken_over=7/7 live_lease_respected=1 "
          f"poisoned_failure_records_skipped={poisoned_records}/4 counts={counts}")


# --- linked directories ------------------------------------------------------------------------

def test_linked_record_directories_never_make_anyone_write_outside(kernels, tmp_path):
    from aoti_farm.runtime import Settings, install

    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    cache = Cache(kernels.copy_to(tmp_path / "c").root, signing_key=None)
    fp_id = kernels.fp.id
    ns = cache.ns(fp_id)
    outside = tmp_path / "outside"
    for sub in ("queue", "leases", "failed"):
        (outside / sub).mkdir(parents=True)
        (outside / sub / "keep").write_text("x")
        if (ns / sub).exists():
            import shutil

            shutil.rmtree(ns / sub)
        os.symlink(outside / sub, ns / sub)
    other = sig_mul()
    with pytest.raises(FarmError):
        missq.enqueue(cache, fp_id, other)
    with pytest.raises(FarmError):
        leases.try_acquire(cache, fp_id, other.key, "x")
    with pytest.raises(FarmError):
        cache.record_failure(kernels.fp, other, "boom")
    with pytest.raises(FarmError):
        missq.pending(cache, fp_id)
    assert cache.failure(fp_id, other.key) is None and cache.failed_keys(fp_id) == set()
    # the serving hook: a miss it cannot queue is counted, nothing written outside
    import torch

    x = torch.randn(5, 3)
    with install(cache_dir=str(cache.root), on_miss="queue", settings=Settings(poll_interval=0.05)) as hook:
        torch.testing.assert_close(torch.mul(x, x), x * x)
        hook.flush()
        st = hook.stats()
    assert st["queue_errors"] >= 1, st
    for sub in ("queue", "leases", "failed"):
        assert os.listdir(outside / sub) == ["keep"], sub
    w = aoti(tmp_path, "verify", "cache", "verify", "--cache-dir", str(cache.root), "--json")
    rep = json.loads(w.out)
    assert w.p.returncode == 1
    assert {("queue-dir", "queue"), ("lease-dir", "leases"), ("failed-dir", "failed")} <= _bad_items(rep), rep
    r = aoti(tmp_path, "repair", "cache", "verify", "--repair", "--cache-dir", str(cache.root), "--json")
    assert r.p.returncode == 0, r.out
    for sub in ("queue", "leases", "failed"):
        assert not os.path.lexists(ns / sub) and os.listdir(outside / sub) == ["keep"]   # the link went, not its target
    assert missq.enqueue(cache, fp_id, other) and (ns / "queue" / f"{other.key}.msgpack").is_file()
    print(f"drill 10 linked dirs: writes_refused=3 hook_queue_errors={st['queue_errors']} outside_touched=0 "
          f"verify_reported=3 repair_removed_links=3")


# --- part 5: the signing key fails closed -------------------------------------------------------

def test_empty_or_unreadable_signing_key_is_exit_2_never_no_signing(kernels, tmp_path):
    sig = sig_add_alpha()
    assert kernels.ensure(sig).status in ("compiled", "cached")
    copy = kernels.copy_to(tmp_path / "c")
    for key in copy.list_keys(kernels.fp.id) - {sig.key}:   # other tests' kernels: not part of the counts
        copy.remove(kernels.fp.id, key)
    root = str(copy.root)
    empty, blank, good = tmp_path / "empty.key", tmp_path / "blank.key", tmp_path / "good.key"
    empty.write_bytes(b"")
    blank.write_bytes(b"  \n\t\n")
    good.write_bytes(b"fleet-secret\n")
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    cases = {
        "key-whitespace": {"AOTI_FARM_SIGNING_KEY": " \t"},
        "file-empty": {"AOTI_FARM_SIGNING_KEY_FILE": str(empty)},
        "file-fifo": {"AOTI_FARM_SIGNING_KEY_FILE": str(fifo)},      # must not hang
        "file-missing": {"AOTI_FARM_SIGNING_KEY_FILE": str(tmp_path / "nope.key")},
    }
    for name, extra in cases.items():
        w = aoti(tmp_path, name, "cache", "verify", "--cache-dir", root, env={**ENV, **extra}, timeout=60)
        lines = [ln for ln in w.err.splitlines() if ln.strip()]
        assert w.p.returncode == 2 and len(lines) == 1 and "Traceback" not in w.err, (name, w.err)
        assert "AOTI_FARM_SIGNING_KEY" in lines[0], lines
    # the TOML's signing_key_file: serve refuses before starting anything
    toml = tmp_path / "farm.toml"
    toml.write_text(f'[farm]\nsigning_key_file = "{blank}"\n')
    w = aoti(tmp_path, "serve-toml", "serve", "--cache-dir", root, "--config", str(toml), timeout=60)
    assert w.p.returncode == 2 and "signing_key_file" in w.err and "Traceback" not in w.err, w.err
    # and in-process: every other form of empty, for the config path (which resolves the key
    # every command and farm process uses), the Cache and the hook
    from aoti_farm.config import FarmConfig, load_signing_key, resolve, signing_key
    from aoti_farm.runtime import Settings, install

    for env in ({"AOTI_FARM_SIGNING_KEY": ""}, {"AOTI_FARM_SIGNING_KEY_FILE": ""},
                {"AOTI_FARM_SIGNING_KEY_FILE": str(blank)}, {"AOTI_FARM_SIGNING_KEY_FILE": str(tmp_path)}):
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            with pytest.raises(UserError):
                signing_key(resolve(FarmConfig))
    for bad in ("", b"", " \n"):
        with pytest.raises(UserError):
            Cache(root, signing_key=bad)
        with pytest.raises(UserError):
            install(cache_dir=root, settings=Settings(signing_key=bad))
    with pytest.raises(UserError, match="signing_key_file"):
        load_signing_key(path=str(empty))
    assert load_signing_key(path=str(good)) == b"fleet-secret"
    # a good key still works: the (unsigned) entry is refused as unsigned, not served
    w = aoti(tmp_path, "good", "cache", "verify", "--cache-dir", root, "--json",
             env={**ENV, "AOTI_FARM_SIGNING_KEY_FILE": str(good)})
    rep = json.loads(w.out)
    assert w.p.returncode == 1 and rep["by_kind"].get("unsigned") == 1, rep
    print(f"drill 10 empty key: cli_exit2={len(cases) + 1}/{len(cases) + 1} in_process_refused=11 "
          f"good_key_checks_signatures=1")


def test_records_module_bounds(tmp_path):
    """Unit-level: the bounded read refuses each poisoned form without reading it."""
    from aoti_farm.cache import failures as failrec, records

    cache = Cache(tmp_path / "c", signing_key=None)
    fp_id = "0" * 24
    d = tmp_path / "c" / fp_id / "queue"
    d.mkdir(parents=True)
    os.mkfifo(d / "fifo")
    os.symlink("/dev/zero", d / "zero")
    _sparse(d / "huge")
    (d / "dir").mkdir()
    fd = records.open_subdir(cache, fp_id, "queue")
    try:
        kinds = {}
        for n in ("fifo", "zero", "huge", "dir"):
            with pytest.raises(records.BadRecord) as e:
                records.read(cache, fd, n, n)
            kinds[n] = e.value.kind
        with pytest.raises(FileNotFoundError):
            records.read(cache, fd, "missing", "missing")
    finally:
        os.close(fd)
    assert kinds == {"fifo": "not_regular", "zero": "insecure", "huge": "too_large", "dir": "not_regular"}
    with pytest.raises(records.BadRecord, match="ttl"):
        records.check_schema({"ttl": float("nan")}, {"ttl": records.is_number}, "x")
    assert not leases._good_ttl(float("inf")) and not leases._good_ttl(-1.0) and not leases._good_ttl(1e9)
    assert failrec.SUFFIX == missq.SUFFIX == ".msgpack"
