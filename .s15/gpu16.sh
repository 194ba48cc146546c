# the 16-core GPU host: run 14 final again, side by side (W=16 then W=1), with the host's ceiling first
set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
lscpu | grep -E "^Model name|^Thread|^Core|^Socket|^CPU\(s\)|MHz" | sed 's/^/[lscpu] /'
python3 scripts/bench/scaling.py --workers 16,1 --trace .s14/trace.json --workdir /root/s15f --json $OUT/final.json --run-timeout 500 2>&1 | tee $OUT/final.log | grep -v "^  pid"
mkdir -p /root/rep && for d in /root/s15f/*/; do n=$(basename $d); cp $d/report.json /root/rep/$n-report.json 2>/dev/null; done
tar czf $OUT/reports.tgz -C /root/rep .
true
