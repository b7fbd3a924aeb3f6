"""How the ops of :mod:`dpl.ops.image` lower: a resize is an index map through per-axis tap
tables (the same :func:`~dpl.ops.image.resize_axes` the reference uses), a convolution of any
rank or a transposed one a reduction over channels and window, a group norm a row statistic over
its group's channels and the spatial axes."""

from __future__ import annotations

import itertools

import numpy as np

from dpl import dtypes
from dpl.kernel import ir
from dpl.kernel.ir import INDEX, Bin
from dpl.kernel.lower import Lowerer, accum_dtype, add, conj, const, dim, div, idx_const, mod, mul, sub
from dpl.kernel.rules import count, rule
from dpl.ops.image import conv_geometry, resize_axes


def _table(lw: Lowerer, hint: str, values: np.ndarray, dtype: str, idx: tuple) -> ir.Expr:
    """``values`` at ``idx``: a constant when they are all equal, else a constant buffer."""
    if np.all(values == values.flat[0]):
        return const(values.flat[0].item(), dtype)
    name = lw.fresh(hint)
    lw.constants[name] = np.ascontiguousarray(values.astype(dtypes.to_numpy(dtype)))
    return lw.load(name, dtype, idx)


def _tap_index(lw: Lowerer, index: np.ndarray, t: int, o) -> ir.Expr:
    """Input position of tap ``t`` at output ``o``: ``o`` itself, ``o / k`` (an integer
    upsampling), or a table."""
    column = index[:, t]
    out = np.arange(len(column))
    if np.array_equal(column, out):
        return o
    for k in range(2, 9):
        if np.array_equal(column, out // k):
            return div(o, idx_const(k))
    return _table(lw, "tap", index, INDEX, (o, idx_const(t)))


@rule("image.resize")
def _resize(lw, c, idx):
    x = c.args[0]
    axes = resize_axes(x.ty.shape, c.attrs)
    if c.attrs["method"] == "nearest":
        src = list(idx)
        for axis, index, _ in axes:
            src[axis] = _tap_index(lw, index, 0, idx[axis])
        return lw.value(x, tuple(src))
    acc = accum_dtype(x.ty.dtype)
    total = None
    for taps in itertools.product(*(range(index.shape[1]) for _, index, _ in axes)):
        src, weight = list(idx), None
        for (axis, index, w), t in zip(axes, taps):
            src[axis] = _tap_index(lw, index, t, idx[axis])
            wt = _table(lw, "weight", w.astype(dtypes.to_numpy(acc)), acc, (idx[axis], idx_const(t)))
            weight = wt if weight is None else lw.op("multiply", weight, wt)
        term = lw.op("multiply", weight, lw.cast(lw.value(x, tuple(src)), acc))
        total = term if total is None else lw.op("add", total, term)
    return lw.cast(total, c.ty.dtype)


def _forward_tap(o, k, stride, dil, pad, size, out_size, ksize):
    """Input position of output ``o`` and window offset ``k``, and its bounds test (None where
    the window never leaves the input; a symbolic size is always tested)."""
    pos = sub(add(mul(o, idx_const(stride)), mul(k, idx_const(dil))), idx_const(pad))
    lo = Bin(">=", pos, idx_const(0)) if pad > 0 else None
    hi = Bin("<", pos, dim(size))
    if isinstance(size, int) and isinstance(out_size, int) and (out_size - 1) * stride + (ksize - 1) * dil - pad < size:
        hi = None
    return pos, conj(lo, hi)


def _transposed_tap(o, k, stride, dil, pad, size, out_size, ksize):
    """Input position that output ``o`` reads through tap ``k`` of a transposed convolution
    (``(o + pad - k * dil) / stride``, where that divides), and its test. The numerator is
    offset by a multiple of the stride to stay non-negative, as kernel index arithmetic must."""
    reach = dil * (ksize - 1) - pad
    offset = stride * (-(-reach // stride)) if reach > 0 else 0
    shifted = add(sub(add(o, idx_const(pad + offset)), mul(k, idx_const(dil))), idx_const(0))
    pos = sub(div(shifted, idx_const(stride)), idx_const(offset // stride))
    tests = [Bin(">=", shifted, idx_const(offset)) if offset > 0 else None]
    if stride > 1:
        tests.append(Bin("==", mod(shifted, idx_const(stride)), idx_const(0)))
    if not (isinstance(size, int) and isinstance(out_size, int) and (out_size - 1 + pad) // stride < size):
        tests.append(Bin("<", pos, dim(size)))
    return pos, conj(*tests)


@rule("nn.conv1d", "nn.conv3d", "nn.conv1d_transpose", "nn.conv2d_transpose", "nn.conv3d_transpose")
def _conv(lw, c, idx):
    x, w = c.args
    rank = x.ty.ndim - 2
    transposed = c.op.endswith("_transpose")
    strides, dilation, lo, _ = conv_geometry(c.attrs, rank)[:4]
    groups = c.attrs["groups"]
    kernel = w.ty.shape[2:]
    n, oc, out = idx[0], idx[1], idx[2:]
    if transposed:
        per_group_in, per_group_out = w.ty.shape[0] // groups, w.ty.shape[1]
    else:
        per_group_in, per_group_out = w.ty.shape[1], w.ty.shape[0] // groups
    group = div(oc, idx_const(per_group_out)) if groups > 1 else idx_const(0)
    tap = _transposed_tap if transposed else _forward_tap
    acc = accum_dtype(c.ty.dtype)
    lw.anchors.append("conv2d")  # the kernel kind of every convolution

    def product(rvars):
        ci, ks = rvars[0], rvars[1:]
        pos, tests = [], []
        for a in range(rank):
            p, ok = tap(out[a], ks[a], strides[a], dilation[a], lo[a], x.ty.shape[2 + a], c.ty.shape[2 + a], kernel[a])
            pos.append(p)
            tests.append(ok)
        chan = add(mul(group, idx_const(per_group_in)), ci)
        xv = lw.guard(conj(*tests), lambda: lw.cast(lw.value(x, (n, chan, *pos)), acc), const(0, acc))
        w_idx = (chan, mod(oc, idx_const(per_group_out)) if groups > 1 else oc, *ks) if transposed else (oc, ci, *ks)
        return lw.op("multiply", xv, lw.cast(lw.value(w, w_idx), acc))

    return lw.cast(lw.reduce("acc", "add", acc, [per_group_in, *kernel], product), c.ty.dtype)


@rule("nn.group_norm")
def _group_norm(lw, c, idx):
    x, gamma, beta = c.args
    channels = x.ty.shape[1]
    per_group = channels // c.attrs["num_groups"]
    ct = accum_dtype(x.ty.dtype)
    first = mul(div(idx[1], idx_const(per_group)), idx_const(per_group)) if per_group < channels else idx_const(0)
    extents = [per_group, *x.ty.shape[2:]]

    def at(rvars):
        return lw.cast(lw.value(x, (idx[0], add(first, rvars[0]), *rvars[1:])), ct)

    def square(e):
        e = lw.let("d", e)
        return lw.op("multiply", e, e)

    n = count(lw, extents, ct)
    mu = lw.let("mean", lw.op("divide", lw.reduce("sum", "add", ct, extents, at), n))
    var = lw.op("divide", lw.reduce("sumsq", "add", ct, extents, lambda r: square(lw.op("subtract", at(r), mu))), n)
    inv = lw.let("inv_std", lw.op("rsqrt", lw.op("add", var, const(c.attrs["epsilon"], ct))))
    out = lw.op("multiply", lw.op("subtract", lw.cast(lw.value(x, idx), ct), mu), inv)
    if c.attrs["scale"]:
        out = lw.op("multiply", out, lw.cast(lw.value(gamma, (idx[1],)), ct))
    if c.attrs["center"]:
        out = lw.op("add", out, lw.cast(lw.value(beta, (idx[1],)), ct))
    return lw.cast(out, c.ty.dtype)
