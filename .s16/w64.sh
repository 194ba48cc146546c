# the 64-core host: its ceiling at 64 copies, then W=64 on run 15's 169 signatures (no W=1: see run 15)
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime)"
lscpu | grep -E "^Model name|^CPU\(s\)|^Hypervisor" | sed 's/^/[lscpu] /'
python3 scripts/bench/scaling.py --workers 64 --trace .s15/trace169.json --workdir /root/w64 --json $OUT/w64.json --run-timeout 400 2>&1 | tee $OUT/w64.log | grep -v "^  pid" | cut -c1-2500
cp /root/w64/w64/report.json $OUT/w64-report.json 2>/dev/null
true
