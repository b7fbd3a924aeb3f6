"""Data movement and creation: reshape, transpose, concat/split, slicing, gather, broadcast,
expand/squeeze, full/zeros/ones, arange, triu/tril. Injective in TVM unless the index map is simpler: a call that
reads its input at the output index (an identity permutation, a slice from 0 with stride 1, a
split into one piece) is ElemWise, as TVM finds by looking at the loads of the kernel."""

from __future__ import annotations

import math

import numpy as np

from dpl import dtypes
from dpl.ir.types import TensorType, TupleType
from dpl.ops._shapes import dim_product, fmt_dims, normalize_axes, normalize_axis
from dpl.ops._slices import slice_axes, sliced_shape
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

K = OpPatternKind


# -- reshape -----------------------------------------------------------------------------------


def _infer_reshape(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    shape = list(info.attrs["shape"])
    if shape.count(-1) > 1:
        raise info.error(f"shape {fmt_dims(shape)} may hold at most one -1")
    if any(isinstance(d, int) and d < -1 for d in shape):
        raise info.error(f"shape {fmt_dims(shape)} has a negative dimension")
    have_n, have_syms = dim_product(x.shape)
    if -1 in shape:
        known = [d for d in shape if d != -1]
        n, syms = dim_product(known)
        rest = list(have_syms)
        for s in syms:
            if s not in rest:
                raise info.error(f"cannot reshape {info.operand(0)} to {fmt_dims(shape)}: symbolic '{s}' is not a dimension of the input")
            rest.remove(s)
        if len(rest) == 1 and have_n == n:
            inferred = rest[0]  # the -1 stands for the one symbolic dim left over
        elif not rest and n and have_n % n == 0:
            inferred = have_n // n
        else:
            raise info.error(f"cannot infer the -1 of {fmt_dims(shape)} from {info.operand(0)}")
        shape[shape.index(-1)] = inferred
    if dim_product(shape) != (have_n, have_syms):
        raise info.error(f"cannot reshape {info.operand(0)} to {fmt_dims(shape)}: element counts differ")
    return TensorType(tuple(shape), x.dtype)


def _reshape_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM 0.27 unravels the flat index with ``% n`` for a symbolic input dimension n; a load
    # index using a variable that is not an output index makes the whole kernel Opaque
    return K.INJECTIVE if info.tensor(0).is_static else K.OPAQUE


register(
    "reshape",
    num_args=1,
    attrs={"shape": AttrSpec("shape")},
    infer=_infer_reshape,
    kind=_reshape_kind,
    ref=lambda x, shape: np.reshape(x, shape),
    doc="same elements, new shape (one -1 may be inferred)",
)

# -- permute_dims ------------------------------------------------------------------------------


def _perm(info: CallInfo, ndim: int):
    axes = info.attrs["axes"]
    if axes is None:
        return tuple(reversed(range(ndim)))
    if len(axes) != ndim:
        raise info.error(f"axes {list(axes)} must list all {ndim} axes of {info.operand(0)}")
    return normalize_axes(info, axes, ndim)


def _infer_permute(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    return TensorType(tuple(x.shape[a] for a in _perm(info, x.ndim)), x.dtype)


register(
    "permute_dims",
    num_args=1,
    attrs={"axes": AttrSpec("ints", default=None)},
    infer=_infer_permute,
    kind=lambda info, out: K.ELEMWISE if _perm(info, out.ndim) == tuple(range(out.ndim)) else K.INJECTIVE,
    ref=lambda x, axes: np.transpose(x, None if axes is None else [a % x.ndim for a in axes]),
    doc="transpose; no axes reverses them",
)

# -- concat / split ----------------------------------------------------------------------------


def _infer_concat(info: CallInfo) -> TensorType:
    tup = info.arg_types[0]
    if not isinstance(tup, TupleType) or not tup.fields:
        raise info.error(f"operand {info.operand(0)} must be a non-empty tuple of tensors")
    if not all(isinstance(t, TensorType) for t in tup.fields):
        raise info.error(f"operand {info.operand(0)} must be a tuple of tensors")
    first = tup.fields[0]
    axis = normalize_axis(info, info.attrs["axis"], first.ndim)
    total_n, total_syms = 0, []
    for t in tup.fields:
        if not isinstance(t, TensorType) or t.ndim != first.ndim or t.dtype != first.dtype:
            raise info.error(f"tuple fields {tup} must be tensors of one rank and dtype")
        for i, (a, b) in enumerate(zip(t.shape, first.shape)):
            if i != axis and a != b:
                raise info.error(f"tuple fields {tup} differ in dimension {i}, which is not the concat axis")
        d = t.shape[axis]
        if isinstance(d, str):
            total_syms.append(d)
        else:
            total_n += d
    if total_syms:
        raise info.error(f"concat along a symbolic dimension ({', '.join(total_syms)}) is not supported")
    shape = list(first.shape)
    shape[axis] = total_n
    return TensorType(tuple(shape), first.dtype)


def _concat_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM reads field k at (output index - the sizes of the fields before it); only when every
    # offset is 0, i.e. every field but the last is empty, is each load at the output index
    axis = info.attrs["axis"] % out.ndim
    if all(t.shape[axis] == 0 for t in info.arg_types[0].fields[:-1]):
        return K.ELEMWISE
    return K.INJECTIVE


register(
    "concat",
    num_args=1,
    attrs={"axis": AttrSpec("axis", default=0)},
    infer=_infer_concat,
    kind=_concat_kind,
    ref=lambda tup, axis: np.concatenate(tup, axis=axis),
    doc="join a tuple of tensors along axis",
)


def _split_points(info: CallInfo, size):
    spec = info.attrs["indices_or_sections"]
    if isinstance(spec, int):
        if isinstance(size, str) or spec <= 0 or size % spec:
            raise info.error(f"cannot split dimension {size} into {spec} equal sections")
        step = size // spec
        return [step * i for i in range(1, spec)]
    if isinstance(size, str):
        raise info.error(f"cannot split symbolic dimension '{size}' at indices")
    points = list(spec)
    if points != sorted(points) or any(p < 0 or p > size for p in points):
        raise info.error(f"split indices {points} must be ascending and within 0..{size}")
    return points


def _infer_split(info: CallInfo) -> TupleType:
    x = info.tensor(0)
    axis = normalize_axis(info, info.attrs["axis"], x.ndim)
    points = _split_points(info, x.shape[axis])
    bounds = [0, *points, x.shape[axis]]
    fields = []
    for lo, hi in zip(bounds, bounds[1:]):
        shape = list(x.shape)
        shape[axis] = hi - lo
        fields.append(TensorType(tuple(shape), x.dtype))
    return TupleType(tuple(fields))


register(
    "split",
    num_args=1,
    attrs={"indices_or_sections": AttrSpec("ints_or_int"), "axis": AttrSpec("axis", default=0)},
    infer=_infer_split,
    kind=lambda info, out: K.ELEMWISE if len(out.fields) == 1 else K.INJECTIVE,
    ref=lambda x, indices_or_sections, axis: tuple(
        np.split(x, indices_or_sections if isinstance(indices_or_sections, int) else list(indices_or_sections), axis=axis)
    ),
    doc="split along axis into equal sections or at indices; gives a tuple",
)

# -- strided_slice -----------------------------------------------------------------------------


def _infer_strided_slice(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    return TensorType(sliced_shape(x, slice_axes(info, x)), x.dtype)


def _strided_slice_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM: a slice from 0 with stride 1 reads x at the output index itself, so it is ElemWise;
    # the begin counts after Python's normalisation (-8 of 8 is 0; so is -100). Slicing a
    # symbolic dimension legalizes into clamped, run-time index arithmetic: Opaque
    x = info.tensor(0)
    slices = slice_axes(info, x)
    if any(isinstance(x.shape[sl.axis], str) for sl in slices):
        return K.OPAQUE
    if all(sl.stride == 1 and sl.start == 0 for sl in slices):
        return K.ELEMWISE
    return K.INJECTIVE


def _strided_slice_ref(x, axes, begin, end, strides):
    index = [slice(None)] * x.ndim
    strides = strides or (1,) * len(axes)
    for a, b, e, s in zip(axes, begin, end, strides):
        index[a % x.ndim] = slice(b, e, s)
    return x[tuple(index)]


register(
    "strided_slice",
    num_args=1,
    attrs={"axes": AttrSpec("ints"), "begin": AttrSpec("ints"), "end": AttrSpec("dims"), "strides": AttrSpec("ints", default=None)},
    infer=_infer_strided_slice,
    kind=_strided_slice_kind,
    ref=_strided_slice_ref,
    doc="x[begin:end:stride] along the given axes (Python slice rules; an end may be a symbolic dim)",
)

# -- take --------------------------------------------------------------------------------------


def _infer_take(info: CallInfo) -> TensorType:
    x, idx = info.tensor(0), info.tensor(1)
    if not idx.dtype.startswith(("int", "uint")):
        raise info.error(f"indices {info.operand(1)} must have an integer dtype")
    axis = info.attrs["axis"]
    if axis is None:
        return TensorType(idx.shape, x.dtype)
    a = normalize_axis(info, axis, x.ndim)
    return TensorType(x.shape[:a] + idx.shape + x.shape[a + 1 :], x.dtype)


register(
    "take",
    num_args=2,
    attrs={"axis": AttrSpec("axis", default=None, optional=True)},
    infer=_infer_take,
    kind=K.OPAQUE,
    ref=lambda x, idx, axis: np.take(x, idx, axis=axis),
    doc="gather x at indices along axis (flattened x when no axis)",
)

# -- broadcast_to / expand_dims / squeeze ------------------------------------------------------


def _broadcast_kind(info: CallInfo, out) -> OpPatternKind:
    """Broadcast, unless the call changes no dimension (then x is read at the output index)."""
    return K.ELEMWISE if info.tensor(0).shape == out.shape else K.BROADCAST


def _infer_broadcast_to(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    shape = tuple(info.attrs["shape"])
    if len(shape) < x.ndim:
        raise info.error(f"cannot broadcast {info.operand(0)} to lower rank {fmt_dims(shape)}")
    for d, t in zip(reversed(x.shape), reversed(shape)):
        if d != 1 and d != t:
            raise info.error(f"cannot broadcast {info.operand(0)} to {fmt_dims(shape)}")
    return TensorType(shape, x.dtype)


register(
    "broadcast_to",
    num_args=1,
    attrs={"shape": AttrSpec("shape")},
    infer=_infer_broadcast_to,
    kind=_broadcast_kind,
    ref=lambda x, shape: np.broadcast_to(x, shape).copy(),
    doc="repeat x along broadcast dimensions",
)


def _infer_expand_dims(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    axes = info.attrs["axis"]
    ndim = x.ndim + len(axes)
    positions = normalize_axes(info, axes, ndim)
    dims = iter(x.shape)
    return TensorType(tuple(1 if i in positions else next(dims) for i in range(ndim)), x.dtype)


register(
    "expand_dims",
    num_args=1,
    attrs={"axis": AttrSpec("axes")},
    infer=_infer_expand_dims,
    kind=_broadcast_kind,
    ref=lambda x, axis: np.expand_dims(x, tuple(a % (x.ndim + len(axis)) for a in axis)),
    doc="insert unit dimensions at the given output positions",
)


def _squeeze_axes(info: CallInfo, x: TensorType):
    axes = info.attrs["axis"]
    if axes is None:
        return tuple(i for i, d in enumerate(x.shape) if d == 1)
    axes = normalize_axes(info, axes, x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise info.error(f"cannot squeeze axis {a} of {info.operand(0)}: its size is {x.shape[a]}")
    return axes


def _infer_squeeze(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    axes = _squeeze_axes(info, x)
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def _squeeze_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM cannot tell whether a symbolic dim is 1: squeezing every unit axis of such a tensor
    # is never legalized, so FuseOps sees an opaque op
    if info.attrs["axis"] is None and any(isinstance(d, str) for d in info.tensor(0).shape):
        return K.OPAQUE
    return _broadcast_kind(info, out)


register(
    "squeeze",
    num_args=1,
    attrs={"axis": AttrSpec("axes", default=None)},
    infer=_infer_squeeze,
    kind=_squeeze_kind,
    ref=lambda x, axis: np.squeeze(x, None if axis is None else tuple(a % x.ndim for a in axis)),
    doc="drop unit dimensions (all of them when no axis)",
)

# -- creation ----------------------------------------------------------------------------------


def _infer_full(info: CallInfo) -> TensorType:
    fill = info.tensor(0)
    if fill.ndim != 0:
        raise info.error(f"fill value {info.operand(0)} must be a scalar")
    return TensorType(tuple(info.attrs["shape"]), info.attrs["dtype"] or fill.dtype)


register(
    "full",
    num_args=1,
    attrs={"shape": AttrSpec("shape"), "dtype": AttrSpec("dtype", default=None)},
    infer=_infer_full,
    # TVM folds a constant fill into the kernel (no load: ElemWise); a fill tensor is broadcast
    kind=lambda info, out: K.ELEMWISE if info.is_scalar_const(0) or out.ndim == 0 else K.BROADCAST,
    ref=lambda v, shape, dtype: np.full(shape, v, dtype=dtypes.to_numpy(dtype) if dtype else v.dtype),
    doc="a tensor of the given shape filled with a scalar operand",
)


def _creation(name, value):
    register(
        name,
        num_args=0,
        attrs={"shape": AttrSpec("shape"), "dtype": AttrSpec("dtype", default="float32")},
        infer=lambda info: TensorType(tuple(info.attrs["shape"]), info.attrs["dtype"]),
        kind=K.ELEMWISE,
        ref=lambda shape, dtype: np.full(shape, value, dtype=dtypes.to_numpy(dtype)),
        doc=f"a tensor of {value}s",
    )


_creation("zeros", 0)
_creation("ones", 1)


# -- arange and triangles ----------------------------------------------------------------------


def _arange_dtype(start, end, step, dtype) -> str:
    """Relax's rule: the given dtype, else float32 when a bound is a float, else int64."""
    if dtype is not None:
        return dtype
    return "float32" if any(isinstance(v, float) for v in (start, end, step)) else "int64"


def _infer_arange(info: CallInfo) -> TensorType:
    start, end, step = info.attrs["start"], info.attrs["end"], info.attrs["step"]
    dtype = _arange_dtype(**info.attrs)
    if isinstance(start, str) or isinstance(step, str):
        raise info.error(f"start {start!r} and step {step!r} must be numbers; only the end may be a symbolic dimension")
    if step == 0:
        raise info.error("step must not be 0")
    bad = next((f"{k} {v}" for k, v in (("start", start), ("end", end), ("step", step)) if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise info.error(f"{bad} is not a finite number (the length of the range would be undefined)")
    if isinstance(end, str):
        if (start, step) != (0, 1):
            raise info.error(f"a range to the symbolic end '{end}' must start at 0 with step 1 (its length must be a "
                             f"dimension), got start {start} and step {step}")
        return TensorType((end,), dtype)
    return TensorType((max(0, math.ceil((end - start) / step)),), dtype)


def _arange_ref(start, end, step, dtype):
    n = max(0, math.ceil((end - start) / step))
    return (start + step * np.arange(n, dtype=np.float64)).astype(dtypes.to_numpy(_arange_dtype(start, end, step, dtype)))


register(
    "arange",
    num_args=0,
    attrs={
        "start": AttrSpec("scalar_or_dim", default=0),
        "end": AttrSpec("scalar_or_dim"),
        "step": AttrSpec("scalar_or_dim", default=1),
        "dtype": AttrSpec("dtype", default=None),
    },
    infer=_infer_arange,
    # TVM computes it from the output index alone; a static range it folds into a constant
    kind=K.ELEMWISE,
    ref=_arange_ref,
    doc="start, start + step, ... below end; the end may be a symbolic dimension (then start 0, step 1)",
)


def _infer_triangle(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    if x.ndim < 2:
        raise info.error(f"operand {info.operand(0)} must have rank >= 2 (the triangle is over its last two axes)")
    return x


for _name, _keep in (("triu", np.triu), ("tril", np.tril)):
    register(
        _name,
        num_args=1,
        attrs={"k": AttrSpec("int", default=0)},
        infer=_infer_triangle,
        kind=K.ELEMWISE,  # x read at the output index, or a zero
        ref=lambda x, k, _keep=_keep: _keep(x, k),
        doc=f"x with the elements {'below' if _name == 'triu' else 'above'} diagonal k of the last two axes zeroed",
    )


# -- scans -------------------------------------------------------------------------------------


def _infer_cumsum(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    normalize_axis(info, info.attrs["axis"], x.ndim)
    return TensorType(x.shape, info.attrs["dtype"] or x.dtype)


def _cumsum_ref(x, axis, dtype):
    out_dtype = dtypes.to_numpy(dtype) if dtype else x.dtype
    # a running sum, in the contract's accumulator (f16 in float32; integers in int64, which
    # wraps into a narrower dtype as summing in it would)
    acc = dtypes.accumulator_numpy(out_dtype)
    return np.cumsum(x, axis=axis, dtype=acc).astype(out_dtype, copy=False)


register(
    "cumsum",
    num_args=1,
    attrs={"axis": AttrSpec("axis"), "dtype": AttrSpec("dtype", default=None)},
    infer=_infer_cumsum,
    # a scan: each output reads all the inputs before it along the axis (TVM: an extern scan)
    kind=K.OPAQUE,
    ref=_cumsum_ref,
    doc="running sums along axis (positions from a padding mask), in dtype when given",
)
