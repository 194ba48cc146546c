"""Serving-process edges of the hook: ``aoti-farm run``'s stats folder, and a process that
cannot load kernels (the libstdc++ trap, see aoti_farm.startup.loadenv).

The unit tests of this module (no compile, no Ray, no subprocess) are in tests/unit/test_launch.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from aoti_farm.startup import loadenv
from aoti_farm.errors import UserError
from aoti_farm.runtime import install, launch
from aoti_farm.trace import load_trace

from _procs import group, wait_all_gone, workers_of
from conftest import sig_add_alpha


def test_stats_folder_gone_at_exit_never_reaches_the_program(tmp_path):
    """The folder vanishes while the program runs (or the variable was set by hand): the
    program's exit and output are its own; the hook says so in one line on stderr."""
    env = launch._child_env({"AOTI_FARM_HOOK": "1", "AOTI_FARM_CACHE_DIR": str(tmp_path / "c"),
                             "AOTI_FARM_ON_MISS": "ignore", "AOTI_FARM_HOOK_STATS": str(tmp_path / "gone")})
    r = subprocess.run([sys.executable, "-c", "import torch; torch.add(torch.ones(2), torch.ones(2)); print('ok')"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    [line] = [x for x in r.stderr.splitlines() if "aoti-farm" in x]
    assert f"hook stats not written to {tmp_path / 'gone'}: No such file or directory" in line, r.stderr


def test_hook_that_cannot_load_kernels_intercepts_nothing(kernels, monkeypatch):
    """On a host that needs the libstdc++ preload, a process started without it can serve
    nothing: the hook registers no kernel at all (eager runs untouched, at eager's cost),
    starts no thread or worker, and says why."""
    if loadenv.system_libstdcxx() is None:
        pytest.skip("no system libstdc++ to preload")
    sig = sig_add_alpha()
    kernels.ensure(sig)
    monkeypatch.setenv("AOTI_FARM_PRELOAD_LIBSTDCXX", "1")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    a, b = torch.randn(8, 16), torch.randn(16)
    expected = torch.add(a, b, alpha=2)
    key = "CPU"
    before = torch._C._dispatch_dump_table("aten::add.Tensor")
    with install(cache_dir=kernels.cache.root, ops=["aten::add.Tensor"], on_miss="compile") as hook:
        during = torch._C._dispatch_dump_table("aten::add.Tensor")
        got = torch.add(a, b, alpha=2)
        st = hook.stats()
        assert hook.ops == [] and hook.worker is None
    assert torch.equal(got, expected)
    assert during == before, "the hook registered a kernel"
    assert key in before
    assert st["serving"] is False and "LD_PRELOAD" in st["native"]["reason"], st
    assert st["calls"] == 0 and st["hits"] == 0 and st["kernels_loaded"] == 0, st
    with pytest.raises(UserError, match="ops"):
        install(cache_dir=kernels.cache.root, ops=["aten::no_such_op"], on_miss="ignore", route="all")


# --- which processes of the program boot the hook -------------------------------------------------

#: Under `aoti-farm run`/`record`: the program imports torch, runs torch's own ISA load check
#: (torch's code, command and environment), one child of its own that imports torch, one
#: that does not, and two the farm starts for itself.  It prints the pids that should boot
#: the hook.
_CHILDREN = r"""
import os, subprocess, sys
import torch
from torch._inductor import cpu_vec_isa

torch.relu(torch.ones(3))
isa = cpu_vec_isa.VecISA
if hasattr(isa, "_probe_load"):                       # torch >= 2.13
    loaded = isa._probe_load(isa, "libc.so.6")
else:
    loaded = subprocess.run([sys.executable, "-c", isa._avx_py_load.replace("__lib_path__", "libc.so.6")],
                            timeout=60).returncode == 0
print("isa-check-loaded", loaded)
mine = subprocess.run([sys.executable, "-c", "import os, torch; torch.neg(torch.ones(2)); print(os.getpid())"],
                      capture_output=True, text=True, check=True).stdout.split()[-1]
subprocess.run([sys.executable, "-c", "print('no torch here')"], check=True)
# two children the farm starts for itself: its loader probe and its verification child
from aoti_farm.startup.loadenv import _PROBE
subprocess.run([sys.executable, "-c", _PROBE, "/no/such/kernel.so", "cpu"], capture_output=True)
subprocess.run([sys.executable, "-m", "aoti_farm.compile.compiler"], input=b"{}", capture_output=True)
print("booting", os.getpid(), mine)
"""


def test_only_the_programs_torch_processes_boot_the_hook(tmp_path):
    """The hook boots in the program and in its own children that import torch, not in a
    child that never imports torch, nor in the children the farm starts for itself (a hook
    would route the eager reference a kernel is checked against), nor in torch's ISA load
    check: there a hook of its own
    made each check wait for the ISA lock its parent held, into the check's 60 s bound
    (and the ISA was then taken as unsupported).  The stats written at exit (one file per
    booted process) and `record`'s process count say which processes booted."""
    prog = tmp_path / "prog.py"
    prog.write_text(_CHILDREN)
    stats = tmp_path / "stats"
    stats.mkdir()
    exe = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    env.update({"AOTI_FARM_HOOK_STATS": str(stats), "AOTI_FARM_ON_MISS": "ignore", "PYTHONWARNINGS": "ignore"})
    r = subprocess.run([exe, "run", "--cache-dir", str(tmp_path / "c"), "--", sys.executable, str(prog)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "isa-check-loaded True" in r.stdout, r.stdout + r.stderr[-3000:]
    [line] = [x for x in r.stdout.splitlines() if x.startswith("booting ")]
    assert sorted(os.listdir(stats)) == sorted(f"stats-{pid}.json" for pid in line.split()[1:]), r.stderr[-3000:]
    env.pop("AOTI_FARM_HOOK_STATS")
    # `record` boots its recorder in the same processes; `--ops` keeps only the ops named
    trace = tmp_path / "t.json"
    r = subprocess.run([exe, "record", "--ops", "aten::neg", "--out", str(trace), "--", sys.executable, str(prog)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "isa-check-loaded True" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "from 2 process(es)" in r.stderr, r.stderr[-3000:]
    assert [(e.sig.op, e.count) for e in load_trace(trace)] == [("aten::neg", 1)]


# --- no compile worker left behind ---------------------------------------------------------------

#: Misses at 40 shapes nobody compiled (more than a worker compiles in 90 s), then waits
#: until its compile worker runs a compiler child (compiling, its queue still long), and
#: exits the ordinary way (the hook's atexit shutdown leaves the worker running).
_MISSES = r"""
import os, sys, time, torch
sys.path.insert(0, sys.argv[1])
from _procs import group, workers_of

for n in range(40):
    torch.tanh(torch.randn(n + 3, 7))
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    mine = workers_of(str(os.getpid()))
    if mine and len(group(mine[0])) > 1:
        print("compiling", mine[0], flush=True)
        break
    time.sleep(0.2)
"""


def test_no_compile_worker_outlives_a_program_that_missed(tmp_path):
    """`aoti-farm run` of a program that misses (shapes the cache never saw) exits while its
    compile worker is compiling with a long queue: within 90 s of the exit neither the
    worker nor a compiler child of it runs.  It ends with its parent (parent-death signal
    and a parent watch), whatever its queue holds; the queue stays for `serve`."""
    prog = tmp_path / "prog.py"
    prog.write_text(_MISSES)
    exe = os.path.join(os.path.dirname(sys.executable), "aoti-farm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOTI_FARM_")}
    env["PYTHONWARNINGS"] = "ignore"
    cache = tmp_path / "c"
    r = subprocess.run([exe, "run", "--cache-dir", str(cache), "--", sys.executable, str(prog),
                        os.path.dirname(os.path.abspath(__file__))], env=env, capture_output=True, text=True,
                       timeout=600)
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        [line] = [x for x in r.stdout.splitlines() if x.startswith("compiling ")]
        worker = int(line.split()[1])
        left = wait_all_gone(sorted({worker, *group(worker)}), 90)
        assert left == [], f"compile worker {worker} (or its compiler) still runs 90 s after its program exited"
    finally:
        for pid in workers_of(str(cache)):
            for p in [*group(pid), pid]:
                try:
                    os.kill(p, 9)
                except ProcessLookupError:
                    pass
