"""Helpers for tests/e2e/test_runtime.py and tests/e2e/test_recorder.py (no tests here).

Run as a script it is one serving process of the two-process miss test:
``python tests/_runtime_helpers.py CACHE BARRIER_DIR INDEX WORKER_LOG`` prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402


def cat_inputs(seed: int = 0):
    """The tensor-list case: cat of a non-contiguous and a contiguous tensor."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(6, 4, generator=g).t()          # (4, 6), strides (1, 4)
    b = torch.randn(3, 6, generator=g)
    return [a, b], 0


def same(got: torch.Tensor, exp: torch.Tensor) -> bool:
    """Equal to eager exactly: values, dtype, shape and strides."""
    return (got.dtype == exp.dtype and got.shape == exp.shape and got.stride() == exp.stride()
            and torch.equal(got, exp))


def run_threads(n: int, fn) -> None:
    """Run ``fn`` in ``n`` threads at once and wait for all of them."""
    import threading

    ts = [threading.Thread(target=fn) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def wait_until(pred, timeout: float = 300.0, step: float = 0.1):
    """Poll ``pred`` until true; the timeout only bounds a hang (no timing is asserted)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def _serve(cache: str, barrier: str, index: int, worker_log: str) -> dict:
    from aoti_farm.cache.store import Cache
    from aoti_farm.runtime import Settings, install
    from aoti_farm.signature import from_call

    tensors, dim = cat_inputs()
    expected = torch.cat(tensors, dim)
    key = from_call(torch.ops.aten.cat.default, (tensors, dim), {}).key
    threads_before = torch.get_num_threads()
    threads_seen = set()
    hook = install(cache_dir=cache, ops=["aten::cat"], on_miss="compile",
                   settings=Settings(poll_interval=0.1, worker_log=worker_log, worker_idle=3.0))
    fp = hook.fps["cpu"]
    # both processes make their first call together
    open(os.path.join(barrier, f"ready-{index}"), "w").close()
    wait_until(lambda: len(os.listdir(barrier)) >= 2, 120, 0.01)
    first = torch.cat(tensors, dim)
    published_at_return = Cache(cache, signing_key=None).has_entry(fp.id, key)
    after_first = hook.stats()
    results = [first]

    def hit():
        results.append(torch.cat(tensors, dim))
        threads_seen.add(torch.get_num_threads())   # this thread's, lowered while compiling
        return hook.stats()["hits"] > 0

    wait_until(hit, 600, 0.2)
    hook.flush()
    st = hook.stats()
    hook.uninstall()
    st["thread_room"] = hook.stats()["thread_room"]
    return {"first_miss": after_first["misses"] == 1 and after_first["hits"] == 0,
            "published_when_first_returned": published_at_return,
            "all_equal": all(same(r, expected) for r in results), "stats": st,
            "worker_pid": hook.worker.pid if hook.worker else None,
            "threads": {"before": threads_before, "seen": sorted(threads_seen), "after": torch.get_num_threads()}}


if __name__ == "__main__":
    print(json.dumps(_serve(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])))


_EVIL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* foreign code: proves by a file whether (and in which process) it ever ran */
__attribute__((constructor)) static void aoti_farm_drill_evil(void) {
  char buf[512];
  const char* key = getenv("AOTI_FARM_SIGNING_KEY");
  int n = snprintf(buf, sizeof buf, "pid=%d key=%s\n", (int)getpid(), key ? key : "-");
  int fd = open(MARKER, O_CREAT | O_WRONLY | O_APPEND, 0644);
  if (fd >= 0) { if (write(fd, buf, n) < 0) {} close(fd); }
#ifdef FORGE
  /* what an attacker's library does when it is loaded to be checked: steal the signing key
     through the parent's environment, then print a passing verdict and leave */
  char path[64], env[65536], line[1024];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
  int e = open(path, O_RDONLY);
  ssize_t m = e >= 0 ? read(e, env, sizeof env - 1) : -1;
  if (e >= 0) close(e);
  for (ssize_t i = 0; m > 0 && i < m; i += strlen(env + i) + 1) {
    env[m] = 0;
    if (strncmp(env + i, "AOTI_FARM_SIGNING_KEY_FILE=", 27) == 0) {
      int k = open(env + i + 27, O_RDONLY);
      ssize_t r = k >= 0 ? read(k, line, sizeof line - 1) : -1;
      if (k >= 0) close(k);
      if (r > 0) {
        line[r] = 0;
        fd = open(MARKER, O_CREAT | O_WRONLY | O_APPEND, 0644);
        if (fd >= 0) { n = snprintf(buf, sizeof buf, "stolen=%s\n", line); if (write(fd, buf, n) < 0) {} close(fd); }
      }
    }
  }
  printf("{\"ok\": true, \"trials\": 2, \"adversarial_cases\": 9}\n");
  fflush(stdout);
  _exit(0);
#endif
}
"""


def build_evil_so(out: str, marker: str, forge: bool = False) -> str:
    """A shared library whose constructor appends ``pid=... key=...`` to ``marker``; with
    ``forge`` it then also appends ``stolen=<key>`` when its parent's environment names a
    signing key file it can read, prints a passing verdict and exits the process."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "evil.c")
        with open(src, "w") as f:
            f.write(_EVIL_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", f'-DMARKER="{marker}"', *(["-DFORGE"] if forge else []),
                        "-o", out, src], check=True)
    return out
