"""The unit tests split from tests/e2e/test_scheduler.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import pytest
import torch

from aoti_farm import signature as S
from aoti_farm.cache.store import Cache
from aoti_farm.workers.warm import plan
from aoti_farm.fingerprint import fingerprint
from aoti_farm.workers.placement import CPU, GPU, actor_options, pool_sizes, route


def cpu_sig(n: int) -> S.Signature:
    return S.from_call(torch.ops.aten.mul.Tensor, (torch.empty(n, 3), torch.empty(n, 3)), {})


def cuda_sig(n: int) -> S.Signature:
    obj = cpu_sig(n).to_obj()
    for a in obj["args"]:
        if a.get("kind") == "tensor":
            a["device"] = "cuda:0"
    return S.parse_signature(obj)


# --- pure functions -----------------------------------------------------------------------------


def test_route_by_device():
    assert route(cpu_sig(2)) == CPU
    assert cuda_sig(2).device == "cuda"
    assert route(cuda_sig(2)) == GPU


def test_actor_options_request_resources():
    c = actor_options(CPU, 0.25)
    g = actor_options(GPU, 0.25)
    assert c["num_cpus"] == 1 and "num_gpus" not in c
    assert g["num_gpus"] == 0.25 and g["num_cpus"] == 1
    assert c["max_restarts"] > 0 and c["max_task_retries"] == 0
    assert c["runtime_env"]["env_vars"]["TORCHINDUCTOR_COMPILE_THREADS"] == "1"


def test_pool_sizes_from_resources():
    res = {"CPU": 16, "GPU": 2}
    assert pool_sizes(res, cpu_workers=None, gpu_workers=None, gpus_per_worker=0.25,
                      n_cpu_tasks=100, n_gpu_tasks=100) == {CPU: 8, GPU: 8}
    # never more actors than tasks, and no GPU actors without CUDA work
    assert pool_sizes(res, cpu_workers=None, gpu_workers=None, gpus_per_worker=0.25,
                      n_cpu_tasks=3, n_gpu_tasks=0) == {CPU: 3, GPU: 0}
    assert pool_sizes(res, cpu_workers=2, gpu_workers=1, gpus_per_worker=0.5,
                      n_cpu_tasks=100, n_gpu_tasks=100) == {CPU: 2, GPU: 1}
    assert pool_sizes({"CPU": 2}, cpu_workers=None, gpu_workers=None, gpus_per_worker=0.25,
                      n_cpu_tasks=5, n_gpu_tasks=5) == {CPU: 2, GPU: 0}


def test_plan_cuda_without_gpu_is_todo_without_fingerprint(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("host has a GPU: CUDA fingerprints are computed locally")
    p = plan([cpu_sig(2), cuda_sig(2)], Cache(tmp_path / "c"))
    kinds = {t.kind: t.fp_id for t in p.todo}
    assert kinds[GPU] is None and kinds[CPU] == fingerprint("cpu").id
    assert "cuda:0" not in p.fingerprints
