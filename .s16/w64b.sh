# the 64-core host: W=64 twice in a row on one fresh machine (fresh caches each): does a second run's start-up go idle too?
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, $(uptime)"
free -m | sed 's/^/[free] /'; grep -E "^(cpu |procs_blocked)" /proc/stat | sed 's/^/[stat] /'
python3 scripts/bench/scaling.py --workers 64 --no-ceiling --also-env AOTI_FARM_BENCH_RUN=first --trace .s15/trace169.json --workdir /root/w64b --json $OUT/w64b.json --run-timeout 300 2>&1 | tee $OUT/w64b.log | grep -v "^  pid" | grep -v "per-signature compile parts" | cut -c1-1500
free -m | sed 's/^/[free] /'
for d in /root/w64b/*/; do cp $d/report.json $OUT/$(basename $d)-report.json 2>/dev/null; done
true
