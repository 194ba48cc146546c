import sys, traceback, os
import torch
seen = {}
def wrap(mod, name):
    f = getattr(mod, name, None)
    if f is None: return
    def g(*a, **k):
        key = name
        st = "".join(traceback.format_stack(limit=16)[:-1])
        if st not in seen.setdefault(key, set()):
            seen[key].add(st); print(f"=== {name} called from:\n{st}", file=sys.stderr)
        return f(*a, **k)
    setattr(mod, name, g)
import torch.cuda
for n in ("is_available", "device_count", "_lazy_init", "get_device_properties", "current_device", "get_device_capability"):
    wrap(torch.cuda, n)
wrap(torch._C, "_cuda_getDeviceCount")
wrap(torch._C, "_cuda_init")
import time
def dstate(tag):
    print(f"--- {tag}: torch.cuda.is_initialized()={torch.cuda.is_initialized()} t={time.time()-T0:.2f}", file=sys.stderr)
T0 = time.time()
dstate("after torch import")
import aoti_farm.workers.actor_preload
dstate("after preload")
import tempfile
from aoti_farm import signature as S
from aoti_farm.compiler import AOTICompiler
from aoti_farm.fingerprint import fingerprint
fp = fingerprint("cpu", AOTICompiler().options())
dstate("after fingerprint")
a, w, b = torch.randn(16, 128), torch.randn(128, 128), torch.randn(128)
r = AOTICompiler().compile(S.from_call(torch.ops.aten.addmm.default, (b, a, w), {}), tempfile.mkdtemp())
dstate(f"after compile ok={r.verification.get('ok')}")
