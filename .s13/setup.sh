# install the carried Ray wheel and the project into /tmp/site (skipped when a warm machine has it)
if [ ! -f /tmp/site/.s13-done ]; then
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . >/dev/null 2>&1 || python3 -m pip install -q --no-deps --target /tmp/site . || exit 1
  chmod -R a+x /tmp/site/ray/core
  python3 -m compileall -q -j 16 /tmp/site > /dev/null 2>&1   # what a normal pip install does
  touch /tmp/site/.s13-done
  echo "[setup] $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH=/tmp/site
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
