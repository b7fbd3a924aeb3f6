"""Constant folding: a binding whose operands are all constants is computed once, at compile time.

TVM's pipeline runs FoldConstant before FuseOps; without it, Gemma's ``(1 + w)`` and every other
computation on bound weights runs on each call and takes a place in a fused group. The pass
evaluates such a binding with the op's NumPy reference (the interpreter's arithmetic, so the
numbers do not change), replaces its uses with the result and drops it; a folded result makes
its users foldable in turn, so whole chains over weights go in one walk.

What is not folded, and why:

- an op whose attributes name a symbolic dim, or whose result has a symbolic shape: its value
  depends on the inputs;
- a result larger than its operands (a ``broadcast_to``, ``full`` or ``arange``) beyond
  ``grow_bytes``: it would bloat the module with values a fused kernel computes for free;
- a result over ``max_bytes``, whatever its operands;
- a call of a module function, and a binding whose reference raises (it stays, to fail or run
  where it always did).

Functions annotated ``Composite``, ``Codegen`` or ``Primitive`` are left as they are: their bodies
belong to the backend that claimed them.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import numpy as np

from dpl import dtypes
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Binding, Call, Constant, Function, Module, Tuple, TupleGetItem
from dpl.ir.types import TensorType, TupleType
from dpl.ops.registry import DIM_ATTR_KINDS, get_op
from dpl.ir.traverse import substitute

log = logging.getLogger(__name__)

#: a folded result may be this much larger than its operands (masks, small ranges, scalars made
#: tensors, T5's relative position bias: 4 heads x 128 x 128 floats from a table of 32 x 4 and two
#: ranges, computed at every call by three kernels below 512 KiB, 0.08 ms of its 2.1 at 1 x 128)
GROW_BYTES = 512 * 1024
#: no folded result is larger than this
MAX_BYTES = 256 * 1024 * 1024

_FUNCTION_ATTRS = ("Composite", "Codegen", "Primitive")


def fold_constants(mod: Module, *, grow_bytes: int = GROW_BYTES, max_bytes: int = MAX_BYTES) -> Module:
    """``mod`` with every foldable all-constant binding computed (the input is not changed)."""
    with paused_collector():  # see dpl.ir.collector
        functions = {name: fold_function(fn, grow_bytes=grow_bytes, max_bytes=max_bytes) for name, fn in mod.functions.items()}
    if all(functions[name] is fn for name, fn in mod.functions.items()):
        return mod
    return Module(functions)


def fold_function(func: Function, *, grow_bytes: int = GROW_BYTES, max_bytes: int = MAX_BYTES) -> Function:
    """``func`` with its all-constant bindings folded; ``func`` itself when none is."""
    if any(key in func.attrs for key in _FUNCTION_ATTRS):
        return func
    table: dict[int, Any] = {}  # id(var) -> the Constant (or Tuple of Constants) it now is
    kept: list[Binding] = []
    for b in func.bindings:
        value = _simplify(substitute(b.value, table)) if table else b.value
        folded = _fold(value, b, grow_bytes, max_bytes)
        if folded is not None:
            table[id(b.var)] = folded
            continue
        kept.append(b if value is b.value else Binding(b.var, value))
    if not table:
        return func
    log.debug("folded %d binding(s) of '%s'", len(func.bindings) - len(kept), func.name)
    ret = _simplify(substitute(func.ret, table))
    return attrs.evolve(func, bindings=tuple(kept), ret=ret)


def _simplify(e):
    """``(c0, c1)[i]`` -> ``ci``: what substituting a folded tuple leaves behind."""
    if isinstance(e, TupleGetItem):
        inner = _simplify(e.tuple_value)
        if isinstance(inner, Tuple):
            return inner.fields[e.index]
        return e if inner is e.tuple_value else TupleGetItem(inner, e.index)
    if isinstance(e, Call):
        args = tuple(_simplify(a) for a in e.args)
        return e if all(x is y for x, y in zip(args, e.args)) else attrs.evolve(e, args=args)
    if isinstance(e, Tuple):
        fields = tuple(_simplify(f) for f in e.fields)
        return e if all(x is y for x, y in zip(fields, e.fields)) else Tuple(fields)
    return e


def _constant(e) -> bool:
    if isinstance(e, Tuple):
        return all(_constant(f) for f in e.fields)
    return isinstance(e, Constant)


def _value(e):
    return tuple(_value(f) for f in e.fields) if isinstance(e, Tuple) else np.asarray(e.value)


def _nbytes(e) -> int:
    return sum(_nbytes(f) for f in e.fields) if isinstance(e, Tuple) else int(e.value.nbytes)


def _static_leaves(ty) -> list[TensorType] | None:
    leaves = list(ty.fields) if isinstance(ty, TupleType) else [ty]
    if not all(isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape) for t in leaves):
        return None
    return leaves


def _fold(value, b: Binding, grow_bytes: int, max_bytes: int):
    """The constant ``value`` computes, or None when it is not to be folded."""
    if isinstance(value, (Constant, Tuple)) and _constant(value):
        return value  # a binding of a constant (or of a tuple of them): its uses take it directly
    if isinstance(value, TupleGetItem):
        return None  # a TupleGetItem of a constant tuple was simplified away already
    if not isinstance(value, Call) or not isinstance(value.op, str) or not all(_constant(a) for a in value.args):
        return None
    op = get_op(value.op)
    if any(op.attrs[k].kind in DIM_ATTR_KINDS and _names_dim(v) for k, v in value.attrs.items() if k in op.attrs):
        return None
    leaves = _static_leaves(value.ty)
    if leaves is None:
        return None
    out_bytes = sum(int(np.prod(t.shape, dtype=np.int64)) * dtypes.to_numpy(t.dtype).itemsize for t in leaves)
    in_bytes = sum(_nbytes(a) for a in value.args)
    if out_bytes > max_bytes or out_bytes > max(in_bytes, grow_bytes):
        return None
    try:
        with np.errstate(all="ignore"):
            result = op.ref(*(_value(a) for a in value.args), **value.attrs)
    except Exception as err:  # the binding stays and fails (or runs) where it always did
        log.debug("not folding '%s' (%s): %s", b.var.name, value.op, err)
        return None
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(leaves):
        return None
    consts = []
    for i, (r, t) in enumerate(zip(results, leaves)):
        r = np.asarray(r)
        if r.shape != tuple(t.shape):
            return None
        name = None if r.ndim == 0 else (b.var.name if len(leaves) == 1 else f"{b.var.name}_{i}")
        consts.append(Constant(np.array(r, dtype=dtypes.to_numpy(t.dtype), order="C"), t, name))
    return Tuple(tuple(consts)) if isinstance(value.ty, TupleType) else consts[0]


def _names_dim(v) -> bool:
    return any(isinstance(x, str) for x in (v if isinstance(v, tuple) else (v,)))
