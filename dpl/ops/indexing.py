"""Indexing, scattering and sorting: argmax/argmin, topk, sort, histc, the gathers and scatters
(gather_nd, gather_elements, scatter_nd, scatter_elements, index_put) and slice_scatter, the
functional form of an in-place write into a slice.

Kinds are TVM 0.27's: argmax/argmin legalize into a reduction with an elementwise output block
(OutEWiseFusable; the kernel IR lowers them as two reductions), every gather and scatter into an
opaque PrimFunc (its load or store index is read from another tensor), and topk/sort are left
unlegalized on the CPU (Opaque to FuseOps). Indices are int64, as torch and ONNX give them;
index operands may be negative (counted from the end), as both frontends allow, and an index out
of range is an :class:`InterpretError`, never a wrapped read. Orders are stable: of equal values
the lower index comes first (ONNX TopK's rule; torch's where it specifies one), and NaN is the
largest value (torch's sort and topk, NumPy's sort).
"""

from __future__ import annotations

import numpy as np

from dpl.errors import InterpretError
from dpl.ir.types import TensorType, TupleType
from dpl.ops._shapes import fmt_dims, normalize_axis
from dpl.ops._slices import slice_axes, sliced_shape
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

K = OpPatternKind
_INDEX_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _indices(info: CallInfo, i: int, what: str = "indices") -> TensorType:
    idx = info.tensor(i)
    if idx.dtype not in _INDEX_DTYPES:
        raise info.error(f"{what} {info.operand(i)} must have an integer dtype")
    return idx


def _same_dtype(info: CallInfo, i: int, j: int) -> None:
    if info.tensor(i).dtype != info.tensor(j).dtype:
        raise info.error(f"operands {info.operand(i)} and {info.operand(j)} have different dtypes")


def _wrapped(op: str, idx: np.ndarray, size: int, axis) -> np.ndarray:
    """Indices in 0..size-1, negative ones counted from the end; one out of range is an error."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise InterpretError(f"'{op}': index {int(idx[bad].flat[0])} is out of range for axis {axis} of size {size}")
    return np.where(idx < 0, idx + size, idx)


# -- argmax / argmin ---------------------------------------------------------------------------


def _infer_arg(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    axis = info.attrs["axis"]
    axes = tuple(range(x.ndim)) if axis is None else (normalize_axis(info, axis, x.ndim),)
    empty = next((a for a in axes if x.shape[a] == 0), None)
    if empty is not None:
        raise info.error(f"'{info.op}' over axis {empty} of {info.operand(0)}, which has length 0, has no value")
    if info.attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, "int64")


def _arg_ref(pick):
    def ref(x, axis, keepdims, select_last_index):
        data, a = (x.reshape(-1), 0) if axis is None else (x, axis % x.ndim)
        if data.shape[a] == 0:
            raise InterpretError(f"'{pick.__name__}' over axis {a}, which has length 0 here, has no value")
        if select_last_index:  # the first of the reversed axis is the last of the axis
            out = data.shape[a] - 1 - pick(np.flip(data, a), axis=a)
        else:
            out = pick(data, axis=a)  # NaN is the extreme: NumPy's (and torch's) first NaN
        out = np.asarray(out, np.int64)
        if keepdims:
            out = out.reshape((1,) * x.ndim) if axis is None else np.expand_dims(out, a)
        return out

    return ref


for _name, _pick in (("argmax", np.argmax), ("argmin", np.argmin)):
    register(
        _name,
        num_args=1,
        attrs={"axis": AttrSpec("axis", default=None, optional=True), "keepdims": AttrSpec("bool", default=False),
               "select_last_index": AttrSpec("bool", default=False)},
        infer=_infer_arg,
        kind=K.OUT_EWISE_FUSABLE,  # TVM: a tuple reduction with an elementwise output block
        ref=_arg_ref(_pick),
        doc=f"int64 index of the {'largest' if _name == 'argmax' else 'smallest'} value along axis (of the flattened "
            "tensor when no axis); the first of equal ones, or the last with select_last_index; NaN is the extreme",
    )

# -- sort / topk -------------------------------------------------------------------------------


def stable_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Indices that sort ``x`` along ``axis``, equal values in index order, NaN largest. A
    descending order is the ascending order of the reversed axis, reversed: still stable."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    n = x.shape[axis]
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return np.flip(n - 1 - order, axis)


def _infer_sort(info: CallInfo) -> TupleType:
    x = info.tensor(0)
    normalize_axis(info, info.attrs["axis"], x.ndim)
    return TupleType((x, TensorType(x.shape, "int64")))


def _sort_ref(x, axis, descending):
    order = stable_order(x, axis % x.ndim, descending)
    return np.take_along_axis(x, order, axis), order.astype(np.int64)


register(
    "sort",
    num_args=1,
    attrs={"axis": AttrSpec("axis", default=-1), "descending": AttrSpec("bool", default=False)},
    infer=_infer_sort,
    kind=K.OPAQUE,  # TVM 0.27 leaves it unlegalized on the CPU (an extern sort)
    ref=_sort_ref,
    doc="(values, int64 indices) sorted along axis; stable, NaN largest",
)


def _infer_topk(info: CallInfo) -> TupleType:
    x = info.tensor(0)
    axis = normalize_axis(info, info.attrs["axis"], x.ndim)
    k, size = info.attrs["k"], x.shape[axis]
    if k < 0 or (isinstance(size, int) and k > size):
        raise info.error(f"k={k} is out of range for axis {axis} of {info.operand(0)} (0..{size})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return TupleType((TensorType(shape, x.dtype), TensorType(shape, "int64")))


def _topk_ref(x, k, axis, largest, sorted):
    axis %= x.ndim
    if k > x.shape[axis]:
        raise InterpretError(f"'topk': k={k} is more than the {x.shape[axis]} elements of axis {axis}")
    order = np.take(stable_order(x, axis, largest), np.arange(k), axis=axis)
    return np.take_along_axis(x, order, axis), order.astype(np.int64)


register(
    "topk",
    num_args=1,
    attrs={"k": AttrSpec("int"), "axis": AttrSpec("axis", default=-1), "largest": AttrSpec("bool", default=True),
           "sorted": AttrSpec("bool", default=True)},
    infer=_infer_topk,
    kind=K.OPAQUE,  # TVM 0.27 leaves it unlegalized on the CPU (an extern topk)
    ref=_topk_ref,
    doc="(values, int64 indices) of the k largest (smallest) along axis, in order; of equal values the lower "
        "index first (unsorted results come sorted, which both frontends allow)",
)

# -- histc -------------------------------------------------------------------------------------


def _infer_histc(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    if not _is_float(x.dtype):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype (torch's histc takes floats)")
    if info.attrs["bins"] < 1:
        raise info.error(f"bins={info.attrs['bins']} must be positive")
    if info.attrs["min"] > info.attrs["max"]:
        raise info.error(f"min={info.attrs['min']} is above max={info.attrs['max']}")
    return TensorType((info.attrs["bins"],), x.dtype)


def _histc_ref(x, bins, min, max):
    """torch.histc on the CPU: equal bounds mean the data's range (widened by 1 each way when
    that is one value too); a value's bin is ``(v - lo) * bins / (hi - lo)`` computed in the
    input's dtype and truncated, the top edge in the last bin; values outside are not counted."""
    lo, hi = float(min), float(max)
    if lo == hi and x.size:
        lo, hi = float(np.min(x)), float(np.max(x))
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise InterpretError(f"'histc': the range [{lo}, {hi}] is not finite")
    t = x.dtype.type
    left, right = t(lo), t(hi)
    v = x[(x >= left) & (x <= right)]
    pos = ((v - left) * t(bins) / (right - left)).astype(np.int64)
    pos[pos == bins] = bins - 1
    return np.bincount(pos, minlength=bins).astype(x.dtype)


register(
    "histc",
    num_args=1,
    attrs={"bins": AttrSpec("int", default=100), "min": AttrSpec("float", default=0.0),
           "max": AttrSpec("float", default=0.0)},
    infer=_infer_histc,
    kind=K.OPAQUE,  # a data-dependent store
    ref=_histc_ref,
    doc="torch.histc: counts of x in bins equal-width bins over [min, max] (min == max: the data's range)",
)

# -- gathers -----------------------------------------------------------------------------------


def _infer_gather_nd(info: CallInfo) -> TensorType:
    data, idx = info.tensor(0), _indices(info, 1)
    b = info.attrs["batch_dims"]
    if idx.ndim < 1 or idx.ndim <= b:
        raise info.error(f"indices {info.operand(1)} must have rank above batch_dims={b} (their last axis holds the "
                         "index tuples)")
    k = idx.shape[-1]
    if not isinstance(k, int) or b < 0 or b + k > data.ndim:
        raise info.error(f"index tuples of length {k} after {b} batch axes do not index {info.operand(0)}")
    if idx.shape[:b] != data.shape[:b]:
        raise info.error(f"the batch axes {fmt_dims(idx.shape[:b])} of {info.operand(1)} differ from those of "
                         f"{info.operand(0)}")
    return TensorType(idx.shape[:-1] + data.shape[b + k:], data.dtype)


def _gather_nd_ref(data, indices, batch_dims):
    b, k = batch_dims, indices.shape[-1]
    n = int(np.prod(data.shape[:b], dtype=np.int64))
    m = int(np.prod(indices.shape[b:-1], dtype=np.int64))
    rows = data.reshape((n,) + data.shape[b:])
    tuples = indices.reshape(n, m, k)
    parts = [_wrapped("gather_nd", tuples[..., j], data.shape[b + j], b + j) for j in range(k)]
    out = rows[(np.arange(n)[:, None],) + tuple(parts)]
    return out.reshape(indices.shape[:-1] + data.shape[b + k:])


register(
    "gather_nd",
    num_args=2,
    attrs={"batch_dims": AttrSpec("int", default=0)},
    infer=_infer_gather_nd,
    kind=K.OPAQUE,
    ref=_gather_nd_ref,
    doc="ONNX GatherND: data at the index tuples on the last axis of indices, after batch_dims shared axes",
)


def _infer_gather_elements(info: CallInfo) -> TensorType:
    data, idx = info.tensor(0), _indices(info, 1)
    if idx.ndim != data.ndim:
        raise info.error(f"indices {info.operand(1)} and data {info.operand(0)} must have the same rank")
    normalize_axis(info, info.attrs["axis"], data.ndim)
    return TensorType(idx.shape, data.dtype)


def _gather_elements_ref(data, indices, axis):
    axis %= data.ndim
    return np.take_along_axis(data, _wrapped("gather_elements", indices, data.shape[axis], axis), axis)


register(
    "gather_elements",
    num_args=2,
    attrs={"axis": AttrSpec("axis", default=0)},
    infer=_infer_gather_elements,
    kind=K.OPAQUE,
    ref=_gather_elements_ref,
    doc="torch.gather / ONNX GatherElements: out[i][j] = data[i][indices[i][j]] along axis",
)

# -- scatters ----------------------------------------------------------------------------------

_REDUCTIONS = ("update", "add", "mul", "max", "min")
_AT = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at, "min": np.minimum.at}


def _reduction(info: CallInfo) -> str:
    r = info.attrs["reduction"]
    if r not in _REDUCTIONS:
        raise info.error(f"reduction '{r}' is not one of {', '.join(_REDUCTIONS)}")
    return r


def _write(out: np.ndarray, index: tuple, values: np.ndarray, reduction: str) -> np.ndarray:
    """``out[index] = values`` (repeated indices: the last write wins), or folded in. ``index``:
    integer arrays over the leading axes."""
    if reduction == "update":
        out[index] = values
    else:
        # the values as a whole array of the indexed shape: NumPy 2.4's ufunc.at folds in only
        # the values' own elements where they broadcast (np.add.at(np.zeros(1), (np.zeros((2, 2),
        # int),), [1.0, 2.0]) gives 3, not 6) and has read past them (garbage, run to run)
        shape = np.broadcast_shapes(*(np.shape(i) for i in index)) + out.shape[len(index):]
        _AT[reduction](out, index, np.broadcast_to(values, shape).copy())  # a copy: C order, 0-d stays 0-d
    return out


def _infer_scatter_elements(info: CallInfo) -> TensorType:
    data, idx, upd = info.tensor(0), _indices(info, 1), info.tensor(2)
    _reduction(info)
    _same_dtype(info, 0, 2)
    if not data.ndim == idx.ndim == upd.ndim:
        raise info.error(f"data {info.operand(0)}, indices {info.operand(1)} and updates {info.operand(2)} must have "
                         "the same rank")
    if idx.shape != upd.shape:
        raise info.error(f"indices {info.operand(1)} and updates {info.operand(2)} must have the same shape")
    axis = normalize_axis(info, info.attrs["axis"], data.ndim)
    for a, (i, d) in enumerate(zip(idx.shape, data.shape)):
        if a != axis and isinstance(i, int) and isinstance(d, int) and i > d:
            raise info.error(f"indices {info.operand(1)} are longer than data {info.operand(0)} along axis {a}")
    return data


def _scatter_elements_ref(data, indices, updates, axis, reduction):
    axis %= data.ndim
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = _wrapped("scatter_elements", indices, data.shape[axis], axis)
    return _write(data.copy(), tuple(grid), updates, reduction)


register(
    "scatter_elements",
    num_args=3,
    attrs={"axis": AttrSpec("axis", default=0), "reduction": AttrSpec("str", default="update")},
    infer=_infer_scatter_elements,
    kind=K.OPAQUE,
    ref=_scatter_elements_ref,
    doc="torch.scatter / ONNX ScatterElements: data with data[i][indices[i][j]] = updates[i][j] along axis "
        "(or folded in with reduction add, mul, max or min)",
)


def _infer_scatter_nd(info: CallInfo) -> TensorType:
    data, idx, upd = info.tensor(0), _indices(info, 1), info.tensor(2)
    _reduction(info)
    _same_dtype(info, 0, 2)
    k = idx.shape[-1] if idx.ndim else None
    if not isinstance(k, int) or k > data.ndim:
        raise info.error(f"indices {info.operand(1)} must end in an axis of index tuples of length at most the rank "
                         f"of {info.operand(0)}")
    want = idx.shape[:-1] + data.shape[k:]
    if upd.shape != want:
        raise info.error(f"updates {info.operand(2)} must have shape {fmt_dims(want)}")
    return data


def _scatter_nd_ref(data, indices, updates, reduction):
    k = indices.shape[-1]
    flat = indices.reshape(-1, k)
    index = tuple(_wrapped("scatter_nd", flat[:, j], data.shape[j], j) for j in range(k))
    return _write(data.copy(), index, updates.reshape((flat.shape[0],) + data.shape[k:]), reduction)


register(
    "scatter_nd",
    num_args=3,
    attrs={"reduction": AttrSpec("str", default="update")},
    infer=_infer_scatter_nd,
    kind=K.OPAQUE,
    ref=_scatter_nd_ref,
    doc="ONNX ScatterND: data with the slices at the index tuples replaced by updates (or folded in)",
)


def _infer_index_put(info: CallInfo) -> TensorType:
    data, values = info.tensor(0), info.tensor(2)
    tup = info.arg_types[1]
    if not isinstance(tup, TupleType) or not tup.fields or len(tup.fields) > data.ndim:
        raise info.error(f"indices {info.operand(1)} must be a tuple of 1 to {data.ndim} index tensors")
    _same_dtype(info, 0, 2)
    shapes = []
    for t in tup.fields:
        if not isinstance(t, TensorType) or t.dtype not in _INDEX_DTYPES:
            raise info.error(f"indices {info.operand(1)} must be integer tensors")
        shapes.append(t.shape)
    indexed = _broadcast(info, shapes) + data.shape[len(tup.fields):]
    if values.ndim > len(indexed) or any(v != 1 and v != d for v, d in zip(values.shape[::-1], indexed[::-1])):
        raise info.error(f"values {info.operand(2)} do not broadcast to the indexed shape {fmt_dims(indexed)}")
    return data


def _broadcast(info: CallInfo, shapes) -> tuple:
    ndim = max(len(s) for s in shapes)
    out = []
    for a in range(ndim):
        dims = {s[a - ndim + len(s)] for s in shapes if a - ndim + len(s) >= 0} - {1}
        if len(dims) > 1:
            raise info.error(f"index shapes {', '.join(fmt_dims(s) for s in shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _index_put_ref(data, indices, values, accumulate):
    return index_put_into(np.empty_like(data), data, indices, values, accumulate)


def index_put_into(out: np.ndarray, data, indices, values, accumulate: bool) -> np.ndarray:
    """``index_put`` written into ``out`` (data's shape and dtype): data copied once, then the
    values put (a backend's runner writes its output buffer so, the reference a fresh array)."""
    index = tuple(_wrapped("index_put", i, data.shape[a], a) for a, i in enumerate(indices))
    np.copyto(out, data)
    return _write(out, index, values, "add" if accumulate else "update")


register(
    "index_put",
    num_args=3,
    attrs={"accumulate": AttrSpec("bool", default=False)},
    infer=_infer_index_put,
    kind=K.OPAQUE,
    ref=_index_put_ref,
    doc="data[i0, i1, ...] = values (the index tensors broadcast, leading axes; trailing ones whole), or += with "
        "accumulate (repeated indices add up)",
)


def _infer_slice_scatter(info: CallInfo) -> TensorType:
    x, src = info.tensor(0), info.tensor(1)
    _same_dtype(info, 0, 1)
    want = sliced_shape(x, slice_axes(info, x))
    if src.shape != want:
        raise info.error(f"source {info.operand(1)} must have the shape {fmt_dims(want)} of the slice it is written to")
    return x


def _slice_scatter_ref(x, src, axes, begin, end, strides):
    index = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, begin, end, strides or (1,) * len(axes)):
        index[a % x.ndim] = slice(b, e, s)
    out = x.copy()
    out[tuple(index)] = src
    return out


register(
    "slice_scatter",
    num_args=2,
    attrs={"axes": AttrSpec("ints"), "begin": AttrSpec("ints"), "end": AttrSpec("dims"),
           "strides": AttrSpec("ints", default=None)},
    infer=_infer_slice_scatter,
    kind=K.OPAQUE,  # TVM 0.27: Opaque
    ref=_slice_scatter_ref,
    doc="x with the strided_slice x[begin:end:stride] (same attributes) replaced by src",
)
