"""Which size of a call bounds an index argument: the table an index selects from.

One table for the two places that need it: the verification's index guards and
adversarial indices (:func:`aoti_farm.compile.adversarial.index_bound`: the bound's value
from a call's tensors) and the shape classes (:func:`aoti_farm.dynamic.shapes.classes`: a
class never lets that size vary, so its kernel's guard is one constant for every member).
"""

from __future__ import annotations

#: Argument names that hold indices into another input.
INDEX_ARGS = ("index", "indices", "target")

#: Ops whose index selects along ``dim`` of ``self`` (or ``input``).
_ALONG_DIM = ("aten::index_select", "aten::index_add", "aten::index_copy", "aten::gather", "aten::scatter",
              "aten::scatter_add", "aten::scatter_reduce", "aten::index_fill")
#: Ops whose target indexes the class dim of ``self``: 1, or 0 for an input of one dim.
_CLASS_DIM = ("aten::nll_loss", "aten::nll_loss_forward", "aten::nll_loss2d", "aten::nll_loss2d_forward",
              "aten::nll_loss_nd", "aten::cross_entropy_loss")
#: Ops whose j-th index tensor indexes dim j of ``self``.
_PER_DIM = ("aten::index", "aten::_unsafe_index", "aten::index_put")


def index_table(op: str, j: int | None, ranks: dict[str, int], dim) -> tuple[str, int | None] | None:
    """``(argument name, dim)`` of the size that is the exclusive upper bound of ``op``'s
    index argument (item ``j`` of a tensor list, else None), from the ranks of the call's
    tensors (``ranks``: by argument name) and its ``dim`` argument (None where it has
    none); dim None: a 0-dim table, whose bound is 1.  None where unknown."""
    base = op.split(".")[0]
    x = "self" if "self" in ranks else "input"
    if base == "aten::embedding":
        return ("weight", 0) if ranks.get("weight", 0) >= 1 else None
    r = ranks.get(x)
    if r is None:
        return None
    if base in _ALONG_DIM:
        if type(dim) is not int:
            return None
        if r == 0:
            return (x, None)
        return (x, dim % r) if -r <= dim < r else None
    if base in _CLASS_DIM:
        return (x, 1 if r >= 2 else 0) if r >= 1 else None
    if base in _PER_DIM and j is not None:
        return (x, j) if j < r else None
    return None
