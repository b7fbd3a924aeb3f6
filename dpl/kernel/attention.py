"""What a ``kernel.attention`` composite computes, read off its bindings, for the flash-style
attention kernels of the backends (``backends/cpu/flash_attention.py``).

The composite is ``llm.dpl``'s ``pattern attention``::

    s   = matmul(q, k)                        # q [..., Sq, D], k [..., D, Sk]
    z   = multiply(s, scale) | divide(s, scale)
    m   = add(z, mask)                        # optional; mask broadcasts to [..., Sq, Sk]
    p   = nn.softmax(m)                       # over the last axis
    out = matmul(p, v)                        # v [..., Sk, Dv]

with NumPy's broadcasting over the batch dimensions of every operand (GQA: k/v heads of size
1 broadcast over q's). :func:`read_attention` gives an :class:`Attention` naming where each
operand comes from (a parameter of the composite, or a constant), or raises
:class:`NotAttention` with the reason, so that a backend can fall back to its other paths.

Why not the kernel IR: flash attention's state between key tiles (a running maximum, a running
sum and a whole output row that is rescaled when the maximum grows) is a set of mutable
accumulators carried across a loop. The kernel IR's statements are single-assignment lets and
:class:`~dpl.kernel.ir.Reduce` folds of one scalar with a registry combiner, which cannot
hold a vector accumulator rescaled by a second one; adding mutable state to it would take
away the property every other kernel relies on (each statement's loops carry no dependences,
so the NumPy evaluator can run them vectorised). So the attention kernel is a template of
its own, fed by this description.
"""

from __future__ import annotations

from typing import Union

import attrs
import numpy as np

from dpl.ir.expr import Call, Constant, Function, Var
from dpl.ir.types import TensorType

FLOATS = ("float32", "float64", "float16", "bfloat16")


class NotAttention(Exception):
    """The composite is not one the flash kernels take (the reason is the message)."""


@attrs.frozen
class Param:
    """Operand read from the composite's parameter ``index``."""

    index: int


@attrs.frozen(eq=False)
class Const:
    """Operand that is a constant inside the composite."""

    value: np.ndarray


Source = Union[Param, Const]


@attrs.frozen(eq=False)
class Attention:
    """softmax(q @ k <scale_op> scale [+ mask]) @ v. ``scale`` is a Python float (a scalar
    constant) or a :data:`Source` of one element; ``head_dim`` (D) and ``value_dim`` (Dv)
    are static."""

    q: Source
    k: Source
    v: Source
    mask: Source | None
    scale: float | Source
    scale_op: str  # "multiply" or "divide"
    dtype: str
    head_dim: int
    value_dim: int
    out_shape: tuple


def _call(b, op: str) -> Call:
    if not (isinstance(b.value, Call) and b.value.op == op):
        raise NotAttention(f"binding '{b.var.name}' is not {op}")
    return b.value


def read_attention(function: Function) -> Attention:
    """The attention a composite computes, or :class:`NotAttention`."""
    if function.attrs.get("Composite") != "kernel.attention":
        raise NotAttention("not a kernel.attention composite")
    bindings = list(function.bindings)
    if len(bindings) not in (4, 5) or function.ret is not bindings[-1].var:
        raise NotAttention("not the five bindings of llm.attention")
    params = {id(p): i for i, p in enumerate(function.params)}

    def source(x) -> Source:
        if isinstance(x, Var) and id(x) in params:
            return Param(params[id(x)])
        if isinstance(x, Constant):
            return Const(np.asarray(x.value))
        raise NotAttention("an operand is computed inside the composite")

    s = _call(bindings[0], "matmul")
    scaled = bindings[1].value
    if not (isinstance(scaled, Call) and scaled.op in ("multiply", "divide")):
        raise NotAttention("no scale after the first product")
    a, b = scaled.args
    if b is bindings[0].var and scaled.op == "multiply":
        a, b = b, a
    if a is not bindings[0].var:
        raise NotAttention("the scale does not apply to the scores")
    scale = _scale(b, source)
    mask, mask_expr = None, None
    prev = bindings[1].var
    rest = bindings[2:]
    if len(rest) == 3:
        add = _call(rest[0], "add")
        x, y = add.args
        if y is prev:
            x, y = y, x
        if x is not prev or y is prev:
            raise NotAttention("the mask is not added to the scaled scores")
        mask, mask_expr = source(y), y
        prev = rest[0].var
        rest = rest[1:]
    soft = _call(rest[0], "nn.softmax")
    if soft.args[0] is not prev:
        raise NotAttention("the softmax does not read the scores")
    rank = len(rest[0].var.ty.shape)
    axis = int(dict(soft.attrs).get("axis", -1))
    if axis not in (-1, rank - 1):
        raise NotAttention(f"softmax over axis {axis}, not the keys")
    out = _call(rest[1], "matmul")
    if out.args[0] is not rest[0].var:
        raise NotAttention("the second product does not read the probabilities")
    q, k, v = source(s.args[0]), source(s.args[1]), source(out.args[1])
    tys = [s.args[0].ty, s.args[1].ty, out.args[1].ty, function.ret.ty]
    if mask_expr is not None:
        tys.append(mask_expr.ty)
    if not all(isinstance(t, TensorType) for t in tys):
        raise NotAttention("an operand is not a tensor")
    dtype = function.ret.ty.dtype
    if dtype not in FLOATS or any(t.dtype != dtype for t in tys):
        raise NotAttention(f"operands are not all of one float dtype ({', '.join(sorted({t.dtype for t in tys}))})")
    if any(len(t.shape) < 2 for t in tys[:4]):
        raise NotAttention("q, k, v and the result need rank >= 2")
    head, value = tys[0].shape[-1], tys[2].shape[-1]
    if not (isinstance(head, int) and isinstance(value, int)):
        raise NotAttention("the head dimensions are not static")
    return Attention(q, k, v, mask, scale, scaled.op, dtype, head, value, tuple(function.ret.ty.shape))


def _scale(x, source) -> float | Source:
    if isinstance(x, Constant):
        value = np.asarray(x.value)
        if value.size != 1:
            raise NotAttention("the scale is not a scalar")
        return float(value.reshape(()))
    ty = x.ty
    if not (isinstance(ty, TensorType) and all(d == 1 for d in ty.shape)):
        raise NotAttention("the scale is not a scalar")
    return source(x)
