#!/usr/bin/env bash
# Warm a shared cache on a Ray cluster.
#
#   scripts/cluster_job.sh TRACE.json [CACHE_DIR]
#
# On the head node: starts Ray (unless one is already running), then submits
# `aoti-farm warm` as a Ray job with this checkout as its working directory.  Other
# nodes join with `ray start --address <head>:6379`; every node must see CACHE_DIR
# (default /shared/aoti-cache) at the same path, e.g. over NFS.
# tests/test_cluster_job.py runs this script against a real Ray head (both ways: joining
# a running head, and starting one).
#
# Environment:
#   RAY_ADDRESS            the running cluster's GCS address, host:port (default: the one
#                          `ray start` recorded on this host); none there: start a head
#   RAY_START_ARGS         extra arguments for that `ray start --head` (e.g. "--num-cpus 8")
#   RAY_DASHBOARD_ADDRESS  the job server for `ray job submit` (default http://127.0.0.1:8265)
#   RAY_AUTH_MODE          default: "token" if a token is there ($RAY_AUTH_TOKEN,
#                          $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), else unset.  `ray start`
#                          (Ray 2.60) turns token authentication on exactly when a token is
#                          there, but the ray CLI sends it only in token mode; and in token
#                          mode without a token, every ray command fails.  Make one with
#                          `ray get-auth-token --generate`.
#   AOTI_FARM_WARM_ARGS    extra arguments for `aoti-farm warm` (e.g. "--retries 3")
set -euo pipefail

usage="usage: scripts/cluster_job.sh TRACE.json [CACHE_DIR]"
trace=${1:?$usage}
cache=${2:-/shared/aoti-cache}

if [ ! -f "$trace" ]; then
  echo "cluster_job.sh: trace $trace: no such file" >&2
  exit 2
fi
# The job runs in Ray's copy of the working directory: pass absolute paths (the job's
# driver runs on this, the head, node).
trace=$(cd "$(dirname "$trace")" && pwd)/$(basename "$trace")
case $cache in /*) ;; *) cache=$PWD/$cache ;; esac

cd "$(dirname "$0")/.."

# The entrypoint runs in the environment the head was started with, whose PATH may lack
# aoti-farm (e.g. `.venv/bin/ray start --head`): pass it by absolute path, and use the
# ray of the same environment.
farm=$(command -v aoti-farm || true)
if [ -z "$farm" ] && [ -x .venv/bin/aoti-farm ]; then
  farm=.venv/bin/aoti-farm
fi
if [ -z "$farm" ]; then
  echo "cluster_job.sh: aoti-farm not found on PATH or in .venv/bin (install this checkout first)" >&2
  exit 2
fi
bindir=$(cd "$(dirname "$farm")" && pwd)
farm=$bindir/aoti-farm
ray=$bindir/ray
[ -x "$ray" ] || ray=ray

if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -n "${RAY_AUTH_TOKEN_PATH:-}" ] ||
                                    [ -f "${HOME:-/nonexistent}/.ray/auth_token" ]; }; then
  export RAY_AUTH_MODE=token
fi

if ! "$ray" status >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  "$ray" start --head --dashboard-host 127.0.0.1 ${RAY_START_ARGS:-}
fi

# shellcheck disable=SC2086
exec "$ray" job submit --address "${RAY_DASHBOARD_ADDRESS:-http://127.0.0.1:8265}" --working-dir . -- \
  "$farm" warm --address auto --model "$trace" --cache-dir "$cache" ${AOTI_FARM_WARM_ARGS:-}
