"""ONNX translations of interpolation, transposed convolution and group/instance normalisation,
and the norms of vectors (``ReduceL1``, ``ReduceL2``, ``ReduceSumSquare``): entries of the op
table (:data:`TABLE`, merged into :data:`dpl.frontend.onnx_ops.ONNX_OPS`).

``Resize`` is ``image.resize`` over the axes whose size changes (leading axes must keep theirs);
over a symbolic axis the output size is a dim, the ``sizes`` input's (Shape arithmetic) or
``floor(n * scale)`` (:func:`dpl.ops.image.scaled_size`). The norms are exact decompositions into fusable ops (``sqrt(sum(x * x))``)."""

from __future__ import annotations

import numpy as np

from dpl.frontend.onnx_node import NodeContext
from dpl.ir.dims import DimError
from dpl.ir.expr import Constant
from dpl.ops.image import scaled_size

# -- Resize ------------------------------------------------------------------------------------

_MODES = {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}
_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def resize(ctx: NodeContext):
    x = ctx.input(0)
    shape = x.ty.shape
    mode = ctx.attr("mode", "nearest")
    if mode not in _MODES:
        raise ctx.unsupported("mode", mode, "nearest, linear or cubic")
    coordinates = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coordinates not in _COORDINATES:
        raise ctx.unsupported("coordinate_transformation_mode", coordinates, ", ".join(_COORDINATES))
    rounding = ctx.attr("nearest_mode", "round_prefer_floor")
    if rounding not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise ctx.unsupported("nearest_mode", rounding, "round_prefer_floor, round_prefer_ceil, floor or ceil")
    if ctx.attr("antialias", 0):
        raise ctx.unsupported("antialias", 1, "0")
    if ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ctx.unsupported("keep_aspect_ratio_policy", ctx.attr("keep_aspect_ratio_policy"), "stretch")
    ctx.attr("extrapolation_value", 0.0)  # only tf_crop_and_resize reads it
    # read before a resize to the input's own size returns it (torch.onnx writes these always)
    cubic_alpha, cubic_exclude = float(ctx.attr("cubic_coeff_a", -0.75)), bool(ctx.attr("exclude_outside", 0))
    axes = [ctx.axis(a, x.ty.ndim) for a in ctx.attr("axes", list(range(x.ty.ndim)))]
    scales = sizes = None
    if ctx.has_input(3):
        sizes = ctx.dims_input(3, "sizes")  # Shape entries may be symbolic: the batch kept as it is
    elif ctx.has_input(2) and ctx.constant(2, "scales").size:
        scales = [float(s) for s in ctx.constant(2, "scales").reshape(-1)]
    else:
        raise ctx.error("Resize needs scales or sizes")
    given = sizes if sizes is not None else scales
    if len(given) != len(axes):
        raise ctx.error(f"{'sizes' if sizes is not None else 'scales'} {given} do not match the axes {axes}")
    full_sizes, full_scales = list(shape), [1.0] * x.ty.ndim
    for k, a in enumerate(axes):
        if sizes is not None:  # the scale is the ratio of the sizes, which the op computes
            full_sizes[a] = sizes[k]
            continue
        full_scales[a] = scales[k]
        if scales[k] != 1.0:
            try:
                full_sizes[a] = scaled_size(shape[a], scales[k])
            except DimError as err:
                raise ctx.error(f"axis {a} of {x.ty}: {err.message}") from None
    changed = [a for a in range(x.ty.ndim) if full_sizes[a] != shape[a] or full_scales[a] != 1.0]
    if not changed:
        return x
    first = changed[0]
    return ctx.emit("image.resize", x, size=tuple(full_sizes[first:]),
                    scales=None if sizes is not None else tuple(full_scales[first:]),
                    method=_MODES[mode], coordinate_transformation_mode=coordinates, rounding_method=rounding,
                    cubic_alpha=cubic_alpha, cubic_exclude=cubic_exclude)


# -- ConvTranspose -----------------------------------------------------------------------------


def conv_transpose(ctx: NodeContext):
    x, w = ctx.input(0), ctx.input(1)
    rank = x.ty.ndim - 2
    if rank not in (1, 2, 3) or w.ty.ndim != x.ty.ndim:
        raise ctx.error(f"ConvTranspose over {rank} spatial dimension(s) is not supported; dpl has 1-D, 2-D and 3-D")
    kernel = list(w.ty.shape[2:])
    if any(not isinstance(k, int) for k in kernel):
        raise ctx.error(f"the weight {w.ty} must have a static window")
    if list(ctx.attr("kernel_shape", kernel)) != kernel:
        raise ctx.error(f"kernel_shape {list(ctx.attr('kernel_shape'))} differs from the weight's spatial shape {kernel}")
    strides = list(ctx.attr("strides", [1] * rank))
    dilations = list(ctx.attr("dilations", [1] * rank))
    output_padding = list(ctx.attr("output_padding", [0] * rank))
    pads = list(ctx.attr("pads", [0] * (2 * rank)))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad != "NOTSET" and auto_pad != "VALID":
        raise ctx.unsupported("auto_pad", auto_pad, "NOTSET or VALID")
    if auto_pad == "VALID":
        pads = [0] * (2 * rank)
    if ctx.attr("output_shape", None) is not None:
        raise ctx.unsupported("output_shape", ctx.attr("output_shape"), "pads and output_padding")
    y = ctx.emit(f"nn.conv{rank}d_transpose", x, w, strides=tuple(strides), padding=tuple(pads),
                 dilation=tuple(dilations), output_padding=tuple(output_padding), groups=ctx.attr("group", 1))
    if ctx.has_input(2):
        y = ctx.emit("add", y, ctx.emit("reshape", ctx.input(2), shape=(-1,) + (1,) * rank))
    return y


# -- normalisations ----------------------------------------------------------------------------


def instance_norm(ctx: NodeContext):
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    if x.ty.ndim < 3:
        raise ctx.error(f"the input must have rank >= 3 (N, C, spatial...), got {x.ty}")
    c = x.ty.shape[1]
    if not isinstance(c, int):
        raise ctx.error(f"the channel dim '{c}' must be static")
    return ctx.emit("nn.group_norm", x, scale, bias, num_groups=c, epsilon=ctx.attr("epsilon", 1e-5))


def group_norm(ctx: NodeContext):
    """GroupNormalization: at op version 21 scale and bias are per channel (dpl's form); at 18
    they were per group, spread here over each group's channels."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    ctx.attr("stash_type", 1)
    groups = ctx.attr("num_groups")
    c = x.ty.shape[1] if x.ty.ndim >= 2 else None
    if not isinstance(c, int):
        raise ctx.error(f"the input {x.ty} must have a static channel dim (axis 1)")
    if ctx.version < 21 and groups != c:
        if not isinstance(scale, Constant) or not isinstance(bias, Constant):
            raise ctx.error("GroupNormalization-18's per-group scale and bias must be constants")
        scale = Constant(np.repeat(scale.value, c // groups))
        bias = Constant(np.repeat(bias.value, c // groups))
    return ctx.emit("nn.group_norm", x, scale, bias, num_groups=groups, epsilon=ctx.attr("epsilon", 1e-5))


# -- norms of vectors --------------------------------------------------------------------------


def _norm(kind: str, axes_input_since: int):
    def translate(ctx: NodeContext):
        x = ctx.input(0)
        keepdims = bool(ctx.attr("keepdims", 1))
        if ctx.version >= axes_input_since:
            noop = bool(ctx.attr("noop_with_empty_axes", 0))
            axes = ctx.ints_input(1, "axes") if ctx.has_input(1) else []
        else:
            noop, axes = False, list(ctx.attr("axes", []))
        if not axes and noop:  # no reduction: the elementwise part alone
            return ctx.emit("abs", x) if kind != "sumsquare" else ctx.emit("multiply", x, x)
        nd = x.ty.ndim
        axis = tuple(sorted(ctx.axis(a, nd, "axes") - nd for a in axes)) if axes else None
        if kind == "l1":
            return ctx.emit("sum", ctx.emit("abs", x), axis=axis, keepdims=keepdims)
        total = ctx.emit("sum", ctx.emit("multiply", x, x), axis=axis, keepdims=keepdims)
        return ctx.emit("sqrt", total) if kind == "l2" else total

    return translate


# ONNX op type -> (translation, first op version, last op version)
TABLE = {
    "Resize": (resize, 11, 19),
    "ConvTranspose": (conv_transpose, 1, 22),
    "InstanceNormalization": (instance_norm, 6, 22),
    "GroupNormalization": (group_norm, 18, 21),
    "ReduceL1": (_norm("l1", 18), 1, 18),
    "ReduceL2": (_norm("l2", 18), 1, 18),
    "ReduceSumSquare": (_norm("sumsquare", 18), 1, 18),
}
