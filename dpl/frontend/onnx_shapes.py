"""ONNX translations of data movement, shape arithmetic and constants: Reshape, Flatten,
Transpose, Concat, Split, Slice, Gather, Unsqueeze/Squeeze, Expand, Pad, Tile, Shape, Size,
Constant, ConstantOfShape, Identity, Dropout. Their entries are in :data:`dpl.frontend.onnx_ops.ONNX_OPS`.

Several of them also compute on :class:`~dpl.frontend.onnx_node.ShapeValue`s, which is how a
``Shape -> Gather -> Concat -> Reshape`` chain over a symbolic batch folds into one reshape.
"""

from __future__ import annotations

import math

import numpy as np

from dpl.frontend.onnx_node import MergedValue, NodeContext, ShapeValue, flat_shape
from dpl.ir import dims
from dpl.ir.expr import Constant, TupleGetItem


def reshape(ctx: NodeContext):
    allowzero = ctx.version >= 14 and bool(ctx.attr("allowzero", 0))
    shape = ctx.dims_input(1, "the shape")
    v = ctx.value(0)
    if isinstance(v, MergedValue):
        return _unmerge(ctx, v, shape)
    if isinstance(v, ShapeValue):  # shape arithmetic: Reshape(Mul(batch, 4), [-1])
        return _reshape_shape(ctx, v, shape, allowzero)
    x = ctx.input(0)
    merged = _merge(x, shape)
    if merged is not None:
        return merged
    if allowzero and 0 in shape:
        raise ctx.unsupported("allowzero", 1, "allowzero=1 only when the shape holds no 0")
    dims = list(x.ty.shape)
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= len(dims):
                raise ctx.error(f"shape {shape} copies dimension {i} (a 0) of an input of rank {len(dims)}")
            out.append(dims[i])
        else:
            out.append(d)
    y = ctx.emit("reshape", x, shape=_known(x.ty.shape, out))
    return x if y.ty == x.ty else y


def _known(have, shape) -> tuple:
    """``shape`` with its -1 worked out where ``have`` is symbolic: the dims both hold cancel
    (``[batch, -1]`` of ``[batch, n * 2, 4]`` is ``[batch, n * 8]``), and what is left of the
    input divides exactly by what is left of the target. Unchanged where that fails: the
    reshape says why."""
    if -1 not in shape or all(isinstance(d, int) for d in have):
        return tuple(shape)
    rest, known = list(have), []
    for d in shape:
        if d == -1:
            continue
        if d in rest:
            rest.remove(d)
        else:
            known.append(d)
    total, divisor = _dims_product(rest), _dims_product(known)
    if divisor == 0:
        return tuple(shape)
    quotient = dims.floordiv(total, divisor)
    if not dims.provably_equal(dims.mul(quotient, divisor), total):
        return tuple(shape)
    return tuple(quotient if d == -1 else d for d in shape)


def _reshape_shape(ctx: NodeContext, v: ShapeValue, shape, allowzero: bool) -> ShapeValue:
    if any(not isinstance(d, int) for d in shape):
        raise ctx.error(f"reshapes the shape {v} to the symbolic {shape}; dpl reshapes a shape to a constant shape")
    target = [v.dims.shape[i] if d == 0 and not allowzero and i < v.dims.ndim else d for i, d in enumerate(shape)]
    try:
        return ShapeValue(v.dims.reshape(target), v.dtype)
    except ValueError:
        raise ctx.error(f"cannot reshape the shape {v} to {shape}") from None


def _merge(x, shape):
    """``x`` reshaped to ``[-1, *rest]`` where the -1 merges a symbolic dimension with other
    leading axes of ``x`` (the trailing axes unchanged): a MergedValue, or None otherwise."""
    if not shape or shape[0] != -1 or any(isinstance(d, int) and d <= 0 for d in shape[1:]):
        return None
    rest = tuple(shape[1:])
    k = x.ty.ndim - len(rest)
    if k >= 2 and tuple(x.ty.shape[k:]) == rest:
        return None if all(isinstance(d, int) for d in x.ty.shape[:k]) else MergedValue(x, k)
    if any(not isinstance(d, int) for d in rest):
        return None
    # the trailing axes are regrouped too ([2, seq, 4, 16] to [-1, 64]): regroup them first
    for k in range(2, x.ty.ndim):
        tail = x.ty.shape[k:]
        if all(isinstance(d, int) for d in tail) and math.prod(tail) == math.prod(rest):
            if all(isinstance(d, int) for d in x.ty.shape[:k]):
                return None
            from dpl.ops.registry import make_call

            return MergedValue(make_call("reshape", (x,), {"shape": tuple(x.ty.shape[:k]) + rest}), k)
    return None


def _unmerge(ctx: NodeContext, v: MergedValue, shape):
    x = v.value
    merged = _merge(x, shape)  # merged again, with other trailing axes
    lead = tuple(x.ty.shape[:v.lead])
    rest = tuple(shape[1:])
    if merged is None and len(shape) > 0 and shape[0] == -1 and dims.provably_equal(
            _dims_product(rest), _dims_product(x.ty.shape[v.lead:])):  # the -1 is the merged axis
        return MergedValue(ctx.emit("reshape", x, shape=lead + rest), v.lead)
    if merged is not None:
        return merged
    return ctx.emit("reshape", x, shape=_known(x.ty.shape, shape))


def flatten(ctx: NodeContext):
    x = ctx.input(0)
    shape = x.ty.shape
    axis = ctx.attr("axis", 1)
    if not -len(shape) <= axis <= len(shape):
        raise ctx.error(f"axis {axis} is out of range for an input of rank {len(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return ctx.emit("reshape", x, shape=(_dims_product(shape[:axis]), _dims_product(shape[axis:])))


def _dims_product(shape):
    """The product of dims as one dim (an int, a symbol or an expression, :mod:`dpl.ir.dims`)."""
    out = 1
    for d in shape:
        out = dims.mul(out, d)
    return out


def transpose(ctx: NodeContext):
    v = ctx.value(0)
    if isinstance(v, MergedValue) and list(ctx.attr("perm"))[0] == 0:  # else it moves the merged axis: flattened
        perm = list(ctx.attr("perm"))
        k = v.lead
        axes = tuple(range(k)) + tuple(p + k - 1 for p in perm[1:])
        return MergedValue(ctx.emit("permute_dims", v.value, axes=axes), k)
    x = ctx.input(0)
    ndim = x.ty.ndim
    perm = ctx.attr("perm", list(reversed(range(ndim))))
    if sorted(ctx.axis(p, ndim, "perm entry") for p in perm) != list(range(ndim)):
        raise ctx.error(f"perm {list(perm)} is not a permutation of the {ndim} axes")
    if list(perm) == list(range(ndim)):
        return x
    return ctx.emit("permute_dims", x, axes=tuple(perm))


def concat(ctx: NodeContext):
    values = [ctx.value(i) for i in range(ctx.num_inputs)]
    axis = ctx.attr("axis")
    if any(isinstance(v, ShapeValue) for v in values):
        parts = [v.dims if isinstance(v, ShapeValue) else np.asarray(ctx.constant(i, "a shape part")).astype(object)
                 for i, v in enumerate(values)]
        dtype = next(v.dtype for v in values if isinstance(v, ShapeValue))  # ONNX's Concat parts share one
        return ShapeValue(np.concatenate([p.reshape(-1) for p in parts]), dtype)
    args = ctx.inputs()
    ndim = args[0].ty.ndim
    return ctx.emit("concat", args, axis=ctx.axis(axis, ndim))


def split(ctx: NodeContext):
    x = ctx.input(0)
    ndim = x.ty.ndim
    axis = ctx.axis(ctx.attr("axis", 0), ndim)
    size = x.ty.shape[axis]
    count = len(ctx.node.output)
    if ctx.version >= 13 and ctx.has_input(1):
        sizes = ctx.ints_input(1, "split")
    elif ctx.version < 13 and ctx.attr("split", None) is not None:
        sizes = list(ctx.attr("split"))
    else:
        if ctx.version >= 18 and ctx.attr("num_outputs", count) != count:
            raise ctx.error(f"num_outputs {ctx.attr('num_outputs')} differs from the node's {count} outputs")
        if not isinstance(size, int):
            raise ctx.error(f"cannot split symbolic dimension '{size}'")
        step = -(-size // count)
        sizes = [min(step, size - i * step) for i in range(count)]
    if not isinstance(size, int) or sum(sizes) != size or len(sizes) != len(ctx.node.output) or min(sizes) < 0:
        raise ctx.error(f"split sizes {sizes} do not cut dimension {axis} of {x.ty} into {len(ctx.node.output)} outputs")
    points = tuple(int(p) for p in np.cumsum(sizes)[:-1])
    tup = ctx.emit("split", x, indices_or_sections=points, axis=axis)
    return [TupleGetItem(tup, i) for i in range(len(sizes))]


_INT_MAX = 2**31 - 1


def slice_tensor(ctx: NodeContext):
    v = ctx.value(0)
    if ctx.version < 10:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.ints_input(1, "starts"), ctx.dims_input(2, "ends")  # an end may be a symbolic length
        axes = ctx.ints_input(3, "axes") if ctx.has_input(3) else list(range(len(starts)))
        steps = ctx.ints_input(4, "steps") if ctx.has_input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if isinstance(v, ShapeValue):
        if any(not isinstance(e, int) for e in ends):
            raise ctx.error(f"ends {ends} of a slice of a shape must be constant")
        if len(axes) != 1 or ctx.axis(axes[0], 1) != 0:
            raise ctx.error(f"axes {axes} do not fit a shape vector, which has one axis")
        return ShapeValue(v.dims[slice(starts[0], ends[0], steps[0])], v.dtype)
    x = ctx.input(0)
    shape = x.ty.shape
    keep = ([], [], [], [])
    for a, b, e, s in zip(axes, starts, ends, steps):
        a = ctx.axis(a, len(shape))
        if s == 0:
            raise ctx.error("steps must not be 0")
        size = shape[a]
        if not isinstance(e, int):  # x[:seq] for a symbolic seq: its length is the dimension
            if e == size and b == 0 and s == 1:
                continue
            if b != 0 or s != 1:
                raise ctx.error(f"a slice to the symbolic end '{e}' must start at 0 with step 1, got start {b}, step {s}")
            for lst, val in zip(keep, (a, b, e, s)):
                lst.append(val)
            continue
        if not isinstance(size, int):
            if b == 0 and s == 1 and e >= _INT_MAX:
                continue  # the whole symbolic axis
            if s > 0 and e >= _INT_MAX:
                e = size
            # static bounds on a symbolic axis (x[:, :-1]): the strided_slice op says which it can type
            for lst, val in zip(keep, (a, b, e, s)):
                lst.append(val)
            continue
        # ONNX clamps like Python slicing does; clamping to [-size-1, size] keeps that meaning
        b, e = (min(max(t, -size - 1), size) for t in (b, e))
        if (b, s) == (0, 1) and e == size:
            continue
        for lst, val in zip(keep, (a, b, e, s)):
            lst.append(val)
    if not keep[0]:
        return x
    return ctx.emit("strided_slice", x, axes=tuple(keep[0]), begin=tuple(keep[1]), end=tuple(keep[2]), strides=tuple(keep[3]))


def gather(ctx: NodeContext):
    v = ctx.value(0)
    axis = ctx.attr("axis", 0)
    if isinstance(v, ShapeValue):
        idx = ctx.constant(1, "indices")
        return ShapeValue(np.asarray(np.take(v.dims, idx, axis=ctx.axis(axis, 1)), dtype=object), v.dtype)
    x, idx = ctx.input(0), ctx.input(1)
    a = ctx.axis(axis, x.ty.ndim)
    size = x.ty.shape[a]
    if isinstance(idx, Constant) and isinstance(size, int):
        if np.any((idx.value < -size) | (idx.value >= size)):
            raise ctx.error(f"indices {idx.value.tolist()} are out of range for dimension {a} of size {size}")
        idx = Constant(np.where(idx.value < 0, idx.value + size, idx.value).astype(idx.value.dtype))
    return ctx.emit("take", x, idx, axis=a)


def unsqueeze(ctx: NodeContext):
    axes = ctx.ints_input(1, "axes") if ctx.version >= 13 else list(ctx.attr("axes"))
    v = ctx.value(0)
    if isinstance(v, ShapeValue):
        return ShapeValue(np.expand_dims(v.dims, tuple(a % (v.dims.ndim + len(axes)) for a in axes)), v.dtype)
    x = ctx.input(0)
    ndim = x.ty.ndim + len(axes)
    return ctx.emit("expand_dims", x, axis=tuple(sorted(ctx.axis(a, ndim) for a in axes)))


def squeeze(ctx: NodeContext):
    if ctx.version >= 13:
        axes = ctx.ints_input(1, "axes") if ctx.has_input(1) else None
    else:
        axes = ctx.attr("axes", None)
    v = ctx.value(0)
    if isinstance(v, ShapeValue):
        return ShapeValue(np.squeeze(v.dims, None if axes is None else tuple(axes)), v.dtype)
    x = ctx.input(0)
    axis = None if axes is None else tuple(sorted(ctx.axis(a, x.ty.ndim) for a in axes))
    return ctx.emit("squeeze", x, axis=axis)


def expand(ctx: NodeContext):
    x = ctx.input(0)
    target = ctx.dims_input(1, "the shape")
    have = list(x.ty.shape)
    ndim = max(len(have), len(target))
    have = [1] * (ndim - len(have)) + have
    target = [1] * (ndim - len(target)) + list(target)
    out = []
    for d, t in zip(have, target):
        if t == 1 or d == t:
            out.append(d)
        elif d == 1:
            out.append(t)
        else:
            raise ctx.error(f"cannot expand {x.ty} to [{', '.join(map(dims.text, target))}]: {dims.text(d)} vs "
                            f"{dims.text(t)}")
    return x if tuple(out) == x.ty.shape else ctx.emit("broadcast_to", x, shape=tuple(out))


# ONNX's pad modes as Relax names them
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


def pad(ctx: NodeContext):
    """``nn.pad``: ONNX's pads are all the begins then all the ends, over every axis or over
    ``axes`` (Pad-18); dpl's pad_width is a (before, after) pair per axis. Before Pad-11 the pads
    and the value are attributes; from it, constant inputs (an initializer, a Constant node, a
    folded expression). A negative pad crops."""
    x = ctx.input(0)
    ndim = x.ty.ndim
    mode = ctx.attr("mode", "constant")
    if mode not in _PAD_MODES:  # wrap is Pad-19's, and torch.onnx writes it at opset 18 as well
        raise ctx.unsupported("mode", mode, "constant, reflect, edge and wrap")
    if ctx.version < 11:
        pads, value = list(ctx.attr("pads")), ctx.attr("value", 0.0)
    else:
        pads = ctx.ints_input(1, "pads")
        value = ctx.scalar_input(2, "constant_value") if ctx.has_input(2) else 0
    axes = list(range(ndim))
    if ctx.version >= 18 and ctx.has_input(3):
        given = ctx.ints_input(3, "axes")
        axes = [ctx.axis(a, ndim, "axes") for a in given]
        if len(set(axes)) != len(axes):
            raise ctx.error(f"axes {given} repeat an axis")
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must hold a begin and an end for each of the {len(axes)} padded axes")
    widths = [0] * (2 * ndim)
    for k, axis in enumerate(axes):
        widths[2 * axis], widths[2 * axis + 1] = pads[k], pads[k + len(axes)]
    if not any(widths):
        return x
    if mode != "constant" or x.ty.dtype.startswith(("float", "bfloat")):
        value = float(value)  # one spelling of the default (0.0) for the text form
    return ctx.emit("nn.pad", x, pad_width=tuple(widths), pad_mode=_PAD_MODES[mode],
                    pad_value=value if mode == "constant" else 0.0)


def tile(ctx: NodeContext):
    """``Tile``: each axis repeated, as ``broadcast_to`` over an interleaved unit axis and a
    ``reshape`` merging each pair (as torch's ``repeat`` comes in); a symbolic axis ``n``
    repeated r times is ``n * r``."""
    x = ctx.input(0)
    reps = ctx.ints_input(1, "repeats")
    if len(reps) != x.ty.ndim or min(reps, default=0) < 0:
        raise ctx.error(f"repeats {reps} must hold one count of at least 0 for each of the {x.ty.ndim} axes")
    if all(r == 1 for r in reps):
        return x
    shape = list(x.ty.shape)
    final = []
    for r, d in zip(reps, shape):
        final.append(dims.mul(r, d))
    pairs = ctx.emit("expand_dims", x, axis=tuple(2 * i for i in range(len(shape))))
    tiled = ctx.emit("broadcast_to", pairs, shape=tuple(v for r, d in zip(reps, shape) for v in (r, d)))
    return ctx.emit("reshape", tiled, shape=tuple(final))


def shape_of(ctx: NodeContext):
    x = ctx.value(0)
    if isinstance(x, ShapeValue):
        shape = list(x.dims.shape)
    else:
        shape = list(flat_shape(x) if isinstance(x, MergedValue) else ctx.input(0).ty.shape)
    start = ctx.attr("start", 0) if ctx.version >= 15 else 0
    end = ctx.attr("end", len(shape)) if ctx.version >= 15 else len(shape)
    shape = shape[slice(start, end)]
    if all(isinstance(d, int) for d in shape):
        return Constant(np.asarray(shape, dtype=np.int64))
    return ShapeValue(np.asarray(shape, dtype=object))


def size_of(ctx: NodeContext):
    v = ctx.value(0)
    shape = flat_shape(v) if isinstance(v, MergedValue) else ctx.input(0).ty.shape
    size = _dims_product(shape)
    if not isinstance(size, int):  # a symbolic element count: shape arithmetic
        return ShapeValue(np.asarray(size, dtype=object))
    return Constant(np.asarray(size, dtype=np.int64))


def constant(ctx: NodeContext):
    given = [a.name for a in ctx.node.attribute]
    if len(given) != 1:
        raise ctx.error(f"needs exactly one value attribute, got {given}")
    key = given[0]
    value = ctx.attr(key)
    if key == "value":
        return Constant(value)
    if key in ("value_float", "value_floats"):
        return Constant(np.asarray(value, dtype=np.float32))
    if key in ("value_int", "value_ints"):
        return Constant(np.asarray(value, dtype=np.int64))
    raise ctx.unsupported(key, value, "tensor, float and int constants")


def constant_of_shape(ctx: NodeContext):
    dims = ctx.dims_input(0, "the shape")
    fill = ctx.attr("value", np.zeros(1, np.float32))
    if fill.size != 1:
        raise ctx.error(f"value must hold one element, got {fill.size}")
    return ctx.emit("full", Constant(fill.reshape(())), shape=tuple(dims))


def identity(ctx: NodeContext):
    return ctx.value(0)


def dropout(ctx: NodeContext):
    ctx.refuse_used_outputs(1, "mask")
    ctx.attr("seed", 0)
    ctx.attr("ratio", 0.5)
    if ctx.version < 7:
        raise ctx.error("Dropout before opset 7 is not supported")
    if ctx.version >= 12 and ctx.has_input(2) and ctx.scalar_input(2, "training_mode"):
        raise ctx.error("training_mode is true; dpl imports models for inference")
    return ctx.value(0)
