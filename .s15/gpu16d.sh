# the 16-core GPU host: W=16 on the 85-signature trace with the host's ceiling and CPU by process, then W=1 on its first 16 signatures
set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime)"
lscpu | grep -E "^Model name|^Flags" | cut -c1-400 | sed 's/^/[lscpu] /'
python3 scripts/bench/scaling.py --workers 16 --trace .s14/trace.json --workdir /root/d16 --json $OUT/w16.json --run-timeout 150 2>&1 | tee $OUT/w16.log | grep -v "^  pid"
python3 scripts/bench/scaling.py --workers 1 --unique 16 --trace .s14/trace.json --workdir /root/d1 --json $OUT/w1u16.json --run-timeout 150 2>&1 | tee $OUT/w1u16.log | grep -v "^  pid"
mkdir -p /root/rep && cp /root/d16/w16/report.json /root/rep/w16-report.json; cp /root/d1/w1/report.json /root/rep/w1u16-report.json; tar czf $OUT/reports.tgz -C /root/rep .
true
