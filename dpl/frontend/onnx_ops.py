"""The ONNX op table: each supported ONNX op type, the op versions it is written for, and a small
function that translates one node into dpl calls (see :mod:`dpl.frontend.onnx_node`). The
compute ops are translated here; data movement, shape arithmetic and constants in
:mod:`dpl.frontend.onnx_shapes`.

Adding an op is one entry in :data:`ONNX_OPS`. Versions are ONNX *op* versions (the
``since_version`` of the schema in effect at the model's opset): a model whose opset selects a
version outside ``first..last`` gets a FrontendError rather than a translation written for other
semantics.

The translations emit the canonical forms dpl's rewrite library and composites expect: axes
counted from the end (``mean(x, axis=[-1])``), size-1 constant operands of elementwise ops as
0-d scalars, ``Gemm`` as ``matmul`` + ``add``, constant expressions folded.
"""

from __future__ import annotations

import math
from typing import Callable

import attrs
import numpy as np

from dpl import dtypes
from dpl.frontend import onnx_dims as shape_math
from dpl.frontend import onnx_gather as gather
from dpl.frontend import onnx_indexing as indexing
from dpl.frontend import onnx_image
from dpl.frontend import onnx_einsum
from dpl.frontend import onnx_shapes as shapes
from dpl.frontend.onnx_node import ONNX_DTYPES, NodeContext, ShapeValue, onnx_dtype_name
from dpl.ir import dims
from dpl.ir.expr import Constant, Expr
from dpl.ir.types import TensorType


@attrs.frozen
class OnnxOp:
    """How one ONNX op type becomes dpl: ``translate(ctx)`` returns the node's output values
    (one value or a list), for op versions ``first`` through ``last``."""

    translate: Callable[[NodeContext], object]
    first: int
    last: int


# -- helpers ----------------------------------------------------------------------------------


def _from_end(ctx: NodeContext, axes, ndim: int, what: str = "axes") -> tuple[int, ...]:
    """Axes counted from the end, sorted: dpl's canonical spelling (``axis=[-1]``)."""
    out = sorted({ctx.axis(a, ndim, what) for a in axes})
    if len(out) != len(list(axes)):
        raise ctx.error(f"{what} {list(axes)} repeat an axis")
    return tuple(a - ndim for a in out)


def _scalarize(c: Expr, other: Expr) -> Expr:
    """A size-1 constant operand that broadcasting would spread anyway becomes 0-d, the form
    dpl patterns write (``add(x, 1e-5)``)."""
    if isinstance(c, Constant) and c.value.size == 1 and c.value.ndim > 0 and c.value.ndim <= other.ty.ndim:
        return Constant(c.value.reshape(()))
    return c


def _binary_of(ctx: NodeContext, op: str, a: Expr, b: Expr) -> Expr:
    return ctx.emit(op, _scalarize(a, b), _scalarize(b, a))


def _window(ctx: NodeContext, x: TensorType, kernel: list[int], what: str):
    """Strides, dilations and (begin..., end...) pads of a Conv or pooling node, ``auto_pad``
    resolved against the static spatial sizes."""
    n = len(kernel)
    symbolic = [d for d in kernel if not isinstance(d, int)]
    if symbolic:
        raise ctx.error(f"kernel {list(kernel)}: spatial dimension '{symbolic[0]}' of the {what} window must be static")
    strides = list(ctx.attr("strides", [1] * n))
    dilations = list(ctx.attr("dilations", [1] * n))
    pads = list(ctx.attr("pads", [0] * (2 * n)))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ctx.error(f"strides {strides}, dilations {dilations} and pads {pads} do not fit a {n}-D {what}")
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1 or min(pads, default=0) < 0:
        raise ctx.error(f"kernel {kernel}, strides {strides} and dilations {dilations} must be positive and pads {pads} "
                        "not negative")
    spatial = x.shape[2:]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for i in range(n):
            out = dims.floordiv(dims.add(spatial[i], strides[i] - 1), strides[i])  # ceil(size / stride)
            total = dims.dmax(dims.add(dims.mul(dims.sub(out, 1), strides[i]), (kernel[i] - 1) * dilations[i] + 1 - spatial[i]), 0)
            if not isinstance(total, int):  # a pad that depends on the symbolic size: no static attribute holds it
                raise ctx.error(f"auto_pad {auto_pad} of the symbolic spatial dimension '{spatial[i]}' pads by {dims.text(total)}, "
                                f"which depends on it; dpl's {what} pads are static")
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    elif auto_pad != "NOTSET":
        raise ctx.unsupported("auto_pad", auto_pad, "NOTSET, VALID, SAME_UPPER and SAME_LOWER")
    return strides, dilations, pads


def _kernel_shape(ctx: NodeContext, x: TensorType, what: str) -> list[int]:
    kernel = list(ctx.attr("kernel_shape"))
    if len(kernel) != 2 or x.ndim != 4:
        raise ctx.error(f"{what} over {len(kernel)} spatial dimension(s) of a rank-{x.ndim} input is not supported; "
                        "dpl pools 2-D (NCHW) inputs")
    return kernel


# -- elementwise ------------------------------------------------------------------------------


def _binary(op: str):
    return lambda ctx: _binary_of(ctx, op, ctx.input(0), ctx.input(1))


def _unary(op: str):
    return lambda ctx: ctx.emit(op, ctx.input(0))


def _variadic(op: str):
    def translate(ctx: NodeContext):
        args = ctx.inputs()
        out = args[0]
        for a in args[1:]:
            out = _binary_of(ctx, op, out, a)
        return out

    return translate


def _pow(ctx: NodeContext):
    x, y = ctx.input(0), ctx.input(1)
    if y.ty.dtype != x.ty.dtype:  # ONNX lets the exponent have its own type; dpl does not
        y = ctx.emit("astype", y, dtype=x.ty.dtype)  # folded when the exponent is a constant
    return _binary_of(ctx, "power", x, y)


def _reciprocal(ctx: NodeContext):
    x = ctx.input(0)
    return ctx.emit("divide", ctx.scalar(1, x), x)


def _cast(ctx: NodeContext):
    ctx.attr("saturate", 1)  # only affects float8 targets, which dpl rejects below
    ctx.attr("round_mode", "up")
    to = ctx.attr("to")
    if to not in ONNX_DTYPES:
        raise ctx.unsupported("to", onnx_dtype_name(to), "casts to " + ", ".join(onnx_dtype_name(t) for t in ONNX_DTYPES))
    dtype = ONNX_DTYPES[to]
    v = ctx.value(0)
    if isinstance(v, ShapeValue) and dtype in ("int64", "int32"):
        return ShapeValue(v.dims)
    if isinstance(v, ShapeValue) and not v.is_static and dtype in ("float32", "float64"):
        # a size as a float, as torch.onnx writes the bound of a float arange; exact for sizes
        # below 2**24 (float32), and only Range and Cast read it (shape arithmetic refuses floats)
        return ShapeValue(v.dims, dtype)
    x = ctx.input(0)
    return x if x.ty.dtype == dtype else ctx.emit("astype", x, dtype=dtype)


def _clip(ctx: NodeContext):
    x = ctx.input(0)
    if ctx.version < 11:
        lo, hi = ctx.attr("min", -math.inf), ctx.attr("max", math.inf)
    else:
        lo = ctx.scalar_input(1, "min") if ctx.has_input(1) else -math.inf
        hi = ctx.scalar_input(2, "max") if ctx.has_input(2) else math.inf
    for what, bound in (("min", lo), ("max", hi)):
        if math.isnan(bound):
            raise ctx.error(f"{what} is NaN; a bound of Clip must be a number")
    if x.ty.dtype.startswith(("float", "bfloat")) and math.isfinite(lo) and math.isfinite(hi):
        return ctx.emit("clip", x, min=float(lo), max=float(hi))
    if math.isfinite(lo):
        x = ctx.emit("maximum", x, ctx.scalar(lo, x))
    if math.isfinite(hi):
        x = ctx.emit("minimum", x, ctx.scalar(hi, x))
    return x


def _gelu(ctx: NodeContext):
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported("approximate", approximate, "'none' and 'tanh'")
    return ctx.emit("nn.gelu" if approximate == "none" else "nn.gelu_tanh", ctx.input(0))


def _where(ctx: NodeContext):
    return ctx.emit("where", ctx.input(0), ctx.input(1), ctx.input(2))


def _mod(ctx: NodeContext):
    """``fmod=1``: C's fmod, the sign of the dividend (``mod``); ``fmod=0``: the sign of the
    divisor (``floor_mod``), for floats from Mod-28 (onnx's reference computes NumPy's mod before
    it too), a zero result with the divisor's sign as Mod-28 says. Integers over 0 give 0, as
    dpl's integer ``divide`` does (the spec leaves it undefined)."""
    fmod = ctx.attr("fmod", 0)
    if fmod not in (0, 1):
        raise ctx.unsupported("fmod", fmod, "0 and 1")
    return _binary_of(ctx, "mod" if fmod else "floor_mod", ctx.input(0), ctx.input(1))


def _rounding(op: str):
    """Floor, Ceil, Round: an integer input (outside the spec's types) is its own rounding."""

    def translate(ctx: NodeContext):
        x = ctx.input(0)
        return ctx.emit(op, x) if x.ty.dtype.startswith(("float", "bfloat")) else x

    return translate


def _softplus(ctx: NodeContext):
    """ln(exp(x) + 1), as Relax's and torch's softplus with beta 1: x itself above 20, where
    ln(1 + exp(-x)) is below float32's resolution of x (onnx's reference is NumPy's logaddexp)."""
    return ctx.emit("nn.softplus", ctx.input(0), beta=1.0, threshold=20.0)


def _hard_sigmoid_of(ctx: NodeContext, x: Expr, alpha: float, beta: float) -> Expr:
    """max(0, min(1, alpha * x + beta)), computed as the spec writes it: a clip of a multiply-add."""
    return ctx.emit("clip", ctx.emit("add", ctx.emit("multiply", x, ctx.scalar(alpha, x)), ctx.scalar(beta, x)),
                    min=0.0, max=1.0)


def _hard_sigmoid(ctx: NodeContext):
    return _hard_sigmoid_of(ctx, ctx.input(0), ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))


def _hard_swish(ctx: NodeContext):
    """x * HardSigmoid(x) with alpha 1/6 and beta 0.5: the function body of the spec."""
    x = ctx.input(0)
    return ctx.emit("multiply", x, _hard_sigmoid_of(ctx, x, float(np.float32(1 / 6)), 0.5))


def _mish(ctx: NodeContext):
    """x * tanh(softplus(x)): the function body of the spec."""
    x = ctx.input(0)
    return ctx.emit("multiply", x, ctx.emit("tanh", _softplus(ctx)))


# -- matrix products, softmax, normalisations -------------------------------------------------


def _gemm(ctx: NodeContext):
    a, b = ctx.input(0), ctx.input(1)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if ctx.attr("transA", 0):
        a = ctx.emit("permute_dims", a, axes=(1, 0))
    if ctx.attr("transB", 0):
        b = ctx.emit("permute_dims", b, axes=(1, 0))
    y = ctx.emit("matmul", a, b)
    if alpha != 1.0:
        y = ctx.emit("multiply", y, ctx.scalar(alpha, y))
    if not ctx.has_input(2) or beta == 0.0:
        return y
    c = ctx.input(2)
    if beta != 1.0:
        c = _binary_of(ctx, "multiply", c, ctx.scalar(beta, c))
    return _binary_of(ctx, "add", y, c)


def _softmax(op: str):
    def translate(ctx: NodeContext):
        x = ctx.input(0)
        ndim = x.ty.ndim
        if ctx.version >= 13:
            return ctx.emit(op, x, axis=ctx.axis(ctx.attr("axis", -1), ndim) - ndim)
        # before opset 13 the input is seen as 2-D: softmax over everything from axis on
        axis = ctx.axis(ctx.attr("axis", 1), ndim)
        if axis == ndim - 1:
            return ctx.emit(op, x, axis=-1)
        flat = ctx.emit("reshape", x, shape=tuple(x.ty.shape[:axis]) + (-1,))
        return ctx.emit("reshape", ctx.emit(op, flat, axis=-1), shape=x.ty.shape)

    return translate


def _layer_norm(ctx: NodeContext):
    ctx.refuse_used_outputs(1, "Mean, InvStdDev")
    ctx.attr("stash_type", 1)  # dpl computes statistics in float64 whatever it is
    x, scale = ctx.input(0), ctx.input(1)
    ndim = x.ty.ndim
    axis = ctx.axis(ctx.attr("axis", -1), ndim)
    axes = tuple(range(axis - ndim, 0))
    normalized = x.ty.shape[axis:]
    scale = _to_shape(ctx, scale, normalized, "Scale")
    if ctx.has_input(2):
        bias = _to_shape(ctx, ctx.input(2), normalized, "B")
    elif all(isinstance(d, int) for d in normalized):
        bias = Constant(np.zeros(normalized, dtype=_numpy_dtype(x)))
    else:
        raise ctx.error(f"LayerNormalization without B over symbolic dimensions {list(normalized)} is not supported")
    return ctx.emit("nn.layer_norm", x, scale, bias, axes=axes, epsilon=ctx.attr("epsilon", 1e-5))


def _rms_norm(ctx: NodeContext):
    ctx.attr("stash_type", 1)
    x, scale = ctx.input(0), ctx.input(1)
    ndim = x.ty.ndim
    axis = ctx.axis(ctx.attr("axis", -1), ndim)
    scale = _to_shape(ctx, scale, x.ty.shape[axis:], "scale")
    return ctx.emit("nn.rms_norm", x, scale, axes=tuple(range(axis - ndim, 0)), epsilon=ctx.attr("epsilon", 1e-5))


def _numpy_dtype(e: Expr) -> np.dtype:
    return dtypes.to_numpy(e.ty.dtype)


def _to_shape(ctx: NodeContext, p: Expr, shape, what: str) -> Expr:
    """A normalisation parameter ONNX lets broadcast, spread to the normalised shape dpl needs."""
    if p.ty.shape == tuple(shape):
        return p
    if not all(isinstance(d, int) for d in shape):
        raise ctx.error(f"{what} of shape {list(p.ty.shape)} must have the normalised shape {list(shape)}")
    return ctx.emit("broadcast_to", p, shape=tuple(shape))


def _batch_norm(ctx: NodeContext):
    ctx.refuse_used_outputs(1, "running_mean, running_var")
    ctx.attr("momentum", 0.9)
    if ctx.version >= 14 and ctx.attr("training_mode", 0):
        raise ctx.unsupported("training_mode", 1, "inference (training_mode=0)")
    x = ctx.input(0)
    if x.ty.ndim < 2:
        raise ctx.error(f"the input must have rank >= 2, got {x.ty}")
    per_channel = (-1,) + (1,) * (x.ty.ndim - 2)
    scale, bias, mean, var = (ctx.emit("reshape", ctx.input(i), shape=per_channel) for i in range(1, 5))
    eps = ctx.scalar(ctx.attr("epsilon", 1e-5), x)
    normed = ctx.emit("divide", ctx.emit("subtract", x, mean), ctx.emit("sqrt", ctx.emit("add", var, eps)))
    return ctx.emit("add", ctx.emit("multiply", normed, scale), bias)


# -- reductions -------------------------------------------------------------------------------


def _reduce(op: str, axes_input_since: int):
    def translate(ctx: NodeContext):
        x = ctx.input(0)
        keepdims = bool(ctx.attr("keepdims", 1))
        noop = False
        if ctx.version >= axes_input_since:
            noop = bool(ctx.attr("noop_with_empty_axes", 0))
            axes = ctx.ints_input(1, "axes") if ctx.has_input(1) else []
        else:
            axes = list(ctx.attr("axes", []))
        if not axes and noop:
            return x
        axis = _from_end(ctx, axes, x.ty.ndim) if axes else None
        return ctx.emit(op, x, axis=axis, keepdims=keepdims)

    return translate


def _global_pool(op: str):
    def translate(ctx: NodeContext):
        x = ctx.input(0)
        if x.ty.ndim < 3:
            raise ctx.error(f"the input must have rank >= 3 (N, C, spatial...), got {x.ty}")
        return ctx.emit(op, x, axis=tuple(range(2 - x.ty.ndim, 0)), keepdims=True)

    return translate


# -- convolution and pooling ------------------------------------------------------------------


def _conv(ctx: NodeContext):
    x, w = ctx.input(0), ctx.input(1)
    xt, wt = x.ty, w.ty
    if xt.ndim not in (3, 4) or wt.ndim != xt.ndim:
        raise ctx.error(f"Conv over {xt.ndim - 2} spatial dimension(s) is not supported; dpl has 1-D (through 2-D) "
                        "and 2-D convolution")
    kernel = list(wt.shape[2:])
    symbolic = [d for d in kernel if not isinstance(d, int)]
    if symbolic:
        raise ctx.error(f"the weight {wt} has the symbolic spatial dimension '{symbolic[0]}'; dpl needs a Conv's kernel size static",
                        hint="give the weight's sizes with from_onnx(..., shapes={...}) or make it an initializer")
    if list(ctx.attr("kernel_shape", kernel)) != kernel:
        raise ctx.error(f"kernel_shape {list(ctx.attr('kernel_shape'))} differs from the weight's spatial shape {kernel}")
    strides, dilations, pads = _window(ctx, xt, kernel, "Conv")
    one_d = xt.ndim == 3
    if one_d:  # [N, C, L] as [N, C, 1, L]
        x, w = ctx.emit("expand_dims", x, axis=(2,)), ctx.emit("expand_dims", w, axis=(2,))
        strides, dilations, pads = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]]
    y = ctx.emit("nn.conv2d", x, w, strides=tuple(strides), padding=tuple(pads), dilation=tuple(dilations),
                 groups=ctx.attr("group", 1))
    if ctx.has_input(2):
        y = ctx.emit("add", y, ctx.emit("reshape", ctx.input(2), shape=(-1, 1, 1)))
    return ctx.emit("squeeze", y, axis=(2,)) if one_d else y


def _max_pool(ctx: NodeContext):
    ctx.refuse_used_outputs(1, "Indices")
    ctx.attr("storage_order", 0)  # only affects Indices
    x = ctx.input(0)
    kernel = _kernel_shape(ctx, x.ty, "MaxPool")
    strides, dilations, pads = _window(ctx, x.ty, kernel, "MaxPool")
    # ONNX's ceil_mode drops a last window that would start in the end padding, as dpl's does
    return ctx.emit("nn.max_pool2d", x, pool_size=tuple(kernel), strides=tuple(strides), padding=tuple(pads),
                    dilation=tuple(dilations), ceil_mode=bool(ctx.attr("ceil_mode", 0)))


def _average_pool(ctx: NodeContext):
    x = ctx.input(0)
    kernel = _kernel_shape(ctx, x.ty, "AveragePool")
    strides, dilations, pads = _window(ctx, x.ty, kernel, "AveragePool")
    return ctx.emit("nn.avg_pool2d", x, pool_size=tuple(kernel), strides=tuple(strides), padding=tuple(pads),
                    dilation=tuple(dilations), ceil_mode=bool(ctx.attr("ceil_mode", 0)),
                    count_include_pad=bool(ctx.attr("count_include_pad", 0)))


def _global_average_pool(ctx: NodeContext):
    x = ctx.input(0)
    if x.ty.ndim == 4 and all(isinstance(d, int) for d in x.ty.shape[2:]):
        return ctx.emit("nn.adaptive_avg_pool2d", x, output_size=(1, 1))
    return _global_pool("mean")(ctx)


# -- masks and ranges -------------------------------------------------------------------------


def _trilu(ctx: NodeContext):
    k = ctx.ints_input(1, "k") if ctx.has_input(1) else [0]
    if len(k) != 1:
        raise ctx.error(f"k must hold one value, got {k}")
    return ctx.emit("triu" if ctx.attr("upper", 1) else "tril", ctx.input(0), k=k[0])


def _range(ctx: NodeContext):
    """A range of constants folds; a range with a symbolic bound (``Range(0, Gather(Shape(x), 1),
    1)``, a bound computed from shapes) is the ``arange`` op, whose length is an expression.
    dpl's length is none where the bounds cross (``max(n // 10, 1) - 1``); where the model
    declares another (``n // 10 - 1``: the exporter knew the sizes' ranges), the range is
    sliced to it, so that it equals the sizes the rest of the graph computes."""
    bounds, dtype = [], None
    for i, what in enumerate(("start", "limit", "delta")):
        v = ctx.value(i)
        if isinstance(v, ShapeValue):
            if v.dims.ndim != 0:
                raise ctx.error(f"{what} must be a scalar, got the shape {v}")
            d = v.dims[()]
            bounds.append(d if isinstance(d, (str, dims.DimExpr)) else int(d))
            dtype = v.dtype if dtype is None else dtype
            continue
        value = ctx.constant(i, what)
        if value.size != 1:
            raise ctx.error(f"{what} must be a scalar, got shape {list(value.shape)}")
        bounds.append(value.item())
        dtype = dtypes.from_numpy(value.dtype)
    if any(isinstance(b, (str, dims.DimExpr)) for b in bounds):  # a float range to a size: whole numbers as ints
        bounds = [int(b) if isinstance(b, float) and b.is_integer() else b for b in bounds]
    start, end, step = bounds
    out = ctx.emit("arange", start=start, end=end, step=step, dtype=dtype or "int64")
    declared = ctx.declared(ctx.node.output[0])
    if isinstance(out.ty.shape[0], int) or declared is None or len(declared) != 1 or declared[0] == out.ty.shape[0]:
        return out
    return ctx.emit("strided_slice", out, axes=[0], begin=[0], end=[declared[0]])


# -- the table --------------------------------------------------------------------------------

ONNX_OPS: dict[str, OnnxOp] = {
    # elementwise arithmetic (numpy broadcasting since version 7)
    "Add": OnnxOp(shape_math.binary(_binary("add")), 7, 14),
    "Sub": OnnxOp(shape_math.binary(_binary("subtract")), 7, 14),
    "Mul": OnnxOp(shape_math.binary(_binary("multiply")), 7, 14),
    "Div": OnnxOp(shape_math.binary(_binary("divide")), 7, 14),
    "Pow": OnnxOp(_pow, 7, 15),
    "Max": OnnxOp(shape_math.variadic(_variadic("maximum")), 8, 13),
    "Min": OnnxOp(shape_math.variadic(_variadic("minimum")), 8, 13),
    "Equal": OnnxOp(_binary("equal"), 7, 19),
    "Less": OnnxOp(_binary("less"), 7, 13),
    "LessOrEqual": OnnxOp(_binary("less_equal"), 12, 16),
    "Greater": OnnxOp(_binary("greater"), 7, 13),
    "GreaterOrEqual": OnnxOp(_binary("greater_equal"), 12, 16),
    "Where": OnnxOp(_where, 9, 16),
    # elementwise functions
    "Sqrt": OnnxOp(_unary("sqrt"), 6, 13),
    "Reciprocal": OnnxOp(_reciprocal, 6, 13),
    "Exp": OnnxOp(_unary("exp"), 6, 13),
    "Log": OnnxOp(_unary("log"), 6, 13),
    "Tanh": OnnxOp(_unary("tanh"), 6, 13),
    "Sigmoid": OnnxOp(_unary("sigmoid"), 6, 13),
    "Erf": OnnxOp(_unary("erf"), 9, 13),
    "Sin": OnnxOp(_unary("sin"), 7, 22),
    "Cos": OnnxOp(_unary("cos"), 7, 22),
    "Neg": OnnxOp(shape_math.negate(_unary("negative")), 6, 13),
    "Abs": OnnxOp(_unary("abs"), 6, 13),
    "Relu": OnnxOp(_unary("nn.relu"), 6, 14),
    "Gelu": OnnxOp(_gelu, 20, 20),
    "Clip": OnnxOp(_clip, 6, 13),
    "Cast": OnnxOp(_cast, 6, 24),
    "Mod": OnnxOp(shape_math.mod(_mod), 10, 28),
    "Floor": OnnxOp(_rounding("floor"), 6, 13),
    "Ceil": OnnxOp(_rounding("ceil"), 6, 13),
    "Round": OnnxOp(_rounding("round"), 11, 22),
    "Sign": OnnxOp(_unary("sign"), 9, 13),
    # activations, decomposed into the ops above (so they fuse as those do; HardSwish and Mish as
    # the spec's function bodies), Softplus the op
    "Softplus": OnnxOp(_softplus, 1, 22),
    "HardSigmoid": OnnxOp(_hard_sigmoid, 6, 22),
    "HardSwish": OnnxOp(_hard_swish, 14, 22),
    "Mish": OnnxOp(_mish, 18, 22),
    # matrix products, softmax, normalisation
    "MatMul": OnnxOp(gather.matmul, 1, 13),
    "Gemm": OnnxOp(_gemm, 7, 13),
    "Softmax": OnnxOp(_softmax("nn.softmax"), 1, 13),
    "LogSoftmax": OnnxOp(_softmax("nn.log_softmax"), 1, 13),
    "LayerNormalization": OnnxOp(_layer_norm, 17, 17),
    "RMSNormalization": OnnxOp(_rms_norm, 23, 23),
    "BatchNormalization": OnnxOp(_batch_norm, 9, 15),
    # reductions (axes become an input: ReduceSum at 13, the others at 18)
    "ReduceMean": OnnxOp(_reduce("mean", 18), 1, 18),
    "ReduceSum": OnnxOp(_reduce("sum", 13), 1, 13),
    "ReduceMax": OnnxOp(_reduce("max", 18), 1, 20),
    "ReduceMin": OnnxOp(_reduce("min", 18), 1, 20),
    "ReduceProd": OnnxOp(shape_math.reduce_prod(_reduce("prod", 18)), 1, 18),
    # convolution and pooling (NCHW)
    "Conv": OnnxOp(_conv, 1, 22),
    "MaxPool": OnnxOp(_max_pool, 1, 22),
    "AveragePool": OnnxOp(_average_pool, 1, 22),
    "GlobalAveragePool": OnnxOp(_global_average_pool, 1, 22),
    "GlobalMaxPool": OnnxOp(_global_pool("max"), 1, 22),
    # shapes and data movement
    "Reshape": OnnxOp(shapes.reshape, 5, 24),
    "Flatten": OnnxOp(shapes.flatten, 1, 24),
    "Transpose": OnnxOp(shapes.transpose, 1, 24),
    "Concat": OnnxOp(shapes.concat, 4, 13),
    "Split": OnnxOp(shapes.split, 2, 18),
    "Slice": OnnxOp(shapes.slice_tensor, 1, 13),
    "Gather": OnnxOp(shapes.gather, 1, 13),
    "Unsqueeze": OnnxOp(shapes.unsqueeze, 1, 24),
    "Squeeze": OnnxOp(shapes.squeeze, 1, 24),
    "Expand": OnnxOp(shapes.expand, 8, 13),
    "Pad": OnnxOp(shapes.pad, 2, 25),
    "Tile": OnnxOp(shapes.tile, 6, 13),
    "Shape": OnnxOp(shapes.shape_of, 1, 24),
    "Size": OnnxOp(shapes.size_of, 1, 24),
    "Constant": OnnxOp(shapes.constant, 1, 24),
    "ConstantOfShape": OnnxOp(shapes.constant_of_shape, 9, 24),
    "Identity": OnnxOp(shapes.identity, 1, 24),
    "Dropout": OnnxOp(shapes.dropout, 7, 22),
    # logic and the gathers of masks
    "IsNaN": OnnxOp(gather.is_nan, 9, 20),
    "And": OnnxOp(gather.logical("minimum"), 7, 7),
    "Or": OnnxOp(gather.logical("maximum"), 7, 7),
    "Xor": OnnxOp(gather.logical("not_equal"), 7, 7),
    "Not": OnnxOp(gather.logical_not, 1, 1),
    "GatherND": OnnxOp(gather.gather_nd, 11, 13),
    "GatherElements": OnnxOp(gather.gather_elements, 11, 13),
    "CumSum": OnnxOp(gather.cumsum, 11, 14),
    # masks and ranges
    "Trilu": OnnxOp(_trilu, 14, 14),
    "Range": OnnxOp(_range, 11, 11),
    # indexing, scattering and sorting (onnx_indexing.py)
    "ArgMax": OnnxOp(indexing.arg_extreme("argmax"), 1, 13),
    "ArgMin": OnnxOp(indexing.arg_extreme("argmin"), 1, 13),
    "TopK": OnnxOp(indexing.topk, 1, 11),
    "ScatterND": OnnxOp(indexing.scatter_nd, 11, 18),
    "ScatterElements": OnnxOp(indexing.scatter_elements, 11, 18),
}

# interpolation, transposed convolution, group and instance norm, norms of vectors: onnx_image.py
ONNX_OPS.update({op: OnnxOp(fn, first, last) for op, (fn, first, last) in onnx_image.TABLE.items()})
# Einsum as a broadcast product and a sum: onnx_einsum.py
ONNX_OPS.update({op: OnnxOp(fn, first, last) for op, (fn, first, last) in onnx_einsum.TABLE.items()})
