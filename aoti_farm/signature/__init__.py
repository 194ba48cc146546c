"""Signatures: the identity of one aten op call, and its stable key.

A signature is the qualified op name plus every argument of the op's schema, bound and
normalised the same way no matter how the call was spelled: positional or keyword, a
default left out or passed explicitly.  Each argument is encoded as a small tagged tuple:

    ("T", dtype, sizes, strides, device)        a tensor
    ("N",)                                       None (an optional left empty)
    ("TL", (tensor|None, ...))                   a tensor list (Tensor[] / Tensor?[])
    ("b"|"i"|"f", value)                         a Python bool / int / float, exact value
    ("s", value)                                 a str
    ("dtype"|"layout"|"mf", name)                torch.dtype / torch.layout / memory_format
    ("dev", "cpu" | "cuda:0")                    a torch.device
    ("il"|"fl"|"bl", (v, ...))                   int / float / bool lists

The tuple of encodings is hashable, so the runtime hook uses it directly as its in-memory
lookup key; the *signature key* is the sha256 of the canonical msgpack form of named,
tagged fields (see :func:`key_fields`).  The recorder and the hook both go through
:func:`encode_call`, so a recorded call and a served call always agree.

Value ranges of integer tensors are *hints* (not part of the key): they let
:func:`materialize` build in-range index tensors for embedding/gather/index_select.

Modules: ``names`` (dtype/layout/memory-format names, int64 limits), ``ops`` (op lookup,
:class:`OpInfo`), ``encoding`` (a call's arguments), ``jsonform`` (the JSON/msgpack
form), ``key`` (:class:`Signature`, its key), ``examples`` (example inputs, the human
form), ``indexing`` (which size bounds an index argument), ``conditions`` (the globals a kernel is served under: default dtype, TF32, cuDNN,
deterministic mode).  Import the names from this package.
"""

from aoti_farm.signature import conditions
from aoti_farm.signature.encoding import encode_call, encode_tensor, encode_value
from aoti_farm.signature.indexing import INDEX_ARGS, index_table
from aoti_farm.signature.examples import (decode_value, describe, make_tensor, materialize, storage_size,
                                          tensor_positions)
from aoti_farm.signature.jsonform import (arg_from_json, arg_to_json, check_hints, check_range, decode_args,
                                          tensor_from_json)
from aoti_farm.signature.key import (KEY_VERSION, Signature, canonical_bytes, from_call, key_fields,
                                     parse_signature, signature_key)
from aoti_farm.signature.names import (DTYPE_NAMES, DTYPES, FLOAT_DTYPES, INT64_MAX, INT64_MIN, INT_DTYPES,
                                       LAYOUT_NAMES, LAYOUTS, MAX_NUMEL, MEMORY_FORMAT_NAMES, MEMORY_FORMATS,
                                       device_ok, device_str, dtype_from_name, exact_float, is_int64, short_repr,
                                       to_float)
from aoti_farm.signature.ops import NO_DEFAULT, OpInfo, op_info, op_name, resolve_op

__all__ = [
    "DTYPES", "DTYPE_NAMES", "FLOAT_DTYPES", "INDEX_ARGS", "INT64_MAX", "INT64_MIN", "INT_DTYPES", "KEY_VERSION",
    "LAYOUTS", "LAYOUT_NAMES", "MAX_NUMEL", "MEMORY_FORMATS", "MEMORY_FORMAT_NAMES", "NO_DEFAULT",
    "OpInfo", "Signature", "arg_from_json", "conditions", "arg_to_json", "canonical_bytes", "check_hints", "check_range",
    "decode_args", "decode_value", "describe", "device_ok", "device_str", "dtype_from_name",
    "encode_call", "encode_tensor", "encode_value", "exact_float", "from_call", "index_table", "is_int64", "key_fields", "make_tensor",
    "materialize", "op_info", "op_name", "parse_signature", "resolve_op", "short_repr", "signature_key",
    "storage_size", "tensor_from_json", "tensor_positions", "to_float",
]
