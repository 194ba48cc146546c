# 16-core GPU host: which import starts a thread in the fork server's second stage; W=16 fork server off/on A/B
export PYTHONUNBUFFERED=1
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores, $(uptime)"
lscpu | grep -E "^Model name" | sed 's/^/[lscpu] /'
python3 -c "import torch; print('[diag] torch', torch.__version__, torch.version.cuda)"
echo "--- threads, GPUs hidden"
OPENBLAS_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= timeout 120 python3 .s19/threads.py 2>&1 | grep -v "^  File" | tail -40
echo "--- actor_preload as the second stage"
OPENBLAS_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= timeout 120 python3 -c "
import aoti_farm.workers.actor_preload as m; from aoti_farm.workers.forkserver import _other_threads; print('[preload]', m.ERROR, _other_threads())" 2>&1 | tail -3
mkdir -p /root/s19
setsid nohup bash -c "python3 scripts/bench/scaling.py --workers 16 --no-ceiling --also-env AOTI_FARM_FORK_SERVER=0 --trace .s14/trace.json --workdir /root/s19/w --json /root/s19/ab.json --run-timeout 300 > /root/s19/ab.log 2>&1; touch /root/s19/done" >/dev/null 2>&1 </dev/null &
echo "[diag] started in the background at $(date -u +%T)"
lim=${2:-420}
while [ ! -f /root/s19/done ] && [ $SECONDS -lt $lim ]; do sleep 5; done
echo "[poll] $(date -u +%T) done=$( [ -f /root/s19/done ] && echo yes || echo no )"
grep -v "^  pid" /root/s19/ab.log | cut -c1-2500 | tail -50
for d in /root/s19/w/*/; do python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); tl=r['timeline']
fk=[(w.get('fork') or {}) for w in tl['workers']]
print('[fork', sys.argv[2]+']', [ (f.get('imports'), f.get('threads_seen'), f.get('error') or f.get('lost')) for f in fk][:3], 'n ok', sum(1 for f in fk if f.get('pid')), 'proxy torch', [w.get('proxy_imported_torch') for w in tl['workers']])
" $d/report.json $(basename $d) 2>&1 | tail -2; done
mkdir -p /root/rep19 && for d in /root/s19/w/*/; do n=$(basename $d); cp $d/report.json /root/rep19/$n-report.json 2>/dev/null; cp $d/stderr.log /root/rep19/$n-stderr.log 2>/dev/null; done
cp /root/s19/*.json /root/s19/*.log /root/rep19/ 2>/dev/null
tar czf $OUT/s19a.tgz -C /root/rep19 .
true
