"""ONNX translations of indexing, scattering and sorting (dpl/ops/indexing.py): ArgMax/ArgMin,
TopK, ScatterND, ScatterElements, and the general GatherND and GatherElements that the
range-only forms of :mod:`dpl.frontend.onnx_gather` fall back to."""

from __future__ import annotations

from dpl.frontend.onnx_node import NodeContext, ShapeValue
from dpl.ir.expr import TupleGetItem

# ONNX's reduction names -> dpl's (Relax's)
_REDUCTIONS = {"none": "update", "add": "add", "mul": "mul", "max": "max", "min": "min"}


def arg_extreme(op: str):
    def translate(ctx: NodeContext):
        x = ctx.input(0)
        axis = ctx.axis(ctx.attr("axis", 0), x.ty.ndim)
        return ctx.emit(op, x, axis=axis, keepdims=bool(ctx.attr("keepdims", 1)),
                        select_last_index=bool(ctx.attr("select_last_index", 0)))

    return translate


def topk(ctx: NodeContext):
    x = ctx.input(0)
    axis = ctx.axis(ctx.attr("axis", -1), x.ty.ndim)
    largest, ordered = bool(ctx.attr("largest", 1)), bool(ctx.attr("sorted", 1))
    if ctx.version < 10:
        k = ctx.attr("k")
    else:
        v = ctx.value(1)
        if isinstance(v, ShapeValue) and not v.is_static:  # k = Shape(x)[axis]: every element, in order
            dims = list(v.dims.reshape(-1))
            if len(dims) != 1 or dims[0] != x.ty.shape[axis]:
                raise ctx.error(f"k {v} is symbolic and not the length {x.ty.shape[axis]} of axis {axis}; dpl's k is a "
                                "number, or the whole axis")
            whole = ctx.emit("sort", x, axis=axis, descending=largest)
            return [TupleGetItem(whole, 0), TupleGetItem(whole, 1)]
        k = ctx.ints_input(1, "k")
        if len(k) != 1:
            raise ctx.error(f"k must hold one value, got {k}")
        k = k[0]
    whole = ctx.emit("topk", x, k=int(k), axis=axis, largest=largest, sorted=ordered)
    return [TupleGetItem(whole, 0), TupleGetItem(whole, 1)]


def _reduction(ctx: NodeContext) -> str:
    r = ctx.attr("reduction", "none")
    if r not in _REDUCTIONS:
        raise ctx.unsupported("reduction", r, ", ".join(_REDUCTIONS))
    return _REDUCTIONS[r]


def scatter_nd(ctx: NodeContext):
    data, idx, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    return ctx.emit("scatter_nd", data, idx, updates, reduction=_reduction(ctx))


def scatter_elements(ctx: NodeContext):
    data, idx, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = ctx.axis(ctx.attr("axis", 0), data.ty.ndim)
    return ctx.emit("scatter_elements", data, idx, updates, axis=axis, reduction=_reduction(ctx))


def gather_nd(ctx: NodeContext):
    return ctx.emit("gather_nd", ctx.input(0), ctx.input(1), batch_dims=int(ctx.attr("batch_dims", 0)))


def gather_elements(ctx: NodeContext):
    x = ctx.input(0)
    return ctx.emit("gather_elements", x, ctx.input(1), axis=ctx.axis(ctx.attr("axis", 0), x.ty.ndim))
