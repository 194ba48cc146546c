set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
mkdir -p /root/ab
i=0
for mode in $2; do
  i=$((i+1))
  unset AOTI_FARM_PRECOMPILE; case $mode in off) export AOTI_FARM_PRECOMPILE=0;; esac
  echo "[diag] run $i: $mode (AOTI_FARM_PRECOMPILE=${AOTI_FARM_PRECOMPILE-unset}), $(date -u +%FT%TZ)"
  python3 scripts/bench/scaling.py --workers 16 --trace .s14/trace.json --workdir /root/s14-$i --json /root/ab/w16-$i-$mode.json --run-timeout 200 2>&1 | tee /root/ab/w16-$i-$mode.log | grep -v "^  pid"
  cp /root/s14-$i/w16/report.json /root/ab/w16-$i-$mode-report.json 2>/dev/null
done
tar czf $OUT/ab.tgz -C /root/ab .
true
