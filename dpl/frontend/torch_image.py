"""The ATen ops of interpolation, convolutions of any rank and group/instance normalisation,
for the torch.export table (:mod:`dpl.frontend.torch_ops`, which imports this module).

Interpolation is ``image.resize``: torch's nearest is ONNX's asymmetric coordinates with floor
rounding, nearest-exact half-pixel coordinates rounded half up, linear and cubic half-pixel
coordinates (``align_corners=False``) or corner-aligned ones. A given scale factor, not the
ratio of the sizes, places the samples (torch's ``scales`` arguments: ``1 / scale_factor``
unless ``recompute_scale_factor``, which exports sizes and no scales), except where torch itself
ignores it (an axis of its own size, nearest's twice it: ``size_shortcuts``). Over a symbolic axis the output size is a dim: the graph's (``h * 2``) or
``floor(h * scale)`` (:func:`dpl.ops.image.scaled_size`). Norms of vectors are exact decompositions into fusable ops (``sqrt(sum(x * x))``),
which FuseOps groups as it groups any reduction with its epilogue.
"""

from __future__ import annotations

import math

import numpy as np

from dpl.frontend.errors import FrontendError
from dpl.ir.dims import DimError, DimExpr
from dpl.ops.image import scaled_size

# ATen overload -> translation; torch_ops merges this table into its own (the import goes that way)
ATEN_OPS: dict = {}


def aten(*names: str):
    def register(fn):
        for name in names:
            ATEN_OPS[f"aten.{name}"] = fn
        return fn

    return register


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


# -- interpolation -----------------------------------------------------------------------------


def _resize(cx, input, output_size, scales, rank: int, method: str, mode: str, rounding: str = "round_prefer_floor"):
    x = cx.tensor(input)
    if x.ty.ndim != rank + 2:
        raise FrontendError(f"a {rank}-D interpolation needs a rank-{rank + 2} input, got {x.ty}")
    spatial = x.ty.shape[2:]
    scales = None if scales is None or all(s is None for s in _as_list(scales)) else [float(s) for s in _as_list(scales)]
    if scales is not None and len(scales) == 1:
        scales = scales * rank
    if output_size is None:
        if scales is None:
            raise FrontendError("an interpolation needs output_size or scale_factors")
        try:
            sizes = [scaled_size(d, s) for d, s in zip(spatial, scales)]
        except DimError as err:
            raise FrontendError(f"the interpolation's output size: {err.message}",
                                hint="pass size= computed from the input's shape (x.shape[2] * 3 // 2)") from None
    else:
        sizes = [_size(d) for d in _as_list(output_size)]  # ints, or dims the graph computed (h * 2)
    if mode == "align_corners" or scales is None or any(s is None or s <= 0 for s in scales):
        scales = None  # torch places the samples by the ratio of the sizes
    # torch's nearest copies an axis of its own size and reads o >> 1 at twice it, its linear
    # copies too, whatever the scale; nearest-exact and cubic have no such shortcut
    shortcuts = method == "linear" or (method == "nearest" and mode == "asymmetric")
    return cx.call("image.resize", x, size=sizes, scales=scales, method=method, coordinate_transformation_mode=mode,
                   rounding_method=rounding, size_shortcuts=shortcuts)


def _size(d):
    if isinstance(d, bool) or not isinstance(d, (int, str, DimExpr)):
        raise FrontendError(f"the interpolation's output size {d!r} is not a size")
    return d


def _nearest(rank: int, exact: bool):
    mode, rounding = ("half_pixel", "round_prefer_ceil") if exact else ("asymmetric", "floor")

    def vec(cx, input, output_size, scale_factors):
        return _resize(cx, input, output_size, scale_factors, rank, "nearest", mode, rounding)

    def default(cx, self, output_size, *scales):
        return _resize(cx, self, output_size, list(scales) or None, rank, "nearest", mode, rounding)

    return vec, default


def _interpolating(rank: int, method: str):
    def vec(cx, input, output_size, align_corners, scale_factors):
        mode = "align_corners" if align_corners else "half_pixel"
        return _resize(cx, input, output_size, scale_factors, rank, method, mode)

    def default(cx, self, output_size, align_corners, *scales):
        mode = "align_corners" if align_corners else "half_pixel"
        return _resize(cx, self, output_size, list(scales) or None, rank, method, mode)

    return vec, default


for _rank, _name in ((1, "1d"), (2, "2d"), (3, "3d")):
    for _exact, _prefix in ((False, "upsample_nearest"), (True, "_upsample_nearest_exact")):
        _vec, _default = _nearest(_rank, _exact)
        aten(f"{_prefix}{_name}.vec")(_vec)
        aten(f"{_prefix}{_name}.default")(_default)
for _op, _rank, _method in (("upsample_linear1d", 1, "linear"), ("upsample_bilinear2d", 2, "linear"),
                            ("upsample_trilinear3d", 3, "linear"), ("upsample_bicubic2d", 2, "cubic")):
    _vec, _default = _interpolating(_rank, _method)
    aten(f"{_op}.vec")(_vec)
    aten(f"{_op}.default")(_default)

# -- convolutions of any rank ------------------------------------------------------------------


def _per_axis(value, rank: int) -> list[int]:
    values = [int(v) for v in _as_list(value)]
    return values * rank if len(values) == 1 else values


def conv(cx, input, weight, bias, stride, padding, dilation, groups, transposed=False, output_padding=0):
    """Any convolution: 2-D forward ones stay ``nn.conv2d`` (with its CPU fast paths), 1-D
    ones over a static length become it too (``[N, C, 1, L]``), the rest their own ops."""
    x, w = cx.tensor(input), cx.tensor(weight)
    rank = x.ty.ndim - 2
    if rank not in (1, 2, 3) or w.ty.ndim != x.ty.ndim:
        raise FrontendError(f"only batched 1-D, 2-D and 3-D convolutions are supported, got input {x.ty} and "
                            f"weight {w.ty}")
    stride, dilation = _per_axis(stride, rank), _per_axis(dilation, rank)
    if isinstance(padding, str):
        padding = _string_padding(cx, padding, w, stride, dilation)
    else:
        padding = _per_axis(padding, rank)
    channels = 1 if transposed else 0
    if transposed:
        out = cx.call(f"nn.conv{rank}d_transpose", x, w, strides=stride, padding=padding, dilation=dilation,
                      output_padding=_per_axis(output_padding, rank), groups=int(groups))
    elif rank == 1 and isinstance(x.ty.shape[2], int):
        lo, hi = (padding[0], padding[0]) if len(padding) == 1 else (padding[0], padding[1])
        out = cx.call("nn.conv2d", cx.call("expand_dims", x, axis=[2]), cx.call("expand_dims", w, axis=[2]),
                      strides=[1, stride[0]], padding=[0, lo, 0, hi], dilation=[1, dilation[0]], groups=int(groups))
        out = cx.call("squeeze", out, axis=[2])
    elif rank == 2:
        out = cx.call("nn.conv2d", x, w, strides=stride, padding=padding, dilation=dilation, groups=int(groups))
    else:
        out = cx.call(f"nn.conv{rank}d", x, w, strides=stride, padding=padding, dilation=dilation, groups=int(groups))
    if bias is None:
        return out
    b = cx.tensor(bias)
    return cx.call("add", out, cx.reshape(b, [1, out.ty.shape[1]] + [1] * rank))


def _string_padding(cx, padding: str, w, stride, dilation) -> list[int]:
    """torch's "valid" and "same" (stride 1: the extra padding of an even window at the end)."""
    rank = len(stride)
    if padding == "valid":
        return [0] * (2 * rank)
    if padding != "same" or any(s != 1 for s in stride):
        raise FrontendError(f"argument 'padding={padding!r}' is not supported with stride {stride}")
    total = [d * (cx.static(k, "a kernel size") - 1) for d, k in zip(dilation, w.ty.shape[2:])]
    return [t // 2 for t in total] + [t - t // 2 for t in total]


@aten("conv1d.default", "conv1d.padding", "conv3d.default", "conv3d.padding")
def _conv_nd(cx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return conv(cx, input, weight, bias, stride, padding, dilation, groups)


@aten("conv_transpose1d.default", "conv_transpose2d.input", "conv_transpose3d.input")
def _conv_transpose(cx, input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return conv(cx, input, weight, bias, stride, padding, dilation, groups, True, output_padding)


# -- normalisations ----------------------------------------------------------------------------


def _channel_params(cx, x, weight, bias):
    c = cx.static(x.ty.shape[1], "the channel dimension")
    dtype = x.ty.dtype
    gamma = cx.scalar(np.ones(c), dtype) if weight is None else cx.cast(cx.tensor(weight), dtype)
    beta = cx.scalar(np.zeros(c), dtype) if bias is None else cx.cast(cx.tensor(bias), dtype)
    return c, gamma, beta


@aten("group_norm.default")
def _group_norm(cx, input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    x = cx.tensor(input)
    _, gamma, beta = _channel_params(cx, x, weight, bias)
    return cx.call("nn.group_norm", x, gamma, beta, num_groups=int(num_groups), epsilon=float(eps))


@aten("native_group_norm.default")
def _native_group_norm(cx, input, weight, bias, N, C, HxW, group, eps):
    from dpl.frontend.torch_graph import Unavailable

    out = _group_norm(cx, input, group, weight, bias, eps)
    return (out, Unavailable("group_norm's saved mean"), Unavailable("group_norm's saved inverse deviation"))


@aten("instance_norm.default")
def _instance_norm(cx, input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps,
                   cudnn_enabled=True):
    if not use_input_stats:
        raise FrontendError("instance_norm with use_input_stats=False (running statistics) is not supported",
                            hint="nn.InstanceNorm*d(track_running_stats=True) in eval mode normalises with stored statistics")
    x = cx.tensor(input)
    c, gamma, beta = _channel_params(cx, x, weight, bias)
    return cx.call("nn.group_norm", x, gamma, beta, num_groups=c, epsilon=float(eps))


@aten("linalg_vector_norm.default")
def _vector_norm(cx, self, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The norm as the ops it is made of: ``sqrt(sum(x * x))`` for ord 2, ``sum(|x|)`` for 1,
    ``max``/``min`` of ``|x|`` for +-inf, the count of non-zeros for 0, ``sum(|x|^p)^(1/p)``
    otherwise, each a reduction whose epilogue FuseOps fuses."""
    out_dtype = cx.out_dtype
    x = cx.cast(cx.tensor(self), out_dtype)
    axes = None if dim is None or len(_as_list(dim)) == 0 else [int(d) for d in _as_list(dim)]
    keep = bool(keepdim)
    ord = float(ord)
    if ord == 2:
        return cx.call("sqrt", cx.call("sum", cx.call("multiply", x, x), axis=axes, keepdims=keep))
    a = cx.call("abs", x)
    if ord == 1:
        return cx.call("sum", a, axis=axes, keepdims=keep)
    if ord == math.inf:
        return cx.call("max", a, axis=axes, keepdims=keep)
    if ord == -math.inf:
        return cx.call("min", a, axis=axes, keepdims=keep)
    if ord == 0:
        nonzero = cx.call("astype", cx.call("not_equal", x, cx.scalar(0, out_dtype)), dtype=out_dtype)
        return cx.call("sum", nonzero, axis=axes, keepdims=keep)
    powered = cx.call("power", a, cx.scalar(ord, out_dtype))
    return cx.call("power", cx.call("sum", powered, axis=axes, keepdims=keep), cx.scalar(1.0 / ord, out_dtype))
