"""Ops of vision and speech models beyond the 2-D core: interpolation (``image.resize``),
convolutions of other ranks (``nn.conv1d``, ``nn.conv3d``), transposed convolutions
(``nn.conv{1,2,3}d_transpose``) and group normalisation (``nn.group_norm``, instance norm being
one group per channel).

Shapes: batch, channel and spatial dims may be symbolic; the output's spatial dims are then
dimension expressions (:mod:`dpl.ir.dims`: ``(n + 2p - d*(k-1) - 1) // s + 1``, transposed
``(n - 1) * s - 2p + d*(k-1) + output_padding + 1``), which run time checks are sizes (a window
that does not fit is an error there, as it is a type error for a static size). A group norm
needs its channels static.

A resize's ``size`` holds dims: over a symbolic axis the output is an expression (``h * 2``
for a scale of 2, :func:`scaled_size`) or a size the graph computed. The per-axis arithmetic
(which input positions each output position reads, with which weights) is :func:`resize_taps`,
in float64, which the NumPy reference runs at the bound sizes; the kernel lowering
(``dpl.kernel.rules_image``) reads it as tables where the axis is static and computes the same
float64 arithmetic in the kernel where it is not, so both read the same rows."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.ir.dims import Dim, DimError, add, floordiv, mul, sub, text
from dpl.ir.types import TensorType
from dpl.ops._shapes import same_dtype
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

FUSABLE = OpPatternKind.OUT_EWISE_FUSABLE


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _acc_numpy(x: np.ndarray) -> np.ndarray:
    return x.astype(dtypes.accumulator_numpy(x.dtype))


# -- resize ------------------------------------------------------------------------------------

RESIZE_METHODS = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
ROUNDING_METHODS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# a scale over a symbolic axis must be p / 2**k with p below this: then ``floor(n * scale)`` in
# float64, as torch and ONNX compute it, is exact for every n below 2**53 / p, and equals (n * p) // 2**k
_MAX_SCALE_NUMERATOR = 2**20


def scaled_size(d: Dim, scale: float) -> Dim:
    """``floor(d * scale)``, the size torch and ONNX give an axis of size ``d`` resized by
    ``scale``: an int for a static ``d``, else the dim ``(d * p) // q`` where ``scale`` is the
    float ``p / q`` exactly, ``q`` a power of two (2, 1.5, 0.25; a scale such as 1.7 is no
    such fraction, and its rounded product no dim expression: a DimError)."""
    if not (scale > 0 and math.isfinite(scale)):
        raise DimError(f"scale {scale} must be positive and finite")
    if isinstance(d, int):
        return int(math.floor(d * scale))
    exact = Fraction(scale)
    q = exact.denominator
    if q & (q - 1) or exact.numerator >= _MAX_SCALE_NUMERATOR:
        raise DimError(f"the symbolic dim '{text(d)}' scaled by {scale}: floor({text(d)} * {scale}) is no dim expression "
                       "(a scale over a symbolic axis must be a fraction over a power of two, such as 2, 1.5 or 0.25)")
    return floordiv(mul(d, exact.numerator), q)


def source_coordinates(in_size: int, out_size: int, scale: float | None, mode: str) -> np.ndarray:
    """Where each output position lies in the input, in float64, as ONNX's Resize defines it;
    ``scale`` is out/in (the given scale factor, else the ratio of the sizes). With a given
    scale, corners align over the unrounded resized length ``in * scale``, as onnx's reference
    computes it; a single output sample of ``pytorch_half_pixel`` is at 0 (the spec and
    onnxruntime; onnx's reference puts it at -0.5)."""
    o = np.arange(out_size, dtype=np.float64)
    s = out_size / in_size if scale is None else scale
    if mode == "align_corners":
        length = out_size if scale is None else in_size * scale
        return o * ((in_size - 1) / (length - 1)) if length != 1 else np.zeros(out_size)
    if mode == "asymmetric":
        return o / s
    x = (o + 0.5) / s - 0.5
    if mode == "pytorch_half_pixel" and out_size == 1:
        return np.zeros(1)
    return x


def _cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 around a point ``t`` in [0, 1)."""
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def size_shortcut(out_size: int, in_size: int, method: str) -> float | None:
    """The step between source coordinates where ``size_shortcuts`` (torch's linear and nearest
    kernels) ignores the scale: 1 (a copy) for an axis resized to its own size, 1/2 for nearest
    to twice its size (torch reads ``o >> 1``); None elsewhere."""
    if out_size == in_size:
        return 1.0
    return 0.5 if method == "nearest" and out_size == 2 * in_size else None


def resize_taps(in_size: int, out_size: int, scale: float | None, method: str, mode: str, rounding: str,
                cubic_alpha: float, cubic_exclude: bool, shortcuts: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Along one axis: ``(index, weight)``, each [out_size, taps]: output ``o`` is the sum over
    taps of ``weight[o, t] * x[index[o, t]]``. Indices are clamped into the input (ONNX's edge
    padding, torch's bounded reads); ``cubic_exclude`` zeroes the taps outside it and rescales
    the others to sum to 1 (ONNX's ``exclude_outside``); ``shortcuts`` is :func:`size_shortcut`."""
    step = size_shortcut(out_size, in_size, method) if shortcuts else None
    if step is None:
        x = source_coordinates(in_size, out_size, scale, mode)
    else:
        x = np.arange(out_size, dtype=np.float64) * step
    if method == "nearest":
        if rounding == "round_prefer_floor":
            i = np.ceil(x - 0.5)
        elif rounding == "round_prefer_ceil":
            i = np.floor(x + 0.5)
        else:
            i = np.floor(x) if rounding == "floor" else np.ceil(x)
        return np.clip(i, 0, in_size - 1).astype(np.int64)[:, None], np.ones((out_size, 1))
    f = np.floor(x)
    t = x - f
    if method == "linear":
        offsets, weights = np.array([0, 1]), np.stack([1 - t, t], axis=1)
    else:
        offsets, weights = np.array([-1, 0, 1, 2]), _cubic_weights(t, cubic_alpha)
    raw = f.astype(np.int64)[:, None] + offsets[None, :]
    if method == "cubic" and cubic_exclude:
        weights = np.where((raw >= 0) & (raw < in_size), weights, 0.0)
        with np.errstate(invalid="ignore"):  # no tap inside (far outside the input): NaN, as ONNX's 0 / 0
            weights = weights / weights.sum(axis=1, keepdims=True)
    return np.clip(raw, 0, in_size - 1), weights


def _resize_geometry(info: CallInfo):
    """(first resized axis, [(in, out, scale)] per resized axis), checked."""
    x = info.tensor(0)
    size, scales = info.attrs["size"], info.attrs["scales"]
    k = len(size)
    if not 1 <= k <= x.ndim:
        raise info.error(f"attribute 'size' {list(size)} must name 1 to {x.ndim} trailing axes of {info.operand(0)}")
    if scales is not None and len(scales) != k:
        raise info.error(f"attribute 'scales' {list(scales)} must have one value per resized axis ({k})")
    first = x.ndim - k
    axes = []
    for j, out in enumerate(size):
        d = x.shape[first + j]
        if isinstance(out, int) and out < 1:
            raise info.error(f"output size {out} of axis {first + j} must be positive")
        if isinstance(d, int) and d < 1:  # a symbolic one is checked at run time (a kernel's requires)
            raise info.error(f"axis {first + j} of {info.operand(0)} is empty; there is nothing to interpolate")
        scale = None if scales is None else scales[j]
        if scale is not None and not (scale > 0 and math.isfinite(scale)):
            raise info.error(f"scale {scale} of axis {first + j} must be positive and finite")
        axes.append((d, out, scale))
    return first, axes


def _infer_resize(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    a = info.attrs
    for key, allowed in (("method", RESIZE_METHODS), ("coordinate_transformation_mode", COORDINATE_MODES),
                         ("rounding_method", ROUNDING_METHODS)):
        if a[key] not in allowed:
            raise info.error(f"attribute '{key}' must be one of {', '.join(allowed)}, got {a[key]!r}")
    if a["method"] != "nearest" and not _is_float(x.dtype):
        raise info.error(f"{a['method']} interpolation of {info.operand(0)} needs a floating-point dtype")
    first, _ = _resize_geometry(info)
    return TensorType(x.shape[:first] + tuple(a["size"]), x.dtype)


def resize_axes(x_shape: tuple, attrs) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(axis, index, weight)`` for each resized axis of an input of (static) ``x_shape``,
    ``attrs["size"]`` bound to ints. An empty input axis is a DplError: nothing to interpolate."""
    size, scales = attrs["size"], attrs["scales"]
    first = len(x_shape) - len(size)
    for j, out in enumerate(size):
        if x_shape[first + j] < 1:
            raise DplError(f"image.resize: axis {first + j} of the input {list(x_shape)} is empty; there is nothing "
                           f"to interpolate into {out} positions")
    return [(first + j, *resize_taps(x_shape[first + j], out, None if scales is None else scales[j], attrs["method"],
                                     attrs["coordinate_transformation_mode"], attrs["rounding_method"],
                                     attrs["cubic_alpha"], attrs["cubic_exclude"], attrs["size_shortcuts"]))
            for j, out in enumerate(size)]


def _resize_ref(x, **attrs):
    y = x if attrs["method"] == "nearest" else _acc_numpy(x)
    for axis, index, weight in resize_axes(x.shape, attrs):
        if attrs["method"] == "nearest":
            y = np.take(y, index[:, 0], axis=axis)
            continue
        w = weight.astype(y.dtype)
        shape = [1] * y.ndim
        shape[axis] = -1
        total = None
        for t in range(index.shape[1]):
            term = np.take(y, index[:, t], axis=axis) * w[:, t].reshape(shape)
            total = term if total is None else total + term
        y = total
    return y.astype(x.dtype)


register(
    "image.resize",
    num_args=1,
    attrs={
        "size": AttrSpec("dims"),
        "scales": AttrSpec("floats", default=None),
        "method": AttrSpec("str", default="nearest"),
        "coordinate_transformation_mode": AttrSpec("str", default="half_pixel"),
        "rounding_method": AttrSpec("str", default="round_prefer_floor"),
        "cubic_alpha": AttrSpec("float", default=-0.75),
        "cubic_exclude": AttrSpec("bool", default=False),
        # torch's linear and nearest kernels: an axis resized to its own size is copied, nearest to
        # twice its size reads o >> 1, whatever the scale (a run-time test over symbolic sizes)
        "size_shortcuts": AttrSpec("bool", default=False),
    },
    infer=_infer_resize,
    kind=OpPatternKind.INJECTIVE,
    ref=_resize_ref,
    doc="resize the trailing len(size) axes to size (dims: h * 2 over a symbolic h) (nearest, linear or cubic; "
        "ONNX Resize's coordinate modes; scales, out/in per axis, for the coordinates where given)",
)

# -- convolutions of any rank, and transposed ones ---------------------------------------------


def conv_geometry(info_or_attrs, rank: int, error=None):
    """(strides, dilation, pads_lo, pads_hi[, output_padding]) of an n-D convolution's attributes,
    each a list of ``rank`` values; one value stands for all, padding may also give lo and hi."""
    attrs = info_or_attrs.attrs if isinstance(info_or_attrs, CallInfo) else info_or_attrs
    error = error or (lambda m: ValueError(m))

    def per_axis(key):
        v = attrs[key]
        v = (v,) if isinstance(v, int) else tuple(v)
        if len(v) == 1:
            v = v * rank
        if len(v) != rank:
            raise error(f"attribute '{key}' must have 1 or {rank} values, got {list(v)}")
        return list(v)

    p = attrs["padding"]
    p = (p,) if isinstance(p, int) else tuple(p)
    if len(p) == 1:
        p = p * (2 * rank)
    elif len(p) == rank:
        p = p * 2
    if len(p) != 2 * rank:
        raise error(f"attribute 'padding' must have 1, {rank} or {2 * rank} values, got {list(attrs['padding'])}")
    out = [per_axis("strides"), per_axis("dilation"), list(p[:rank]), list(p[rank:])]
    if "output_padding" in attrs:
        out.append(per_axis("output_padding"))
    return out


def _conv_rank(op: str) -> int:
    return int(op.split(".")[1][4])  # nn.conv3d_transpose -> 3


def _infer_conv(info: CallInfo) -> TensorType:
    rank = _conv_rank(info.op)
    transposed = info.op.endswith("_transpose")
    x, w = info.tensor(0), info.tensor(1)
    if x.ndim != rank + 2 or w.ndim != rank + 2:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} must have rank {rank + 2}")
    if x.dtype != w.dtype:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} have different dtypes")
    if x.dtype == "bool":
        raise info.error(f"operand {info.operand(0)} must have a numeric dtype, not bool")
    groups = info.attrs["groups"]
    if groups < 1:
        raise info.error(f"groups must be positive, got {groups}")
    geometry = conv_geometry(info, rank, info.error)
    strides, dilation, lo, hi = geometry[:4]
    if min(strides) < 1 or min(dilation) < 1 or min(lo + hi) < 0:
        raise info.error(f"strides {strides} and dilation {dilation} must be positive and padding {lo + hi} not negative")
    c, kernel = x.shape[1], w.shape[2:]
    for k in kernel:
        if not isinstance(k, int) or k < 1:
            raise info.error(f"window {list(kernel)} of {info.operand(1)} must be static and positive")
    if transposed:  # weight [C_in, C_out / groups, k...]
        cin, o = w.shape[0], w.shape[1]
        if isinstance(c, int) and isinstance(cin, int) and c != cin:
            raise info.error(f"input channels {c} of {info.operand(0)} do not match {cin} of {info.operand(1)}")
        if isinstance(cin, int) and cin % groups:
            raise info.error(f"input channels {cin} are not divisible by groups {groups}")
        out_channels = mul(o, groups)
    else:  # weight [C_out, C_in / groups, k...]
        out_channels, i = w.shape[0], w.shape[1]
        if isinstance(c, int) and isinstance(i, int) and c != i * groups:
            raise info.error(f"input channels {c} of {info.operand(0)} do not match {i} x groups {groups} of {info.operand(1)}")
        if isinstance(out_channels, int) and out_channels % groups:
            raise info.error(f"output channels {out_channels} are not divisible by groups {groups}")
    spatial = []
    for a in range(rank):
        size, k, s, d, p0, p1 = x.shape[2 + a], kernel[a], strides[a], dilation[a], lo[a], hi[a]
        span = d * (k - 1)
        if transposed:
            op_ = geometry[4][a]
            if not 0 <= op_ < max(s, d):
                raise info.error(f"output_padding {op_} of axis {2 + a} must be below the stride {s} or the dilation {d}")
        if not isinstance(size, int):  # the formula as a dimension; run time checks the window fits
            if transposed:
                spatial.append(add(mul(sub(size, 1), s), span + geometry[4][a] + 1 - p0 - p1))
            else:
                spatial.append(add(floordiv(add(size, p0 + p1 - span - 1), s), 1))
            continue
        n = (size - 1) * s - p0 - p1 + span + geometry[4][a] + 1 if transposed else (size + p0 + p1 - span - 1) // s + 1
        if n < 1 or (not transposed and size + p0 + p1 < span + 1):
            raise info.error(f"window {k} (dilation {d}) does not fit axis {2 + a} of {info.operand(0)} with padding "
                             f"({p0}, {p1}): no output")
        spatial.append(n)
    return TensorType((x.shape[0], out_channels, *spatial), info.attrs["out_dtype"] or x.dtype)


def _conv_ref_of(rank: int, transposed: bool):
    def ref(x, w, **attrs):
        strides, dilation, lo, hi = conv_geometry(attrs, rank)[:4]
        groups = attrs["groups"]
        acc = dtypes.accumulator_numpy(x.dtype)
        xf, wf = x.astype(acc), w.astype(acc)
        if transposed:
            out = _conv_transpose(xf, wf, strides, dilation, lo, hi, conv_geometry(attrs, rank)[4], groups)
        else:
            out = _conv_forward(xf, wf, strides, dilation, lo, hi, groups)
        return out.astype(attrs["out_dtype"] or x.dtype)

    return ref


def _conv_forward(x, w, strides, dilation, lo, hi, groups):
    rank = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(lo, hi)))
    kernel = w.shape[2:]
    outs = [(xp.shape[2 + a] - dilation[a] * (kernel[a] - 1) - 1) // strides[a] + 1 for a in range(rank)]
    o, ci = w.shape[:2]
    og = o // groups
    out = np.zeros((x.shape[0], o, *outs), x.dtype)
    for g in range(groups):
        xs = xp[:, g * ci : (g + 1) * ci]
        for k in itertools.product(*(range(n) for n in kernel)):
            window = tuple(slice(k[a] * dilation[a], k[a] * dilation[a] + strides[a] * (outs[a] - 1) + 1, strides[a])
                           for a in range(rank))
            patch = xs[(slice(None), slice(None)) + window]
            out[:, g * og : (g + 1) * og] += np.tensordot(patch, w[(slice(g * og, (g + 1) * og), slice(None)) + k],
                                                          axes=([1], [1])).transpose(0, rank + 1, *range(1, rank + 1))
    return out


def _conv_transpose(x, w, strides, dilation, lo, hi, output_padding, groups):
    """The scatter-add: input position ``i`` and tap ``k`` add into output ``i*s + k*d - lo``."""
    rank = x.ndim - 2
    sizes, kernel = x.shape[2:], w.shape[2:]
    full = [(sizes[a] - 1) * strides[a] + dilation[a] * (kernel[a] - 1) + 1 + output_padding[a] for a in range(rank)]
    cin, og = w.shape[:2]
    ci = cin // groups
    out = np.zeros((x.shape[0], og * groups, *full), x.dtype)
    for g in range(groups):
        xs = x[:, g * ci : (g + 1) * ci]
        for k in itertools.product(*(range(n) for n in kernel)):
            window = tuple(slice(k[a] * dilation[a], k[a] * dilation[a] + strides[a] * (sizes[a] - 1) + 1, strides[a])
                           for a in range(rank))
            contrib = np.tensordot(xs, w[(slice(g * ci, (g + 1) * ci), slice(None)) + k], axes=([1], [0]))
            out[(slice(None), slice(g * og, (g + 1) * og)) + window] += contrib.transpose(0, rank + 1, *range(1, rank + 1))
    crop = tuple(slice(lo[a], full[a] - hi[a]) for a in range(rank))
    return out[(slice(None), slice(None)) + crop]


def _conv_attrs(rank: int, transposed: bool) -> dict:
    attrs = {
        "strides": AttrSpec("ints_or_int", default=(1,) * rank),
        "padding": AttrSpec("ints_or_int", default=(0,) * (2 * rank)),
        "dilation": AttrSpec("ints_or_int", default=(1,) * rank),
    }
    if transposed:
        attrs["output_padding"] = AttrSpec("ints_or_int", default=(0,) * rank)
    attrs["groups"] = AttrSpec("int", default=1)
    attrs["out_dtype"] = AttrSpec("dtype", default=None)
    return attrs


_LAYOUT = {1: ("NCW", "W"), 2: ("NCHW", "HW"), 3: ("NCDHW", "DHW")}
for _rank, _transposed in ((1, False), (3, False), (1, True), (2, True), (3, True)):
    _data, _win = _LAYOUT[_rank]
    register(
        f"nn.conv{_rank}d" + ("_transpose" if _transposed else ""),
        num_args=2,
        attrs=_conv_attrs(_rank, _transposed),
        infer=_infer_conv,
        kind=FUSABLE,
        ref=_conv_ref_of(_rank, _transposed),
        doc=(f"{_rank}-D transposed convolution (the gradient of a convolution), {_data} data and IO{_win} weights"
             if _transposed else f"{_rank}-D convolution, {_data} data and OI{_win} weights"),
    )

# -- group normalisation -----------------------------------------------------------------------


def _infer_group_norm(info: CallInfo) -> TensorType:
    x = info.tensor(0)
    if x.ndim < 2:
        raise info.error(f"operand {info.operand(0)} must have rank >= 2 (N, C, ...)")
    if not _is_float(x.dtype):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype")
    c, groups = x.shape[1], info.attrs["num_groups"]
    if not isinstance(c, int):
        raise info.error(f"the channel dim '{c}' of {info.operand(0)} must be static to be split into groups")
    if groups < 1 or c % groups:
        raise info.error(f"{c} channels of {info.operand(0)} cannot be split into {groups} groups")
    for i in (1, 2):
        p = info.tensor(i)
        if p.shape != (c,):
            raise info.error(f"operand {info.operand(i)} must have shape [{c}] (the channels of {info.operand(0)})")
    same_dtype(info)
    return x


def _group_norm_ref(x, gamma, beta, num_groups, epsilon, center, scale):
    n, c = x.shape[:2]
    z = _acc_numpy(x).reshape((n, num_groups, c // num_groups, *x.shape[2:]))
    axes = tuple(range(2, z.ndim))
    mu = z.mean(axis=axes, keepdims=True)
    var = ((z - mu) ** 2).mean(axis=axes, keepdims=True)
    y = ((z - mu) / np.sqrt(var + np.asarray(epsilon, z.dtype))).reshape(x.shape)
    channel = (1, c) + (1,) * (x.ndim - 2)
    if scale:
        y = y * _acc_numpy(gamma).reshape(channel)
    if center:
        y = y + _acc_numpy(beta).reshape(channel)
    return y.astype(x.dtype)


def _group_norm_kind(info: CallInfo, out) -> OpPatternKind:
    # TVM 0.27 legalizes a group norm over a symbolic shape into a PrimFunc whose reshaped
    # statistics it cannot analyse: Opaque; over a static shape, a reduction with an
    # elementwise output block (tests/test_kinds_tvm.py)
    return FUSABLE if info.tensor(0).is_static else OpPatternKind.OPAQUE


register(
    "nn.group_norm",
    num_args=3,
    attrs={
        "num_groups": AttrSpec("int"),
        "epsilon": AttrSpec("float", default=1e-5),
        "center": AttrSpec("bool", default=True),
        "scale": AttrSpec("bool", default=True),
    },
    infer=_infer_group_norm,
    kind=_group_norm_kind,
    ref=_group_norm_ref,
    doc="(x - mean) / sqrt(var + eps) * gamma + beta, the statistics over each group of channels (axis 1) and "
        "every axis after it; instance norm is one group per channel",
)
