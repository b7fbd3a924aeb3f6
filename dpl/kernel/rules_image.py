"""How the ops of :mod:`dpl.ops.image` lower: a resize is an index map through per-axis taps (over
a static axis tables of the same :func:`~dpl.ops.image.resize_taps` the reference uses, over a
symbolic one that arithmetic in float64 in the kernel, from the run-time extents), a convolution
of any rank or a transposed one a reduction over channels and window, a group norm a row
statistic over its group's channels and the spatial axes."""

from __future__ import annotations

import itertools

import numpy as np

from dpl import dtypes
from dpl.kernel import ir
from dpl.kernel.ir import INDEX, Bin, Select
from dpl.kernel.lower import Lowerer, accum_dtype, add, conj, const, dim, div, idx_const, mod, mul, sub
from dpl.kernel.rules import count, rule
from dpl.ops.image import conv_geometry, resize_taps


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


def _static_taps(lw: Lowerer, c, size: int, out: int, scale, o, acc: str) -> list[tuple[ir.Expr, ir.Expr]]:
    """``(input position, weight)`` of each tap of output ``o`` along a static axis: tables."""
    a = c.attrs
    index, weight = resize_taps(size, out, scale, a["method"], a["coordinate_transformation_mode"], a["rounding_method"],
                                a["cubic_alpha"], a["cubic_exclude"], a["size_shortcuts"])
    return [(_tap_index(lw, index, t, o),
             _table(lw, "weight", weight.astype(dtypes.to_numpy(acc)), acc, (o, idx_const(t))))
            for t in range(index.shape[1])]


F64 = "float64"  # the taps' arithmetic: the reference's (resize_taps), so both read the same rows


def _f64(value: float) -> ir.Expr:
    return const(value, F64)


def _source(lw: Lowerer, c, size, out, scale, o) -> ir.Expr:
    """Where output ``o`` lies in the input, in float64, from the run-time extents ``size`` and
    ``out``: :func:`dpl.ops.image.source_coordinates`, operation for operation."""
    mode = c.attrs["coordinate_transformation_mode"]
    pos = lw.cast(o, F64)
    n = lw.cast(dim(size), F64)
    m = lw.cast(dim(out), F64)
    if mode == "align_corners":
        length = m if scale is None else lw.op("multiply", n, _f64(scale))
        span = lw.let("span", lw.op("subtract", length, _f64(1.0)))
        single = lw.let("single", lw.op("equal", span, _f64(0.0)))
        ratio = lw.op("divide", lw.op("subtract", n, _f64(1.0)), Select(single, _f64(1.0), span))  # no 0 / 0 unselected
        return Select(single, _f64(0.0), lw.op("multiply", pos, ratio))
    s = _f64(scale) if scale is not None else lw.let("scale", lw.op("divide", m, n))
    if mode == "asymmetric":
        return lw.op("divide", pos, s)
    x = lw.op("subtract", lw.op("divide", lw.op("add", pos, _f64(0.5)), s), _f64(0.5))
    if mode == "pytorch_half_pixel":
        return Select(Bin("==", dim(out), idx_const(1)), _f64(0.0), x)
    return x


def _clamped_index(lw: Lowerer, position: ir.Expr, last: ir.Expr) -> ir.Expr:
    """An integral float64 ``position`` clamped into [0, last] and made an index. Clamped before
    the conversion, and by comparisons that send a NaN to 0, so no value (an infinity of a tiny
    scale) converts out of range or reads outside the input."""
    p = lw.let("pos", position)
    inside = Select(lw.op("greater_equal", p, _f64(0.0)), Select(lw.op("less_equal", p, last), p, last), _f64(0.0))
    return lw.cast(inside, INDEX)


def _cubic_weights(lw: Lowerer, t: ir.Expr, alpha: float) -> list[ir.Expr]:
    """:func:`dpl.ops.image._cubic_weights` at ``t``: the taps at -1, 0, 1, 2."""
    a = _f64(alpha)

    def near(d):  # ((a + 2) * d - (a + 3)) * d * d + 1
        d = lw.let("d", d)
        inner = lw.op("subtract", lw.op("multiply", _f64(alpha + 2), d), _f64(alpha + 3))
        return lw.op("add", lw.op("multiply", lw.op("multiply", inner, d), d), _f64(1.0))

    def far(d):  # ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        d = lw.let("d", d)
        inner = lw.op("subtract", lw.op("multiply", a, d), _f64(5 * alpha))
        return lw.op("subtract", lw.op("multiply", lw.op("add", lw.op("multiply", inner, d), _f64(8 * alpha)), d),
                     _f64(4 * alpha))

    one = _f64(1.0)
    return [far(lw.op("add", t, one)), near(t), near(lw.op("subtract", one, t)), far(lw.op("subtract", _f64(2.0), t))]


def _runtime_taps(lw: Lowerer, c, size, out, scale, o, acc: str) -> list[tuple[ir.Expr, ir.Expr]]:
    """``(input position, weight)`` of each tap of output ``o`` along a symbolic axis, computed
    in the kernel as :func:`dpl.ops.image.resize_taps` computes them. The input axis must hold a
    row to read: the kernel requires ``1 <= size``, which the backends check before it runs."""
    a = c.attrs
    if not isinstance(size, int):
        lw.requires.append((1, size))
    x = _source(lw, c, size, out, scale, o)
    if a["size_shortcuts"]:  # dpl.ops.image.size_shortcut, tested at run time
        pos = lw.cast(o, F64)
        if a["method"] == "nearest":
            x = Select(Bin("==", dim(out), mul(dim(size), idx_const(2))), lw.op("multiply", pos, _f64(0.5)), x)
        x = Select(Bin("==", dim(out), dim(size)), pos, x)
    x = lw.let("src", x)
    last = lw.let("last", lw.op("subtract", lw.cast(dim(size), F64), _f64(1.0)))
    if a["method"] == "nearest":
        rounding = a["rounding_method"]
        if rounding == "round_prefer_floor":
            r = lw.op("ceil", lw.op("subtract", x, _f64(0.5)))
        elif rounding == "round_prefer_ceil":
            r = lw.op("floor", lw.op("add", x, _f64(0.5)))
        else:
            r = lw.op(rounding, x)
        return [(lw.let("near", _clamped_index(lw, r, last)), None)]
    f = lw.let("base", lw.op("floor", x))
    t = lw.let("frac", lw.op("subtract", x, f))
    if a["method"] == "linear":
        offsets, weights = (0, 1), [lw.op("subtract", _f64(1.0), t), t]
    else:
        offsets, weights = (-1, 0, 1, 2), _cubic_weights(lw, t, a["cubic_alpha"])
    raw = [lw.let("tap", lw.op("add", f, _f64(k))) if k else f for k in offsets]
    if a["method"] == "cubic" and a["cubic_exclude"]:  # taps outside the input weigh 0, the rest sum to 1
        weights = [Select(Bin("&&", lw.op("greater_equal", p, _f64(0.0)), lw.op("less_equal", p, last)), w, _f64(0.0))
                   for p, w in zip(raw, weights)]
        weights = [lw.let("w", w) for w in weights]
        total = lw.let("wsum", _sum(lw, weights))
        weights = [lw.op("divide", w, total) for w in weights]
    return [(lw.let("at", _clamped_index(lw, p, last)), lw.let("w", lw.cast(w, acc))) for p, w in zip(raw, weights)]


def _sum(lw: Lowerer, terms: list) -> ir.Expr:
    total = terms[0]
    for term in terms[1:]:
        total = lw.op("add", total, term)
    return total


@rule("image.resize")
def _resize(lw, c, idx):
    x = c.args[0]
    size, scales = c.attrs["size"], c.attrs["scales"]
    first = x.ty.ndim - len(size)
    acc = accum_dtype(x.ty.dtype)
    axes = []  # (axis, [(input position, weight)] per tap)
    for j, out in enumerate(size):
        axis, scale = first + j, None if scales is None else scales[j]
        n = x.ty.shape[axis]
        taps = _static_taps if isinstance(n, int) and isinstance(out, int) else _runtime_taps
        axes.append((axis, taps(lw, c, n, out, scale, idx[axis], acc)))
    if c.attrs["method"] == "nearest":
        src = list(idx)
        for axis, taps in axes:
            src[axis] = taps[0][0]
        return lw.value(x, tuple(src))
    total = None
    for combo in itertools.product(*(taps for _, taps in axes)):
        src, weight = list(idx), None
        for (axis, _), (position, w) in zip(axes, combo):
            src[axis] = position
            weight = w if weight is None else lw.op("multiply", weight, w)
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
