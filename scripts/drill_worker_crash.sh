#!/usr/bin/env bash
# Drill 1, repeated: kill -9 a compile actor mid-compile during `aoti-farm warm`, N times
# (default 10).  Each round uses a fresh cache and checks: warm exits 0, no partial entry,
# no tmp/ orphan or stale lease, attempts within 1 + --retries, nothing compiled twice.
# Usage: scripts/drill_worker_crash.sh [ROUNDS]      (about 30-60 s a round on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-10}"
PY="${PYTHON:-.venv/bin/python}"
export TORCHINDUCTOR_COMPILE_THREADS=1
exec "$PY" - "$ROUNDS" <<'PYEOF'
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests")
from conftest import sig_add_alpha, sig_mul
from test_drills_farm import run_worker_crash

rounds, bad = int(sys.argv[1]), 0
for i in range(rounds):
    with tempfile.TemporaryDirectory(prefix="drill1-") as d:
        sigs = [sig_add_alpha(), sig_mul()]
        f = run_worker_crash(Path(d), sigs)
        ok = (f["exit"] == 0 and f["killed"] >= 1 and f["keys"] == sorted(s.key for s in sigs)
              and f["compiled"] == len(sigs) and all(len(v) == 1 for v in f["statuses"].values())
              and f["attempts"] and max(f["attempts"]) <= 3 and f["verify_clean"]
              and not f["tmp"] and not f["leases"])
        bad += not ok
        print(f"round {i + 1}/{rounds}: {'ok' if ok else 'FAILED'} killed={f['killed']} exit={f['exit']} "
              f"attempts={f['attempts']} compiles={f['compiled']} entries={f['entries']} "
              f"tmp_orphans={len(f['tmp'])} stale_leases={len(f['leases'])}", flush=True)
        if not ok:
            print(f["stderr"], file=sys.stderr)
print(f"drill 1 x{rounds}: {rounds - bad} ok, {bad} failed")
sys.exit(1 if bad else 0)
PYEOF
