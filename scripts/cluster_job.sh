#!/usr/bin/env bash
# Warm a shared cache on a Ray cluster.
#
#   scripts/cluster_job.sh TRACE.json [CACHE_DIR]
#
# On the head node: starts Ray (unless one is already running), then submits
# `aoti-farm warm` as a Ray job with this checkout as its working directory.  Other
# nodes join with `ray start --address <head>:6379`; every node must see CACHE_DIR
# (default /shared/aoti-cache) at the same path, e.g. over NFS.
# Environment: RAY_DASHBOARD_ADDRESS (default http://127.0.0.1:8265) for `ray job submit`;
# extra arguments for `aoti-farm warm` in AOTI_FARM_WARM_ARGS (e.g. "--retries 3").
set -euo pipefail

trace=${1:?usage: scripts/cluster_job.sh TRACE.json [CACHE_DIR]}
cache=${2:-/shared/aoti-cache}
cd "$(dirname "$0")/.."

if [ ! -f "$trace" ]; then
  echo "cluster_job.sh: trace $trace: no such file (pass a path inside this checkout)" >&2
  exit 2
fi

if ! ray status >/dev/null 2>&1; then
  ray start --head --dashboard-host 127.0.0.1
fi

# shellcheck disable=SC2086
exec ray job submit --address "${RAY_DASHBOARD_ADDRESS:-http://127.0.0.1:8265}" --working-dir . -- \
  aoti-farm warm --address auto --model "$trace" --cache-dir "$cache" ${AOTI_FARM_WARM_ARGS:-}
