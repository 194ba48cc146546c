# wait for the background run until $1 seconds of this call have passed, then bring back what there is
lim=${1:-560}
while [ ! -f /root/s16/done ] && [ $SECONDS -lt $lim ]; do sleep 5; done
echo "[poll] $(date -u +%T) done=$( [ -f /root/s16/done ] && echo yes || echo no )"
grep -v "^  pid" /root/s16/final.log | cut -c1-2500 | tail -60
for d in /root/s16/w/*/; do tail -c 600 $d/stderr.log 2>/dev/null | tail -2 | sed "s|^|[$(basename $d)] |"; done
mkdir -p /root/rep && for d in /root/s16/w/*/; do n=$(basename $d); cp $d/report.json /root/rep/$n-report.json 2>/dev/null; done
cp /root/s16/*.json /root/s16/*.log /root/rep/ 2>/dev/null
tar czf $OUT/s16.tgz -C /root/rep .
true
