"""Arithmetic on symbolic shapes: ``Mul``, ``Add``, ``Sub``, ``Div``, ``Mod``, ``Max``, ``Min``,
``Neg`` and ``ReduceProd`` of a :class:`~dpl.frontend.onnx_node.ShapeValue`, computed at import
time as dimension expressions (:mod:`dpl.ir.dims`). ``torch.onnx.export(dynamo=True)`` writes
``Shape -> Gather -> Mul -> Concat -> Reshape`` for ``x.view(b * 4, s, 16)``; the Reshape gets
the target ``[batch * 4, s, 16]`` and no arithmetic is left for run time.

Each wrapper takes the op's tensor translation and runs it unless an input is a symbolic
ShapeValue. The integer semantics are ONNX's: ``Div`` truncates towards zero, written with
floor divisions that simplify away where the dividend is provably >= 0
(``trunc(a / b) = max(a, 0) // b - max(-a, 0) // b`` for ``b > 0``); ``Mod`` with ``fmod=0`` is
the floor remainder, with ``fmod=1`` the truncated one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from dpl.frontend.onnx_node import NodeContext, ShapeValue
from dpl.ir import dims
from dpl.ir.expr import Constant


def _symbolic(ctx: NodeContext) -> bool:
    """Whether the node computes on a symbolic shape: one input is, and every other is a shape
    or a constant (a tensor of run time beside a shape is the shape used as data: the tensor
    translation says so)."""
    values = [ctx.value(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    return any(isinstance(v, ShapeValue) and not v.is_static for v in values) and all(
        isinstance(v, (ShapeValue, Constant)) for v in values)


def _operand(ctx: NodeContext, i: int) -> np.ndarray:
    """Input ``i`` as an object array of dims: a ShapeValue's, or a constant's integers."""
    v = ctx.value(i)
    if isinstance(v, ShapeValue) and v.dtype != "int64":
        raise ctx.error(f"shape arithmetic on the size {v} cast to {v.dtype}: dpl computes on symbolic sizes with "
                        "integers only")
    if isinstance(v, ShapeValue):
        return v.dims
    value = ctx.constant(i, "an operand of shape arithmetic")
    if value.dtype.kind not in "iub":
        raise ctx.error(f"shape arithmetic with the {value.dtype} operand '{ctx.node.input[i]}': dpl computes on "
                        "symbolic sizes with integers only")
    return np.vectorize(int, otypes=[object])(value) if value.size else value.astype(object)


def _apply(ctx: NodeContext, fn: Callable, operands: list[np.ndarray]) -> ShapeValue:
    try:
        out = np.frompyfunc(fn, len(operands), 1)(*operands)
    except ValueError as err:  # shapes that do not broadcast
        raise ctx.error(f"shape operands do not broadcast: {err}") from None
    except dims.DimError as err:
        raise ctx.error(f"shape arithmetic: {err.message}") from None
    return ShapeValue(np.asarray(out, dtype=object))


def trunc_div(a, b):
    """ONNX's integer ``Div``: the quotient rounded towards zero (``b != 0``)."""
    if type(b) is int and b < 0:
        return dims.neg(trunc_div(a, -b))
    if type(a) is int and type(b) is int:
        return abs(a) // b * (1 if a >= 0 else -1)
    return dims.sub(dims.floordiv(dims.dmax(a, 0), b), dims.floordiv(dims.dmax(dims.neg(a), 0), b))


def trunc_mod(a, b):
    """C's remainder (``Mod`` with ``fmod=1``): the sign of the dividend."""
    return dims.sub(a, dims.mul(b, trunc_div(a, b)))


_BINARY = {"Add": dims.add, "Sub": dims.sub, "Mul": dims.mul, "Div": trunc_div}


def binary(tensor: Callable[[NodeContext], object]):
    """``Add``/``Sub``/``Mul``/``Div`` of a symbolic shape, else ``tensor``'s translation."""
    def translate(ctx: NodeContext):
        if not _symbolic(ctx):
            return tensor(ctx)
        if ctx.node.op_type == "Div" and not (isinstance(ctx.value(1), ShapeValue) or np.all(_operand(ctx, 1) != 0)):
            raise ctx.error("shape arithmetic divides by 0")
        return _apply(ctx, _BINARY[ctx.node.op_type], [_operand(ctx, 0), _operand(ctx, 1)])

    return translate


def mod(tensor: Callable[[NodeContext], object]):
    def translate(ctx: NodeContext):
        if not _symbolic(ctx):
            return tensor(ctx)
        fmod = ctx.attr("fmod", 0)
        if fmod not in (0, 1):
            raise ctx.unsupported("fmod", fmod, "0 and 1")
        return _apply(ctx, trunc_mod if fmod else dims.mod, [_operand(ctx, 0), _operand(ctx, 1)])

    return translate


def variadic(tensor: Callable[[NodeContext], object]):
    """``Max``/``Min`` of symbolic shapes."""
    def translate(ctx: NodeContext):
        if not _symbolic(ctx):
            return tensor(ctx)
        fn = dims.dmax if ctx.node.op_type == "Max" else dims.dmin
        operands = [_operand(ctx, i) for i in range(ctx.num_inputs)]
        return _apply(ctx, fn, operands) if len(operands) > 1 else ShapeValue(operands[0])

    return translate


def negate(tensor: Callable[[NodeContext], object]):
    def translate(ctx: NodeContext):
        return _apply(ctx, dims.neg, [_operand(ctx, 0)]) if _symbolic(ctx) else tensor(ctx)

    return translate


def reduce_prod(tensor: Callable[[NodeContext], object]):
    """``ReduceProd`` of a shape vector over its one axis: the element count, as ``x.numel()``."""
    def translate(ctx: NodeContext):
        if not _symbolic(ctx):
            return tensor(ctx)
        v = ctx.value(0)
        if ctx.version >= 18 and ctx.has_input(1):
            axes = ctx.ints_input(1, "axes")
        else:
            axes = list(ctx.attr("axes", [0]))
        if ctx.version >= 18:
            ctx.attr("noop_with_empty_axes", 0)
        if v.dims.ndim != 1 or len(axes) != 1 or ctx.axis(axes[0], 1, "axes") != 0:
            raise ctx.error(f"ReduceProd of the shape {v} over axes {axes}: dpl multiplies a shape vector over its one axis")
        out = 1
        for d in v.dims:
            out = dims.mul(out, d)
        keep = ctx.attr("keepdims", 1)
        return ShapeValue(np.asarray([out] if keep else out, dtype=object))

    return translate
