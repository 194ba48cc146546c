"""The Signature and its key: the sha256 of the canonical msgpack form of named, tagged
fields (:func:`key_fields`; print them with ``aoti-farm key``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgpack
import torch

from aoti_farm.errors import Ineligible
from aoti_farm.signature.encoding import encode_call
from aoti_farm.signature.jsonform import arg_to_json, decode_args
from aoti_farm.signature.ops import OpInfo, op_info, resolve_op

KEY_VERSION = 1


@dataclass(frozen=True)
class Signature:
    op: str
    args: tuple                     # encoded, one per schema argument
    hints: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def device(self) -> str:
        """'cuda' if any tensor argument lives on CUDA, else 'cpu'."""
        for a in self.args:
            for t in (a[1] if a[0] == "TL" else (a,)):
                if t[0] == "T" and t[4].startswith("cuda"):
                    return "cuda"
        return "cpu"

    @property
    def key(self) -> str:
        return signature_key(self.op, self.args)

    def info(self) -> OpInfo:
        return op_info(resolve_op(self.op))

    def to_obj(self) -> dict:
        """msgpack/JSON-safe form (used by manifests, queue files and traces);
        :func:`parse_signature` is its inverse."""
        names = self.info().arg_names
        return {"op": self.op, "args": [arg_to_json(n, a) for n, a in zip(names, self.args)],
                **({"hints": self.hints} if self.hints else {})}


def parse_signature(obj: Any, where: str = "signature") -> Signature:
    """Validate and decode the JSON/msgpack form; ValueError names the failing field."""
    return Signature(*decode_args(obj, where))


def key_fields(op: str, args: tuple) -> list[tuple[str, Any]]:
    """The named, tagged fields hashed into a signature key (print with `aoti-farm key`)."""
    return [("key_version", KEY_VERSION), ("op", op)] + [
        (f"arg{i}", list(a)) for i, a in enumerate(args)
    ]


def canonical_bytes(fields: list[tuple[str, Any]]) -> bytes:
    try:
        return msgpack.packb([[k, _listify(v)] for k, v in fields], use_bin_type=True)
    except OverflowError:  # parse_signature and encode_call admit int64 only; never here
        raise ValueError("a signature integer is outside int64") from None


def _listify(x: Any) -> Any:
    return [_listify(i) for i in x] if isinstance(x, (list, tuple)) else x


@lru_cache(maxsize=65536)
def signature_key(op: str, args: tuple) -> str:
    """The key of an (op, encoded args) pair: what ``Signature(op, args).key`` is."""
    return hashlib.sha256(canonical_bytes(key_fields(op, args))).hexdigest()


def from_call(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Signature:
    info = op_info(op)
    if info.ineligible:
        raise Ineligible(info.ineligible)
    return Signature(info.name, encode_call(info, args, kwargs))
