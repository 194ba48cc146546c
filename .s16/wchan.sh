# the 64-core host: where do 64 importing processes sleep? (kernel wait channel of every python / ray:: process, every 0.5 s)
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
# 1: 64 plain imports of torch and the compile path (from bytecode: a warm-up import first)
export PYTHONDONTWRITEBYTECODE=
python3 -X pycache_prefix=/root/pyc -c "import torch, torch._inductor.codecache" 2>/dev/null
sample imports 20 &
S=$!
t0=$(date +%s.%N)
for i in $(seq 64); do python3 -X pycache_prefix=/root/pyc -c "import torch, torch._inductor.codecache" 2>/dev/null & done
while [ $(jobs -p | wc -l) -gt 1 ]; do sleep 0.2; done
echo "[imports] 64 at once done in $(python3 -c "import time;print(round(time.time()-$t0,2))") s"
wait $S
# 2: a W=64 warm (the bench's set-up), sampled for its first 30 s
export PYTHONDONTWRITEBYTECODE=1
( python3 scripts/bench/scaling.py --workers 64 --no-ceiling --trace .s15/trace169.json --workdir /root/wc --json $OUT/wc.json --run-timeout 300 > $OUT/wc.log 2>&1 ) &
while [ ! -d /root/wc/w64 ]; do sleep 0.1; done
sample warm 30
wait
grep -E "rc=|busy CPUs|by state|counted" $OUT/wc.log | cut -c1-600
for f in $OUT/wchan-*.txt; do echo "== $f"; grep -v "^T" $f | awk '{c[$2" "$3" "$4]+=$1} END {for (k in c) print c[k], k}' | sort -rn | head -14; done
true
