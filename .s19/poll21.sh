lim=${1:-560}
while [ ! -f /root/s21/done ] && [ $SECONDS -lt $lim ]; do sleep 5; done
echo "[poll] $(date -u +%T) done=$( [ -f /root/s21/done ] && echo yes || echo no )"
grep -v "^  pid" /root/s21/final.log | cut -c1-2500 | tail -60
for d in /root/s21/w/*/; do python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); tl=r['timeline']
fk=[(w.get('fork') or {}) for w in tl['workers']]
print('[fork', sys.argv[2]+']', sorted(set(str((f.get('imports'), f.get('threads_seen'), f.get('error') or f.get('lost'))) for f in fk)), 'n ok', sum(1 for f in fk if f.get('pid')), 'proxy torch', sorted(set(str(w.get('proxy_imported_torch')) for w in tl['workers'])))
" $d/report.json $(basename $d) 2>/dev/null; done
mkdir -p /root/rep21 && for d in /root/s21/w/*/; do n=$(basename $d); cp $d/report.json /root/rep21/$n-report.json 2>/dev/null; done
cp /root/s21/*.json /root/s21/*.log /root/rep21/ 2>/dev/null
tar czf $OUT/s21.tgz -C /root/rep21 .
true
