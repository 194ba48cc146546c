lim=${1:-560}
while [ ! -f /root/s17/done ] && [ $SECONDS -lt $lim ]; do sleep 5; done
echo "[poll] $(date -u +%T) done=$( [ -f /root/s17/done ] && echo yes || echo no )"
grep -v "^  pid" /root/s17/final.log | cut -c1-2500 | tail -60
for d in /root/s17/w/*/; do python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); tl=r['timeline']
print('[fork', sys.argv[2]+']', 'server threads', sorted(set(str((w.get('fork') or {}).get('server_threads')) for w in tl['workers'])), [ (w.get('fork') or {}).get('error') or (w.get('fork') or {}).get('lost') or ('ok' if (w.get('fork') or {}).get('pid') else None) for w in tl['workers']], 'proxy torch', [w.get('proxy_imported_torch') for w in tl['workers']])
" $d/report.json $(basename $d) 2>/dev/null; done
mkdir -p /root/rep17 && for d in /root/s17/w/*/; do n=$(basename $d); cp $d/report.json /root/rep17/$n-report.json 2>/dev/null; done
cp /root/s17/*.json /root/s17/*.log /root/rep17/ 2>/dev/null
tar czf $OUT/s17.tgz -C /root/rep17 .
true
