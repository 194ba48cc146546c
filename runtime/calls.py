"""What the serving hook knows about one call's signature, memoised per (op, encoding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aoti_farm import signature as S
from aoti_farm.compile.runner import flat_tensors

#: Most distinct (op, encoding) pairs memoised; beyond, keys are computed per call.
MEMO_LIMIT = 65536


@dataclass
class Call:
    """One signature as the hook serves it."""

    sig: S.Signature
    key: str
    device: str
    missed: bool = False
    gather: Any = None                # (args, kwargs) -> runner inputs, built once per signature


def gatherer(sig: S.Signature):
    """A function building the runner's inputs for calls of ``sig`` (the same list as
    ``runner.flat_tensors``), specialised once: the hit path then skips the schema walk."""
    pos = S.tensor_positions(sig)
    info = sig.info()
    if all(j is None and not info.kwarg_only[i] for i, j in pos):
        idx = [i for i, _ in pos]
        if idx == list(range(len(idx))):
            n = len(idx)
            return lambda args, kwargs: list(args[:n])
        return lambda args, kwargs: [args[i] for i in idx]
    return lambda args, kwargs: flat_tensors(sig, args, kwargs)


class CallMemo:
    """``(op name, encoding) -> Call`` for the devices the hook serves."""

    def __init__(self, devices):
        self.devices = set(devices)
        self._memo: dict[tuple, Call] = {}

    def get(self, info: S.OpInfo, enc: tuple) -> Call | None:
        """The call's Call, or None when its device is not served."""
        call = self._memo.get((info.name, enc))
        if call is not None:
            return call
        sig = S.Signature(info.name, enc)
        if sig.device not in self.devices:
            return None
        call = Call(sig, sig.key, sig.device, gather=gatherer(sig))
        if len(self._memo) < MEMO_LIMIT:
            self._memo[(info.name, enc)] = call
        return call
