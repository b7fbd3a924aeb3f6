"""Reductions over axes. TVM: ``sum``/``max``/``min``/``prod`` are CommReduce; ``mean`` and
``variance`` are OutEWiseFusable, because their legalized forms end in an elementwise output
block. A reduction over no axes (``axis=[]``, or a 0-d input) is a copy: ElemWise."""

from __future__ import annotations

import numpy as np

from dpl import dtypes
from dpl.errors import InterpretError
from dpl.ir.types import TensorType
from dpl.ops._shapes import normalize_axes
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

# reductions without an identity: over a zero-length axis they have no value
_NO_IDENTITY = ("max", "min")
_REDUCE_ATTRS = {"axis": AttrSpec("axes", default=None), "keepdims": AttrSpec("bool", default=False)}


def _infer_reduce(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    axes = normalize_axes(info, info.attrs["axis"], x.ndim)
    empty = next((i for i in axes if x.shape[i] == 0), None)
    if info.op in _NO_IDENTITY and empty is not None:
        raise info.error(f"'{info.op}' over axis {empty} of {info.operand(0)}, which has length 0, has no value "
                         "(the maximum or minimum of nothing is undefined)")
    if info.attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, x.dtype)


def _reduce_ref(fn, accumulate=False):
    def ref(x, axis, keepdims):
        axes = None if axis is None else tuple(a % x.ndim for a in axis)
        empty = next((a for a in (range(x.ndim) if axes is None else axes) if x.shape[a] == 0), None)
        if fn in (np.max, np.min) and empty is not None:  # a symbolic dim that is 0 at run time
            raise InterpretError(f"'{'max' if fn is np.max else 'min'}' over axis {empty}, which has length 0 here, has no value "
                                 "(the maximum or minimum of nothing is undefined)")
        if fn in (np.mean, np.var) and not dtypes.is_float_numpy(x.dtype):
            return _integer_moment(fn is np.var, x, axes, keepdims)
        # floats accumulate in the contract's accumulator (float32 for f32, f16, bf16), as the kernels do
        data = x.astype(dtypes.accumulator_numpy(x.dtype)) if accumulate and dtypes.is_float_numpy(x.dtype) else x
        return np.asarray(fn(data, axis=axes, keepdims=keepdims)).astype(x.dtype)

    return ref


def _integer_moment(variance: bool, x: np.ndarray, axes, keepdims) -> np.ndarray:
    """``mean`` or ``variance`` of integers or bools, exactly (docs/architecture.md, "Numerical
    contract"): the real mean (or population variance) rounded toward zero, wrapped into the
    dtype as an integer cast wraps (a variance may exceed it); a bool result is whether the real
    value is not 0 (``any`` for the mean, "not all equal" for the variance). Over nothing, 0.
    With m the truncated mean, D = sum(x - m) and Q = sum((x - m)^2): n^2 var = n Q - D^2 and
    |D| < n, so floor(var) = (Q - ceil(D^2 / n)) / n, in int64 up to 16-bit data (32-bit for
    the mean), in Python integers beyond."""
    wide = object if x.dtype.itemsize >= 8 or (variance and x.dtype.itemsize >= 4) else np.int64
    data = x.astype(wide)
    n = x.size if axes is None else int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    total = np.sum(data, axis=axes, keepdims=True, dtype=wide)
    if n == 0:
        value = nonzero = np.zeros(total.shape, np.int64)
    else:
        mean = total // n
        mean = np.where((total < 0) & (mean * n != total), mean + 1, mean)  # floor -> toward zero
        value, nonzero = mean, total != 0
    if variance and n > 0:
        dev = data - mean
        d = np.sum(dev, axis=axes, keepdims=True, dtype=wide)
        q = np.sum(dev * dev, axis=axes, keepdims=True, dtype=wide)
        value = (q - (d * d + n - 1) // n) // n
        if x.dtype == np.bool_:  # whose q is at most n: n q fits
            nonzero = n * q != d * d
    result = nonzero if x.dtype == np.bool_ else value
    if not keepdims:
        result = np.squeeze(result, axis=axes)
    if x.dtype == np.bool_:
        return np.asarray(result != 0)
    if wide is object:  # into int64's range first: the wrap into the dtype keeps the low bits
        result = (np.asarray(result, dtype=object) + 2**63) % 2**64 - 2**63
    return np.asarray(result).astype(np.int64).astype(x.dtype)


def _reduce_kind(kind: OpPatternKind):
    def kind_fn(info: CallInfo, out) -> OpPatternKind:
        axes = info.attrs["axis"]
        if info.tensor(0).ndim == 0 or (axes is not None and len(axes) == 0):
            return OpPatternKind.ELEMWISE
        return kind

    return kind_fn


def _reduction(name, fn, kind, doc, accumulate=True):
    register(name, num_args=1, attrs=_REDUCE_ATTRS, infer=_infer_reduce, kind=_reduce_kind(kind), ref=_reduce_ref(fn, accumulate), doc=doc)


_reduction("sum", np.sum, OpPatternKind.COMM_REDUCE, "sum over axes")
_reduction("prod", np.prod, OpPatternKind.COMM_REDUCE, "product over axes")
_reduction("max", np.max, OpPatternKind.COMM_REDUCE, "maximum over axes", accumulate=False)
_reduction("min", np.min, OpPatternKind.COMM_REDUCE, "minimum over axes", accumulate=False)
_reduction("mean", np.mean, OpPatternKind.OUT_EWISE_FUSABLE, "mean over axes")
_reduction("variance", np.var, OpPatternKind.OUT_EWISE_FUSABLE, "population variance over axes")
