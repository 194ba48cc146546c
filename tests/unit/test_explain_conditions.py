"""``explain`` names what the hook checks before it serves an entry besides its key: the
globals the kernel was verified under and, on CPU, the thread counts it was verified at."""

from __future__ import annotations

from aoti_farm import signature as S
from aoti_farm.report.explain import serving_conditions


def test_a_hit_names_its_serving_conditions_and_verified_threads():
    m = {"conditions": S.conditions.as_dict(), "verified_threads": [1, 2, 16]}
    lines = serving_conditions(m, "cpu")
    assert lines[0].startswith("served only while default_dtype=float32") and "(as verified)" in lines[0]
    assert "deterministic_algorithms=False" in lines[0] and "tf32" not in lines[0]
    assert lines[1].startswith("verified at 1, 2, 16 intra-op threads")
    cuda = serving_conditions({"conditions": S.conditions.as_dict()}, "cuda")
    assert len(cuda) == 1 and "matmul_allow_tf32=" in cuda[0] and "cudnn_allow_tf32=" in cuda[0]
    # an old manifest: torch's defaults, said as such; no thread line
    old = serving_conditions({}, "cpu")
    assert len(old) == 1 and "the manifest names none" in old[0]
