set -o pipefail
export PYTHONUNBUFFERED=1
source .s13/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
lscpu | grep -E "^Model name|^Thread|^Core|^Socket|^CPU\(s\)|MHz" | sed 's/^/[lscpu] /'
python3 scripts/bench/scaling.py --workers $2 --trace .s13/trace.json --workdir /root/s13f --json $OUT/final.json --run-timeout 520 2>&1 | tee $OUT/final.log | grep -v "^  pid"
mkdir -p /root/rep && for d in /root/s13f/*/; do n=$(basename $d); cp $d/report.json /root/rep/$n-report.json 2>/dev/null; done
tar czf $OUT/reports.tgz -C /root/rep .
true
