"""The unit tests split from tests/e2e/test_runtime.py (no compile, no Ray, no subprocess); that
file's docstring describes the topic, and it holds the tests that compile, start Ray or
start processes."""

from __future__ import annotations

import torch

from aoti_farm.runtime import dispatch

from _runtime_helpers import same


# --- the differential cases ------------------------------------------------------------------

def _g(seed=0):
    return torch.Generator().manual_seed(seed)


# --- dispatch layer: wrapped numbers, re-entrancy, uninstall -----------------------------------

def test_numbers_passed_as_tensors_stay_exact():
    """`x * 2.5`, allclose and friends pass Python numbers where the schema says Tensor."""
    xi, x = torch.arange(6), torch.randn(6, generator=_g())
    h, d = x.half(), x.double()
    calls = {
        "int*float": lambda: xi * 2.5, "int+int": lambda: xi + 3, "bool&True": lambda: (xi > 2) & True,
        "half*0.1": lambda: h * 0.1, "double*0.1": lambda: d * 0.1, "float/3": lambda: x / 3,
        "where(int,float)": lambda: torch.where(xi > 2, xi, 2.5), "pow": lambda: x.abs() ** 0.5,
        "eq": lambda: xi == 2, "rsub": lambda: 1 - x, "0dim*num": lambda: torch.tensor(3, dtype=torch.int32) * 2,
    }
    expected = {k: f() for k, f in calls.items()}
    seen = []

    def handler(info, device, orig, keyset, args, kwargs):
        seen.append(info.name)
        return dispatch.call_original(info, orig, keyset, args, kwargs)

    reg = dispatch.Registration(None, handler)
    try:
        got = {k: f() for k, f in calls.items()}
        close = torch.allclose(x, x + 1e-9) and not torch.allclose(x, x + 1)
    finally:
        reg.uninstall()
    for k in calls:
        assert same(got[k], expected[k]), (k, got[k], expected[k])
    assert close and "aten::mul.Tensor" in seen
    n = len(seen)
    _ = xi * 2.5                                           # uninstalled: nothing reaches the handler
    assert len(seen) == n
    print(f"dispatch: {len(reg.ops)} ops registered in {reg.install_seconds * 1000:.0f} ms; "
          f"{len(calls)} number-as-tensor calls exact")
