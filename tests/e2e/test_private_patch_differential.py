"""The differential test of ``private._patch_torch_cache_dirs``, the one patch of a torch
internal in ``aoti_farm/security/private.py`` (Inductor's ``default_cache_dir()`` and
``codecache._HEADER_DIR``): the same signature compiled by the farm's compile path with
the patch and without it gives kernels whose outputs are bitwise identical; only the
directories Inductor's defaults point at differ (private, against torch's
``$TMPDIR/torchinductor_<user>``).  Each compile runs in a fresh process (the patch is
process-wide, and Inductor keeps in-process caches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

CHILD = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch
    from aoti_farm.security import private
    from aoti_farm.build import commonobj, splitbuild
    from aoti_farm import signature as S
    from aoti_farm.compile.compiler import AOTICompiler, load_runner
    from aoti_farm.compile.runner import flat_tensors

    mode, out = sys.argv[1], sys.argv[2]
    if mode == "unpatched":
        private._patch_torch_cache_dirs = lambda d, import_missing=True: None   # torch's own defaults, the rest as in the farm
    compiler = AOTICompiler({}, measure_speed=False)
    import torch._inductor.codecache as cc
    from torch._inductor.runtime import cache_dir_utils, runtime_utils

    results = {}
    for name, op, shapes in (("addcmul", torch.ops.aten.addcmul.default, [(33, 17)] * 3),
                             ("softmax", torch.ops.aten._softmax.default, None)):
        if shapes:
            sig = S.from_call(op, tuple(torch.empty(s) for s in shapes), {"value": 0.5})
        else:
            sig = S.from_call(op, (torch.empty(9, 31), 1, False), {})
        work = tempfile.mkdtemp(dir=out)
        res = compiler.compile(sig, work)
        runner = load_runner(res.files["kernel.so"], "cpu")
        args, kwargs = S.materialize(sig, seed=1234)
        results[name] = runner.run(flat_tensors(sig, args, kwargs))
    torch.save(results, os.path.join(out, "outputs.pt"))
    dirs = {"cache_dir": cache_dir_utils.cache_dir(), "default_cache_dir": runtime_utils.default_cache_dir(),
            "codecache.default_cache_dir": cc.default_cache_dir(), "header_dir": cc._HEADER_DIR,
            "common_dir": commonobj.common_dir()}
    with open(os.path.join(out, "dirs.json"), "w") as f:
        json.dump(dirs, f)
""")


def _compile(mode: str, tmp_path: Path) -> tuple[dict, dict]:
    out = tmp_path / mode
    out.mkdir()
    tmpdir = tmp_path / "tmp"   # torch's default lands under $TMPDIR: a directory of this test's
    tmpdir.mkdir(exist_ok=True, mode=0o700)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TMPDIR": str(tmpdir)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(out)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out / "outputs.pt"), json.loads((out / "dirs.json").read_text())


def test_patch_changes_no_result_only_where_inductor_keeps_its_defaults(tmp_path):
    patched, pdirs = _compile("patched", tmp_path)
    plain, udirs = _compile("unpatched", tmp_path)
    assert patched.keys() == plain.keys() == {"addcmul", "softmax"}
    for name in patched:
        a, b = patched[name], plain[name]
        assert len(a) == len(b) >= 1
        for x, y in zip(a, b):
            assert (x.dtype, x.shape, x.stride()) == (y.dtype, y.shape, y.stride())
            # bitwise: the same bytes, NaN payloads and signed zeros included
            assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), name
    private = str(tmp_path / "xdg" / "aoti-farm-private")
    torch_default = str(tmp_path / "tmp" / "torchinductor_")
    # the same in both: the cache the farm sets through TORCHINDUCTOR_CACHE_DIR, and the split build's
    assert pdirs["cache_dir"] == udirs["cache_dir"] and pdirs["cache_dir"].startswith(private)
    assert pdirs["common_dir"] == udirs["common_dir"]
    # what the patch changes, and nothing else: torch's own defaults
    for k in ("default_cache_dir", "codecache.default_cache_dir", "header_dir"):
        assert pdirs[k].startswith(private + "/"), (k, pdirs[k])
        assert udirs[k].startswith(torch_default), (k, udirs[k])


START = textwrap.dedent("""
    import json, sys
    from aoti_farm.cli import _private_inductor
    _private_inductor("warm")                  # what `aoti-farm warm` does first
    torch_at_start = "torch" in sys.modules
    from aoti_farm.compile.compiler import AOTICompiler
    AOTICompiler({}, measure_speed=False)      # a place that builds: patches torch itself
    import torch._inductor.codecache as cc
    from torch._inductor.runtime import runtime_utils
    print(json.dumps({"torch_at_start": torch_at_start, "header_dir": cc._HEADER_DIR,
                      "default_cache_dir": runtime_utils.default_cache_dir()}))
""")


def test_a_command_start_imports_no_torch_and_the_compile_path_is_still_patched(tmp_path):
    """The command's start sets and checks the private cache without importing torch (its
    import would come ahead of the bytecode cache and Ray's start); the compile path's
    own call puts the patch in force before Inductor builds anything."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TMPDIR": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["torch_at_start"] is False
    private = str(tmp_path / "xdg" / "aoti-farm-private") + "/"
    assert got["header_dir"].startswith(private) and got["default_cache_dir"].startswith(private), got
