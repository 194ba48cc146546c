# wait for the background W=1 until $1 seconds of this call have passed, then bring back what there is
lim=${1:-560}
while [ ! -f /root/s15/w1.done ] && [ $SECONDS -lt $lim ]; do sleep 5; done
echo "[poll] $(date -u +%T) done=$( [ -f /root/s15/w1.done ] && echo yes || echo no ); compiled so far: $(grep -c -i "compiled\|published" /root/s15/b/w1/stderr.log 2>/dev/null)"
tail -c 1500 /root/s15/b/w1/stderr.log 2>/dev/null; tail -5 /root/s15/w1.log
mkdir -p /root/rep && for d in /root/s15/a/*/ /root/s15/b/*/; do n=$(basename $d); cp $d/report.json /root/rep/$n-report.json 2>/dev/null; done
cp /root/s15/*.json /root/s15/*.log /root/rep/ 2>/dev/null
tar czf $OUT/s15.tgz -C /root/rep .
true
