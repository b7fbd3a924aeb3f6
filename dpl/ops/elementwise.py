"""Elementwise and broadcasting ops: arithmetic, math functions, activations, casts, compare.

Each carries a scalar C template (``{0}``, ``{1}`` are operands; math names are the
type-generic ones of ``<tgmath.h>``) so the kernel emitters never special-case an op.
"""

from __future__ import annotations

import math

import numpy as np

from dpl import dtypes

from dpl.ir.types import TensorType
from dpl.ops._shapes import broadcast_shapes, is_full_shape, same_dtype
from dpl.ops.registry import AttrSpec, CallInfo, OpPatternKind, register

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    return _erf(np.asarray(x, dtype=np.float64)).astype(np.float64)


def broadcast_kind(info: CallInfo, out) -> OpPatternKind:
    """TVM: a broadcast op with one operand read at the output index is ElemWise as a whole;
    only a pure broadcast (every operand broadcast) stays Broadcast."""
    if any(is_full_shape(t, out) for t in info.arg_types):
        return OpPatternKind.ELEMWISE
    return OpPatternKind.BROADCAST


def _same_float(fn):
    """A NumPy function computed in float64 and cast back, so f16 and f32 agree with C."""

    def ref(*xs, **_):
        dtype = np.result_type(*xs)
        return np.asarray(fn(*(np.asarray(x, np.float64) for x in xs))).astype(dtype)

    return ref


def _infer_binary(info: CallInfo) -> TensorType:
    return TensorType(broadcast_shapes(info), same_dtype(info))


def _infer_compare(info: CallInfo) -> TensorType:
    same_dtype(info)
    return TensorType(broadcast_shapes(info), "bool")


def _infer_unary(info: CallInfo) -> TensorType:
    return info.tensor(0)


# ops with no boolean form (NumPy refuses '-' on bools, and x * x of a bool is no bool; nor has a bool
# a remainder or a sign other than itself), and the
# spelling of what was likely meant, over the operands' names
_BOOL_HINTS = {
    "subtract": "for a boolean 'a and not b' write where({1}, false, {0}); for 'a xor b', not_equal({0}, {1})",
    "negative": "for a boolean 'not', write equal({0}, false); for -x as a number, astype({0}, dtype=i8) first",
    "square": "a bool squared is itself; for x * x as a number, astype({0}, dtype=i8) first",
    "mod": "for the remainder of numbers, astype({0}, dtype=i8) and astype({1}, dtype=i8) first",
    "floor_mod": "for the remainder of numbers, astype({0}, dtype=i8) and astype({1}, dtype=i8) first",
    "sign": "a bool is its own sign: use {0} itself; for -1, 0 or 1 as a number, astype({0}, dtype=i8) first",
}


def _reject_bool(info: CallInfo) -> None:
    for i in range(len(info.arg_types)):
        if info.tensor(i).dtype == "bool":
            err = info.error(f"operand {info.operand(i)} is bool, and '{info.op}' has no boolean form")
            names = [info.arg_names[k] if k < len(info.arg_names) else "xy"[k] for k in range(len(info.arg_types))]
            err.hint = _BOOL_HINTS[info.op].format(*names)
            raise err


def _infer_arith_binary(info: CallInfo) -> TensorType:
    _reject_bool(info)
    return _infer_binary(info)


def _infer_arith_unary(info: CallInfo) -> TensorType:
    _reject_bool(info)
    return _infer_unary(info)


def _infer_float_unary(info: CallInfo) -> TensorType:
    t = info.tensor(0)
    if not t.dtype.startswith(("float", "bfloat")):
        raise info.error(f"operand {info.operand(0)} must have a floating-point dtype")
    return t


def _binary(name, fn, c, doc, infer=_infer_binary):
    register(name, num_args=2, infer=infer, kind=broadcast_kind, ref=lambda a, b: np.asarray(fn(a, b)).astype(np.result_type(a, b)), c_expr=c, doc=doc)


def _compare(name, fn, c):
    register(name, num_args=2, infer=_infer_compare, kind=broadcast_kind, ref=lambda a, b: np.asarray(fn(a, b)), c_expr=c, doc=f"elementwise {name}, giving bool")


def _unary(name, fn, c, doc, infer=_infer_float_unary):
    register(name, num_args=1, infer=infer, kind=OpPatternKind.ELEMWISE, ref=fn, c_expr=c, doc=doc)


def _divide(a, b):
    """Floats: IEEE division. Integers: C's truncation toward zero, in integers (exact for every
    int64), with what C leaves undefined defined: a zero divisor gives 0, and the most negative
    value over -1 wraps to itself (the generated C's ``dpl_div_*`` helpers agree)."""
    dtype = np.result_type(a, b)
    if dtype == np.bool_:
        return np.logical_and(a, b)  # a / 1 is a, a / 0 is 0
    if not np.issubdtype(dtype, np.integer):
        return np.divide(a, b)
    a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        floor = np.floor_divide(a, b)  # 0 where b is 0; the most negative over -1 wraps
        rem = np.remainder(a, b)
    # floor and truncation differ by one where the division is inexact and the signs differ
    return np.where((rem != 0) & ((a < 0) != (b < 0)), floor + dtype.type(1), floor)


def _fmod(a, b, dtype):
    """C's fmod (truncated: the sign of the dividend), exact in float64 for every float dtype;
    NumPy's integer fmod gives 0 for a zero divisor and for the most negative value over -1."""
    if np.issubdtype(dtype, np.integer):
        a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    else:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b), b


def _mod(a, b):
    """``a - trunc(a / b) * b``, the remainder of integer ``divide``: ONNX Mod with fmod=1, torch's
    fmod. Floats: C's fmod (NaN for a zero divisor). Integers: exact, with what C leaves undefined
    defined as ``divide`` defines it: 0 for a zero divisor, and 0 for the most negative value
    over -1 (the generated C's ``dpl_mod_*`` helpers agree)."""
    dtype = np.result_type(a, b)
    m, _ = _fmod(a, b, dtype)
    return m.astype(dtype)


def _floor_mod(a, b):
    """``a - floor(a / b) * b``, the sign of the divisor: torch's remainder, ONNX Mod with fmod=0,
    Python's ``%``. Computed as NumPy's remainder is: ``m = fmod(a, b)``, plus ``b`` where ``m``
    is not 0 and its sign differs from ``b``'s; a zero result has the divisor's sign (NumPy's,
    Python's and ONNX Mod-28's; torch's keeps the dividend's). Integers as ``mod``: 0 for a zero
    divisor."""
    dtype = np.result_type(a, b)
    m, b = _fmod(a, b, dtype)
    with np.errstate(invalid="ignore"):
        out = np.where((m != 0) & ((m < 0) != (b < 0)), m + b, m)
    if not np.issubdtype(dtype, np.integer):
        out = np.where(m == 0, np.copysign(0.0, b), out)
    return out.astype(dtype)


_binary("add", np.add, "({0} + {1})", "a + b")
_binary("subtract", np.subtract, "({0} - {1})", "a - b", infer=_infer_arith_binary)
_binary("multiply", np.multiply, "({0} * {1})", "a * b")
_binary("divide", _divide, "({0} / {1})", "a / b")
_binary("power", lambda a, b: np.power(np.asarray(a, np.float64), b), "pow({0}, {1})", "a ** b")
# NumPy's maximum and minimum: a NaN operand gives NaN (``x != x`` is false for integers)
_binary("mod", _mod, "fmod({0}, {1})", "a - trunc(a / b) * b (C's fmod; integers: 0 for a zero divisor)",
        infer=_infer_arith_binary)
_binary("floor_mod", _floor_mod,
        "(fmod({0}, {1}) == 0 ? copysign(0.0, {1}) : (fmod({0}, {1}) < 0) != ({1} < 0) ? fmod({0}, {1}) + {1} "
        ": fmod({0}, {1}))",
        "a - floor(a / b) * b (Python's %; integers: 0 for a zero divisor)", infer=_infer_arith_binary)
_binary("maximum", np.maximum, "(({0} > {1} || {0} != {0}) ? {0} : {1})", "max(a, b)")
_binary("minimum", np.minimum, "(({0} < {1} || {0} != {0}) ? {0} : {1})", "min(a, b)")

_compare("equal", np.equal, "({0} == {1})")
_compare("not_equal", np.not_equal, "({0} != {1})")
_compare("less", np.less, "({0} < {1})")
_compare("less_equal", np.less_equal, "({0} <= {1})")
_compare("greater", np.greater, "({0} > {1})")
_compare("greater_equal", np.greater_equal, "({0} >= {1})")

_unary("exp", _same_float(np.exp), "exp({0})", "e ** x")
_unary("log", _same_float(np.log), "log({0})", "natural logarithm")
_unary("sqrt", _same_float(np.sqrt), "sqrt({0})", "square root")
_unary("rsqrt", _same_float(lambda x: 1.0 / np.sqrt(x)), "(1 / sqrt({0}))", "1 / sqrt(x)")
_unary("tanh", _same_float(np.tanh), "tanh({0})", "hyperbolic tangent")
_unary("sigmoid", _same_float(lambda x: 1.0 / (1.0 + np.exp(-x))), "(1 / (1 + exp(-{0})))", "1 / (1 + e ** -x)")
_unary("erf", _same_float(erf), "erf({0})", "the error function")
_unary("sin", _same_float(np.sin), "sin({0})", "sine")
_unary("cos", _same_float(np.cos), "cos({0})", "cosine")
_unary("log1p", _same_float(np.log1p), "log1p({0})", "log(1 + x), exact near 0")
_unary("expm1", _same_float(np.expm1), "expm1({0})", "e ** x - 1, exact near 0")
# the roundings: float operands only (of an integer each is the integer itself; the frontends
# pass integers through). ``rint`` rounds half to even in C's default rounding mode, as NumPy,
# torch and ONNX's Round do
_unary("floor", np.floor, "floor({0})", "round toward -inf")
_unary("ceil", np.ceil, "ceil({0})", "round toward +inf")
_unary("round", np.rint, "rint({0})", "round to nearest, half to even")
_unary("trunc", np.trunc, "trunc({0})", "round toward 0")
_unary("negative", np.negative, "(-{0})", "-x", infer=_infer_arith_unary)
# ``x + 0``: NumPy's |-0.0| is +0.0
_unary("abs", np.abs, "({0} < 0 ? -{0} : {0} + 0)", "|x|", infer=_infer_unary)
_unary("square", np.square, "({0} * {0})", "x * x", infer=_infer_arith_unary)


def _sign(x):
    """NumPy's sign: 1, -1, or x + 0 (+0.0 for either zero, NaN for NaN)."""
    x = np.asarray(x)
    one, zero = np.ones((), x.dtype), np.zeros((), x.dtype)
    rest = x + zero if x.dtype.kind == "u" else np.where(x < 0, -one, x + zero)
    return np.where(x > 0, one, rest).astype(x.dtype)


# ``x + 0``: +0.0 for -0.0, NaN for NaN (NumPy's; torch's sign of NaN is 0, which its frontend adds)
_unary("sign", _sign, "({0} > 0 ? 1 : {0} < 0 ? -1 : {0} + 0)", "1, -1 or 0 by the sign of x; NaN for NaN",
       infer=_infer_arith_unary)
# ``x <= 0`` is false for NaN, which passes through (NumPy's maximum); -0.0 gives +0.0
_unary("nn.relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), "({0} <= 0 ? 0 : {0})", "max(x, 0)", infer=_infer_unary)
_unary(
    "nn.gelu",
    _same_float(lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))),
    "(0.5 * {0} * (1 + erf({0} * 0.7071067811865476)))",
    "x * Phi(x), with erf",
)
_unary(
    "nn.gelu_tanh",
    _same_float(lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))),
    # 0.5 x (1 + tanh(u)) is x * sigmoid(2u): one exp instead of tanh (a vector tanhf is ~2.3x a
    # vector expf in glibc's libmvec), and no 1 + tanh(u) cancelling where x < 0
    "({0} / (1 + exp(-1.5957691216057308 * ({0} + 0.044715 * {0} * {0} * {0}))))",
    "GELU, tanh approximation",
)
_unary("nn.silu", _same_float(lambda x: x / (1.0 + np.exp(-x))), "({0} / (1 + exp(-{0})))", "x * sigmoid(x)")



def _softplus_ref(x, beta, threshold):
    x64 = np.asarray(x, np.float64)
    scaled = x64 * beta
    with np.errstate(over="ignore"):
        return np.where(scaled > threshold, x64, np.log1p(np.exp(scaled)) / beta).astype(x.dtype)


register(
    "nn.softplus",
    num_args=1,
    attrs={"beta": AttrSpec("float", default=1.0), "threshold": AttrSpec("float", default=20.0)},
    infer=_infer_float_unary,
    kind=OpPatternKind.ELEMWISE,
    # torch's softplus and Relax's: x itself where beta * x is above the threshold
    ref=_softplus_ref,
    c_expr="({0} * {beta} > {threshold} ? {0} : log1p(exp({0} * {beta})) / {beta})",
    doc="log(1 + e ** (beta * x)) / beta; x where beta * x > threshold",
)

register(
    "clip",
    num_args=1,
    attrs={"min": AttrSpec("float"), "max": AttrSpec("float")},
    infer=_infer_unary,
    kind=OpPatternKind.ELEMWISE,
    # NumPy's clip: min(max(x, min), max), x kept unless strictly beyond a bound (so -0.0 stays
    # -0.0), max wherever min > max, NaN where x or a bound is NaN. The template is that for
    # min <= max; the other bounds lower to a constant (kernel/rules.py, elementwise)
    ref=lambda x, min, max: np.clip(x, min, max).astype(x.dtype),
    c_expr="({0} < {min} ? {min} : {0} > {max} ? {max} : {0})",
    doc="clamp x to [min, max] as NumPy's clip does (max wherever min > max)",
)

register(
    "astype",
    num_args=1,
    attrs={"dtype": AttrSpec("dtype")},
    infer=lambda info: TensorType(info.tensor(0).shape, info.attrs["dtype"]),
    kind=OpPatternKind.ELEMWISE,
    ref=lambda x, dtype: np.asarray(x).astype(dtypes.to_numpy(dtype)),
    c_expr="(({dtype}){0})",
    doc="convert to another dtype",
)


def _infer_where(info: CallInfo) -> TensorType:
    if info.tensor(0).dtype != "bool":
        raise info.error(f"condition {info.operand(0)} must have dtype bool")
    return TensorType(broadcast_shapes(info), same_dtype(info, [1, 2]))


register(
    "where",
    num_args=3,
    infer=_infer_where,
    kind=broadcast_kind,
    ref=lambda c, a, b: np.where(c, a, b).astype(np.result_type(a, b)),
    c_expr="({0} ? {1} : {2})",
    doc="cond ? a : b, broadcasting",
)
