"""A fresh host's CPU vector ISA predicted from the CPU's flags, so that per-host work
that follows from it can start before Inductor's own probe has answered.  Nothing built
on a prediction is used until that probe agrees.

Inductor picks its vector ISA (``pick_vec_isa``) by building and loading a test program
per candidate ISA and extension (``VecISA.check_build``).  The host's probe
(:func:`aoti_farm.fingerprint.host_isa_memo`) runs these once and writes the memo whose
ISA goes into every CPU fingerprint.  On a fresh 16-core host that probe, run in a child,
took 15.5 s (run 11, 2026-11-26: its own torch and Inductor imports from source, then
10 check builds).  The host preparation (:mod:`aoti_farm.hostprep`) waited for it
before it began building the split build's common object, and every actor's first
compile then waited for that object.

**The prediction:** every check the CPU's flags allow passes.  These are the checks
the probe itself prefetches (:func:`check_jobs`).  :func:`pick` runs Inductor's own
``pick_vec_isa`` in this process with those answers (a check outside that list runs for
real) and records every answer the pick used.  :func:`confirmed` compares them with the
memo that the real probe writes.  Inductor's pick is a function of those answers, made
in the same order from the same state, so if every answer agrees, and the ISA too, this
process's Inductor holds exactly the state that replaying the memo gives it.

**Contract** for a process that picked by prediction:

* it computes no fingerprint, publishes no kernel, writes no per-host marker and runs
  no loader probe before :func:`confirmed` is True;
* after a disagreement it compiles nothing more.  Inductor caches the ISA answers inside
  its ISA objects and offers no way to reset them, so the caller starts a new process
  (:mod:`aoti_farm.hostprep` answers ``mispredicted``).

A wrong prediction can only leave behind files that are keyed by their exact inputs:
the common object's key hashes its compile command, which names the ISA's flags, and
Inductor's check builds are keyed by their flags.  No other process's key names such
a file, so a wrong prediction costs time and never a wrong kernel.
``AOTI_FARM_DEV=isa_predict=0`` turns prediction off.
"""

from __future__ import annotations

import hashlib
import os
import platform

DEV = "isa_predict"   # its key in AOTI_FARM_DEV (aoti_farm/config.py)
from aoti_farm.config import dev as _dev  # noqa: E402 -- AOTI_FARM_DEV, parsed in one place
_PICKED: list = []   # this process's predicted pick, once made (see picked_here)


def picked_here() -> bool:
    """Whether this process's Inductor picked its ISA by prediction (:func:`pick`): such a
    process must never probe or write the host's memo
    (:func:`aoti_farm.fingerprint.host_isa_memo` refuses)."""
    return bool(_PICKED)


def enabled() -> bool:
    return _dev(DEV) != "0"


def check_key(isa, code: str) -> str:
    """The key of one Inductor check build, as the host's memo records its answer: the
    ISA's class, its flags at call time (AVX512's bf16 check adds one), the flags the
    build uses (they follow earlier answers) and the code."""
    return hashlib.sha256(f"{type(isa).__name__}|{isa._arch_flags}|{isa.build_arch_flags()}|{code}".encode()
                          ).hexdigest()[:24]


def check_jobs(cpu_vec_isa) -> list[tuple]:
    """``[(isa, code)]``: every (candidate, extension) check the CPU's flags allow.  Each
    ``isa`` is a copy of Inductor's candidate, set up as Inductor's own sequence would
    have it at that step: the flags it adds, and the BF16 answer that later builds'
    flags follow, predicted from the CPU's flags.  x86 only (else ``[]``)."""
    import copy

    import torch

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = cpu_vec_isa.x86_isa_checker()
    cands = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in flags for f in str(isa).split())]
    tcpu = torch.cpu
    bf16 = bool(getattr(tcpu, "_is_avx512_bf16_supported", lambda: False)())
    jobs: list = []

    def job(isa, code, suffix: str, bf16_state: bool) -> None:
        cp = copy.copy(isa)
        cp._arch_flags = type(isa)._arch_flags + suffix
        if hasattr(cp, "_is_avx512_bf16_supported"):
            cp._is_avx512_bf16_supported = bf16_state
        if hasattr(cp, "_is_amx_fp16_supported"):
            cp._is_amx_fp16_supported = False
        jobs.append((cp, code))

    for isa in cands:
        cls = type(isa)
        job(isa, cpu_vec_isa.VecISA._avx_code, "", False)
        if isinstance(isa, cpu_vec_isa.VecAVX512) and bf16 and hasattr(cls, "_avx512_bf16_code"):
            job(isa, cls._avx512_bf16_code, " -mavx512bf16", False)
        if hasattr(cls, "_avx512_vnni_code") and getattr(tcpu, "_is_vnni_supported", lambda: False)():
            job(isa, cls._avx512_vnni_code, "", bf16)
        if hasattr(cls, "_amx_code"):
            job(isa, cls._amx_code, "", bf16)
            if hasattr(cls, "_amx_fp16_code") and getattr(tcpu, "_is_amx_fp16_supported", lambda: False)():
                job(isa, cls._amx_fp16_code, " -mamx-fp16", bf16)
    return jobs


def predicted_answers(cpu_vec_isa) -> dict:
    """``{check key: True}`` for every check of :func:`check_jobs` (keys as the memo's)."""
    return {check_key(isa, code): True for isa, code in check_jobs(cpu_vec_isa)}


def pick() -> dict | None:
    """Inductor's ``pick_vec_isa`` in this process, answered from the prediction:
    ``{"isa": str, "used": {check key: answer}}``.  None where it does not apply (turned
    off, not x86, fbcode, nothing to predict, or this process's Inductor has picked
    already).  Afterwards this process is bound by the module's contract.  An exception
    leaves Inductor half-probed: the caller must compile nothing more here."""
    if not enabled() or platform.machine() not in ("x86_64", "AMD64"):
        return None
    from torch._inductor import config, cpu_vec_isa

    if config.is_fbcode() or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
        return None
    predicted = predicted_answers(cpu_vec_isa)
    if not predicted:
        return None
    used: dict = {}
    orig = cpu_vec_isa.VecISA.check_build

    def check_build(self, code):
        key = check_key(self, code)
        ok = predicted[key] if key in predicted else bool(orig(self, code))
        used[key] = bool(ok)
        return ok

    cpu_vec_isa.VecISA.check_build = check_build
    _PICKED.append(True)   # from here on, even if the pick fails half-way
    try:
        isa = str(cpu_vec_isa.pick_vec_isa())
    finally:
        cpu_vec_isa.VecISA.check_build = orig
    return {"isa": isa, "used": used}


def confirmed(picked: dict | None, memo: dict | None) -> bool:
    """Whether the host's probed memo (its ``isa`` and recorded ``checks``) agrees with
    every answer the predicted pick used, and names the same ISA."""
    if not picked or not isinstance(memo, dict):
        return False
    checks = memo.get("checks")
    used = picked.get("used")
    if not isinstance(checks, dict) or not isinstance(used, dict) or memo.get("isa") != picked.get("isa"):
        return False
    return all(k in checks and bool(checks[k]) == bool(v) for k, v in used.items())
