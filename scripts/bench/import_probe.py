"""Time the imports a compile actor pays, alone and N at once; the slowest modules of
the actor's compile path (python -X importtime).  Scaling diagnosis, issue 17."""
import re, subprocess, sys, time
CODE = {
    "torch": "import torch",
    "ray": "import ray",
    "actor_path": "import torch, torch._inductor; from aoti_farm.compiler import import_compile_path; import_compile_path()",
}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
for name, code in CODE.items():
    t = time.time(); subprocess.run([sys.executable, "-c", code], check=True); one = time.time() - t
    t = time.time()
    ps = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    [p.wait() for p in ps]
    print(f"{name}: alone {one:.2f}s, {n} at once {time.time() - t:.2f}s", flush=True)
p = subprocess.run([sys.executable, "-X", "importtime", "-c", CODE["actor_path"]], capture_output=True, text=True)
rows = []
for line in p.stderr.splitlines():
    m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
    if m:
        rows.append((int(m.group(2)), len(m.group(3)), m.group(4)))
print("top cumulative imports (s, depth, module):")
for cum, depth, mod in sorted(rows, reverse=True)[:40]:
    print(f"  {cum / 1e6:7.2f} {depth:3d} {mod}")
