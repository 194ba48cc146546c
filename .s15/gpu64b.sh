# the 64-core host again: W=64 on the 169-signature trace, with the host's ceiling at 64 copies first and CPU by process
set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
mkdir -p /root/s15b
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
python3 scripts/bench/scaling.py --workers 64 --trace .s15/trace169.json --workdir /root/s15b/w --run-timeout 200 --json $OUT/w64-again.json 2>&1 | tee $OUT/w64-again.log | grep -v "^  pid"
cp /root/s15b/w/w64/report.json $OUT/w64-again-report.json
true
