"""ONNX translations of logic and of the gathers masks are built with: IsNaN, And/Or/Xor/Not,
and GatherND whose indices are ranges.

``torch.onnx.export`` writes ``attention_mask[batch_idx, kv_idx]`` (transformers' padding mask)
as ``GatherND(mask, Concat(Unsqueeze(Expand(range_b)), Unsqueeze(Expand(range_kv))))``: each
index component a range (``Range(0, n, 1)``, or a constant holding 0..n-1) varying along one
axis of the index shape. Such a gather selects a slice of the data and lays it out along those
axes, and is translated so (strided_slice, permute_dims, expand_dims, broadcast_to): no gather
at run time. Other GatherND indices (and batch_dims) are the general ``gather_nd`` op.
"""

from __future__ import annotations

import numpy as np

from dpl import dtypes
from dpl.frontend import onnx_indexing as indexing
from dpl.frontend.onnx_node import NodeContext, ShapeValue
from dpl.ir.expr import Constant


def is_nan(ctx: NodeContext):
    x = ctx.input(0)
    return ctx.emit("not_equal", x, x)


def _truth(ctx: NodeContext, i: int):
    x = ctx.input(i)
    if x.ty.dtype != "bool":
        raise ctx.error(f"input {i} has dtype {x.ty.dtype}; logical ops take bool tensors")
    return x


def logical(op: str):
    """And / Or / Xor of bools: minimum, maximum, not_equal."""
    return lambda ctx: ctx.emit(op, _truth(ctx, 0), _truth(ctx, 1))


def logical_not(ctx: NodeContext):
    return ctx.emit("equal", _truth(ctx, 0), Constant(np.asarray(False)))


_THROUGH = {"Unsqueeze", "Reshape", "Cast", "Identity", "Expand", "Squeeze"}


def _range_of(ctx: NodeContext, name: str):
    """``(length, offset)`` when the ONNX value ``name`` holds ``offset + 0..length-1`` along one
    axis (through unsqueezes, reshapes, casts and expands); else None."""
    offset = 0
    for _ in range(64):
        node = ctx.producer(name)
        if node is None or node.op_type == "Constant":
            value = ctx.values(name)
            if not isinstance(value, Constant):
                return None
            flat = np.asarray(value.value).reshape(-1)
            if flat.size == 0 or np.count_nonzero(np.asarray(value.value.shape) != 1) > 1:
                return None
            if not np.array_equal(flat, flat[0] + np.arange(flat.size)):
                return None
            return flat.size, offset + int(flat[0])
        if node.op_type in _THROUGH:
            name = node.input[0]
        elif node.op_type == "Add":
            const = [i for i in (0, 1) if isinstance(ctx.values(node.input[i]), Constant)
                     and np.asarray(ctx.values(node.input[i]).value).size == 1]
            if not const:
                return None
            offset += int(np.asarray(ctx.values(node.input[const[0]]).value).reshape(()))
            name = node.input[1 - const[0]]
        elif node.op_type == "Range":
            start, limit, delta = (ctx.values(n) for n in node.input)
            if not all(isinstance(v, Constant) for v in (start, delta)) or int(np.asarray(delta.value)) != 1:
                return None
            begin = int(np.asarray(start.value))
            if isinstance(limit, ShapeValue) and limit.dims.ndim == 0:
                end = limit.dims[()]
            elif isinstance(limit, Constant):
                end = int(np.asarray(limit.value))
            else:
                return None
            if not isinstance(end, (int, np.integer)):  # a symbolic length
                return (end, offset) if begin == 0 else None
            return int(end) - begin, offset + begin
        else:
            return None
    return None


def _components(ctx: NodeContext, name: str, k: int):
    """The ONNX names of the k index components of a GatherND's indices (Concat along the last
    axis of Unsqueeze(-1)'d tensors), or None."""
    node = ctx.producer(name)
    if node is None or node.op_type != "Concat" or len(node.input) != k:
        return None
    out = []
    for part in node.input:
        unsq = ctx.producer(part)
        if unsq is None or unsq.op_type != "Unsqueeze":
            return None
        out.append(unsq.input[0])
    return out


def gather_nd(ctx: NodeContext):
    data = ctx.input(0)
    indices = ctx.input(1)
    if ctx.attr("batch_dims", 0) != 0:
        return indexing.gather_nd(ctx)
    if indices.ty.ndim < 1:
        raise ctx.error(f"indices are 0-d ({indices.ty}); GatherND's indices have rank >= 1, their last axis holding "
                        "the index tuples")
    if indices.ty.dtype not in ("int32", "int64"):
        raise ctx.error(f"indices are {indices.ty}; GatherND's indices are int32 or int64")
    k = indices.ty.shape[-1]
    if not isinstance(k, int) or not 1 <= k <= data.ty.ndim:
        raise ctx.error(f"indices of shape {list(indices.ty.shape)} do not index data of rank {data.ty.ndim}")
    out_lead = list(indices.ty.shape[:-1])
    rank = len(out_lead)
    found = _constant_grid(indices, k) if isinstance(indices, Constant) else _computed_grid(ctx, k, rank)
    if found is None:  # indices computed otherwise: the general gather
        return indexing.gather_nd(ctx)
    x = data
    placed = []
    for axis, (length, offset, varying) in enumerate(found):
        size = x.ty.shape[axis]
        if not (offset == 0 and length == size):
            end = offset + length if isinstance(length, int) else length
            x = ctx.emit("strided_slice", x, axes=(axis,), begin=(offset,), end=(end,), strides=(1,))
        placed.append(varying)
    order = sorted(range(k), key=lambda j: placed[j])
    if order != list(range(k)):
        x = ctx.emit("permute_dims", x, axes=tuple(order) + tuple(range(k, x.ty.ndim)))
    targets = sorted(placed)
    missing = tuple(i for i in range(rank) if i not in targets)
    if missing:
        x = ctx.emit("expand_dims", x, axis=missing)
    out = tuple(out_lead) + tuple(data.ty.shape[k:])
    return x if tuple(x.ty.shape) == out else ctx.emit("broadcast_to", x, shape=out)


def _computed_grid(ctx: NodeContext, k: int, rank: int):
    """(length, offset, the axis it varies along) of each index component built by ops."""
    parts = _components(ctx, ctx.node.input[1], k)
    if parts is None:
        return None
    out = []
    for part in parts:
        r = _range_of(ctx, part)
        if r is None:
            return None
        before = _before_expand(ctx, part)
        shape = (1,) * (rank - before.ty.ndim) + tuple(before.ty.shape)
        varying = [i for i, d in enumerate(shape) if d != 1]
        if len(varying) != 1:
            return None
        out.append((r[0], r[1], varying[0]))
    return out


def _constant_grid(indices: Constant, k: int):
    """(length, offset, axis) of each component of constant indices that are a grid of ranges."""
    value = np.asarray(indices.value)
    out = []
    for j in range(k):
        comp = value[..., j]
        varying = [a for a in range(comp.ndim) if comp.shape[a] != 1 and not np.all(np.diff(comp, axis=a) == 0)]
        if len(varying) != 1:
            return None
        a = varying[0]
        line = np.moveaxis(comp, a, 0).reshape(comp.shape[a], -1)[:, 0]
        if not np.array_equal(line, line[0] + np.arange(line.size)) or not all(
                np.all(np.diff(comp, axis=b) == 0) for b in range(comp.ndim) if b != a):
            return None
        out.append((line.size, int(line[0]), a))
    if sorted(a for _l, _o, a in out) != sorted(set(a for _l, _o, a in out)):
        return None
    return out


def _before_expand(ctx: NodeContext, name: str):
    """The value an Expand broadcasts (the range's own shape tells the axis it varies along)."""
    node = ctx.producer(name)
    while node is not None and node.op_type == "Expand":
        name = node.input[0]
        node = ctx.producer(name)
    value = ctx.values(name)
    if isinstance(value, ShapeValue):
        raise ctx.error(f"index component '{name}' is a shape, not a tensor of indices")
    return value


def cumsum(ctx: NodeContext):
    x = ctx.input(0)
    axis = ctx.ints_input(1, "axis")
    if len(axis) != 1:
        raise ctx.error(f"axis must hold one value, got {axis}")
    if ctx.attr("exclusive", 0) or ctx.attr("reverse", 0):
        raise ctx.error("exclusive and reverse running sums are not supported")
    return ctx.emit("cumsum", x, axis=ctx.axis(axis[0], x.ty.ndim))


def gather_elements(ctx: NodeContext):
    """GatherElements where the indices vary along ``axis`` only (their other axes of size 1),
    as torch.gather in BERT's buffered token types: a ``take`` along ``axis``."""
    x, idx = ctx.input(0), ctx.input(1)
    if idx.ty.ndim != x.ty.ndim:
        raise ctx.error(f"indices of rank {idx.ty.ndim} ({idx.ty}) and data of rank {x.ty.ndim} ({x.ty}): "
                        "GatherElements needs both of the same rank")
    if idx.ty.dtype not in ("int32", "int64"):
        raise ctx.error(f"indices are {idx.ty}; GatherElements' indices are int32 or int64")
    axis = ctx.axis(ctx.attr("axis", 0), x.ty.ndim)
    others = [i for i in range(idx.ty.ndim) if i != axis]
    if any(idx.ty.shape[i] != 1 for i in others):  # the general gather
        return indexing.gather_elements(ctx)
    if any(x.ty.shape[i] != 1 for i in others):
        x = ctx.emit("strided_slice", x, axes=tuple(others), begin=(0,) * len(others), end=(1,) * len(others),
                     strides=(1,) * len(others))
    flat = ctx.emit("reshape", idx, shape=(idx.ty.shape[axis],))
    return ctx.emit("take", x, flat, axis=axis)


def matmul(ctx: NodeContext):
    """MatMul; where its left operand is torch.onnx's safe softmax, ``Where(IsNaN(p), 0, p)``
    with ``p = Softmax(s)`` (SDPA's guard for a query that sees no key), the guard moves after
    the product: ``where(max(s) > -inf, p @ v, 0)``, equal row by row, so that the attention
    chain softmax -> matmul stays whole for ``llm.dpl``'s pattern."""
    guarded = _safe_softmax(ctx, ctx.node.input[0])
    if guarded is None:
        return ctx.emit("matmul", ctx.input(0), ctx.input(1))
    probs, scores = guarded
    product = ctx.emit("matmul", probs, ctx.input(1))
    lowest = Constant(np.asarray(-np.inf, dtype=dtypes.to_numpy(scores.ty.dtype)))
    seen = ctx.emit("greater", ctx.emit("max", scores, axis=(-1,), keepdims=True), lowest)
    zero = Constant(np.asarray(0, dtype=np.dtype(product.ty.dtype)))
    return ctx.emit("where", seen, product, zero)


def _safe_softmax(ctx: NodeContext, name: str):
    """(the softmax's value, its scores) where ``name`` is ``Where(IsNaN(p), 0, p)`` of a
    ``Softmax`` over the last axis; else None."""
    where = ctx.producer(name)
    if where is None or where.op_type != "Where" or len(where.input) != 3:
        return None
    test, fill, p = where.input
    isnan = ctx.producer(test)
    softmax = ctx.producer(p)
    if isnan is None or isnan.op_type != "IsNaN" or isnan.input[0] != p or softmax is None or softmax.op_type != "Softmax":
        return None
    zero = ctx.values(fill)
    if not isinstance(zero, Constant) or np.asarray(zero.value).size != 1 or float(np.asarray(zero.value).reshape(())) != 0:
        return None
    probs, scores = ctx.values(p), ctx.values(softmax.input[0])
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
    if not hasattr(probs, "ty") or not hasattr(scores, "ty") or axis not in (-1, scores.ty.ndim - 1):
        return None
    return probs, scores
