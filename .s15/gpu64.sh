# call 1 on the 64-core host: set-up, W=64 in the foreground, then W=1 in its own session (it outlives the call)
set -o pipefail
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, torch $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null), $(uptime), PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset}"
lscpu | grep -E "^Model name|^Thread|^Core|^Socket|^CPU\(s\)|MHz|^NUMA" | sed 's/^/[lscpu] /'
free -g | sed 's/^/[free] /'; df -h /dev/shm /root /tmp | sed 's/^/[df] /'
L=8,12,16,20,24,28,32,36,40,44,48,52,56,60
python3 scripts/bench/scaling.py --workers 64 --lengths $L --workdir /root/s15/a --json /root/s15/w64.json --run-timeout 400 2>&1 | tee /root/s15/w64.log | grep -v "^  pid"
cp /root/s15/a/trace.json /root/s15/trace.json
setsid nohup bash -c "python3 scripts/bench/scaling.py --workers 1 --trace /root/s15/trace.json --workdir /root/s15/b --json /root/s15/w1.json --run-timeout 1500 > /root/s15/w1.log 2>&1; touch /root/s15/w1.done" >/dev/null 2>&1 </dev/null &
echo "[diag] W=1 started in the background at $(date -u +%T)"
bash .s15/poll.sh $(( 565 - SECONDS ))
