set -o pipefail
export PYTHONUNBUFFERED=1
source .s13/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
i=0
for mode in $2; do
  i=$((i+1))
  unset AOTI_FARM_EARLY_RAY AOTI_FARM_PRELOAD_NICE; case $mode in off) export AOTI_FARM_EARLY_RAY=0;; nice0) export AOTI_FARM_PRELOAD_NICE=0;; w1) ;; esac
  echo "[diag] run $i: $mode (AOTI_FARM_EARLY_RAY=${AOTI_FARM_EARLY_RAY-unset} AOTI_FARM_PRELOAD_NICE=${AOTI_FARM_PRELOAD_NICE-unset}), $(date -u +%FT%TZ)"
  python3 scripts/bench/scaling.py --workers 16 --trace .s13/trace.json --workdir /root/s13-$i --json $OUT/w16-$i-$mode.json --run-timeout 200 2>&1 | tee $OUT/w16-$i-$mode.log | grep -v "^  pid"
  cp /root/s13-$i/w16/report.json $OUT/w16-$i-$mode-report.json 2>/dev/null
done
true
