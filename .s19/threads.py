# which import starts a thread (second stage of the fork server)
import os, sys, threading, time, importlib
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
def th():
    me = str(threading.get_native_id()); out = []
    for t in os.listdir("/proc/self/task"):
        if t != me:
            try: out.append(t + ":" + open(f"/proc/self/task/{t}/comm").read().strip())
            except OSError: out.append(t + ":?")
    return sorted(out)
prev = set()
def step(name):
    global prev
    t0 = time.time()
    try:
        importlib.import_module(name); err = ""
    except Exception as e:
        err = f" ERR {type(e).__name__}: {e}"[:200]
    cur = set(th())
    new = sorted(cur - prev); prev = cur
    py = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print(f"[threads] {name}: {time.time()-t0:.2f}s new={new} total={len(cur)} pythreads={py}{err}", flush=True)
from aoti_farm import notices
notices.drop(notices.TORCH_NOTICES)
MODS = ("torch._inductor.compile_fx", "torch._inductor.graph", "torch._inductor.scheduler",
    "torch._inductor.lowering", "torch._inductor.select_algorithm", "torch._inductor.kernel.mm",
    "torch._inductor.fx_passes.pre_grad", "torch._inductor.fx_passes.joint_graph",
    "torch._inductor.fx_passes.post_grad", "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.cpp_wrapper_cpu", "torch._inductor.cpp_builder",
    "torch._inductor.async_compile", "torch.utils.cpp_extension", "aoti_farm.job", "aoti_farm.compiler", "aoti_farm.workers.compile_actor")
print("[threads] torch already imported:", "torch" in sys.modules)
for m in ["torch", "torch._inductor", "torch._inductor.codecache"] + list(MODS):
    step(m)
import faulthandler
for t in threading.enumerate():
    if t is not threading.main_thread():
        print("[threads] py thread", t.name, t.ident, getattr(t, "_target", None), flush=True)
faulthandler.dump_traceback(all_threads=True)
