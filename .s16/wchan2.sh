# the 64-core host: W=64 with the farm's processes on torch's NVML check (the commit given), where do its processes sleep?
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, $(uptime)"
sample() {  # $1 tag, $2 seconds
  local end=$((SECONDS+$2))
  while [ $SECONDS -lt $end ]; do
    echo "T $(date +%s.%N) $(head -1 /proc/stat) $(grep procs_ /proc/stat | tr '\n' ' ')"
    ps -eo stat=,wchan:32=,comm= | awk '$3 ~ /python|ray::|default_wo|cc1plus|g\+\+/ {print substr($1,1,1)" "$2" "($3 ~ /cc1plus|g\+\+/ ? "cc" : "py")}' | sort | uniq -c | sort -rn | head -10
    sleep 0.5
  done > $OUT/wchan-$1.txt
}
( python3 scripts/bench/scaling.py --workers 64 --no-ceiling --trace .s15/trace169.json --workdir /root/wc --json $OUT/wc.json --run-timeout 300 > $OUT/wc.log 2>&1 ) &
while [ ! -d /root/wc/w64 ]; do sleep 0.1; done
sample warm 30
wait
cp /root/wc/w64/report.json $OUT/w64-report.json 2>/dev/null
grep -E "rc=|busy CPUs|by state" $OUT/wc.log | cut -c1-600
grep -A3 "^run " $OUT/wc.log | cut -c1-250
for f in $OUT/wchan-*.txt; do echo "== $f"; grep -v "^T" $f | awk '{c[$2" "$3" "$4]+=$1} END {for (k in c) print c[k], k}' | sort -rn | head -14; done
true
