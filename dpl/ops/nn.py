"""Neural-network ops with internal structure: matrix product, normalisations, softmax,
convolution and pooling. All OutEWiseFusable in TVM (they can absorb elementwise epilogues),
except a matmul with a 1-D operand, which TVM sees as a plain CommReduce, and an adaptive pooling
whose windows vary in length along both axes, which it sees as Opaque."""

from __future__ import annotations

import numpy as np

from dpl import dtypes
from dpl.ir.dims import add, dmax, dmin, floordiv, mul, sub
from dpl.ir.types import Dim, TensorType
from dpl.ops._shapes import broadcast_shapes, normalize_axes, normalize_axis, same_dtype
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

FUSABLE = OpPatternKind.OUT_EWISE_FUSABLE


def _acc(x):
    """``x`` in the dtype its op computes in (docs/architecture.md, "Numerical contract"): the
    accumulator of a float dtype (float32 for f32, f16 and bf16, as the kernels and torch
    compute), float64 for integers and bools (their averages and norms are real numbers)."""
    x = np.asarray(x)
    return x.astype(dtypes.accumulator_numpy(x.dtype) if dtypes.is_float_numpy(x.dtype) else np.float64)


# -- matmul ------------------------------------------------------------------------------------


def _infer_matmul(info: CallInfo) -> TensorType:
    a, b = info.tensor(0), info.tensor(1)
    if a.ndim == 0 or b.ndim == 0:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} must have rank >= 1")
    if a.dtype != b.dtype:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} have different dtypes")
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    k_a, k_b = a_shape[-1], b_shape[-2]
    if k_a != k_b:
        raise info.error(
            f"operands {info.operand(0)} and {info.operand(1)} have mismatched reduction dimensions ({k_a} vs {k_b})"
        )
    batch = broadcast_shapes(
        CallInfo(info.op, (TensorType(a_shape[:-2], a.dtype), TensorType(b_shape[:-2], b.dtype)), info.attrs, info.arg_names)
    )
    shape = batch + ((a_shape[-2],) if a.ndim > 1 else ()) + ((b_shape[-1],) if b.ndim > 1 else ())
    return TensorType(shape, info.attrs["out_dtype"] or a.dtype)


def _matmul_ref(a, b, out_dtype):
    acc = dtypes.accumulator_numpy(a.dtype)  # int64 for integers and bools
    return np.matmul(a.astype(acc), b.astype(acc)).astype(out_dtype or a.dtype)


def _matmul_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM calls a reduction block a multiply-add (OutEWiseFusable) only when each operand
    # misses some output index; a 1-D operand covers every output index of its product
    if info.tensor(0).ndim == 1 or info.tensor(1).ndim == 1:
        return OpPatternKind.COMM_REDUCE
    return FUSABLE


register(
    "matmul",
    num_args=2,
    attrs={"out_dtype": AttrSpec("dtype", default=None)},
    infer=_infer_matmul,
    kind=_matmul_kind,
    ref=_matmul_ref,
    doc="matrix product with NumPy's batching and 1-D rules",
)

# -- softmax and normalisations ----------------------------------------------------------------


def _infer_softmax(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    normalize_axis(info, info.attrs["axis"], x.ndim)
    if not x.dtype.startswith(("float", "bfloat")):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype")
    return x


def _softmax_ref(x, axis):
    if x.size == 0:  # nothing to normalise (and NumPy's max of nothing fails)
        return x.copy()
    z = _acc(x)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _log_softmax_ref(x, axis):
    if x.size == 0:  # nothing to normalise (and NumPy's max of nothing fails)
        return x.copy()
    z = _acc(x)
    z = z - z.max(axis=axis, keepdims=True)
    return (z - np.log(np.exp(z).sum(axis=axis, keepdims=True))).astype(x.dtype)


register("nn.softmax", num_args=1, attrs={"axis": AttrSpec("axis", default=-1)}, infer=_infer_softmax, kind=FUSABLE, ref=_softmax_ref, doc="softmax along axis")
register("nn.log_softmax", num_args=1, attrs={"axis": AttrSpec("axis", default=-1)}, infer=_infer_softmax, kind=FUSABLE, ref=_log_softmax_ref, doc="log of softmax along axis")


def _infer_norm(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    axes = normalize_axes(info, info.attrs["axes"], x.ndim)
    want = tuple(x.shape[a] for a in axes)
    for i in range(1, len(info.arg_types)):
        p = info.tensor(i)
        if p.shape != want:
            raise info.error(f"operand {info.operand(i)} must have shape {list(want)} (the normalised axes of {info.operand(0)})")
    same_dtype(info)
    return x


def _param_view(p, x, axes):
    """Reshape a parameter over the normalised axes so it broadcasts against x."""
    shape = [1] * x.ndim
    for a, d in zip(axes, p.shape):
        shape[a] = d
    return _acc(p).reshape(shape)


def _rms_norm_ref(x, weight, axes, epsilon):
    axes = tuple(a % x.ndim for a in axes)
    z = _acc(x)
    rms = np.sqrt(np.mean(z * z, axis=axes, keepdims=True) + epsilon)
    return (z / rms * _param_view(weight, x, axes)).astype(x.dtype)


def _layer_norm_ref(x, gamma, beta, axes, epsilon, center, scale):
    axes = tuple(a % x.ndim for a in axes)
    z = _acc(x)
    mu = z.mean(axis=axes, keepdims=True)
    var = ((z - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (z - mu) / np.sqrt(var + epsilon)
    if scale:
        y = y * _param_view(gamma, x, axes)
    if center:
        y = y + _param_view(beta, x, axes)
    return y.astype(x.dtype)


register(
    "nn.rms_norm",
    num_args=2,
    attrs={"axes": AttrSpec("axes", default=(-1,)), "epsilon": AttrSpec("float", default=1e-5)},
    infer=_infer_norm,
    kind=FUSABLE,
    ref=_rms_norm_ref,
    doc="x / sqrt(mean(x^2) + eps) * weight",
)
register(
    "nn.layer_norm",
    num_args=3,
    attrs={
        "axes": AttrSpec("axes", default=(-1,)),
        "epsilon": AttrSpec("float", default=1e-5),
        "center": AttrSpec("bool", default=True),
        "scale": AttrSpec("bool", default=True),
    },
    infer=_infer_norm,
    kind=FUSABLE,
    ref=_layer_norm_ref,
    doc="(x - mean) / sqrt(var + eps) * gamma + beta",
)

# -- convolution and pooling (NCHW, NHWC) ------------------------------------------------------


def _pair(info: CallInfo, key: str):
    v = info.attrs[key]
    v = (v,) if isinstance(v, int) else v
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2:
        raise info.error(f"attribute '{key}' must have 1 or 2 values, got {list(v)}")
    return v


def _padding(info: CallInfo):
    """(top, left, bottom, right), from 1, 2 or 4 values as in Relax."""
    p = info.attrs["padding"]
    p = (p,) if isinstance(p, int) else p
    if len(p) == 1:
        return (p[0],) * 4
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    if len(p) == 4:
        return tuple(p)
    raise info.error(f"attribute 'padding' must have 1, 2 or 4 values, got {list(p)}")


def _window_out(info, size, kernel, stride, dilation, pad_lo, pad_hi, ceil_mode=False):
    if not isinstance(kernel, int):
        raise info.error(f"window dimension '{kernel}' must be static")
    if kernel < 1 or stride < 1 or dilation < 1 or pad_lo < 0 or pad_hi < 0:
        raise info.error(f"window {kernel}, stride {stride} and dilation {dilation} must be positive and padding "
                         f"({pad_lo}, {pad_hi}) not negative")
    if not isinstance(size, int):  # (n + 2p - d*(k-1) - 1) // s + 1; run time checks the window fits
        return pool_out_dim(size, kernel, stride, dilation, pad_lo, pad_hi, ceil_mode)
    span = dilation * (kernel - 1) + 1
    total = size + pad_lo + pad_hi - span
    # with ceil_mode a window larger than the padded input is one partial window, as in torch
    if total < 0 and not (ceil_mode and pool_out(size, kernel, stride, dilation, pad_lo, pad_hi, ceil_mode) >= 1):
        raise info.error(f"window {kernel} (dilation {dilation}) is larger than the padded input {size + pad_lo + pad_hi}")
    return pool_out(size, kernel, stride, dilation, pad_lo, pad_hi, ceil_mode)


def pool_out(size: int, kernel: int, stride: int, dilation: int, pad_lo: int, pad_hi: int, ceil_mode: bool) -> int:
    """Windows along one axis, as TVM 0.27 (and PyTorch) count them: with ``ceil_mode`` a last,
    partial window is kept only when it starts inside the input or its leading padding."""
    total = size + pad_lo + pad_hi - (dilation * (kernel - 1) + 1)
    if not ceil_mode:
        return total // stride + 1
    out = (total + stride - 1) // stride + 1
    return out - 1 if (out - 1) * stride >= size + pad_lo else out


def pool_out_dim(size: Dim, kernel: int, stride: int, dilation: int, pad_lo: int, pad_hi: int, ceil_mode: bool) -> Dim:
    """:func:`pool_out` of a symbolic size, as a dimension expression (exact wherever the
    window fits the padded input). With ``ceil_mode`` the last window is dropped where it
    would start in the trailing padding: ``out - [start >= size + pad_lo]``, the indicator
    written ``min(1, max(0, x + 1))`` of ``x = start - size - pad_lo``, which the simplifier
    folds where it can prove it."""
    total = add(size, pad_lo + pad_hi - (dilation * (kernel - 1) + 1))
    if not ceil_mode:
        return add(floordiv(total, stride), 1)
    out = add(floordiv(add(total, stride - 1), stride), 1)
    last_start = mul(sub(out, 1), stride)
    return sub(out, dmin(1, dmax(0, add(sub(last_start, add(size, pad_lo)), 1))))


# The data layouts of 2-D convolutions and pools, each with its convolution's kernel layout:
# NCHW (the frontends') and NHWC (channels last: what dpl's convert-layout pass makes, since the
# CPU's convolutions run faster on it; the weights OHWI, each output channel's taps in a row).
KERNEL_LAYOUTS = {"NCHW": "OIHW", "NHWC": "OHWI"}


def layout_axes(layout: str, canonical: str = "NCHW") -> tuple[int, ...]:
    """Where each letter of ``canonical`` sits in ``layout``: the transpose that reads a
    ``layout`` array as a ``canonical`` one (NHWC -> NCHW: (0, 3, 1, 2))."""
    return tuple(layout.index(c) for c in canonical)


def _check_layout(info: CallInfo, key: str, allowed=tuple(KERNEL_LAYOUTS)) -> str:
    """The layout ``info`` names under ``key``, one of ``allowed``."""
    got = info.attrs[key]
    if got not in allowed:
        known = " or ".join(f'"{a}"' for a in allowed)
        raise info.error(f"{key}=\"{got}\" is not supported; {key} is {known}")
    return got


def _as_nchw(shape: tuple, layout: str) -> tuple:
    return tuple(shape[a] for a in layout_axes(layout))


def _from_nchw(shape: tuple, layout: str) -> tuple:
    return tuple(shape[a] for a in layout_axes("NCHW", layout))


def _ref_in_nchw(ref, x, layout: str, *args, **attrs):
    """A NCHW reference run on a ``layout`` array: transposed in, and back."""
    if layout == "NCHW":
        return ref(x, *args, **attrs)
    out = ref(np.transpose(x, layout_axes(layout)), *args, **attrs)
    return np.ascontiguousarray(np.transpose(out, layout_axes("NCHW", layout)))


def _infer_conv2d(info: CallInfo) -> TensorType:
    layout = _check_layout(info, "data_layout")
    want = KERNEL_LAYOUTS[layout]
    if info.attrs["kernel_layout"] != want:
        raise info.error(f"data_layout=\"{layout}\" takes kernel_layout=\"{want}\", got \"{info.attrs['kernel_layout']}\"")
    x, w = info.tensor(0), info.tensor(1)
    if x.ndim != 4 or w.ndim != 4:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} must have rank 4")
    groups = info.attrs["groups"]
    if groups < 1:
        raise info.error(f"groups must be positive, got {groups}")
    n, c, h, wd = _as_nchw(x.shape, layout)
    o, i, kh, kw = tuple(w.shape[a] for a in layout_axes(want, "OIHW"))
    if isinstance(c, int) and isinstance(i, int) and c != i * groups:
        raise info.error(f"input channels {c} of {info.operand(0)} do not match {i} x groups {groups} of {info.operand(1)}")
    if isinstance(o, int) and o % groups:
        raise info.error(f"output channels {o} are not divisible by groups {groups}")
    if x.dtype != w.dtype:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} have different dtypes")
    sh, sw = _pair(info, "strides")
    dh, dw = _pair(info, "dilation")
    pt, pl, pb, pr = _padding(info)
    oh = _window_out(info, h, kh, sh, dh, pt, pb)
    ow = _window_out(info, wd, kw, sw, dw, pl, pr)
    return TensorType(_from_nchw((n, o, oh, ow), layout), info.attrs["out_dtype"] or x.dtype)


def _conv2d_ref(x, w, strides, padding, dilation, groups, data_layout, kernel_layout, out_dtype):
    if data_layout != "NCHW":
        w = np.transpose(w, layout_axes(kernel_layout, "OIHW"))
        return _ref_in_nchw(_conv2d_ref_nchw, x, data_layout, w, strides, padding, dilation, groups, out_dtype)
    return _conv2d_ref_nchw(x, w, strides, padding, dilation, groups, out_dtype)


def _conv2d_ref_nchw(x, w, strides, padding, dilation, groups, out_dtype):
    sh, sw = (strides, strides) if isinstance(strides, int) else (tuple(strides) * 2)[:2]
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else (tuple(dilation) * 2)[:2]
    p = (padding,) if isinstance(padding, int) else tuple(padding)
    pt, pl, pb, pr = p * 4 if len(p) == 1 else (p[0], p[1], p[0], p[1]) if len(p) == 2 else p
    xp = np.pad(_acc(x), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, c, h, wd = xp.shape
    o, ci, kh, kw = w.shape
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow), xp.dtype)
    og = o // groups
    wf = _acc(w)
    for g in range(groups):
        xs = xp[:, g * ci : (g + 1) * ci]
        for ki in range(kh):
            for kj in range(kw):
                patch = xs[:, :, ki * dh : ki * dh + sh * (oh - 1) + 1 : sh, kj * dw : kj * dw + sw * (ow - 1) + 1 : sw]
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wf[g * og : (g + 1) * og, :, ki, kj])
    return out.astype(out_dtype or x.dtype)


register(
    "nn.conv2d",
    num_args=2,
    attrs={
        "strides": AttrSpec("ints_or_int", default=(1, 1)),
        "padding": AttrSpec("ints_or_int", default=(0, 0, 0, 0)),
        "dilation": AttrSpec("ints_or_int", default=(1, 1)),
        "groups": AttrSpec("int", default=1),
        "data_layout": AttrSpec("str", default="NCHW"),
        "kernel_layout": AttrSpec("str", default="OIHW"),
        "out_dtype": AttrSpec("dtype", default=None),
    },
    infer=_infer_conv2d,
    kind=FUSABLE,
    ref=_conv2d_ref,
    doc="2-D convolution, NCHW data and OIHW weights or NHWC data and OHWI weights",
)


def _infer_max_pool2d(info: CallInfo) -> TensorType:
    layout = _check_layout(info, "layout")
    x = info.tensor(0)
    if x.ndim != 4:
        raise info.error(f"operand {info.operand(0)} must have rank 4")
    if x.dtype == "bool":
        err = info.error(f"operand {info.operand(0)} must have a numeric dtype, not bool")
        err.hint = "pool astype(x, dtype=u8) and compare the result with 0"
        raise err
    kh, kw = _pair(info, "pool_size")
    sh, sw = _pair(info, "strides")
    dh, dw = _pair(info, "dilation")
    pt, pl, pb, pr = _padding(info)
    ceil = info.attrs["ceil_mode"]
    n, c, h, w = _as_nchw(x.shape, layout)
    oh = _window_out(info, h, kh, sh, dh, pt, pb, ceil)
    ow = _window_out(info, w, kw, sw, dw, pl, pr, ceil)
    return TensorType(_from_nchw((n, c, oh, ow), layout), x.dtype)


def _max_pool2d_ref(x, pool_size, strides, padding, dilation, ceil_mode, layout):
    if layout != "NCHW":
        return _ref_in_nchw(_max_pool2d_ref, x, layout, pool_size, strides, padding, dilation, ceil_mode, "NCHW")
    info = CallInfo("nn.max_pool2d", (TensorType(x.shape, str(x.dtype)),), dict(pool_size=pool_size, strides=strides, padding=padding, dilation=dilation, ceil_mode=ceil_mode, layout=layout))
    out_ty = _infer_max_pool2d(info)
    kh, kw = _pair(info, "pool_size")
    sh, sw = _pair(info, "strides")
    dh, dw = _pair(info, "dilation")
    pt, pl, pb, pr = _padding(info)
    oh, ow = out_ty.shape[2], out_ty.shape[3]
    # pad enough on the high side for ceil_mode windows; padding never wins a max
    hi_h = max(pb, (oh - 1) * sh + dh * (kh - 1) + 1 - x.shape[2] - pt)
    hi_w = max(pr, (ow - 1) * sw + dw * (kw - 1) + 1 - x.shape[3] - pl)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, hi_h), (pl, hi_w)), constant_values=-np.inf if dtypes.is_float_numpy(x.dtype) else np.iinfo(x.dtype).min)
    out = None
    for ki in range(kh):
        for kj in range(kw):
            patch = xp[:, :, ki * dh : ki * dh + sh * (oh - 1) + 1 : sh, kj * dw : kj * dw + sw * (ow - 1) + 1 : sw]
            out = patch if out is None else np.maximum(out, patch)
    return out.astype(x.dtype)


register(
    "nn.max_pool2d",
    num_args=1,
    attrs={
        "pool_size": AttrSpec("ints_or_int", default=(1, 1)),
        "strides": AttrSpec("ints_or_int", default=(1, 1)),
        "padding": AttrSpec("ints_or_int", default=(0, 0, 0, 0)),
        "dilation": AttrSpec("ints_or_int", default=(1, 1)),
        "ceil_mode": AttrSpec("bool", default=False),
        "layout": AttrSpec("str", default="NCHW"),
    },
    infer=_infer_max_pool2d,
    kind=FUSABLE,
    ref=_max_pool2d_ref,
    doc="2-D max pooling, NCHW or NHWC",
)

# -- average pooling ---------------------------------------------------------------------------


def avg_pool_axis(size: int, kernel: int, stride: int, dilation: int, pad_lo: int, pad_hi: int, out: int,
                  count_include_pad: bool) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis: where each window's first tap lies in the input (negative inside the
    leading padding), and how many taps it averages. TVM (and PyTorch) count padding taps when
    ``count_include_pad``, but never the taps a ceil-mode window hangs past the padding."""
    starts = np.arange(out) * stride - pad_lo
    taps = starts[:, None] + np.arange(kernel)[None, :] * dilation
    lo, hi = (-pad_lo, size + pad_hi) if count_include_pad else (0, size)
    return starts, np.maximum(((taps >= lo) & (taps < hi)).sum(axis=1), 1)


def _pool_geometry(info: CallInfo):
    """(kernel, strides, dilation, (top, left, bottom, right)) of a pooling call."""
    return _pair(info, "pool_size"), _pair(info, "strides"), _pair(info, "dilation"), _padding(info)


def _infer_avg_pool2d(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    if not x.dtype.startswith(("float", "bfloat")):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype")
    return _infer_max_pool2d(info)


def _avg_pool2d_ref(x, pool_size, strides, padding, dilation, ceil_mode, count_include_pad, layout):
    if layout != "NCHW":
        return _ref_in_nchw(_avg_pool2d_ref, x, layout, pool_size, strides, padding, dilation, ceil_mode,
                            count_include_pad, "NCHW")
    attrs = dict(pool_size=pool_size, strides=strides, padding=padding, dilation=dilation, ceil_mode=ceil_mode,
                 count_include_pad=count_include_pad, layout=layout)
    info = CallInfo("nn.avg_pool2d", (TensorType(x.shape, str(x.dtype)),), attrs)
    oh, ow = _infer_max_pool2d(info).shape[2:]
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = _pool_geometry(info)
    h, w = x.shape[2:]
    rows, div_h = avg_pool_axis(h, kh, sh, dh, pt, pb, oh, count_include_pad)
    cols, div_w = avg_pool_axis(w, kw, sw, dw, pl, pr, ow, count_include_pad)
    hi_h = max(pb, rows[-1] + dh * (kh - 1) + 1 - h)
    hi_w = max(pr, cols[-1] + dw * (kw - 1) + 1 - w)
    xp = np.pad(_acc(x), ((0, 0), (0, 0), (pt, hi_h), (pl, hi_w)))
    total = np.zeros(x.shape[:2] + (oh, ow), xp.dtype)
    for ki in range(kh):
        for kj in range(kw):
            total += xp[:, :, ki * dh : ki * dh + sh * (oh - 1) + 1 : sh, kj * dw : kj * dw + sw * (ow - 1) + 1 : sw]
    return (total / np.outer(div_h, div_w).astype(total.dtype)).astype(x.dtype)


_POOL_ATTRS = {
    "pool_size": AttrSpec("ints_or_int", default=(1, 1)),
    "strides": AttrSpec("ints_or_int", default=(1, 1)),
    "padding": AttrSpec("ints_or_int", default=(0, 0, 0, 0)),
    "dilation": AttrSpec("ints_or_int", default=(1, 1)),
    "ceil_mode": AttrSpec("bool", default=False),
}

register(
    "nn.avg_pool2d",
    num_args=1,
    attrs={**_POOL_ATTRS, "count_include_pad": AttrSpec("bool", default=False), "layout": AttrSpec("str", default="NCHW")},
    infer=_infer_avg_pool2d,
    kind=FUSABLE,
    ref=_avg_pool2d_ref,
    doc="2-D average pooling, NCHW or NHWC; padding counts in the divisor only with count_include_pad",
)


def adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Window ``i`` of ``out`` over ``size`` elements: [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    starts = (i * size) // out
    ends = -((-(i + 1) * size) // out)
    return starts, ends


def _adaptive_output(info: CallInfo, hw: tuple) -> tuple[int, int]:
    size = info.attrs["output_size"]
    if size is None:
        return hw
    oh, ow = _pair(info, "output_size")
    if oh < 1 or ow < 1:
        raise info.error(f"output_size {[oh, ow]} must be positive")
    return oh, ow


def _infer_adaptive_avg_pool2d(info: CallInfo) -> TensorType:
    layout = _check_layout(info, "layout")
    x = info.tensor(0)
    if x.ndim != 4:
        raise info.error(f"operand {info.operand(0)} must have rank 4")
    if not x.dtype.startswith(("float", "bfloat")):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype")
    n, c, h, w = _as_nchw(x.shape, layout)
    for d in (h, w):
        if not isinstance(d, int):
            raise info.error(f"spatial dimension '{d}' of {info.operand(0)} must be static")
    return TensorType(_from_nchw((n, c) + _adaptive_output(info, (h, w)), layout), x.dtype)


def _adaptive_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM 0.27 gives windows whose length varies with the output index along both axes (neither
    # size divides evenly) an extent AnnotateTIROpPattern cannot read: Opaque; one even axis suffices
    axes = layout_axes(info.attrs["layout"])[2:]
    (h, w), (oh, ow) = ([t.shape[a] for a in axes] for t in (info.tensor(0), out))
    return OpPatternKind.OPAQUE if h % oh and w % ow else FUSABLE


def _adaptive_avg_pool2d_ref(x, output_size, layout):
    if layout != "NCHW":
        return _ref_in_nchw(_adaptive_avg_pool2d_ref, x, layout, output_size, "NCHW")
    info = CallInfo("nn.adaptive_avg_pool2d", (TensorType(x.shape, str(x.dtype)),), dict(output_size=output_size, layout=layout))
    oh, ow = _infer_adaptive_avg_pool2d(info).shape[2:]
    z = _acc(x)
    out = np.empty(x.shape[:2] + (oh, ow), z.dtype)
    for i, (h0, h1) in enumerate(zip(*adaptive_windows(x.shape[2], oh))):
        for j, (w0, w1) in enumerate(zip(*adaptive_windows(x.shape[3], ow))):
            out[:, :, i, j] = z[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return out.astype(x.dtype)


register(
    "nn.adaptive_avg_pool2d",
    num_args=1,
    attrs={"output_size": AttrSpec("ints_or_int", default=None), "layout": AttrSpec("str", default="NCHW")},
    infer=_infer_adaptive_avg_pool2d,
    kind=_adaptive_kind,
    ref=_adaptive_avg_pool2d_ref,
    doc="2-D average pooling to a given output size (no output_size: the input's), NCHW or NHWC",
)
