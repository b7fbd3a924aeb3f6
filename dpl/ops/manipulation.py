"""Data movement and creation: reshape, transpose, concat/split, slicing, gather, broadcast,
expand/squeeze, padding, full/zeros/ones, arange, triu/tril. Injective in TVM unless the index map is simpler: a call that
reads its input at the output index (an identity permutation, a slice from 0 with stride 1, a
split into one piece) is ElemWise, as TVM finds by looking at the loads of the kernel."""

from __future__ import annotations

import math

import numpy as np

from dpl import dtypes
from dpl.ir.dims import add, dmax, floordiv, mul, provably_equal, sub, text
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
    total = dim_product(x.shape)
    if -1 in shape:
        known = dim_product([d for d in shape if d != -1])
        if known == 0:
            raise info.error(f"cannot infer the -1 of {fmt_dims(shape)} from {info.operand(0)}: the other dimensions hold "
                             "no elements")
        inferred = floordiv(total, known)  # exact division only: the product must come back
        if not provably_equal(mul(inferred, known), total):
            raise info.error(f"cannot infer the -1 of {fmt_dims(shape)} from {info.operand(0)}: {text(total)} elements "
                             f"are not provably a multiple of {text(known)}")
        shape[shape.index(-1)] = inferred
    if not provably_equal(dim_product(shape), total):
        raise info.error(f"cannot reshape {info.operand(0)} to {fmt_dims(shape)}: element counts differ "
                         f"({text(total)} vs {text(dim_product(shape))})")
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
    total = 0
    for t in tup.fields:
        if not isinstance(t, TensorType) or t.ndim != first.ndim or t.dtype != first.dtype:
            raise info.error(f"tuple fields {tup} must be tensors of one rank and dtype")
        for i, (a, b) in enumerate(zip(t.shape, first.shape)):
            if i != axis and a != b:
                raise info.error(f"tuple fields {tup} differ in dimension {i}, which is not the concat axis")
        total = add(total, t.shape[axis])  # n + m, canonical
    shape = list(first.shape)
    shape[axis] = total
    return TensorType(tuple(shape), first.dtype)


def _concat_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM reads field k at (output index - the sizes of the fields before it); only when every
    # offset is 0, i.e. every field but the last is empty, is each load at the output index. A
    # symbolic offset (a field before the last of symbolic size along the axis) makes the index
    # arithmetic TVM 0.27 leaves Opaque
    axis = info.attrs["axis"] % out.ndim
    before = [t.shape[axis] for t in info.arg_types[0].fields[:-1]]
    if all(d == 0 for d in before):
        return K.ELEMWISE
    return K.INJECTIVE if all(type(d) is int for d in before) else K.OPAQUE


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
        step = floordiv(size, spec) if spec > 0 else None
        if step is None or not provably_equal(mul(step, spec), size):  # n * 4 splits in 2, n does not
            raise info.error(f"cannot split dimension {size} into {spec} equal sections")
        return [mul(step, i) for i in range(1, spec)]
    points = list(spec)
    if points != sorted(points) or any(p < 0 for p in points) or (isinstance(size, int) and any(p > size for p in points)):
        raise info.error(f"split indices {points} must be ascending and within 0..{size}")
    # along a symbolic size the last piece is `size - last`, which assumes last <= size (the
    # interpreter checks it, as it checks a slice's end)
    return points


def _infer_split(info: CallInfo) -> TupleType:
    x = info.tensor(0)
    axis = normalize_axis(info, info.attrs["axis"], x.ndim)
    points = _split_points(info, x.shape[axis])
    bounds = [0, *points, x.shape[axis]]
    fields = []
    for lo, hi in zip(bounds, bounds[1:]):
        shape = list(x.shape)
        shape[axis] = sub(hi, lo)
        fields.append(TensorType(tuple(shape), x.dtype))
    return TupleType(tuple(fields))


def _split_kind(info: CallInfo, out) -> OpPatternKind:
    # as concat's: a piece read at (output index + its start), Opaque to TVM 0.27 where a start
    # is symbolic (equal sections of a symbolic axis; indices along it start at constants)
    if len(out.fields) == 1:
        return K.ELEMWISE
    x = info.tensor(0)
    points = _split_points(info, x.shape[normalize_axis(info, info.attrs["axis"], x.ndim)])
    return K.INJECTIVE if all(type(p) is int for p in points) else K.OPAQUE


register(
    "split",
    num_args=1,
    attrs={"indices_or_sections": AttrSpec("ints_or_int"), "axis": AttrSpec("axis", default=0)},
    infer=_infer_split,
    kind=_split_kind,
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
    if any(not isinstance(x.shape[sl.axis], int) for sl in slices):
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
    if info.attrs["axis"] is None and not info.tensor(0).is_static:
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

# -- padding -----------------------------------------------------------------------------------

PAD_MODES = ("constant", "reflect", "replicate", "circular")  # Relax's names (ONNX: edge, wrap)


def pad_pairs(widths, ndim: int) -> list[tuple[int, int]]:
    """Relax's flat ``pad_width`` as (before, after) per axis."""
    return list(zip(widths[0::2], widths[1::2])) if len(widths) == 2 * ndim else []


def pad_source(n: int, before: int, after: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis of length ``n`` padded by (before, after): for each output position, the
    input position it reads and whether that lies inside the input. Output position i reads
    ``j = i - before`` (a negative width crops), brought into [0, n) by the mode: clamped
    (``replicate``; ``constant`` reads there too and gives its value outside), mirrored about the
    edges without repeating them (``reflect``: periodic with period 2 (n - 1), as NumPy and ONNX
    pad wider than the axis; an axis of one element repeats it), or wrapped modulo n
    (``circular``)."""
    j = np.arange(n + before + after, dtype=np.int64) - before
    inside = (j >= 0) & (j < n)
    if n == 0:
        return np.zeros_like(j), inside
    if mode == "reflect" and n > 1:
        period = 2 * (n - 1)
        m = j % period
        return np.where(m < n, m, period - m), inside
    if mode == "circular":
        return j % n, inside
    return np.clip(j, 0, n - 1), inside


def pad_value_error(value, dtype: str) -> str | None:
    """Why ``value`` is no value of ``dtype`` (None when it is): integer and bool pads take whole
    numbers of their range; a float pad any number (rounded to the dtype, as a cast rounds)."""
    if dtypes.is_float(dtype):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
        return f"{value!r} is no value of {dtype}"
    v = int(value)
    lo, hi = (0, 1) if dtype == "bool" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    return None if lo <= v <= hi else f"{value!r} is outside the range of {dtype}"


def _infer_pad(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    widths, mode = info.attrs["pad_width"], info.attrs["pad_mode"]
    if mode not in PAD_MODES:
        raise info.error(f"pad_mode {mode!r} is not one of {', '.join(repr(m) for m in PAD_MODES)}")
    if len(widths) != 2 * x.ndim:
        raise info.error(f"pad_width must hold a (before, after) pair for each of the {x.ndim} axes of "
                         f"{info.operand(0)} ({2 * x.ndim} values), got {list(widths)}")
    shape = []
    for axis, (d, (before, after)) in enumerate(zip(x.shape, pad_pairs(widths, x.ndim))):
        if before == 0 and after == 0:
            shape.append(d)
            continue
        if not isinstance(d, int):  # n + 2; a crop (n - 2) assumes n >= 2, which run time checks
            shape.append(add(d, before + after))
            continue
        size = d + before + after
        if size < 0:
            raise info.error(f"axis {axis} of size {d} padded by ({before}, {after}) would have a negative size")
        if d == 0 and size > 0 and mode != "constant":
            raise info.error(f"axis {axis} is empty: a {mode} pad has nothing to repeat (only a constant pad fills it)")
        shape.append(size)
    bad = pad_value_error(info.attrs["pad_value"], x.dtype)
    if bad is not None:
        raise info.error(f"pad_value {bad}")
    return TensorType(tuple(shape), x.dtype)


def _pad_kind(info: CallInfo, out) -> OpPatternKind:
    """TVM's: a constant pad is a select over the index (Injective), or x read at the output index
    when no width is given before any axis (ElemWise: padding or cropping only after); the other modes compute the index from x's sizes, which
    with a symbolic size among them (padded or not) is arithmetic TVM leaves Opaque, and
    otherwise Injective even with no width."""
    if info.attrs["pad_mode"] == "constant":  # no width before: x read at the output index, under a guard
        return K.INJECTIVE if any(info.attrs["pad_width"][0::2]) else K.ELEMWISE
    return K.OPAQUE if not info.tensor(0).is_static else K.INJECTIVE


def _pad_ref(x, pad_width, pad_mode, pad_value):
    pairs = pad_pairs(pad_width, x.ndim)
    parts = [pad_source(n, before, after, pad_mode) for n, (before, after) in zip(x.shape, pairs)]
    shape = tuple(len(src) for src, _ in parts)
    with np.errstate(over="ignore"):  # a float pad beyond a 16-bit dtype's range is inf, as a cast
        value = np.asarray(pad_value).astype(x.dtype)
    if x.size == 0:  # every output element is padding (or there is none)
        return np.full(shape, value, dtype=x.dtype)
    out = x[np.ix_(*[src for src, _ in parts])] if x.ndim else x.copy()
    if pad_mode != "constant" or x.ndim == 0:
        return out
    inside = np.ones(shape, dtype=bool)
    for axis, (_, mask) in enumerate(parts):
        inside = inside & mask.reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    return np.where(inside, out, value)


register(
    "nn.pad",
    num_args=1,
    attrs={"pad_width": AttrSpec("ints"), "pad_mode": AttrSpec("str", default="constant"),
           "pad_value": AttrSpec("scalar", default=0.0)},
    infer=_infer_pad,
    kind=_pad_kind,
    ref=_pad_ref,
    doc="pad each axis by (before, after) = pad_width[2 * axis : 2 * axis + 2] (negative widths crop): with "
        "pad_value (constant), mirrored without the edge (reflect), the edge repeated (replicate) or wrapped (circular)",
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
    if not isinstance(step, (int, float)):
        raise info.error(f"step {step} must be a number; only the start and the end may be symbolic dimensions")
    if step == 0:
        raise info.error("step must not be 0")
    bad = next((f"{k} {v}" for k, v in (("start", start), ("end", end), ("step", step)) if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise info.error(f"{bad} is not a finite number (the length of the range would be undefined)")
    if not (isinstance(start, (int, float)) and isinstance(end, (int, float))):
        if any(isinstance(v, float) for v in (start, end, step)):
            raise info.error(f"a range with a symbolic bound ({start} to {end}) must have integer bounds and step, "
                             f"got step {step}")
        # ceil((end - start) / step) elements, none where that is negative (Python's range)
        span, stride = (sub(end, start), step) if step > 0 else (sub(start, end), -step)
        return TensorType((dmax(0, floordiv(add(span, stride - 1), stride)),), dtype)
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
