# the 64-core host: its own ceiling at 64 and 32 copies (no warms), with the farm's own C++ compiles replayed
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
lscpu | grep -E "^Model name|^Thread|^Core|^Socket|^CPU\(s\)|MHz|^NUMA|^Hypervisor" | sed 's/^/[lscpu] /'
mkdir -p /root/c64
for n in 64 32; do
  python3 scripts/bench/scaling.py --ceiling-only --workers $n --workdir /root/c64/w$n --json $OUT/ceiling$n.json 2>&1 | tee $OUT/ceiling$n.log | cut -c1-3000
  grep -E "^cpu " /proc/stat | sed 's/^/[stat] /'
done
true
