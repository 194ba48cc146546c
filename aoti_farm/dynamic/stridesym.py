"""The graph of a shape class whose strides are symbols, for AOTInductor.

``torch.export`` makes sizes symbolic (``Dim``) but gives a tensor of static sizes static
strides, and a stride that no size implies (the ``[2, 1]`` last column of a growing
``[2, n]`` buffer has stride ``n``; GPT-2 decode adds to it at every step) has no
``Dim``.  ShapeEnv itself has symbolic strides (``DimDynamic.DYNAMIC`` in a
``StatelessSymbolicContext``'s ``dynamic_strides``; Dynamo uses them when a stride
changes between calls), and AOTInductor compiles the placeholders' fake tensors of the
graph it is given (``compile_fx._extract_inputs_from_exported_gm``), reading such a
stride from the input at run time.  So :func:`trace` fakes the class's example inputs
with a symbol per varying size and stride, each constrained to its range, and traces the
op with ``make_fx``.

Export's guarantee is kept by hand: the graph must hold across the whole class, so every
guard and runtime assertion the trace recorded must be provable from the ranges (ties
between positions the class ties are allowed), every symbol must stay a free symbol of
its range, and every fixed size or stride must come out as the constant it is.  Anything
else raises :class:`Unsupported` (the class's members are then compiled exactly).  The
verification across the range (:meth:`aoti_farm.compile.compiler.AOTICompiler.verify_class`) then
checks the kernel against eager at both ends of every range, as for any class.

This uses torch internals the way ``torch._dynamo`` does (``ShapeEnv``,
``StatelessSymbolicContext`` with ``dynamic_strides``/``constraint_strides``,
``FakeTensorMode.from_tensor``, ``make_fx``; tested with torch 2.13) and patches none:
where they are missing or refuse the pattern, the class is :class:`Unsupported` (the
reason names the exception) and its members are compiled exactly.
"""

from __future__ import annotations

import torch

from aoti_farm.dynamic import shapes as SH


class Unsupported(Exception):
    """This class's graph cannot be traced with symbolic strides (the message says why)."""


def trace(cls: SH.ShapeClass, module: torch.nn.Module, tensors: list) -> tuple[torch.fx.GraphModule, tuple]:
    """(graph, fake inputs) of ``module`` (the op with its non-tensor arguments baked in)
    at the class's pattern: ``tensors`` are real inputs at one point of the class (the
    symbols' hints).  Raises :class:`Unsupported`."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, StrictMinMaxConstraint
    from torch.utils._sympy.value_ranges import ValueRanges

    ranges = cls.symbols
    if len(tensors) != len(cls.dims):
        raise Unsupported("the inputs do not match the class's tensors")
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)

    def constraint(p):
        lo, hi = ranges[p]
        return StrictMinMaxConstraint(vr=ValueRanges(lo, hi), warn_only=False)

    try:
        fakes = _fakes(cls, tensors, mode, constraint)
    except Exception as e:  # noqa: BLE001 -- another torch's ShapeEnv, a pattern it refuses
        raise Unsupported(f"fake inputs with symbolic strides failed: {_why(e)}") from None
    with mode:
        try:
            gm = make_fx(lambda *ts: _outputs(module(*ts)), tracing_mode="real")(*fakes)
        except Exception as e:  # noqa: BLE001 -- a meta function that needs a concrete stride, ...
            raise Unsupported(f"tracing with symbolic strides failed: {_why(e)}") from None
    check(cls, fakes)
    return gm, tuple(fakes)


def _fakes(cls: SH.ShapeClass, tensors: list, mode, constraint) -> list:
    """Fake tensors of ``tensors`` with a ShapeEnv symbol per symbolic size and stride."""
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    fakes = []
    for i, (t, pat, strided) in enumerate(zip(tensors, cls.dims, cls.strided)):
        rank = t.dim()
        sizes, strides = pat[:rank], (pat[rank:] if strided else (None,) * rank)
        ctx = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.DYNAMIC if isinstance(p, str) else DimDynamic.STATIC for p in sizes],
            constraint_sizes=[constraint(p) if isinstance(p, str) else None for p in sizes],
            dynamic_strides=[DimDynamic.DYNAMIC if isinstance(p, str) else DimDynamic.INFER_STRIDE for p in strides],
            constraint_strides=[constraint(p) if isinstance(p, str) else None for p in strides])
        f = mode.from_tensor(t, source=LocalSource(f"t{i}"), symbolic_context=ctx)
        fakes.append(f)
    return fakes


def check(cls: SH.ShapeClass, fakes) -> None:
    """Raise :class:`Unsupported` unless the fakes still have the class's pattern and
    everything the trace (and, called again after the compile, Inductor) assumed of the
    symbols holds across the class: each symbol still a free symbol of its own (positions
    the class ties may share one), each fixed size or stride its constant, every guard
    and deferred runtime assertion provable from the class's ranges."""
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    env = fakes[0].fake_mode.shape_env
    names: dict = {}     # sympy symbol (as ShapeEnv now has it) -> the class's symbol name
    for f, pat, strided in zip(fakes, cls.dims, cls.strided):
        got = tuple(f.size()) + (tuple(f.stride()) if strided else ())
        for p, v in zip(pat, got):
            e = v.node.expr if isinstance(v, torch.SymInt) else sympy.Integer(v)   # replacements applied
            if isinstance(p, int):
                if e != p:   # INFER_STRIDE made a fixed stride of a tensor of symbolic sizes a symbol
                    raise Unsupported(f"the fixed size or stride {p} became {e}")
            elif not isinstance(e, sympy.Symbol):
                raise Unsupported(f"the trace specialised {p} to {e}")
            elif names.setdefault(e, p) != p:
                raise Unsupported(f"the trace made {names[e]} and {p} one")
    # the class's own ranges: a guard narrows ShapeEnv's (a branch on ``stride > 20``
    # taken at the hint leaves [8, 20] there), and the proof is of the whole class
    ranges = cls.symbols
    bounds = {sym: ValueRanges(*ranges[p]) for sym, p in names.items()}
    facts = [g.expr for g in env.guards]
    for ras in env.deferred_runtime_asserts.values():
        facts.extend(ra.expr for ra in ras)
    for expr in facts:
        e = env.replace(expr)
        if e is sympy.true:
            continue
        if not e.free_symbols <= set(names):
            raise Unsupported(f"the trace assumed {expr} of a symbol that is not the class's")
        vr = bound_sympy(e, bounds)
        if not (vr.is_bool and vr.lower is sympy.true):
            raise Unsupported(f"the trace assumed {expr}, which does not hold across the class's ranges")


def _why(e: BaseException) -> str:
    """An exception as a refusal names it: its type and first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _outputs(out) -> tuple:
    """The op's outputs as the flat tuple AOTInductor wants of a graph (export's
    ``ep.module()`` flattens them the same way: the runner returns the same list)."""
    if isinstance(out, torch.Tensor):
        return (out,)
    flat = []
    for o in out:
        flat.extend(_outputs(o) if isinstance(o, (tuple, list)) else (o,))
    return tuple(flat)


__all__ = ["trace", "check", "Unsupported"]
