"""Recording the op signatures a program calls: ``with aoti_farm.record("trace.json"): ...``.

The recorder registers through the same :class:`aoti_farm.runtime.dispatch.Registration`
and normalises with the same ``encode_call`` as the serving hook, so a recorded signature
is exactly what the hook will look up.  Each call still runs eager's kernel.

Per unique signature it keeps the call count, the order it was first seen and, for
integer tensors, the value range seen (min/max, widened over calls) as a hint
(``Signature.hints[argname] = {"range": [lo, hi]}``; tensor lists get
``{"items": [{"range": ...}|None, ...]}``), so example inputs built from the trace are
valid indices.  On exit it writes the trace with :func:`aoti_farm.trace.save_trace`.
Calls that can never be served are counted by reason in ``Recorder.skipped``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from aoti_farm import signature as S
from aoti_farm.metrics.counters import Counters
from aoti_farm.errors import Ineligible
from . import dispatch
from aoti_farm.trace import Trace, TraceEntry, save_trace

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass
class _Seen:
    order: int
    count: int = 0
    hints: dict = field(default_factory=dict)


def _range(t: torch.Tensor) -> list[int] | None:
    if t.dtype not in _INT_DTYPES or t.numel() == 0:
        return None
    return [int(t.min()), int(t.max())]


def _widen(old: list | None, new: list | None) -> list | None:
    if old is None or new is None:
        return old or new
    return [min(old[0], new[0]), max(old[1], new[1])]


class Recorder:
    """Collects signatures while installed; :meth:`trace` returns what was seen."""

    def __init__(self, ops: Iterable | None = None, devices: Iterable[str] = ("cpu", "cuda")):
        self._seen: dict[tuple, _Seen] = {}
        self._lock = threading.Lock()
        self.counters = Counters("calls", skipped={})
        served = [d for d in devices if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]
        self._reg = dispatch.Registration(ops, self._handle, served)

    def _handle(self, info: S.OpInfo, device: str, orig, keyset, args: tuple, kwargs: dict):
        try:
            if dispatch.requires_grad_input(args, kwargs):
                raise Ineligible("requires_grad")
            enc = S.encode_call(info, args, kwargs)
            hints = self._hints(info, enc, args, kwargs)
        except Ineligible as e:
            self.counters.inc("skipped", str(e))
        except Exception as e:  # noqa: BLE001 -- recording never breaks the program
            self.counters.inc("skipped", f"unencodable: {type(e).__name__}")
        else:
            self.counters.inc("calls")
            with self._lock:
                s = self._seen.get((info.name, enc))
                if s is None:
                    s = self._seen[(info.name, enc)] = _Seen(len(self._seen))
                s.count += 1
                for name, h in hints.items():
                    mine = s.hints.get(name)
                    if mine is None:
                        s.hints[name] = h
                    elif "range" in h:
                        mine["range"] = _widen(mine.get("range"), h["range"])
                    elif "items" in h:
                        mine["items"] = [
                            None if a is None and b is None else {"range": _widen((a or {}).get("range"), (b or {}).get("range"))}
                            for a, b in zip(mine["items"], h["items"])]
        return dispatch.call_original(info, orig, keyset, args, kwargs)

    @staticmethod
    def _hints(info: S.OpInfo, enc: tuple, args: tuple, kwargs: dict) -> dict:
        hints = {}
        for i, (name, a) in enumerate(zip(info.arg_names, enc)):
            if a[0] not in ("T", "TL"):
                continue
            v = args[i] if i < len(args) and not info.kwarg_only[i] else kwargs.get(name)
            if a[0] == "T" and a[1] in S.INT_DTYPES:
                r = _range(v)
                if r is not None:
                    hints[name] = {"range": r}
            elif a[0] == "TL" and any(t[0] == "T" and t[1] in S.INT_DTYPES for t in a[1]):
                items = [None if (t is None or t.dtype not in _INT_DTYPES) else
                         ({"range": _range(t)} if _range(t) else None) for t in v]
                if any(items):
                    hints[name] = {"items": items}
        return hints

    def trace(self) -> Trace:
        with self._lock:
            entries = [TraceEntry(S.Signature(op, enc, {k: dict(v) for k, v in s.hints.items()}), s.count, s.order)
                       for (op, enc), s in self._seen.items()]
        entries.sort(key=lambda e: e.order)
        return Trace(entries)

    @property
    def skipped(self) -> dict[str, int]:
        """Calls never recorded (they can never be served), by reason."""
        return self.counters.snapshot()["skipped"]

    @property
    def calls(self) -> int:
        """Calls recorded."""
        return self.counters.get("calls")

    def stop(self) -> None:
        self._reg.uninstall()

    @property
    def ops(self) -> list[str]:
        return list(self._reg.ops)


@contextlib.contextmanager
def record(path: str | os.PathLike, ops: Iterable | None = None,
           devices: Iterable[str] = ("cpu", "cuda")) -> Iterator[Recorder]:
    """Record every served op's signatures inside the block; write ``path`` on exit
    (also when the block raises)."""
    rec = Recorder(ops, devices)
    try:
        yield rec
    finally:
        rec.stop()
        save_trace(rec.trace(), path)
