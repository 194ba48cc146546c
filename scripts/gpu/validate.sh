#!/usr/bin/env bash
# GPU validation of aoti-farm in one command, on a host with a CUDA GPU (issue 7).
#
#   scripts/gpu/validate.sh [--skip-upstream-seq]
#
# Runs scripts/gpu/checks.py: the mixed CPU+CUDA warm on 4 fractional-GPU actors, the
# hook-vs-eager differential on CUDA, the CUDA per-call benchmarks against upstream's
# holder, upstream's sequential compile and the GPU-arch fingerprint check.  Everything it
# measures lands in $OUT (default /tmp/aoti-farm-gpu-out): gpu-results.json, gpu.log, the
# warm report.
#
# This checkout is installed (not imported in place) into /tmp/site with pip --no-index,
# beside the wheels in $WHEELS (default: .whl/ of the checkout), for a host without
# network access whose Python lacks Ray: build a Ray wheel there beforehand and carry it.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/aoti-farm-gpu-out}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || { echo "wheel install failed"; exit 1; }
  # a re-zipped wheel may lose its file modes: Ray's own binaries need +x back
  chmod -R a+x /tmp/site/ray/core 2>/dev/null
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
  --target /tmp/site . || { echo "aoti-farm install failed"; exit 1; }
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PATH=/tmp/site/bin:$PATH
REPO=$PWD
cd /tmp  # import aoti_farm from /tmp/site, not the checkout
python3 "$REPO/scripts/gpu/checks.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
exit "${PIPESTATUS[0]}"
