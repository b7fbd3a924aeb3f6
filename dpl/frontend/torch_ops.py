"""The ATen ops the torch.export frontend translates: one table, one small function per op.

A translation gets a :class:`~dpl.frontend.torch_export.NodeContext` and the node's arguments
as torch passed them (tensors already dpl expressions, sizes ints or symbol names) under the
names of the op's schema, and returns a dpl expression (calls may nest), an existing value, or
a tuple for an op with several results. It raises :class:`FrontendError` for an argument it
does not handle, naming it. Adding an op is one decorated function:

    @aten("erf.default")
    def _erf(cx, self):
        return cx.call("erf", cx.cast(self, cx.out_dtype))

The forms emitted are the canonical Relax ones TVM's torch frontend produces, which the
rewrite library (``patterns/rewrites.dpl``) and the fusion patterns are written against:
``power(x, 2.0)`` with a float exponent of the operand's dtype, ``linear`` as
``matmul(x, permute_dims(w))`` then ``add(bias)``, a scalar operand as a constant of the
result's dtype, a same-dtype cast dropped.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from dpl.frontend.errors import FrontendError
from dpl.frontend import torch_image, torch_moe
from dpl.ir.dims import add as add_dims

ATEN_OPS: dict[str, Callable] = {}


def aten(*names: str):
    """Register a translation for the named ATen overloads (``"add.Tensor"``)."""

    def register(fn):
        for name in names:
            key = f"aten.{name}"
            if key in ATEN_OPS:
                raise ValueError(f"{key} is translated twice")
            ATEN_OPS[key] = fn
        return fn

    return register


def supported_ops() -> list[str]:
    """The ATen overloads the frontend translates, sorted."""
    return sorted(ATEN_OPS)


def _axis(dim: int, ndim: int) -> int:
    if not -ndim <= dim < max(ndim, 1):
        raise FrontendError(f"dimension {dim} is out of range for rank {ndim}")
    return dim % ndim if ndim else 0


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


# -- elementwise arithmetic --------------------------------------------------------------------


def _binary(dpl_op: str):
    def translate(cx, self, other, *, alpha=1):
        dtype = cx.out_dtype
        a, b = cx.operand(self, dtype), cx.operand(other, dtype)
        if alpha != 1:
            b = cx.call("multiply", b, cx.scalar(alpha, dtype))
        return cx.call(dpl_op, a, b)

    return translate


aten("add.Tensor", "add.Scalar")(_binary("add"))
aten("sub.Tensor", "sub.Scalar")(_binary("subtract"))


@aten("mul.Tensor", "mul.Scalar")
def _mul(cx, self, other):
    dtype = cx.out_dtype
    return cx.call("multiply", cx.operand(self, dtype), cx.operand(other, dtype))


@aten("div.Tensor", "div.Scalar")
def _div(cx, self, other):
    dtype = cx.out_dtype
    return cx.call("divide", cx.operand(self, dtype), cx.operand(other, dtype))


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx, self, other, *, rounding_mode=None):
    """``divide`` is exact for floats and truncates integers. Rounded float quotients round it;
    an integer floor division (``perm // top_k``) divides what is left after the floor
    remainder, a multiple of the divisor, so the truncation is exact."""
    dtype = cx.out_dtype
    if rounding_mode not in (None, "trunc", "floor"):
        raise FrontendError(f"argument 'rounding_mode={rounding_mode!r}' is not supported (None, 'trunc', 'floor')")
    a, b = cx.operand(self, dtype), cx.operand(other, dtype)
    floats = dtype.startswith(("float", "bfloat"))
    if rounding_mode is None or (rounding_mode == "trunc" and not floats):
        return cx.call("divide", a, b)
    if floats:
        return cx.call(rounding_mode, cx.call("divide", a, b))
    return cx.call("divide", cx.call("subtract", a, cx.call("floor_mod", a, b)), b)


@aten("floor_divide.default", "floor_divide.Scalar")
def _floor_divide(cx, self, other):
    return _div_mode(cx, self, other, rounding_mode="floor")


@aten("rsub.Scalar", "rsub.Tensor")
def _rsub(cx, self, other, alpha=1):
    dtype = cx.out_dtype
    a = cx.operand(self, dtype)
    if alpha != 1:
        a = cx.call("multiply", a, cx.scalar(alpha, dtype))
    return cx.call("subtract", cx.operand(other, dtype), a)


@aten("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar")
def _pow(cx, self, exponent):
    dtype = cx.out_dtype
    return cx.call("power", cx.operand(self, dtype), cx.operand(exponent, dtype))


@aten("maximum.default", "max.other")
def _maximum(cx, self, other):
    return cx.call("maximum", cx.operand(self, cx.out_dtype), cx.operand(other, cx.out_dtype))


@aten("minimum.default", "min.other")
def _minimum(cx, self, other):
    return cx.call("minimum", cx.operand(self, cx.out_dtype), cx.operand(other, cx.out_dtype))


def _compare(dpl_op: str):
    def translate(cx, self, other):
        dtype = cx.result_dtype()
        return cx.call(dpl_op, cx.operand(self, dtype), cx.operand(other, dtype))

    return translate


for _name, _op in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                   ("ge", "greater_equal")]:
    aten(f"{_name}.Tensor", f"{_name}.Scalar")(_compare(_op))


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(cx, condition, self, other):
    dtype = cx.out_dtype
    return cx.call("where", cx.tensor(condition), cx.operand(self, dtype), cx.operand(other, dtype))


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx, self, mask, value):
    dtype = cx.out_dtype
    return cx.call("where", cx.tensor(mask), cx.operand(value, dtype), cx.operand(self, dtype))


@aten("bitwise_not.default", "logical_not.default")
def _not(cx, self):
    """dpl has no logical ops: on bools ``not x`` is ``x == false``; on integers ``~x`` is ``-x - 1``."""
    x = cx.tensor(self)
    if x.ty.dtype == "bool":
        return cx.call("equal", x, cx.scalar(False, "bool"))
    if str(cx.node.target).startswith("aten.logical"):
        return cx.call("equal", x, cx.scalar(0, x.ty.dtype))
    return cx.call("subtract", cx.call("negative", x), cx.scalar(1, x.ty.dtype))


def _logical(dpl_op: str):
    """``and`` / ``or`` of truth values, as ``minimum`` / ``maximum`` of bools."""

    def translate(cx, self, other):
        a, b = (cx.tensor(v) if hasattr(v, "ty") else cx.scalar(bool(v), "bool") for v in (self, other))
        truth = [t if t.ty.dtype == "bool" else cx.call("not_equal", t, cx.scalar(0, t.ty.dtype)) for t in (a, b)]
        return cx.call(dpl_op, *truth)

    return translate


aten("logical_and.default")(_logical("minimum"))
aten("logical_or.default")(_logical("maximum"))


@aten("bitwise_and.Tensor", "bitwise_or.Tensor", "__and__.Tensor", "__or__.Tensor")
def _bitwise_bool(cx, self, other):
    if cx.out_dtype != "bool":
        raise FrontendError("bitwise operations on integers have no dpl op (only on bools)")
    return _logical("minimum" if "and" in str(cx.node.target) else "maximum")(cx, self, other)


# -- elementwise functions ---------------------------------------------------------------------


def _unary(dpl_op: str):
    def translate(cx, self):
        return cx.call(dpl_op, cx.cast(cx.tensor(self), cx.out_dtype))

    return translate


for _name, _op in [("neg", "negative"), ("abs", "abs"), ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"),
                   ("rsqrt", "rsqrt"), ("tanh", "tanh"), ("sigmoid", "sigmoid"), ("erf", "erf"), ("sin", "sin"),
                   ("cos", "cos"), ("relu", "nn.relu"), ("silu", "nn.silu"), ("square", "square")]:
    aten(f"{_name}.default")(_unary(_op))


@aten("reciprocal.default")
def _reciprocal(cx, self):
    dtype = cx.out_dtype
    return cx.call("divide", cx.scalar(1.0, dtype), cx.cast(cx.tensor(self), dtype))


@aten("gelu.default")
def _gelu(cx, self, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise FrontendError(f"argument 'approximate={approximate!r}' is not supported")
    return cx.call("nn.gelu" if approximate == "none" else "nn.gelu_tanh", cx.tensor(self))


@aten("clamp.default")
def _clamp(cx, self, min=None, max=None):
    dtype = cx.out_dtype
    x = cx.cast(cx.tensor(self), dtype)
    if min is not None and max is not None:
        return cx.call("clip", x, min=float(min), max=float(max))
    if min is not None:
        x = cx.call("maximum", x, cx.scalar(min, dtype))
    if max is not None:
        x = cx.call("minimum", x, cx.scalar(max, dtype))
    return x


@aten("clamp_min.default")
def _clamp_min(cx, self, min):
    return _clamp(cx, self, min=min)


@aten("clamp_max.default")
def _clamp_max(cx, self, max):
    return _clamp(cx, self, max=max)


@aten("hardtanh.default")
def _hardtanh(cx, self, min_val=-1.0, max_val=1.0):
    return cx.call("clip", cx.tensor(self), min=float(min_val), max=float(max_val))


@aten("leaky_relu.default")
def _leaky_relu(cx, self, negative_slope=0.01):
    x, dtype = cx.tensor(self), cx.out_dtype
    positive = cx.call("greater", x, cx.scalar(0, dtype))
    return cx.call("where", positive, x, cx.call("multiply", x, cx.scalar(negative_slope, dtype)))


aten("log1p.default")(_unary("log1p"))
aten("expm1.default")(_unary("expm1"))


# -- remainders, roundings, sign ---------------------------------------------------------------


def _remainder(dpl_op: str):
    """``fmod`` truncates (``mod``), ``remainder`` floors (``floor_mod``). Integers over 0 give 0,
    as dpl's integer ``divide`` does, where torch's CPU kernels raise ZeroDivisionError."""

    def translate(cx, self, other):
        dtype = cx.out_dtype
        return cx.call(dpl_op, cx.operand(self, dtype), cx.operand(other, dtype))

    return translate


aten("fmod.Tensor", "fmod.Scalar")(_remainder("mod"))
aten("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor")(_remainder("floor_mod"))


def _is_float(x) -> bool:
    return x.ty.dtype.startswith(("float", "bfloat"))


def _rounding(dpl_op: str):
    """floor, ceil, trunc and round (half to even): torch rounds an integer to itself."""

    def translate(cx, self):
        x = cx.tensor(self)
        return cx.call(dpl_op, x) if _is_float(x) else x

    return translate


for _name, _op in [("floor", "floor"), ("ceil", "ceil"), ("trunc", "trunc"), ("fix", "trunc"), ("round", "round")]:
    aten(f"{_name}.default")(_rounding(_op))


@aten("round.decimals")
def _round_decimals(cx, self, *, decimals=0):
    """torch's: x * 10^d rounded, divided by 10^d (by 10^-d, rounded, times 10^-d for d < 0),
    10^d a value of x's dtype."""
    x = cx.tensor(self)
    if not _is_float(x) or decimals == 0:
        return _rounding("round")(cx, x)
    scale = cx.scalar(10.0 ** abs(decimals), x.ty.dtype)
    if decimals > 0:
        return cx.call("divide", cx.call("round", cx.call("multiply", x, scale)), scale)
    return cx.call("multiply", cx.call("round", cx.call("divide", x, scale)), scale)


@aten("sign.default", "sgn.default")
def _sign(cx, self):
    """dpl's sign is NumPy's (NaN for NaN); torch's sign of NaN is 0, so floats select it. A
    bool is its own sign."""
    x = cx.tensor(self)
    if x.ty.dtype == "bool":
        return x
    s = cx.call("sign", x)
    if not _is_float(x):
        return s
    return cx.call("where", cx.call("not_equal", x, x), cx.scalar(0, x.ty.dtype), s)


# -- activations -------------------------------------------------------------------------------
#
# softplus is the op; hardswish, hardsigmoid and mish are decomposed into ops that fuse, with
# torch's kernels' arithmetic (in float for 16-bit floats, rounded once, as torch computes them)


@aten("softplus.default")
def _softplus(cx, self, beta=1, threshold=20):
    return cx.call("nn.softplus", cx.tensor(self), beta=float(beta), threshold=float(threshold))


def _in_float(cx, x, fn):
    """``fn(x)``, computed in float32 for a 16-bit float ``x`` and rounded back once."""
    if x.ty.dtype in ("float16", "bfloat16"):
        return cx.cast(fn(cx.cast(x, "float32")), x.ty.dtype)
    return fn(x)


def _relu6_of(cx, x):
    """min(max(x + 3, 0), 6): the clamp both hard activations share."""
    return cx.call("clip", cx.call("add", x, cx.scalar(3, x.ty.dtype)), min=0.0, max=6.0)


@aten("hardswish.default")
def _hardswish(cx, self):
    """x * min(max(x + 3, 0), 6) / 6, multiplied then divided, as torch's kernel computes it."""
    return _in_float(cx, cx.tensor(self), lambda x: cx.call(
        "divide", cx.call("multiply", x, _relu6_of(cx, x)), cx.scalar(6, x.ty.dtype)))


@aten("hardsigmoid.default")
def _hardsigmoid(cx, self):
    """min(max(x + 3, 0), 6) / 6."""
    return _in_float(cx, cx.tensor(self), lambda x: cx.call("divide", _relu6_of(cx, x), cx.scalar(6, x.ty.dtype)))


@aten("mish.default")
def _mish(cx, self):
    """x * tanh(log1p(exp(x))), torch's kernel (no threshold: exp overflows to inf and x comes out)."""
    return _in_float(cx, cx.tensor(self), lambda x: cx.call(
        "multiply", x, cx.call("tanh", cx.call("log1p", cx.call("exp", x)))))


# -- casts and identities ----------------------------------------------------------------------


@aten("to.dtype", "to.dtype_layout", "to.device", "_to_copy.default", "type_as.default")
def _to(cx, self, *args, dtype=None, copy=False):
    # every overload's result dtype is in torch's metadata; the other arguments place the tensor
    return cx.cast(cx.tensor(self), cx.out_dtype)


# detach_ changes no value (only autograd's view of its operand): the value itself
@aten("clone.default", "contiguous.default", "alias.default", "detach.default", "lift_fresh_copy.default",
      "detach_.default")
def _identity(cx, self):
    return cx.tensor(self)


@aten("dropout.default")
def _dropout(cx, input, p, train):
    if train and p > 0:
        raise FrontendError("dropout in training mode changes values at random", hint="export the model after model.eval()")
    return cx.tensor(input)


# -- reductions --------------------------------------------------------------------------------


def _reduce_axes(cx, x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return [int(d) for d in _as_list(dim)]


def _reduction(dpl_op: str):
    def translate(cx, self, dim=None, keepdim=False, *, dtype=None):
        x = cx.cast(cx.tensor(self), cx.out_dtype)
        return cx.call(dpl_op, x, axis=_reduce_axes(cx, x, dim), keepdims=bool(keepdim))

    return translate


aten("mean.dim", "mean.default")(_reduction("mean"))
aten("sum.dim_IntList", "sum.default")(_reduction("sum"))
aten("amax.default")(_reduction("max"))
aten("amin.default")(_reduction("min"))


@aten("var.correction", "var.dim")
def _var(cx, self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Population variance, rescaled by n / (n - correction) for a static n."""
    if unbiased is not None:  # var.dim(self, dim, unbiased, keepdim)
        correction = 1 if unbiased else 0
    correction = 1 if correction is None else correction
    x = cx.cast(cx.tensor(self), cx.out_dtype)
    axes = _reduce_axes(cx, x, dim)
    out = cx.call("variance", x, axis=axes, keepdims=bool(keepdim))
    if correction == 0:
        return out
    n = 1
    for a in (range(x.ty.ndim) if axes is None else axes):
        n *= cx.static(x.ty.shape[a], f"the reduced dimension {a}")
    return cx.call("multiply", out, cx.scalar(n / (n - correction), x.ty.dtype))


# -- matrix products, normalisations, softmax, attention ---------------------------------------


@aten("linear.default")
def _linear(cx, input, weight, bias=None):
    w = cx.tensor(weight)
    out = cx.call("matmul", cx.tensor(input), cx.permute(w, list(reversed(range(w.ty.ndim)))))
    return out if bias is None else cx.call("add", out, cx.tensor(bias))


@aten("matmul.default", "mm.default", "bmm.default")
def _matmul(cx, self, other):
    return cx.call("matmul", cx.tensor(self), cx.tensor(other))


@aten("addmm.default")
def _addmm(cx, self, mat1, mat2, *, beta=1, alpha=1):
    dtype = cx.out_dtype
    product = cx.call("matmul", cx.tensor(mat1), cx.tensor(mat2))
    if alpha != 1:
        product = cx.call("multiply", product, cx.scalar(alpha, dtype))
    bias = cx.tensor(self)
    if beta != 1:
        bias = cx.call("multiply", bias, cx.scalar(beta, dtype))
    return cx.call("add", product, bias)


@aten("softmax.int", "_softmax.default")
def _softmax(cx, self, dim, dtype_or_half_to_float=None, *, dtype=None):
    x = cx.cast(cx.tensor(self), cx.out_dtype)
    return cx.call("nn.softmax", x, axis=int(dim))


@aten("log_softmax.int", "_log_softmax.default")
def _log_softmax(cx, self, dim, dtype_or_half_to_float=None, *, dtype=None):
    x = cx.cast(cx.tensor(self), cx.out_dtype)
    return cx.call("nn.log_softmax", x, axis=int(dim))


def _norm_params(cx, x, normalized_shape, *params):
    """The normalised axes (the last ones, negative as Relax writes them) and each parameter,
    a constant of ones or zeros where torch's is None."""
    k = len(_as_list(normalized_shape))
    axes = list(range(-k, 0))
    shape = x.ty.shape[x.ty.ndim - k:]
    out = []
    for value, fill in params:
        if value is None:
            dims = [cx.static(d, "a normalised dimension") for d in shape]
            out.append(cx.scalar(np.full(dims, fill), x.ty.dtype))
        else:
            out.append(cx.cast(cx.tensor(value), x.ty.dtype))
    return axes, out


@aten("layer_norm.default")
def _layer_norm(cx, input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    x = cx.tensor(input)
    axes, (gamma, beta) = _norm_params(cx, x, normalized_shape, (weight, 1.0), (bias, 0.0))
    return cx.call("nn.layer_norm", x, gamma, beta, axes=axes, epsilon=float(eps))


_MACHINE_EPSILON = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


@aten("rms_norm.default")
def _rms_norm(cx, input, normalized_shape, weight=None, eps=None):
    x = cx.tensor(input)
    axes, (w,) = _norm_params(cx, x, normalized_shape, (weight, 1.0))
    if eps is None:  # torch's default: the machine epsilon of the input's dtype
        eps = _MACHINE_EPSILON[x.ty.dtype]
    return cx.call("nn.rms_norm", x, w, axes=axes, epsilon=float(eps))


@aten("batch_norm.default")
def _batch_norm(cx, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    if training:
        raise FrontendError("batch_norm in training mode normalises with batch statistics and updates the running ones",
                            hint="export the model after model.eval()")
    return _batch_norm_inference(cx, input, weight, bias, running_mean, running_var, eps)


@aten("_native_batch_norm_legit_no_training.default")
def _native_batch_norm(cx, input, weight, bias, running_mean, running_var, momentum, eps):
    out = _batch_norm_inference(cx, input, weight, bias, running_mean, running_var, eps)
    return (out, _unavailable("batch_norm's saved mean"), _unavailable("batch_norm's saved variance"))


def _batch_norm_inference(cx, input, weight, bias, running_mean, running_var, eps):
    """(x - mean) * rsqrt(var + eps) * weight + bias, with the per-channel vectors shaped to
    broadcast over axis 1."""
    x = cx.tensor(input)
    dtype = x.ty.dtype
    channel = [1, x.ty.shape[1]] + [1] * (x.ty.ndim - 2)

    def per_channel(value, fill):
        if value is None:
            return cx.scalar(fill, dtype)
        return cx.reshape(cx.cast(cx.tensor(value), dtype), channel)

    inv = cx.call("rsqrt", cx.call("add", per_channel(running_var, 1.0), cx.scalar(eps, dtype)))
    y = cx.call("multiply", cx.call("subtract", x, per_channel(running_mean, 0.0)), inv)
    if weight is not None:
        y = cx.call("multiply", y, per_channel(weight, 1.0))
    if bias is not None:
        y = cx.call("add", y, per_channel(bias, 0.0))
    return y


@aten("scaled_dot_product_attention.default")
def _sdpa(cx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """softmax(q @ k^T * scale + mask) @ v: the chain ``llm.dpl``'s attention pattern claims."""
    if dropout_p:
        raise FrontendError(f"argument 'dropout_p={dropout_p}' is not supported (dropout is random)")
    q, k, v = cx.tensor(query), cx.tensor(key), cx.tensor(value)
    if enable_gqa and q.ty.ndim >= 3 and k.ty.shape[-3] != q.ty.shape[-3]:
        return _grouped_sdpa(cx, q, k, v, attn_mask, is_causal, scale)
    shared = [_repeated_heads(cx, x) for x in (k, v)]
    if (q.ty.ndim >= 3 and None not in shared and shared[0].ty.shape[-3] == shared[1].ty.shape[-3]
            and q.ty.shape[-3] == k.ty.shape[-3]):
        return _grouped_sdpa(cx, q, *shared, attn_mask, is_causal, scale)
    dtype = q.ty.dtype
    head = cx.static(q.ty.shape[-1], "the head dimension")
    scale = 1.0 / math.sqrt(head) if scale is None else scale
    axes = list(range(k.ty.ndim - 2)) + [k.ty.ndim - 1, k.ty.ndim - 2]
    scores = cx.call("multiply", cx.call("matmul", q, cx.permute(k, axes)), cx.scalar(scale, dtype))
    if is_causal:
        scores = cx.call("add", scores, _causal_mask(cx, q.ty.shape[-2], k.ty.shape[-2], dtype))
    seen = None
    if attn_mask is not None:
        mask = cx.tensor(attn_mask)
        if mask.ty.dtype == "bool":
            # torch's safe softmax: a query that may see no key at all (a padded row of a
            # left-padded batch) gets zeros, not NaN. The masked scores are the dtype's lowest
            # value rather than -inf, so such a row's softmax stays finite, and the product is
            # then multiplied by 0 for it; elsewhere exp(lowest - max) is exactly 0, as exp(-inf)
            seen = cx.call("max", cx.cast(mask, dtype), axis=[-1], keepdims=True)
            mask = cx.call("where", mask, cx.scalar(0.0, dtype), cx.scalar(_lowest(dtype), dtype))
        scores = cx.call("add", scores, cx.cast(mask, dtype))
    out = cx.call("matmul", cx.call("nn.softmax", scores, axis=-1), v)
    return out if seen is None else cx.call("multiply", out, seen)


def _repeated_heads(cx, x):
    """The key/value heads ``x`` repeats, where it is Hugging Face's ``repeat_kv`` (each head
    ``n`` times in a row: ``reshape(broadcast_to(expand_dims(h, axis=-4), [..., H, n, S, D]),
    [..., H * n, S, D])``), else None. Attention over the repeated heads is grouped-query
    attention over ``h``: the static cache's decode step copied every layer's cache twice a token
    for it (21 + 38 us a layer at 159 keys), where the dynamic cache's ``enable_gqa`` copies none."""
    merged = cx.producer(x, "reshape")
    spread = merged and cx.producer(merged.args[0], "broadcast_to")
    added = spread and cx.producer(spread.args[0], "expand_dims")
    if added is None or x.ty.ndim < 3:
        return None
    h, wide = added.args[0], spread.ty.shape
    axis = [a % added.ty.ndim for a in added.attrs["axis"]]
    if axis != [added.ty.ndim - 3] or len(wide) != x.ty.ndim + 1 or h.ty.ndim != x.ty.ndim:
        return None
    heads, group = wide[-4], wide[-3]
    # h only lacks the repeats: a broadcast over any other axis (a key axis of 1) is not this
    same = tuple(h.ty.shape[:-3]) == tuple(x.ty.shape[:-3]) == tuple(wide[:-4]) and \
        tuple(h.ty.shape[-2:]) == tuple(x.ty.shape[-2:]) == tuple(wide[-2:])
    if (not same or h.ty.shape[-3] != heads or not isinstance(heads, int) or not isinstance(group, int)
            or x.ty.shape[-3] != heads * group):
        return None
    return h


def _grouped_sdpa(cx, q, k, v, attn_mask, is_causal, scale):
    """Grouped-query attention (``enable_gqa=True``: k and v have fewer heads, each serving
    ``q heads // kv heads`` query heads in a row) as plain attention over one more batch axis:
    q's heads split into [kv heads, group], k and v given a group axis of 1 that broadcasts,
    so the key/value heads are never copied (the attention kernel broadcasts batch axes)."""
    heads = cx.static(q.ty.shape[-3], "the query heads")
    kv_heads = cx.static(k.ty.shape[-3], "the key/value heads")
    if v.ty.shape[-3] != kv_heads or heads % kv_heads:
        raise FrontendError(f"enable_gqa=True needs as many key as value heads, dividing the {heads} query heads; "
                            f"got {kv_heads} key and {v.ty.shape[-3]} value heads")

    def grouped(x, group):
        shape = list(x.ty.shape)
        return cx.reshape(x, shape[:-3] + [kv_heads, group] + shape[-2:])

    mask = attn_mask
    if attn_mask is not None and cx.tensor(attn_mask).ty.ndim >= 3:  # its axis over the heads splits too
        m = cx.tensor(attn_mask)
        m = cx.reshape(m, list(m.ty.shape[:-3]) + [1] * (q.ty.ndim - m.ty.ndim) + list(m.ty.shape[-3:]))
        per_head = m.ty.shape[-3] == heads
        mask = grouped(m, heads // kv_heads) if per_head else cx.call("expand_dims", m, axis=[m.ty.ndim - 2])
    out = _sdpa(cx, grouped(q, heads // kv_heads), grouped(k, 1), grouped(v, 1), mask, is_causal=is_causal, scale=scale)
    return cx.reshape(out, list(q.ty.shape[:-1]) + [v.ty.shape[-1]])


def _lowest(dtype: str) -> float:
    from dpl import dtypes

    return float(np.finfo(dtypes.to_numpy(dtype)).min)


def _causal_mask(cx, rows, cols, dtype):
    """0 where key j may be seen from query i (j <= i, torch's top-left alignment), -inf elsewhere:
    a constant for static lengths, built from two ranges for symbolic ones."""
    if isinstance(rows, int) and isinstance(cols, int):
        allowed = np.tril(np.ones((rows, cols), bool))
        return cx.scalar(np.where(allowed, 0.0, -np.inf), dtype)
    query = cx.call("expand_dims", cx.call("arange", end=rows), axis=[1])
    key = cx.call("expand_dims", cx.call("arange", end=cols), axis=[0])
    return cx.call("where", cx.call("greater_equal", query, key), cx.scalar(0.0, dtype), cx.scalar(-np.inf, dtype))


# -- convolution and pooling -------------------------------------------------------------------


def _pair(value) -> list[int]:
    values = [int(v) for v in _as_list(value)]
    return values * 2 if len(values) == 1 else values


@aten("conv2d.default", "conv2d.padding")
def _conv2d(cx, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x, w = cx.tensor(input), cx.tensor(weight)
    if x.ty.ndim != 4:
        raise FrontendError(f"only batched 2-D convolution (rank-4 input) is supported, got {x.ty}")
    if isinstance(padding, str):
        padding = _string_padding(cx, padding, w, _pair(stride), _pair(dilation))
    out = cx.call("nn.conv2d", x, w, strides=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                  groups=int(groups))
    if bias is None:
        return out
    b = cx.tensor(bias)
    return cx.call("add", out, cx.reshape(b, [1, b.ty.shape[0], 1, 1]))


def _string_padding(cx, padding: str, w, stride, dilation) -> list[int]:
    if padding == "valid":
        return [0, 0, 0, 0]
    if padding != "same" or stride != [1, 1]:
        raise FrontendError(f"argument 'padding={padding!r}' is not supported with stride {stride}")
    total = [d * (cx.static(k, "a kernel size") - 1) for d, k in zip(dilation, w.ty.shape[2:])]
    return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]


@aten("convolution.default")
def _convolution(cx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed or cx.tensor(input).ty.ndim != 4:  # other ranks and transposed ones: torch_image.py
        return torch_image.conv(cx, input, weight, bias, stride, padding, dilation, groups, transposed, output_padding)
    return _conv2d(cx, input, weight, bias, stride, padding, dilation, groups)


@aten("max_pool2d.default")
def _max_pool2d(cx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    x = cx.tensor(self)
    stride = stride if stride else kernel_size
    return cx.call("nn.max_pool2d", x, pool_size=_pair(kernel_size), strides=_pair(stride), padding=_pair(padding),
                   dilation=_pair(dilation), ceil_mode=bool(ceil_mode))


@aten("max_pool2d_with_indices.default")
def _max_pool2d_with_indices(cx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return (_max_pool2d(cx, self, kernel_size, stride, padding, dilation, ceil_mode), _unavailable("max_pool2d's indices"))


@aten("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(cx, self, output_size):
    x = cx.tensor(self)
    if x.ty.ndim != 4:
        raise FrontendError(f"only batched 2-D pooling (rank-4 input) is supported, got {x.ty}")
    return cx.call("nn.adaptive_avg_pool2d", x, output_size=_pair(output_size))


@aten("avg_pool2d.default")
def _avg_pool2d(cx, self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    x = cx.tensor(self)
    if divisor_override is not None:
        raise FrontendError(f"argument 'divisor_override={divisor_override}' is not supported")
    if x.ty.ndim != 4:
        raise FrontendError(f"only batched 2-D pooling (rank-4 input) is supported, got {x.ty}")
    return cx.call("nn.avg_pool2d", x, pool_size=_pair(kernel_size), strides=_pair(stride) if stride else _pair(kernel_size),
                   padding=_pair(padding), ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


# -- shapes and data movement ------------------------------------------------------------------


@aten("view.default", "_unsafe_view.default", "reshape.default")
def _view(cx, self, size):
    x = cx.tensor(self)
    shape = list(size)
    if shape == list(x.ty.shape):
        return x
    if -1 in shape and not x.ty.is_static:  # torch knows the -1 (``n * 8``), as an expression
        shape = list(cx.out_shape)
    return cx.call("reshape", x, shape=shape)


@aten("flatten.using_ints")
def _flatten(cx, self, start_dim=0, end_dim=-1):
    return _view(cx, self, list(cx.out_shape))


@aten("permute.default")
def _permute(cx, self, dims):
    x = cx.tensor(self)
    return cx.permute(x, [_axis(d, x.ty.ndim) for d in dims])


@aten("transpose.int")
def _transpose(cx, self, dim0, dim1):
    x = cx.tensor(self)
    axes = list(range(x.ty.ndim))
    a, b = _axis(dim0, x.ty.ndim), _axis(dim1, x.ty.ndim)
    axes[a], axes[b] = axes[b], axes[a]
    return cx.permute(x, axes)


@aten("t.default", "numpy_T.default")
def _t(cx, self):
    x = cx.tensor(self)
    return cx.permute(x, list(reversed(range(x.ty.ndim))))


@aten("unsqueeze.default")
def _unsqueeze(cx, self, dim):
    x = cx.tensor(self)
    return cx.call("expand_dims", x, axis=[_axis(dim, x.ty.ndim + 1)])


@aten("squeeze.dim", "squeeze.dims", "squeeze.default")
def _squeeze(cx, self, dim=None):
    x = cx.tensor(self)
    candidates = range(x.ty.ndim) if dim is None else [_axis(d, x.ty.ndim) for d in _as_list(dim)]
    axes = [a for a in candidates if x.ty.shape[a] == 1]  # torch leaves a dimension that is not 1 alone
    return cx.call("squeeze", x, axis=axes) if axes else x


@aten("expand.default")
def _expand(cx, self, size, *, implicit=False):
    x = cx.tensor(self)
    size = list(size)
    offset = len(size) - x.ty.ndim
    shape = [x.ty.shape[i - offset] if d == -1 else d for i, d in enumerate(size)]
    if shape == list(x.ty.shape):
        return x
    return cx.call("broadcast_to", x, shape=shape)


@aten("cat.default")
def _cat(cx, tensors, dim=0):
    from dpl.ir.expr import Tuple

    dtype = cx.out_dtype
    # an empty part adds nothing: torch.tensor([]) (shape [0]) or a key/value cache before its
    # first update (shape [b, h, 0, d])
    axis = _axis(dim, cx.out_type.ndim)
    parts = [cx.cast(cx.tensor(t), dtype) for t in tensors
             if not (t.ty.ndim == 1 and t.ty.shape == (0,)) and not (t.ty.ndim > axis and t.ty.shape[axis] == 0)]
    if len(parts) == 1:
        return parts[0]
    return cx.call("concat", Tuple(tuple(parts)), axis=axis)


@aten("stack.default")
def _stack(cx, tensors, dim=0):
    from dpl.ir.expr import Tuple

    dtype = cx.out_dtype
    ndim = cx.tensor(tensors[0]).ty.ndim + 1
    axis = _axis(dim, ndim)
    parts = [cx.call("expand_dims", cx.cast(cx.tensor(t), dtype), axis=[axis]) for t in tensors]
    return cx.call("concat", Tuple(tuple(parts)), axis=axis)


def _split_at(cx, x, points, dim):
    from dpl.ir.expr import TupleGetItem

    axis = _axis(dim, x.ty.ndim)
    whole = cx.call("split", x, indices_or_sections=list(points), axis=axis)
    return tuple(TupleGetItem(whole, i) for i in range(len(points) + 1))


@aten("split.Tensor")
def _split(cx, self, split_size, dim=0):
    x = cx.tensor(self)
    size = cx.static(x.ty.shape[_axis(dim, x.ty.ndim)], "the split dimension")
    return _split_at(cx, x, list(range(split_size, size, split_size)), dim)


@aten("split_with_sizes.default")
def _split_with_sizes(cx, self, split_sizes, dim=0):
    points = list(np.cumsum(split_sizes[:-1]).tolist())
    return _split_at(cx, cx.tensor(self), points, dim)


@aten("chunk.default")
def _chunk(cx, self, chunks, dim=0):
    x = cx.tensor(self)
    size = cx.static(x.ty.shape[_axis(dim, x.ty.ndim)], "the chunked dimension")
    step = -(-size // chunks)
    return _split_at(cx, x, list(range(step, size, step)), dim)


_TO_END = 2**63 - 1  # torch's end for "to the end"


@aten("slice.Tensor")
def _slice(cx, self, dim=0, start=None, end=None, step=1):
    """A slice; along a symbolic dimension, or to a symbolic end, it must have a length a dpl
    type can hold (``x[:, -1:]``, ``mask[:seq]``): the strided_slice op says which do."""
    x = cx.tensor(self)
    axis, start, end, whole = _slice_bounds(x, dim, start, end, step, "slices")
    if whole:
        return x
    return cx.call("strided_slice", x, axes=[axis], begin=[start], end=[end], strides=[int(step)])


def _slice_bounds(x, dim, start, end, step, verb: str):
    """(axis, start, end, whether it is the whole axis) of a slice of ``x``: a missing start is
    0, a missing end the axis's end, a static end clamped to a static size; a symbolic start
    is refused, but for minus the axis's size (``x[:, -seq:]`` along ``seq``): 0 at every size."""
    axis = _axis(dim, x.ty.ndim)
    size = x.ty.shape[axis]
    start = 0 if start is None else start
    end = _TO_END if end is None else end
    if not isinstance(start, int) and add_dims(size, start) == 0:
        start = 0
    if not isinstance(start, int):
        raise FrontendError(f"slice start '{start}' is symbolic; dpl {verb} from a static start")
    if isinstance(size, int) and isinstance(end, int):
        end = min(end, size)
    whole = start == 0 and step == 1 and (end == size or (isinstance(end, int) and end >= _TO_END))
    return axis, start, end, whole


@aten("select.int")
def _select(cx, self, dim, index):
    x = cx.tensor(self)
    axis, index, end = _select_bounds(x, dim, index)
    row = cx.call("strided_slice", x, axes=[axis], begin=[index], end=[end], strides=[1])
    return cx.call("squeeze", row, axis=[axis])


def _select_bounds(x, dim, index):
    """(axis, begin, end) of the one element ``index`` along ``dim`` of ``x``: a static index,
    negative ones counted from a static size's end; along a symbolic size -1 is the last."""
    axis = _axis(dim, x.ty.ndim)
    size = x.ty.shape[axis]
    if not isinstance(index, int) or (isinstance(size, int) and not -size <= index < size):
        raise FrontendError(f"index {index} is not a static index into dimension {axis} of size {size}")
    if isinstance(size, int):
        index %= size
    return axis, index, _TO_END if index == -1 else index + 1


@aten("embedding.default")
def _embedding(cx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return cx.call("take", cx.tensor(weight), cx.tensor(indices), axis=0)


@aten("index_select.default")
def _index_select(cx, self, dim, index):
    x = cx.tensor(self)
    return cx.call("take", x, cx.tensor(index), axis=_axis(dim, x.ty.ndim))


# -- creation ----------------------------------------------------------------------------------


@aten("full.default")
def _full(cx, size, fill_value, *, dtype=None):
    return cx.call("full", cx.scalar(fill_value, cx.out_dtype), shape=list(size))


@aten("zeros.default", "ones.default")
def _zeros_ones(cx, size, *, dtype=None):
    return cx.call("zeros" if str(cx.node.target).startswith("aten.zeros") else "ones", shape=list(size), dtype=cx.out_dtype)


@aten("full_like.default")
def _full_like(cx, self, fill_value, *, dtype=None):
    return cx.call("full", cx.scalar(fill_value, cx.out_dtype), shape=list(cx.out_shape))


@aten("zeros_like.default", "ones_like.default")
def _zeros_ones_like(cx, self, *, dtype=None):
    fill = 1 if str(cx.node.target).startswith("aten.ones") else 0
    return cx.call("full", cx.scalar(fill, cx.out_dtype), shape=list(cx.out_shape))


@aten("empty.memory_format", "empty_permuted.default", "empty_like.default")
def _empty(cx, *args, **kwargs):
    """An uninitialised tensor (``torch.empty_like(perm)`` before ``inv[perm] = ...``) is zeros:
    a program that reads it before writing it has no defined result anyway."""
    return cx.call("full", cx.scalar(0, cx.out_dtype), shape=list(cx.out_shape))


@aten("scalar_tensor.default")
def _scalar_tensor(cx, s, *, dtype=None):
    return cx.scalar(s, cx.out_dtype)


@aten("new_full.default")
def _new_full(cx, self, size, fill_value, *, dtype=None):
    return cx.call("full", cx.scalar(fill_value, cx.out_dtype), shape=list(size))


@aten("new_zeros.default", "new_ones.default")
def _new_zeros_ones(cx, self, size, *, dtype=None):
    op = "zeros" if str(cx.node.target).startswith("aten.new_zeros") else "ones"
    return cx.call(op, shape=list(size), dtype=cx.out_dtype)


@aten("arange.default", "arange.start", "arange.start_step")
def _arange(cx, start, end=None, step=1, *, dtype=None):
    """A static range is a constant; a range with a symbolic bound (``torch.arange(seq)``,
    ``torch.arange(1, n + 1)``) is the ``arange`` op, whose length is an expression. dpl's
    length is none where the bounds cross (``max(n // 10, 1) - 1``); where torch's ranges of
    its sizes rule that out, its length (``n // 10 - 1``) is the one every other op of the
    program sees, so the range is sliced to it (a slice of its whole length: no copy)."""
    start, end = (0, start) if end is None else (start, end)
    if not isinstance(step, (int, float)):
        raise FrontendError(f"a range with the symbolic step '{step}' has no dpl op", hint="the step of a range must be a number")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return cx.scalar(np.arange(start, end, step), cx.out_dtype)
    out = cx.call("arange", start=start, end=end, step=step, dtype=cx.out_dtype)
    (length,) = cx.out_shape
    if out.ty.shape[0] == length:
        return out
    return cx.call("strided_slice", out, axes=[0], begin=[0], end=[length])


def _triangle(op):
    def translate(cx, self, diagonal=0):
        return cx.call(op, cx.tensor(self), k=int(diagonal))

    return translate


aten("triu.default")(_triangle("triu"))
aten("tril.default")(_triangle("tril"))


def _unavailable(what: str):
    from dpl.frontend.torch_graph import Unavailable

    return Unavailable(what)


# -- advanced indexing -------------------------------------------------------------------------


def _arange_of(node):
    """``(length, offset)`` when the fx ``node`` is ``arange(length) + offset`` (step 1, a static
    offset), seen through casts and the reshapes that only add size-1 axes; else None. The
    masks transformers builds index with such ranges (``mask[batch_idx, kv_idx]``)."""
    offset = 0
    while hasattr(node, "target"):
        name = str(node.target)
        if name in ("aten.unsqueeze.default", "aten.view.default", "aten.reshape.default", "aten._to_copy.default",
                    "aten.clone.default", "aten.expand.default", "aten.alias.default"):
            node = node.args[0]
        elif name in ("aten.add.Tensor", "aten.add.Scalar") and isinstance(node.args[1], int) and not node.kwargs:
            offset += node.args[1]
            node = node.args[0]
        elif name == "aten.arange.default" or (name == "aten.arange.start" and node.args[0] == 0):
            return node.meta["val"].shape[0], offset
        else:
            return None
    return None


@aten("index.Tensor")
def _index(cx, self, indices):
    """``x[i0, i1, ...]``. Indices that are ranges (``arange(n) + c``, each varying along one
    axis of the broadcast index shape) select a slice and place it: strided_slice, permute and
    expand_dims, no gather. A single tensor index (the others None) is ``take``."""
    x = cx.tensor(self)
    nodes = list(cx.node.args[1])
    given = [(axis, value, node) for axis, (value, node) in enumerate(zip(indices, nodes)) if value is not None]
    if len(given) == 1:  # x[:, :, idx]: the axes before it whole, as NumPy's one advanced index
        axis, idx, _ = given[0]
        return cx.call("take", x, _wrapped(cx, cx.tensor(idx), x.ty.shape[axis]), axis=axis)
    if any(v is None for v in indices):  # x[:, i, j]
        return _gather_tuples(cx, x, indices)
    ranges = [_arange_of(node) for _axis_, _value, node in given]
    if any(r is None for r in ranges):  # computed indices: a gather of the index tuples
        return _gather_tuples(cx, x, indices)
    rank = max(cx.tensor(v).ty.ndim for _a, v, _n in given)
    placed = []  # (axis of the result, axis of x) for each index
    for (axis, value, _node), (length, offset) in zip(given, ranges):
        shape = (1,) * (rank - value.ty.ndim) + tuple(value.ty.shape)
        varying = [i for i, d in enumerate(shape) if d != 1]
        if len(varying) > 1:
            raise FrontendError(f"index {axis} varies along several axes {varying}")
        size = x.ty.shape[axis]
        length = cx.importer.dim(length, f"the length of index {axis}")
        if not (offset == 0 and length == size):
            x = cx.call("strided_slice", x, axes=[axis], begin=[offset], end=[_end(offset, length)], strides=[1])
        placed.append((varying[0] if varying else None, axis))
    k = len(given)
    # x's indexed axes, in the order of the result axes they go to; then size-1 axes in between
    order = sorted(range(k), key=lambda j: (placed[j][0] is None, placed[j][0] if placed[j][0] is not None else 0))
    x = cx.permute(x, order + list(range(k, x.ty.ndim)))
    targets = [placed[j][0] for j in order]
    ones = [i for i, t in enumerate(targets) if t is None]  # one-element indices (batch 1): sorted last, axes of 1
    if ones:
        x = cx.call("squeeze", x, axis=ones)
        targets = [t for t in targets if t is not None]
    missing = [i for i in range(rank) if i not in targets]
    if missing:
        x = cx.call("expand_dims", x, axis=missing)
    out = list(cx.out_shape)
    return x if list(x.ty.shape) == out else cx.call("broadcast_to", x, shape=out)


def _gather_tuples(cx, x, indices):
    """``x[i0, i1, ...]`` with computed index tensors: they broadcast, stack into index tuples
    along a new last axis, and ``gather_nd`` reads them (a leading ``x[:, i, j]`` as ranges)."""
    from dpl.ir.expr import Tuple

    tensors = _index_tensors(cx, x, indices)
    shape = list(_broadcast_dims([t.ty.shape for t in tensors]))
    parts = [cx.call("expand_dims", t if list(t.ty.shape) == shape else cx.call("broadcast_to", t, shape=shape),
                     axis=[len(shape)]) for t in tensors]
    return cx.call("gather_nd", x, cx.call("concat", Tuple(tuple(parts)), axis=len(shape)))


def _broadcast_dims(shapes) -> tuple:
    ndim = max(len(s) for s in shapes)
    out = []
    for a in range(ndim):
        dims = [s[a - ndim + len(s)] for s in shapes if a - ndim + len(s) >= 0]
        out.append(next((d for d in dims if d != 1), 1))
    return tuple(out)


def _wrapped(cx, idx, size):
    """Constant indices with negative entries counted from the end, as torch counts them."""
    from dpl.ir.expr import Constant

    if isinstance(idx, Constant) and isinstance(size, int) and (np.asarray(idx.value) < 0).any():
        value = np.asarray(idx.value)
        return Constant(np.where(value < 0, value + size, value).astype(value.dtype))
    return idx


def _end(offset, length):
    return offset + length if isinstance(length, int) else (length if offset == 0 else None)


@aten("gather.default")
def _gather(cx, self, dim, index, *, sparse_grad=False):
    """``torch.gather`` where the index varies along ``dim`` only (its other axes of size 1), as
    BERT's buffered token types use it: a ``take`` along ``dim``."""
    x, idx = cx.tensor(self), cx.tensor(index)
    axis = _axis(dim, x.ty.ndim)
    others = [i for i in range(idx.ty.ndim) if i != axis]
    base = _expanded_from(cx, cx.node.args[0])
    if base is not None and all(base.ty.shape[i] == 1 for i in others) and base.ty.ndim == x.ty.ndim:
        # rows that are copies of one (RoBERTa's token types expanded to the batch): take from it
        row = cx.reshape(base, [base.ty.shape[axis]])
        return cx.call("take", row, idx, axis=0)
    index_base = _repeated_from(cx, cx.node.args[2])
    if index_base is not None and all(index_base.ty.shape[i] == 1 for i in others) and \
            all(idx.ty.shape[i] == x.ty.shape[i] for i in others):
        # an index repeated along the other axes (GPT-J's position ids per rotary channel)
        return cx.call("take", x, cx.reshape(index_base, [index_base.ty.shape[axis]]), axis=axis)
    if any(idx.ty.shape[i] != 1 for i in others):  # a general gather (DeBERTa's relative positions)
        return cx.call("gather_elements", x, idx, axis=axis)
    if any(x.ty.shape[i] != 1 for i in others):
        x = cx.call("strided_slice", x, axes=others, begin=[0] * len(others), end=[1] * len(others),
                    strides=[1] * len(others))
    flat = cx.reshape(idx, [idx.ty.shape[axis]])
    return cx.call("take", x, flat, axis=axis)


def _expanded_from(cx, node):
    """The dpl value an ``aten.expand`` node broadcasts, or None when ``node`` is no expand."""
    if str(getattr(node, "target", "")) != "aten.expand.default":
        return None
    value = cx.importer.env.get(node.args[0])
    return value if hasattr(value, "ty") else None


def _repeated_from(cx, node):
    """The dpl value an ``aten.expand`` or ``aten.repeat`` node copies along its size-1 axes."""
    if str(getattr(node, "target", "")) not in ("aten.expand.default", "aten.repeat.default"):
        return None
    value = cx.importer.env.get(node.args[0])
    if not hasattr(value, "ty") or value.ty.ndim != len(node.meta["val"].shape):
        return None
    return value


@aten("cumsum.default")
def _cumsum(cx, self, dim, *, dtype=None):
    x = cx.tensor(self)
    return cx.call("cumsum", x, axis=_axis(dim, x.ty.ndim), dtype=cx.out_dtype)


# -- padding -----------------------------------------------------------------------------------


def _pad_width(x, pad) -> list[int]:
    """torch's pad, (before, after) pairs from the last axis backwards, as the op's pad_width:
    (before, after) pairs from the first axis on, 0 for the axes torch leaves alone."""
    pad = list(pad)
    if any(not isinstance(p, int) for p in pad):
        raise FrontendError(f"pad {pad} holds a symbolic size; dpl pads by static widths")
    ndim = x.ty.ndim
    if len(pad) % 2 or len(pad) > 2 * ndim:
        raise FrontendError(f"pad {pad} must hold (before, after) pairs for at most the {ndim} axes of the input")
    widths = [0] * (2 * ndim)
    for k in range(len(pad) // 2):
        axis = ndim - 1 - k
        widths[2 * axis], widths[2 * axis + 1] = pad[2 * k], pad[2 * k + 1]
    return widths


def _padded(cx, self, pad, mode: str, value=None):
    x = cx.tensor(self)
    widths = _pad_width(x, pad)
    if not any(widths):
        return x
    if mode != "constant" or value is None:
        value = 0
    if _is_float(x):
        value = float(value)
    elif isinstance(value, float) and value == int(value):
        value = int(value)  # a whole float padding integers (torch casts it)
    return cx.call("nn.pad", x, pad_width=widths, pad_mode=mode, pad_value=value)


@aten("constant_pad_nd.default")
def _constant_pad_nd(cx, self, pad, value=0):
    return _padded(cx, self, pad, "constant", value)


for _n in (1, 2, 3):
    aten(f"reflection_pad{_n}d.default")(lambda cx, self, padding: _padded(cx, self, padding, "reflect"))
    aten(f"replication_pad{_n}d.default")(lambda cx, self, padding: _padded(cx, self, padding, "replicate"))


@aten("_pad_circular.default")
def _pad_circular(cx, self, pad):
    return _padded(cx, self, pad, "circular")


@aten("pad.default")
def _pad(cx, self, pad, mode="constant", value=None):
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise FrontendError(f"argument 'mode={mode!r}' is not supported (constant, reflect, replicate, circular)")
    return _padded(cx, self, pad, mode, value)


@aten("repeat.default")
def _repeat(cx, self, repeats):
    """``x.repeat(r0, r1, ...)``: each axis tiled, as broadcast_to over an interleaved size-1
    axis then a reshape merging the pair (a symbolic size tiled more than once has no dpl type)."""
    x = cx.tensor(self)
    reps = list(repeats)
    if len(reps) < x.ty.ndim:
        raise FrontendError(f"repeat takes at least {x.ty.ndim} sizes for a rank-{x.ty.ndim} tensor, got {reps}")
    if len(reps) > x.ty.ndim:
        x = cx.call("expand_dims", x, axis=list(range(len(reps) - x.ty.ndim)))
    if all(r == 1 for r in reps):
        return x
    shape = list(x.ty.shape)
    final = []
    for r, d in zip(reps, shape):
        if r == 1 or d == 1:
            final.append(d if r == 1 else r)
        elif isinstance(r, int) and isinstance(d, int):
            final.append(r * d)
        else:
            raise FrontendError(f"repeating a dimension {d} {r} times gives a size no dpl type can hold")
    pairs = cx.call("expand_dims", x, axis=[2 * i for i in range(len(shape))])
    tiled = cx.call("broadcast_to", pairs, shape=[v for r, d in zip(reps, shape) for v in (r, d)])
    return cx.call("reshape", tiled, shape=final)


# interpolation, convolutions of any rank, group and instance norm, vector norms: torch_image.py;
# the experts' grouped products of mixture-of-experts layers: torch_moe.py
for _name, _fn in {**torch_image.ATEN_OPS, **torch_moe.TORCH_OPS}.items():
    if _name in ATEN_OPS:
        raise ValueError(f"{_name} is translated twice")
    ATEN_OPS[_name] = _fn


# -- indexing, scattering and sorting (dpl/ops/indexing.py) ------------------------------------
#
# In-place writes reach here functionalised: ``y[:, 1:3] = v`` is slice_scatter, ``y[2] = v``
# select_scatter, ``y[i] = v`` / ``y.index_put_(...)`` index_put, ``y.copy_(v)`` copy.


def _items(call, n: int = 2) -> tuple:
    from dpl.ir.expr import TupleGetItem

    return tuple(TupleGetItem(call, i) for i in range(n))


def _target(cx) -> str:
    return str(cx.node.target)


@aten("argmax.default", "argmin.default")
def _argmax(cx, self, dim=None, keepdim=False):
    x = cx.tensor(self)
    op = "argmax" if _target(cx).startswith("aten.argmax") else "argmin"
    return cx.call(op, x, axis=None if dim is None else _axis(dim, x.ty.ndim), keepdims=bool(keepdim))


@aten("max.dim", "min.dim")
def _max_dim(cx, self, dim, keepdim=False):
    """``x.max(dim)``: (values, indices), the first index of equal values as torch documents."""
    x = cx.tensor(self)
    axis, keep = _axis(dim, x.ty.ndim), bool(keepdim)
    big = _target(cx).startswith("aten.max")
    return (cx.call("max" if big else "min", x, axis=[axis], keepdims=keep),
            cx.call("argmax" if big else "argmin", x, axis=axis, keepdims=keep))


@aten("topk.default")
def _topk(cx, self, k, dim=-1, largest=True, sorted=True):
    x = cx.tensor(self)
    axis = _axis(dim, x.ty.ndim)
    if not isinstance(k, int):  # x.topk(x.shape[d], d): every element, in order
        if k != x.ty.shape[axis]:
            raise FrontendError(f"topk with the symbolic k '{k}' along dimension {axis} of size {x.ty.shape[axis]} "
                                "is not supported (dpl's k is a number, or the whole dimension)")
        return _items(cx.call("sort", x, axis=axis, descending=bool(largest)))
    return _items(cx.call("topk", x, k=int(k), axis=axis, largest=bool(largest), sorted=bool(sorted)))


@aten("sort.default", "sort.stable")
def _sort(cx, self, dim=-1, descending=False, *, stable=None):
    """A stable sort always: torch leaves the order of equal values unspecified without stable=True."""
    x = cx.tensor(self)
    return _items(cx.call("sort", x, axis=_axis(dim, x.ty.ndim), descending=bool(descending)))


@aten("histc.default")
def _histc(cx, self, bins=100, min=0, max=0):
    return cx.call("histc", cx.tensor(self), bins=int(bins), min=float(min), max=float(max))


@aten("copy.default", "fill.Scalar", "fill.Tensor")
def _copy(cx, self, src, non_blocking=False):
    """``self.copy_(src)`` / ``self.fill_(v)``: src in self's dtype, broadcast to its shape."""
    x = cx.tensor(self)
    v = cx.operand(src, x.ty.dtype)
    return v if v.ty.shape == x.ty.shape else cx.call("broadcast_to", v, shape=list(x.ty.shape))


@aten("slice_scatter.default")
def _slice_scatter(cx, self, src, dim=0, start=None, end=None, step=1):
    x = cx.tensor(self)
    s = cx.cast(cx.tensor(src), x.ty.dtype)
    axis, start, end, whole = _slice_bounds(x, dim, start, end, step, "writes into slices")
    if whole:
        return s  # the whole tensor written over
    return cx.call("slice_scatter", x, s, axes=[axis], begin=[start], end=[end], strides=[int(step)])


@aten("select_scatter.default")
def _select_scatter(cx, self, src, dim, index):
    x = cx.tensor(self)
    axis, index, end = _select_bounds(x, dim, index)
    row = cx.call("expand_dims", cx.cast(cx.tensor(src), x.ty.dtype), axis=[axis])
    return cx.call("slice_scatter", x, row, axes=[axis], begin=[index], end=[end], strides=[1])


def _index_tensors(cx, x, indices) -> list:
    """The int64 index tensors of ``x[indices]`` for dpl's index ops, which index the leading
    axes: a leading ``None`` (``x[:, i]``) becomes a range along its axis, shaped to broadcast
    before the others; trailing ``None``s are dropped. A ``None`` between tensors (NumPy moves
    the indexed axes first then) is refused."""
    given = list(indices)
    while given and given[-1] is None:
        given.pop()
    lead = 0
    while lead < len(given) and given[lead] is None:
        lead += 1
    if not given or any(i is None for i in given[lead:]):
        raise FrontendError("indexing with None between tensor indices is not supported")
    tensors = [cx.tensor(i) for i in given[lead:]]
    if any(t.ty.dtype == "bool" for t in tensors):
        raise FrontendError("a boolean mask index is supported only alone, writing one value (x[mask] = v)")
    tensors = [cx.cast(t, "int64") for t in tensors]
    rank = max(t.ty.ndim for t in tensors)
    ranges = []
    for j in range(lead):
        d = x.ty.shape[j]
        r = cx.scalar(np.arange(d), "int64") if isinstance(d, int) else cx.call("arange", end=d, dtype="int64")
        trailing = list(range(1, lead - j + rank))
        ranges.append(cx.call("expand_dims", r, axis=trailing) if trailing else r)
    return ranges + tensors


@aten("index_put.default")
def _index_put(cx, self, indices, values, accumulate=False):
    from dpl.ir.expr import Tuple

    x = cx.tensor(self)
    v = cx.operand(values, x.ty.dtype)
    given = [i for i in indices if i is not None]
    if len(given) == 1 and cx.tensor(given[0]).ty.dtype == "bool" and indices[0] is not None:
        mask = cx.tensor(given[0])  # x[mask] = v: a where, when v is one value
        if accumulate or any(d != 1 for d in v.ty.shape):
            raise FrontendError("x[mask] = values is supported with one value (values of one element), not accumulated")
        if mask.ty.ndim < x.ty.ndim:
            mask = cx.call("expand_dims", mask, axis=list(range(mask.ty.ndim, x.ty.ndim)))
        return cx.call("where", mask, cx.reshape(v, []), x)
    tensors = _index_tensors(cx, x, indices)
    return cx.call("index_put", x, Tuple(tuple(tensors)), v, accumulate=bool(accumulate))


@aten("index_copy.default")
def _index_copy(cx, self, dim, index, source):
    from dpl.ir.expr import Tuple

    x = cx.tensor(self)
    axis = _axis(dim, x.ty.ndim)
    tensors = _index_tensors(cx, x, [None] * axis + [index])
    return cx.call("index_put", x, Tuple(tuple(tensors)), cx.cast(cx.tensor(source), x.ty.dtype))


@aten("index_add.default")
def _index_add(cx, self, dim, index, source, *, alpha=1):
    from dpl.ir.expr import Tuple

    x = cx.tensor(self)
    axis = _axis(dim, x.ty.ndim)
    src = cx.cast(cx.tensor(source), x.ty.dtype)
    if alpha != 1:
        src = cx.call("multiply", src, cx.scalar(alpha, x.ty.dtype))
    tensors = _index_tensors(cx, x, [None] * axis + [index])
    return cx.call("index_put", x, Tuple(tuple(tensors)), src, accumulate=True)


_SCATTER_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


@aten("scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two")
def _scatter(cx, self, dim, index, src, reduce=None, *, include_self=True):
    """torch.scatter and its reductions: scatter_elements. torch reads only the part of src
    that the index covers, so a larger src is sliced to the index's shape first."""
    x, idx = cx.tensor(self), cx.tensor(index)
    axis = _axis(dim, x.ty.ndim)
    target = _target(cx)
    reduction = "add" if target.startswith("aten.scatter_add") else "update"
    if target == "aten.scatter_reduce.two":
        if reduce not in _SCATTER_REDUCE or not include_self:
            raise FrontendError(f"scatter_reduce with reduce={reduce!r}, include_self={include_self} is not supported "
                                f"(dpl folds in with {', '.join(_SCATTER_REDUCE)}, including self)")
        reduction = _SCATTER_REDUCE[reduce]
    if isinstance(src, (bool, int, float)):
        updates = cx.call("full", cx.scalar(src, x.ty.dtype), shape=list(idx.ty.shape))
    else:
        updates = cx.cast(cx.tensor(src), x.ty.dtype)
        if updates.ty.shape != idx.ty.shape:
            axes = [a for a in range(idx.ty.ndim) if updates.ty.shape[a] != idx.ty.shape[a]]
            updates = cx.call("strided_slice", updates, axes=axes, begin=[0] * len(axes),
                              end=[idx.ty.shape[a] for a in axes], strides=[1] * len(axes))
    return cx.call("scatter_elements", x, idx, updates, axis=axis, reduction=reduction)
