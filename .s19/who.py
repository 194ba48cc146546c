# which call starts the CUDA driver's thread during the compile path's imports
import os, sys, traceback, importlib, threading
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
import torch
n0 = len(os.listdir("/proc/self/task"))
print("[who] tasks after torch", n0, "env NVML", os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"), flush=True)
done = [False]
def prof(frame, event, arg):
    if done[0] or event not in ("c_return", "return"):
        return
    if len(os.listdir("/proc/self/task")) > n0:
        done[0] = True
        sys.setprofile(None)
        print("[who] thread appeared at", event, getattr(arg, "__qualname__", arg) if event == "c_return" else frame.f_code.co_qualname, flush=True)
        for line in traceback.format_stack(frame)[-25:]:
            print("[who]", line.rstrip().replace("\n", " | "), flush=True)
sys.setprofile(prof)
for m in ["torch._inductor", "torch._inductor.codecache", "torch._inductor.compile_fx"]:
    importlib.import_module(m)
sys.setprofile(None)
print("[who] tasks at end", len(os.listdir("/proc/self/task")), [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")], flush=True)
