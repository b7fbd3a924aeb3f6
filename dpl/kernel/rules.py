"""How each op lowers: the value of ``op(args)`` at an output index, as kernel IR.

Elementwise and broadcast ops are their registry ``c_expr`` over broadcast-mapped operands
(:func:`elementwise`); injective ops map the index onto their operand (transpose, reshape,
slices, concat, split, expand/squeeze, broadcast, pads); reductions, matrix products, convolution,
pooling and the high-level row ops (softmax, norms) build :class:`~dpl.kernel.ir.Reduce`
statements through :meth:`Lowerer.reduce`, which hoists them to once per row.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from dpl import dtypes
from dpl.ir import dims as dimexpr
from dpl.ir.expr import Call, Tuple, TupleGetItem, Var as IRVar
from dpl.kernel import ir
from dpl.kernel.ir import INDEX, Bin
from dpl.kernel.lower import (
    ELEMENTWISE, RULES, TUPLE_ITEM, Lowerer, LoweringError, accum_dtype, add, broadcast_index, conj, const, dim, div, idx_const, mod, mul, sub,
)
from dpl.ops._slices import slice_axes
from dpl.ops.nn import adaptive_windows, avg_pool_axis, layout_axes
from dpl.ops.registry import call_info

Rule = Callable[[Lowerer, Call, tuple], ir.Expr]


def rule(*names: str):
    def register(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return register


def _axes(axes, ndim: int) -> list[int]:
    return sorted(range(ndim) if axes is None else {a % ndim for a in axes})


@rule(ELEMENTWISE)
def elementwise(lw: Lowerer, c: Call, idx: tuple) -> ir.Expr:
    shape = c.ty.shape
    args = [lw.value(a, broadcast_index(a.ty.shape, shape, idx)) for a in c.args]
    if c.op == "astype":
        return lw.cast(args[0], c.ty.dtype)  # a cast to the same dtype is no cast
    if c.op == "clip" and not c.attrs["min"] <= c.attrs["max"]:
        return _clip_to_a_bound(lw, args[0], c.attrs["min"], c.attrs["max"], c.ty.dtype)
    return lw.op(c.op, *args, **dict(c.attrs))


def _clip_to_a_bound(lw, x, lo, hi, dtype):
    """``clip`` with min > max or a NaN bound: NumPy's min(max(x, min), max) is then max (or the
    NaN bound) wherever x is not NaN; clip's template holds for min <= max only."""
    bound = lo if math.isnan(lo) else hi
    if not dtypes.is_float(dtype):
        if math.isnan(bound):
            raise LoweringError("'clip' of integers with a NaN bound has no integer value")
        return const(math.trunc(bound), dtype)  # NumPy's cast of the float bound
    x = lw.let("clip_arg", x)
    return ir.Select(lw.op("not_equal", x, x), x, const(bound, dtype))


# -- injective ---------------------------------------------------------------------------------


@rule("broadcast_to")
def _broadcast_to(lw, c, idx):
    x = c.args[0]
    return lw.value(x, broadcast_index(x.ty.shape, c.ty.shape, idx))


@rule("permute_dims")
def _permute_dims(lw, c, idx):
    x = c.args[0]
    n = x.ty.ndim
    perm = list(reversed(range(n))) if c.attrs["axes"] is None else [a % n for a in c.attrs["axes"]]
    src = [None] * n
    for k, a in enumerate(perm):
        src[a] = idx[k]
    return lw.value(x, tuple(src))


def reshape_index(in_shape: tuple, out_shape: tuple, idx: tuple) -> tuple:
    """Row-major reshape: equal leading and trailing dims pass through, the middle is
    linearised over the output dims and split over the input dims."""
    p = 0
    while p < min(len(in_shape), len(out_shape)) and in_shape[p] == out_shape[p]:
        p += 1
    q = 0
    while q < min(len(in_shape), len(out_shape)) - p and in_shape[-1 - q] == out_shape[-1 - q]:
        q += 1
    out_mid = out_shape[p : len(out_shape) - q]
    in_mid = in_shape[p : len(in_shape) - q]
    linear = idx_const(0)
    for d, i in zip(out_mid, idx[p : len(out_shape) - q]):
        linear = add(mul(linear, dim(d)), i)
    parts = []
    for k, d in enumerate(reversed(in_mid)):
        if k == len(in_mid) - 1:
            parts.append(linear)
        else:
            parts.append(mod(linear, dim(d)))
            linear = div(linear, dim(d))
    return idx[:p] + tuple(reversed(parts)) + idx[len(out_shape) - q :]


@rule("reshape")
def _reshape(lw, c, idx):
    x = c.args[0]
    return lw.value(x, reshape_index(x.ty.shape, c.ty.shape, idx))


@rule("expand_dims")
def _expand_dims(lw, c, idx):
    n = c.ty.ndim
    new = {a % n for a in c.attrs["axis"]}
    return lw.value(c.args[0], tuple(i for k, i in enumerate(idx) if k not in new))


@rule("squeeze")
def _squeeze(lw, c, idx):
    x = c.args[0]
    shape = x.ty.shape
    axes = {k for k, d in enumerate(shape) if d == 1} if c.attrs["axis"] is None else {a % x.ty.ndim for a in c.attrs["axis"]}
    out = iter(idx)
    return lw.value(x, tuple(idx_const(0) if k in axes else next(out) for k in range(len(shape))))


@rule("strided_slice")
def _strided_slice(lw, c, idx):
    x = c.args[0]
    src = list(idx)
    for sl in slice_axes(call_info(c), x.ty):
        # counted from the end of a symbolic n: n - k
        start = add(dim(sl.start[0]), idx_const(sl.start[1])) if isinstance(sl.start, tuple) else dim(sl.start)
        src[sl.axis] = add(start, mul(idx[sl.axis], idx_const(sl.stride)))
        lw.requires.extend(sl.requires)
    return lw.value(x, tuple(src))


@rule("nn.pad")
def _pad(lw, c, idx):
    """Output index i reads x at ``j = i - before`` brought into the axis by the mode (see
    ``dpl.ops.manipulation.pad_source``): clamped (replicate), mirrored (reflect), wrapped
    (circular). A constant pad reads x clamped into bounds and selects its value outside, as
    ``concat`` selects its fields: the load stays in bounds wherever it runs, so what it reads
    (a producer fused before the pad, a local hoisted out of the select) needs no guard."""
    x = c.args[0]
    mode, widths = c.attrs["pad_mode"], c.attrs["pad_width"]
    src, inside = list(idx), []
    for axis, n in enumerate(x.ty.shape):
        before, after = widths[2 * axis], widths[2 * axis + 1]
        if before == 0 and after == 0:
            continue
        if n == 0:  # a constant pad of an empty axis: nothing but the value
            return const(c.attrs["pad_value"], c.ty.dtype)
        j = sub(idx[axis], idx_const(before))
        if mode in ("reflect", "circular") and not isinstance(n, int):
            raise LoweringError(f"a {mode} pad of axis {axis}, of the symbolic size {n}, has no kernel (its index "
                                "wraps by a size known only at run time)")
        if mode == "reflect":
            src[axis] = _reflected(j, before, after, n)
        elif mode == "circular":
            src[axis] = _wrapped(j, before, after, n)
        else:
            src[axis] = _clamped(j, before > 0, after > 0, n)
            if mode == "constant":
                inside += [Bin(">=", j, idx_const(0))] if before > 0 else []
                inside += [Bin("<", j, dim(n))] if after > 0 else []
        src[axis] = lw.let(f"pad{axis}", src[axis])  # once per iteration of its own loop
    value = lw.value(x, tuple(src))
    cond = conj(*inside)
    return value if cond is None else ir.Select(cond, value, const(c.attrs["pad_value"], c.ty.dtype))


def _clamped(j, low: bool, high: bool, n):
    """``j`` clamped into [0, n): only at the ends a pad can reach (a negative width crops); ``n``
    may be symbolic."""
    if low:
        j = ir.Select(Bin("<", j, idx_const(0)), idx_const(0), j)
    if high:
        last = sub(dim(n), idx_const(1))
        j = ir.Select(Bin(">", j, last), last, j)
    return j


def _reflected(j, before: int, after: int, n: int):
    """``j`` mirrored into [0, n) about the edges, which are not repeated: one mirror per side
    for widths below n (torch's bound, the common case), else periodically (period 2 (n - 1),
    shifted to stay non-negative, as ``%`` of the kernel IR needs)."""
    if n == 1:
        return idx_const(0)
    if max(before, after) <= n - 1:
        if before > 0:
            j = ir.Select(Bin("<", j, idx_const(0)), sub(idx_const(0), j), j)
        if after > 0:
            j = ir.Select(Bin(">", j, idx_const(n - 1)), sub(idx_const(2 * (n - 1)), j), j)
        return j
    period = 2 * (n - 1)
    m = mod(add(j, idx_const(-(-max(before, 0) // period) * period)), idx_const(period))
    return ir.Select(Bin("<", m, idx_const(n)), m, sub(idx_const(period), m))


def _wrapped(j, before: int, after: int, n: int):
    """``j`` modulo n: a select per side for widths up to n, else ``%`` of j shifted non-negative."""
    if max(before, after) <= n:
        if before > 0:
            j = ir.Select(Bin("<", j, idx_const(0)), add(j, idx_const(n)), j)
        if after > 0:
            j = ir.Select(Bin(">", j, idx_const(n - 1)), sub(j, idx_const(n)), j)
        return j
    return mod(add(j, idx_const(-(-max(before, 0) // n) * n)), idx_const(n))


def _tuple_fields(lw: Lowerer, t) -> tuple:
    """The field expressions of a tuple operand (a Tuple, or a variable bound to one)."""
    while isinstance(t, IRVar) and id(t) in lw.defs:
        t = lw.defs[id(t)].value
    if isinstance(t, Tuple):
        return t.fields
    raise LoweringError("the tuple operand must be built inside the group")


@rule("concat")
def _concat(lw, c, idx):
    fields = _tuple_fields(lw, c.args[0])
    axis = c.attrs["axis"] % c.ty.ndim
    offsets, at = [], 0
    for f in fields:
        offsets.append(at)
        at = dimexpr.add(at, f.ty.shape[axis])  # symbolic sizes sum to an expression (n + m)

    def field_at(k):
        # clamped into the field, so its loads (and any reduction or local hoisted out of the
        # select) stay in bounds wherever they run; the select keeps the right field's value
        i = sub(idx[axis], dim(offsets[k]))
        if k > 0:
            i = ir.Select(Bin("<", i, idx_const(0)), idx_const(0), i)
        if k < len(fields) - 1:
            last = dim(dimexpr.sub(fields[k].ty.shape[axis], 1))
            i = ir.Select(Bin(">", i, last), last, i)
        src = list(idx)
        src[axis] = i
        return lw.value(fields[k], tuple(src))

    out = field_at(len(fields) - 1)
    for k in reversed(range(len(fields) - 1)):
        out = ir.Select(Bin("<", idx[axis], dim(offsets[k + 1])), field_at(k), out)
    return out


def _tuple_source(lw: Lowerer, t):
    """What a tuple-valued expression is made of: bound variables followed, and items of
    literal tuples (nested tuples, as a flattened tuple parameter is) taken."""
    while True:
        while isinstance(t, IRVar) and id(t) in lw.defs:
            t = lw.defs[id(t)].value
        if not isinstance(t, TupleGetItem):
            return t
        inner = _tuple_source(lw, t.tuple_value)
        if not isinstance(inner, Tuple):
            return t
        t = inner.fields[t.index]


@rule(TUPLE_ITEM)
def tuple_item(lw: Lowerer, e: TupleGetItem, idx: tuple) -> ir.Expr:
    t = _tuple_source(lw, e.tuple_value)
    if isinstance(t, Tuple):
        return lw.value(t.fields[e.index], idx)
    if isinstance(t, Call) and t.op == "split":
        x = t.args[0]
        axis = t.attrs["axis"] % x.ty.ndim
        offset = 0
        for f in t.ty.fields[: e.index % len(t.ty.fields)]:
            offset = dimexpr.add(offset, f.shape[axis])
        src = list(idx)
        src[axis] = add(idx[axis], dim(offset))
        return lw.value(x, tuple(src))
    raise LoweringError(f"tuple item [{e.index}] of a {type(t).__name__} cannot be lowered")


@rule("full")
def _full(lw, c, idx):
    return lw.cast(lw.value(c.args[0], ()), c.ty.dtype)


@rule("zeros", "ones")
def _zeros_ones(lw, c, idx):
    return const(0 if c.op == "zeros" else 1, c.ty.dtype)


@rule("arange")
def _arange(lw, c, idx):
    start, step = c.attrs["start"], c.attrs["step"]
    (i,) = idx
    if isinstance(start, int) and isinstance(step, int):
        return lw.cast(add(idx_const(start), mul(i, idx_const(step))), c.ty.dtype)
    # the reference computes start + i * step in float64, then rounds to the dtype
    at = lw.op("add", const(start, "float64"), lw.op("multiply", lw.cast(i, "float64"), const(step, "float64")))
    return lw.cast(at, c.ty.dtype)


@rule("triu", "tril")
def _triangle(lw, c, idx):
    row, col = idx[-2], idx[-1]
    diagonal = add(row, idx_const(c.attrs["k"]))
    keep = Bin(">=", col, diagonal) if c.op == "triu" else Bin("<=", col, diagonal)
    return ir.Select(keep, lw.value(c.args[0], idx), const(0, c.ty.dtype))


# -- reductions --------------------------------------------------------------------------------

COMBINER = {"sum": "add", "mean": "add", "variance": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}


def count(lw: Lowerer, dims, dtype: str) -> ir.Expr:
    """The number of elements over ``dims``, as a ``dtype`` scalar."""
    n = idx_const(1)
    for d in dims:
        n = mul(n, dim(d))
    return lw.cast(n, dtype)


def row_index(idx: tuple, axes: list[int], rvars: list) -> tuple:
    src = list(idx)
    for a, r in zip(axes, rvars):
        src[a] = r
    return tuple(src)


def _reduced_source(idx, axes, ndim: int, keep: bool):
    """``at(rvars)``: the input index a reduction over ``axes`` reads for output index ``idx``
    and the reduction variables ``rvars`` (a kept axis's output index is 0, so skipped)."""

    def at(rvars):
        kept = iter(idx)
        src = []
        for d in range(ndim):
            if d in axes:
                src.append(rvars[axes.index(d)])
                if keep:
                    next(kept)
            else:
                src.append(next(kept))
        return tuple(src)

    return at


@rule(*COMBINER)
def _reduction(lw, c, idx):
    x = c.args[0]
    xt = x.ty
    axes = _axes(c.attrs["axis"], xt.ndim)
    keep = c.attrs["keepdims"]
    at = _reduced_source(idx, axes, xt.ndim, keep)

    acc = accum_dtype(xt.dtype)
    extents = [xt.shape[a] for a in axes]
    hint = f"{c.op}"

    def xv(rvars):
        return lw.cast(lw.value(x, at(rvars)), acc)

    if c.op in ("mean", "variance") and not dtypes.is_float(xt.dtype):
        return _integer_moment(lw, c, extents, xv)
    if c.op == "variance":
        mu = lw.let("mean", lw.op("divide", lw.reduce("sum", "add", acc, extents, xv), count(lw, extents, acc)))
        sq = lw.reduce("sumsq", "add", acc, extents, lambda r: _square(lw, lw.op("subtract", xv(r), mu)))
        out = lw.op("divide", sq, count(lw, extents, acc))
    else:
        out = lw.reduce(hint, COMBINER[c.op], acc, extents, xv)
        if c.op == "mean":
            out = lw.op("divide", out, count(lw, extents, acc))
    return lw.cast(out, c.ty.dtype)


def _integer_moment(lw, c, extents, xv):
    """Integer and bool ``mean``/``variance`` exactly as the interpreter defines them (the real
    value toward zero, wrapped into the dtype; for bool, whether it is not 0), in int64 alone:
    with m the truncated mean, D = sum(x - m) and Q = sum((x - m)^2), n^2 var = n Q - D^2 with
    |D| < n, so floor(var) = (Q - ceil(D^2 / n)) / n. Where int64 cannot hold that (int64 sums,
    int32 squares) the group has no kernel and runs op by op on the reference."""
    dtype = c.args[0].ty.dtype
    if dtypes.ITEMSIZE[dtype] >= 8 or (c.op == "variance" and dtypes.ITEMSIZE[dtype] >= 4):
        raise LoweringError(f"an exact '{c.op}' of {dtypes.short(dtype)} values needs more than 64-bit integers")
    n = count(lw, extents, "int64")
    total = lw.reduce("sum", "add", "int64", extents, xv)
    if c.op == "mean":
        return lw.cast(total if dtype == "bool" else lw.op("divide", total, n), dtype)  # C's division truncates
    m = lw.let("mean", lw.op("divide", total, n))
    d = lw.reduce("dev", "add", "int64", extents, lambda r: lw.op("subtract", xv(r), m))
    q = lw.reduce("sumsq", "add", "int64", extents, lambda r: _square(lw, lw.op("subtract", xv(r), m)))
    d2 = _square(lw, d)
    if dtype == "bool":  # bools: (x - m)^2 <= 1, so n Q stays below n^2
        return lw.cast(lw.op("subtract", lw.op("multiply", n, q), d2), dtype)
    ceil = lw.op("divide", lw.op("subtract", lw.op("add", d2, n), const(1, "int64")), n)
    return lw.cast(lw.op("divide", lw.op("subtract", q, ceil), n), dtype)


def _square(lw, e):
    e = lw.let("d", e)
    return lw.op("multiply", e, e)


# -- anchors -----------------------------------------------------------------------------------


@rule("matmul")
def _matmul(lw, c, idx):
    a, b = c.args
    ra, rb = a.ty.ndim, b.ty.ndim
    out = c.ty.shape
    nbatch = len(out) - (ra > 1) - (rb > 1)
    batch = idx[:nbatch]
    i = idx[nbatch] if ra > 1 else None
    j = idx[-1] if rb > 1 else None
    acc = accum_dtype(c.ty.dtype)
    lw.anchors.append("matmul")

    def product(rvars):
        (k,) = rvars
        a_idx = (k,) if ra == 1 else broadcast_index(a.ty.shape[:-2], out[:nbatch], batch) + (i, k)
        b_idx = (k,) if rb == 1 else broadcast_index(b.ty.shape[:-2], out[:nbatch], batch) + (k, j)
        return lw.op("multiply", lw.cast(lw.value(a, a_idx), acc), lw.cast(lw.value(b, b_idx), acc))

    return lw.cast(lw.reduce("acc", "add", acc, [a.ty.shape[-1]], product), c.ty.dtype)


def _pair(v):
    v = (v,) if isinstance(v, int) else tuple(v)
    return (v[0], v[0]) if len(v) == 1 else v


def _pads(v):
    p = (v,) if isinstance(v, int) else tuple(v)
    return p * 4 if len(p) == 1 else (p[0], p[1], p[0], p[1]) if len(p) == 2 else p


def _window(lw, o, k, stride, dil, pad, size, out_size, ksize):
    """The input position of output ``o`` and window offset ``k``, and the bounds test it
    needs (None where the window never leaves the input)."""
    pos = sub(add(mul(o, idx_const(stride)), mul(k, idx_const(dil))), idx_const(pad))
    lo = Bin(">=", pos, idx_const(0)) if pad > 0 else None
    last = dimexpr.add(dimexpr.mul(dimexpr.sub(out_size, 1), stride), (ksize - 1) * dil - pad)
    # no test where the last window provably ends inside (sizes symbolic or not)
    hi = None if dimexpr.provably_nonnegative(dimexpr.sub(dimexpr.sub(size, last), 1)) else Bin("<", pos, dim(size))
    return pos, conj(lo, hi)


def _nchw(shape_or_idx, layout: str) -> tuple:
    """A 4-D shape or index of a ``layout`` tensor in NCHW order (kernel layouts: OIHW)."""
    return tuple(shape_or_idx[a] for a in layout_axes(layout, "NCHW" if layout[0] == "N" else "OIHW"))


def _laid_out(nchw: tuple, layout: str) -> tuple:
    """An NCHW (or OIHW) index as ``layout`` orders it."""
    return tuple(nchw[a] for a in layout_axes("NCHW" if layout[0] == "N" else "OIHW", layout))


@rule("nn.conv2d")
def _conv2d(lw, c, idx):
    x, w = c.args
    layout, kernel_layout = c.attrs["data_layout"], c.attrs["kernel_layout"]
    _, _, H, W = _nchw(x.ty.shape, layout)
    O, CI, KH, KW = _nchw(w.ty.shape, kernel_layout)
    groups = c.attrs["groups"]
    sh, sw = _pair(c.attrs["strides"])
    dh, dw = _pair(c.attrs["dilation"])
    pt, pl, _, _ = _pads(c.attrs["padding"])
    _, _, OH, OW = _nchw(c.ty.shape, layout)
    n, oc, oy, ox = _nchw(idx, layout)
    group = div(oc, idx_const(O // groups)) if groups > 1 else idx_const(0)
    acc = accum_dtype(c.ty.dtype)
    lw.anchors.append("conv2d")

    def product(rvars):
        ci, ky, kx = rvars
        hy, hy_ok = _window(lw, oy, ky, sh, dh, pt, H, OH, KH)
        wx, wx_ok = _window(lw, ox, kx, sw, dw, pl, W, OW, KW)
        chan = add(mul(group, idx_const(CI)), ci)
        xv = lw.guard(conj(hy_ok, wx_ok), lambda: lw.cast(lw.value(x, _laid_out((n, chan, hy, wx), layout)), acc),
                      const(0, acc))
        return lw.op("multiply", xv, lw.cast(lw.value(w, _laid_out((oc, ci, ky, kx), kernel_layout)), acc))

    return lw.cast(lw.reduce("acc", "add", acc, [CI, KH, KW], product), c.ty.dtype)


def _pool_windows(lw, c, idx, dtype: str, outside):
    """The (ky, kx) window of a 2-D pool over ``c``'s input at output ``idx``: each element cast
    to ``dtype``, ``outside`` where the window reaches into the padding; and the reduction axes."""
    x = c.args[0]
    layout = c.attrs["layout"]
    _, _, H, W = _nchw(x.ty.shape, layout)
    sh, sw = _pair(c.attrs["strides"])
    dh, dw = _pair(c.attrs["dilation"])
    pt, pl, pb, pr = _pads(c.attrs["padding"])
    KH, KW = (_reachable_taps(k, d, size, lo + hi)
              for k, d, size, lo, hi in zip(_pair(c.attrs["pool_size"]), (dh, dw), (H, W), (pt, pl), (pb, pr)))
    _, _, OH, OW = _nchw(c.ty.shape, layout)
    n, ch, oy, ox = _nchw(idx, layout)
    lw.anchors.append("pool")

    def window(rvars):
        ky, kx = rvars
        hy, hy_ok = _window(lw, oy, ky, sh, dh, pt, H, OH, KH)
        wx, wx_ok = _window(lw, ox, kx, sw, dw, pl, W, OW, KW)
        return lw.guard(conj(hy_ok, wx_ok), lambda: lw.cast(lw.value(x, _laid_out((n, ch, hy, wx), layout)), dtype),
                        const(outside, dtype))

    return window, [KH, KW]


def _reachable_taps(kernel: int, dilation: int, size, pads: int) -> int:
    """The window taps that can meet the padded input: a ceil-mode window may be larger than
    it (EfficientNet's pooler, AvgPool2d(1280, ceil_mode=True) over 7 x 7), and every tap past
    the padded input is outside for every window, so the loop stops there."""
    if not isinstance(size, int):
        return kernel
    return min(kernel, -(-(size + pads) // dilation))


@rule("nn.max_pool2d")
def _max_pool2d(lw, c, idx):
    dtype = c.args[0].ty.dtype
    lowest = float("-inf") if dtype.startswith(("float", "bfloat")) else int(np.iinfo(dtype).min)
    window, axes = _pool_windows(lw, c, idx, dtype, lowest)
    return lw.reduce("pool", "maximum", dtype, axes, window)


def _table(lw, hint: str, values: np.ndarray, dtype: str, idx: tuple) -> ir.Expr:
    """``values`` (known at lowering) at ``idx``: a constant when they are all equal, else a
    constant buffer the kernel reads."""
    values = np.asarray(values)
    if np.all(values == values.flat[0]):
        return const(values.flat[0].item(), dtype)
    name = lw.fresh(hint)
    lw.constants[name] = values.astype(dtypes.to_numpy(dtype))
    return lw.load(name, dtype, idx)


@rule("nn.avg_pool2d")
def _avg_pool2d(lw, c, idx):
    x = c.args[0]
    layout = c.attrs["layout"]
    _, _, H, W = _nchw(x.ty.shape, layout)
    KH, KW = _pair(c.attrs["pool_size"])
    sh, sw = _pair(c.attrs["strides"])
    dh, dw = _pair(c.attrs["dilation"])
    pt, pl, pb, pr = _pads(c.attrs["padding"])
    _, _, OH, OW = _nchw(c.ty.shape, layout)
    _, _, oy, ox = _nchw(idx, layout)
    acc = accum_dtype(x.ty.dtype)
    window, axes = _pool_windows(lw, c, idx, acc, 0)
    total = lw.reduce("pool", "add", acc, axes, window)
    include = c.attrs["count_include_pad"]
    _, div_h = avg_pool_axis(H, KH, sh, dh, pt, pb, OH, include)
    _, div_w = avg_pool_axis(W, KW, sw, dw, pl, pr, OW, include)
    divisor = _table(lw, "divisor", np.outer(div_h, div_w), acc, (oy, ox))
    return lw.cast(lw.op("divide", total, divisor), c.ty.dtype)


@rule("nn.adaptive_avg_pool2d")
def _adaptive_avg_pool2d(lw, c, idx):
    x = c.args[0]
    layout = c.attrs["layout"]
    _, _, H, W = _nchw(x.ty.shape, layout)
    _, _, OH, OW = _nchw(c.ty.shape, layout)
    n, ch, oy, ox = _nchw(idx, layout)
    lw.anchors.append("pool")
    acc = accum_dtype(x.ty.dtype)
    axes = []
    for size, out, o in ((H, OH, oy), (W, OW, ox)):
        starts, ends = adaptive_windows(size, out)
        lengths = ends - starts
        widest = int(lengths.max())
        # windows of one length need no bounds test; equal windows tiling the axis, no table
        length = None if np.all(lengths == widest) else _table(lw, "length", lengths, INDEX, (o,))
        if length is None and np.all(starts == np.arange(out) * widest):
            axes.append((mul(o, idx_const(widest)), widest, None))
        else:
            axes.append((_table(lw, "start", starts, INDEX, (o,)), widest, length))

    def window(rvars):
        pos, inside = [], []
        for (start, _, length), r in zip(axes, rvars):
            pos.append(add(start, r))
            inside.append(None if length is None else Bin("<", r, length))
        return lw.guard(conj(*inside), lambda: lw.cast(lw.value(x, _laid_out((n, ch, *pos), layout)), acc), const(0, acc))

    total = lw.reduce("pool", "add", acc, [axes[0][1], axes[1][1]], window)
    counts = [np.diff(np.stack(adaptive_windows(size, out)), axis=0)[0] for size, out in ((H, OH), (W, OW))]
    divisor = _table(lw, "divisor", np.outer(*counts), acc, (oy, ox))
    return lw.cast(lw.op("divide", total, divisor), c.ty.dtype)


# -- high-level row ops ------------------------------------------------------------------------


def _row(lw, x, idx, axes, ct):
    """Helpers over the rows of ``x`` along ``axes``: its value at a row point, in ``ct``."""
    extents = [x.ty.shape[a] for a in axes]

    def at(rvars):
        return lw.cast(lw.value(x, row_index(idx, axes, rvars)), ct)

    return extents, at


@rule("nn.softmax", "nn.log_softmax")
def _softmax(lw, c, idx):
    x = c.args[0]
    axes = [c.attrs["axis"] % x.ty.ndim]
    ct = accum_dtype(x.ty.dtype)
    extents, at = _row(lw, x, idx, axes, ct)
    m = lw.reduce("rowmax", "maximum", ct, extents, at)
    low = lw.let("exp_floor", lw.op("subtract", m, const(87.0 if ct != "float64" else 708.0, ct)))
    s = lw.reduce("rowsum", "add", ct, extents, lambda r: _exp_minus_max(lw, at(r), m, low))
    here = lw.cast(lw.value(x, idx), ct)
    if c.op == "nn.softmax":
        out = lw.op("divide", _exp_minus_max(lw, here, m, low), s)
    else:
        out = lw.op("subtract", lw.op("subtract", here, m), lw.op("log", s))
    return lw.cast(out, c.ty.dtype)


def _exp_minus_max(lw, x, m, low):
    """``exp(x - m)`` for a row's maximum ``m``, 0 below ``low = m - 87`` (float32; 708 in
    float64), where it underflows past the smallest normal number. Vector ``exp`` takes a slow
    scalar path for such arguments, and a causal mask's -3.4e38 (or -inf) sends half of
    attention's scores there: softmax of 16x512x512 scores took 13.4 ms masked, 3.0 unmasked.
    So ``x`` is clamped to ``low`` before ``exp`` (a bound known only at run time, so the C
    compiler cannot turn the clamp into a blend of ``exp(x - m)`` with a folded constant) and
    the result selected as 0; the exact result there is a denormal or 0, divided by a row sum
    of at least 1. NaN and infinities give what ``exp(x - m)`` gives."""
    under = lw.op("less", x, low)
    return ir.Select(under, const(0.0, m.dtype), lw.op("exp", lw.op("subtract", ir.Select(under, low, x), m)))


def _param(lw, p, idx, axes, ct):
    return lw.cast(lw.value(p, tuple(idx[a] for a in axes)), ct)


@rule("nn.rms_norm")
def _rms_norm(lw, c, idx):
    x, weight = c.args
    axes = _axes(c.attrs["axes"], x.ty.ndim)
    ct = accum_dtype(x.ty.dtype)
    extents, at = _row(lw, x, idx, axes, ct)
    ss = lw.reduce("sumsq", "add", ct, extents, lambda r: _square(lw, at(r)))
    ms = lw.op("divide", ss, count(lw, extents, ct))
    inv = lw.let("inv_rms", lw.op("rsqrt", lw.op("add", ms, const(c.attrs["epsilon"], ct))))
    here = lw.cast(lw.value(x, idx), ct)
    out = lw.op("multiply", lw.op("multiply", here, inv), _param(lw, weight, idx, axes, ct))
    return lw.cast(out, c.ty.dtype)


@rule("nn.layer_norm")
def _layer_norm(lw, c, idx):
    x, gamma, beta = c.args
    axes = _axes(c.attrs["axes"], x.ty.ndim)
    ct = accum_dtype(x.ty.dtype)
    extents, at = _row(lw, x, idx, axes, ct)
    n = count(lw, extents, ct)
    mu = lw.let("mean", lw.op("divide", lw.reduce("sum", "add", ct, extents, at), n))
    var = lw.op("divide", lw.reduce("sumsq", "add", ct, extents, lambda r: _square(lw, lw.op("subtract", at(r), mu))), n)
    inv = lw.let("inv_std", lw.op("rsqrt", lw.op("add", var, const(c.attrs["epsilon"], ct))))
    out = lw.op("multiply", lw.op("subtract", lw.cast(lw.value(x, idx), ct), mu), inv)
    if c.attrs["scale"]:
        out = lw.op("multiply", out, _param(lw, gamma, idx, axes, ct))
    if c.attrs["center"]:
        out = lw.op("add", out, _param(lw, beta, idx, axes, ct))
    return lw.cast(out, c.ty.dtype)


@rule("take")
def _take(lw, c, idx):
    raise LoweringError("op 'take' is opaque: a data-dependent gather is its own kernel, not part of a fused one")



@rule("argmax", "argmin")
def _arg_extreme(lw, c, idx):
    """The extreme, then the first (last) index holding it: two reductions, ``max`` and then
    ``min`` of ``x == m ? i : n``. NaN is the extreme (``maximum`` propagates it), so where a row
    holds one, the positions compared are its NaNs (``x != x``)."""
    x = c.args[0]
    xt = x.ty
    axes = _axes(None if c.attrs["axis"] is None else [c.attrs["axis"]], xt.ndim)
    keep = c.attrs["keepdims"]
    at = _reduced_source(idx, axes, xt.ndim, keep)
    extents = [xt.shape[a] for a in axes]
    extreme = lw.reduce(c.op, "maximum" if c.op == "argmax" else "minimum", xt.dtype, extents,
                        lambda r: lw.value(x, at(r)))
    last = c.attrs["select_last_index"]
    n = idx_const(1)
    for e in extents:
        n = mul(n, dim(e))

    def position(rvars):
        flat = idx_const(0)
        for r, e in zip(rvars, extents):
            flat = add(mul(flat, dim(e)), r)
        v = lw.value(x, at(rvars))
        hit = lw.op("equal", v, extreme)
        if dtypes.is_float(xt.dtype):
            hit = lw.op("maximum", hit, lw.op("not_equal", v, v))
        return lw.op("where", hit, flat, idx_const(-1) if last else n)

    return lw.reduce(f"{c.op}_index", "maximum" if last else "minimum", "int64", extents, position)
