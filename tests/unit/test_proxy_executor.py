"""An op that AOTInductor can only run through its proxy executor is told from the wrapper
source it generated (on CUDA the kernel does not raise: it returns garbage), and refused as
unsupported, a verification refusal (recorded once, never retried)."""

from __future__ import annotations

from aoti_farm.cache.failures import PROXY_EXECUTOR_REFUSAL
from aoti_farm.compile.verify import is_verification_refusal
from aoti_farm.compile.checks import needs_proxy_executor


def test_the_generated_wrapper_tells_a_proxy_executor_call(tmp_path):
    (tmp_path / "c1.wrapper.cpp").write_text("void run() { kernel_0(buf0); }\n")
    (tmp_path / "c1.wrapper.model.cpp").write_text("AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_relu(x));\n")
    assert needs_proxy_executor(str(tmp_path)) is False
    (tmp_path / "c1.wrapper.model.cpp").write_text(
        "aoti_torch_proxy_executor_call_function(proxy_executor, 0, 1, a, 2, b);\n")
    assert needs_proxy_executor(str(tmp_path)) is True
    assert needs_proxy_executor(str(tmp_path / "missing")) is False
    assert is_verification_refusal(PROXY_EXECUTOR_REFUSAL)


def test_every_refusal_has_a_named_class():
    from aoti_farm.cache.failures import REFUSAL_CLASSES, refusal_class

    cases = {
        ("kernel disagrees with eager on adversarial inputs: finite special values", "values"): "values",
        ("kernel disagrees with eager", "memory format"): "layout",
        ("kernel less accurate than eager on ill-conditioned inputs: large offset", "precision"): "precision",
        ("kernel does not raise where eager raises: negative index (index=-1)", None): "errors",
        ("kernel aborts the process where eager raises (signal 6): index out of bounds", None): "aborts",
        (PROXY_EXECUTOR_REFUSAL, None): "proxy executor",
        ("unsupported on CUDA: the bounds of index argument 'index' cannot be checked", None): "unverifiable",
        ("ineligible: nondeterministic", None): "ineligible",
        ("compile error: LoweringException: x", None): "compile error",
        ("bug in aoti-farm: KeyError at x.py:1", None): "bug",
    }
    for (reason, problem), want in cases.items():
        got = refusal_class(reason, {"problem": problem} if problem else {})
        assert got == want and got in REFUSAL_CLASSES, (reason, got)
    # a precision refusal does not fail warm: it is a verification refusal like the others
    assert is_verification_refusal("kernel less accurate than eager on ill-conditioned inputs: large offset")
