set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
mkdir -p /root/ab2
i=0
for mode in $2; do
  i=$((i+1))
  unset AOTI_FARM_AB_LOADER_BESIDE; case $mode in beside) export AOTI_FARM_AB_LOADER_BESIDE=1;; esac
  echo "[diag] run $i: $mode (AOTI_FARM_AB_LOADER_BESIDE=${AOTI_FARM_AB_LOADER_BESIDE-unset}), $(date -u +%FT%TZ)"
  python3 scripts/bench/scaling.py --workers 16 --trace .s14/trace.json --workdir /root/s14b-$i --json /root/ab2/w16-$i-$mode.json --run-timeout 200 2>&1 | tee /root/ab2/w16-$i-$mode.log | grep -v "^  pid"
  cp /root/s14b-$i/w16/report.json /root/ab2/w16-$i-$mode-report.json 2>/dev/null
done
tar czf $OUT/ab2.tgz -C /root/ab2 .
true
