# 16-core GPU host: W=16 and W=1 side by side in one scaling.py (background; outlives the call), fork server on (default)
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, $(uptime)"
lscpu | grep -E "^Model name" | sed 's/^/[lscpu] /'
mkdir -p /root/s17
setsid nohup bash -c "python3 scripts/bench/scaling.py --workers 16,1 --no-ceiling --trace .s14/trace.json --workdir /root/s17/w --json /root/s17/final.json --run-timeout 600 > /root/s17/final.log 2>&1; touch /root/s17/done" >/dev/null 2>&1 </dev/null &
echo "[diag] started in the background at $(date -u +%T)"
bash .s18/poll17.sh $(( 525 - SECONDS ))
