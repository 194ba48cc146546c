#!/usr/bin/env bash
# GPU validation of aoti-farm, in ONE call of the lent H100 machine (issue 7).
#
# Here, once:   echo /.whl/ >> .git/info/exclude && ../shared/device/make-gpu-wheels.sh .whl
# Then, with the device tool:  run(command="bash scripts/gpu_validate.sh", carry=[".whl"])
#
# It installs the carried Ray wheel and this checkout into /tmp/site (that machine has no
# network), then runs scripts/gpu_checks.py, which does the mixed CPU+CUDA warm on >= 4
# fractional-GPU actors, the hook-vs-eager differential on CUDA, the CUDA benchmarks
# against upstream's holder and the fingerprint check.  Everything it measures lands in
# $OUT (gpu-results.json, gpu.log, the warm report).
set -uo pipefail
OUT=${OUT:-/tmp/aoti-farm-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "ray wheel install failed"; exit 1; }
# the carried wheel is re-zipped without file modes: Ray's own binaries need +x back
chmod -R a+x /tmp/site/ray/core 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
  --target /tmp/site . || { echo "aoti-farm install failed"; exit 1; }
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PATH=/tmp/site/bin:$PATH
cd /tmp  # import aoti_farm from /tmp/site, not the checkout
python3 "$OLDPWD/scripts/gpu_checks.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
exit "${PIPESTATUS[0]}"
