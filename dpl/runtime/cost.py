"""What a Primitive group moves and computes, at concrete shapes: the default fusion model.

Priced from the group's IR types alone (no lowering, so it costs microseconds at plan time):

- *apart*: every op its own kernel call, reading each operand and writing its result
  (intermediates are written and read back); a view op (reshape, squeeze, expand_dims) is
  free, as the plan runs it as a view of its operand (:mod:`dpl.runtime.plan`);
- *fused*: one kernel call reading each parameter and constant once and writing the results;
- arithmetic: one operation per output element of an op, ``2·M·N·K`` for a matrix product and
  ``2·out·C/groups·kh·kw`` for a convolution (the same either way: fusing saves calls and
  bytes, never arithmetic, but a group that computes much gains little from saving them).

Estimated time = calls × :data:`CALL_S` + bytes / :data:`BYTES_PER_S` + operations /
:data:`OPS_PER_S`, constants measured roughly on the 2-core bench host (one thread). The
model only ranks "fused" against "apart" for one group; ``dpl profile`` data replaces it
wherever the profile has the group (:mod:`dpl.runtime.heuristics`). A small parameter (a bias,
BatchNorm's scale) adds its few bytes to both sides and never sends a group op by op.
"""

from __future__ import annotations

import math
from typing import Sequence

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.ir.expr import Call, Constant, Function, Tuple, TupleGetItem, Var
from dpl.ir.types import TensorType, TupleType
from dpl.runtime.shapes import bind_dims, concrete
from dpl.transform.graph import is_view

CALL_S = 3e-6  # a kernel call from the plan: Python, ctypes, argument checks
BYTES_PER_S = 8e9  # one core streaming from memory
OPS_PER_S = 4e9  # elementwise arithmetic; products run far faster per op, and count as such below
PRODUCT_OPS_PER_S = 5e10


@attrs.frozen
class GroupCost:
    calls_apart: int
    bytes_apart: int
    bytes_fused: int
    ops: int  # elementwise operations
    product_ops: int  # multiply-adds of products and convolutions, times two

    def seconds(self, fused: bool) -> float:
        calls, moved = (1, self.bytes_fused) if fused else (self.calls_apart, self.bytes_apart)
        return calls * CALL_S + moved / BYTES_PER_S + self.ops / OPS_PER_S + self.product_ops / PRODUCT_OPS_PER_S

    def __str__(self) -> str:
        return (f"{self.calls_apart} kernel{'s' if self.calls_apart != 1 else ''} moving {_kb(self.bytes_apart)} apart vs 1 moving {_kb(self.bytes_fused)} fused, "
                f"est. {self.seconds(False) * 1e3:.3g} ms vs {self.seconds(True) * 1e3:.3g} ms")


def _kb(n: int) -> str:
    return f"{n / 1024:.4g} KiB"


def _nbytes(ty) -> int:
    if isinstance(ty, TupleType):
        return sum(_nbytes(t) for t in ty.fields)
    if not isinstance(ty, TensorType):
        return 0
    return math.prod(ty.shape) * np.dtype(dt.to_numpy(ty.dtype)).itemsize


def _elements(ty) -> int:
    if isinstance(ty, TupleType):
        return sum(_elements(t) for t in ty.fields)
    return math.prod(ty.shape) if isinstance(ty, TensorType) else 0


def group_cost(fn: Function, shapes: Sequence[Sequence[int]]) -> GroupCost:
    """Price ``fn`` (a Primitive group) at these concrete parameter shapes."""
    params = [p.ty for p in fn.params]
    dims = bind_dims(params, [tuple(s) for s in shapes], [f"parameter '{p.name}'" for p in fn.params])
    types: dict[int, object] = {id(p): concrete(p.ty, dims, fn.name) for p in fn.params}

    def type_of(e):
        if isinstance(e, Var):
            return types.get(id(e), e.ty)
        if isinstance(e, Constant):
            return e.ty
        if isinstance(e, Tuple):
            return TupleType(tuple(type_of(f) for f in e.fields))
        if isinstance(e, TupleGetItem):
            whole = type_of(e.tuple_value)
            return whole.fields[e.index] if isinstance(whole, TupleType) else None
        return concrete(e.ty, dims, fn.name) if isinstance(e.ty, (TensorType, TupleType)) else e.ty

    totals = {"calls": 0, "apart": 0, "ops": 0, "product_ops": 0, "consts": 0}

    def visit(e) -> None:
        """Price every call of ``e`` (calls nest inside a binding's value)."""
        if isinstance(e, Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)
        elif isinstance(e, Call):
            for a in e.args:
                visit(a)
            if is_view(e) and all(isinstance(a, (Var, Constant)) for a in e.args):
                return  # no kernel, no bytes, no arithmetic: a view apart, an index fused
            args = [type_of(a) for a in e.args]
            out = type_of(e)
            totals["calls"] += 1
            totals["consts"] += sum(_nbytes(a.ty) for a in e.args if isinstance(a, Constant))
            totals["apart"] += sum(_nbytes(t) for t in args) + _nbytes(out)
            product = _product_ops(e, args, out)
            totals["product_ops"] += product
            totals["ops"] += 0 if product else _elements(out)

    for b in fn.bindings:
        visit(b.value)
        types[id(b.var)] = concrete(b.var.ty, dims, fn.name)
    visit(fn.ret)  # the result may be a call itself
    rets = fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,)
    fused = sum(_nbytes(types[id(p)]) for p in fn.params) + totals["consts"] + sum(_nbytes(type_of(r)) for r in rets)
    return GroupCost(totals["calls"], totals["apart"], fused, totals["ops"], totals["product_ops"])


def _product_ops(call: Call, args, out) -> int:
    if not isinstance(call.op, str) or not isinstance(out, TensorType):
        return 0
    if call.op == "matmul" and args and isinstance(args[0], TensorType) and args[0].ndim:
        return 2 * math.prod(out.shape) * int(args[0].shape[-1])
    if call.op == "nn.conv2d" and len(args) > 1 and isinstance(args[1], TensorType) and args[1].ndim == 4:
        return 2 * math.prod(out.shape) * math.prod(args[1].shape[1:])
    return 0
