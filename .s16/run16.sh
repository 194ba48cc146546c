# call 1 on the 16-core GPU host: set-up, then W=16 and W=1 side by side in one scaling.py (in its own session: it outlives the call)
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
lscpu | grep -E "^Model name|^Thread|^Core|^Socket|^CPU\(s\)|MHz|^NUMA|^Hypervisor|^Virtualization" | sed 's/^/[lscpu] /'
grep -E "^cpu " /proc/stat | sed 's/^/[stat] /'; uname -a | sed 's/^/[uname] /'; mount | grep -E " / | /tmp | /root " | sed 's/^/[mount] /'
mkdir -p /root/s16
setsid nohup bash -c "python3 scripts/bench/scaling.py --workers 16,1 --trace .s14/trace.json --workdir /root/s16/w --json /root/s16/final.json --run-timeout 600 > /root/s16/final.log 2>&1; touch /root/s16/done" >/dev/null 2>&1 </dev/null &
echo "[diag] started in the background at $(date -u +%T)"
bash .s16/poll.sh $(( 560 - SECONDS ))
