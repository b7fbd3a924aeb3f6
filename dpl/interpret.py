"""The reference interpreter: runs a function on NumPy arrays, binding by binding.

It is the numerical truth every pass and backend is checked against, so it is plain and
strict: inputs must match the parameters' dtypes and shapes, symbolic dimensions bind from
the inputs and must agree, and every op's result is checked against its inferred type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpl import dtypes
from dpl.errors import DplError, InterpretError
from dpl.ir.dim_binding import DimMismatch, bind_shapes, concrete_shape
from dpl.ir.dims import DimExpr, evaluate, free_symbols
from dpl.ir.expr import Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.types import TensorType, TupleType, Type
from dpl.limits import MAX_CALL_DEPTH, LimitError
from dpl.ops.registry import DIM_ATTR_KINDS, get_op


def _check_value(ty: Type, value: Any, what: str, entries: list) -> None:
    """Check ``value``'s structure, dtypes, ranks and static dims against ``ty``, collecting
    ``(declared shape, shape, what)`` of each tensor leaf for :func:`bind_shapes`."""
    if isinstance(ty, TupleType):
        if not isinstance(value, tuple) or len(value) != len(ty.fields):
            raise InterpretError(f"{what} must be a tuple of {len(ty.fields)} arrays")
        for i, (t, v) in enumerate(zip(ty.fields, value)):
            _check_value(t, v, f"{what}[{i}]", entries)
        return
    if not isinstance(value, np.ndarray):
        raise InterpretError(f"{what} must be a NumPy array of type {ty}, got {type(value).__name__}")
    if value.dtype != dtypes.to_numpy(ty.dtype):
        raise InterpretError(f"{what} expects dtype {dtypes.short(ty.dtype)}, got {value.dtype}")
    if value.ndim != ty.ndim:
        raise InterpretError(f"{what} expects rank {ty.ndim} ({ty}), got shape {value.shape}")
    if any(type(want) is int and want != got for want, got in zip(ty.shape, value.shape)):
        raise InterpretError(f"{what} expects shape {ty}, got {value.shape}")
    entries.append((ty.shape, value.shape, what))


def _bind_type(ty: Type, value: Any, dims: dict[str, int], what: str) -> None:
    """Check ``value`` against ``ty``, binding symbolic dims in ``dims``."""
    _bind_types([(ty, value, what)], dims)


def _bind_types(items: list, dims: dict[str, int], fallback: dict[str, int] | None = None) -> None:
    """Check each ``(type, value, what)``, binding the symbols of all of them together (plain
    symbols, then linear expressions solved, then every expression checked)."""
    entries: list = []
    for ty, value, what in items:
        _check_value(ty, value, what, entries)
    try:
        bind_shapes(entries, dims, fallback)
    except DimMismatch as err:
        raise InterpretError(err.message) from None


def _resolve_dims(value: Any, dims: dict[str, int]) -> Any:
    if isinstance(value, tuple):
        return tuple(_resolve_dims(v, dims) for v in value)
    if isinstance(value, (str, DimExpr)) and free_symbols(value) <= dims.keys():
        return evaluate(value, dims)
    return value


class _Frame:
    def __init__(self, mod: Module | None, fn: Function, dims: dict[str, int], depth: int = 0):
        self.mod, self.fn, self.dims, self.depth = mod, fn, dims, depth
        self.env: dict[int, Any] = {}

    def eval(self, e: Expr) -> Any:
        if isinstance(e, Var):
            return self.env[id(e)]
        if isinstance(e, Constant):
            return np.asarray(e.value)
        if isinstance(e, Tuple):
            return tuple(self.eval(f) for f in e.fields)
        if isinstance(e, TupleGetItem):
            return self.eval(e.tuple_value)[e.index]
        if isinstance(e, Call):
            return self.call(e)
        raise DplError(f"cannot evaluate {type(e).__name__}")

    def call(self, c: Call) -> Any:
        args = [self.eval(a) for a in c.args]
        if isinstance(c.op, GlobalVar):
            if self.mod is None or c.op.name not in self.mod.functions:
                raise DplError(f"call of unknown function '{c.op.name}'")
            if self.depth >= MAX_CALL_DEPTH:  # a module built in Python may call itself
                raise LimitError(f"calls nest deeper than MAX_CALL_DEPTH = {MAX_CALL_DEPTH} levels at '{c.op.name}' (recursion?)")
            return run_function(self.mod, self.mod[c.op.name], args, outer_dims=self.dims, _depth=self.depth + 1)
        op = get_op(c.op)
        attrs = {k: _resolve_dims(v, self.dims) if op.attrs[k].kind in DIM_ATTR_KINDS else v for k, v in c.attrs.items()}
        for k, v in attrs.items():
            unbound = [s for d in (v if isinstance(v, tuple) else (v,)) if isinstance(d, (str, DimExpr))
                       for s in sorted(free_symbols(d))] if op.attrs[k].kind in DIM_ATTR_KINDS else []
            if unbound:
                raise InterpretError(f"op '{c.op}': attribute '{k}' names the symbolic dimension '{unbound[0]}', which "
                                     f"no input of '{self.fn.name}' binds")
        if _mentions_symbolic_dims(c):  # a size the type computes must be one before the reference runs
            for leaf in (c.ty.fields if isinstance(c.ty, TupleType) else (c.ty,)):
                try:
                    concrete_shape(leaf.shape, self.dims, f"the result of {c.op}, {leaf}")
                except DimMismatch as err:
                    raise InterpretError(f"op '{c.op}' at {_bound(self.dims)}: {err.message}; its type {c.ty} assumes "
                                         "more of the symbolic dimensions than these inputs give") from None
        result = op.ref(*args, **attrs)
        result = tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else np.asarray(result)
        try:
            _bind_type(c.ty, result, dict(self.dims), f"result of {c.op}")
        except InterpretError as err:
            if _mentions_symbolic_dims(c):
                # a type over symbolic dims may assume something of their values (a slice ending
                # at 'T' assumes T is within the sliced dimension); these inputs break it
                raise InterpretError(f"op '{c.op}' at {_bound(self.dims)}: {err.message}; its type {c.ty} assumes more of the "
                                     "symbolic dimensions than these inputs give (a slice end beyond the sliced "
                                     "dimension?)") from None
            raise DplError(f"internal error: {err.message}") from None  # the reference disagrees with type inference
        return result


def _bound(dims: dict[str, int]) -> str:
    return ", ".join(f"{d}={n}" for d, n in sorted(dims.items()))


def _as_value(ty: Type, a: Any) -> Any:
    """An input as the interpreter holds it: arrays, and tuples (nested too) of them."""
    if isinstance(ty, TupleType) and isinstance(a, (tuple, list)):
        return tuple(_as_value(t, x) for t, x in zip(ty.fields, a)) if len(a) == len(ty.fields) else tuple(a)
    return np.asarray(a)


def _mentions_symbolic_dims(c: Call) -> bool:
    types = [a.ty for a in c.args] + [c.ty]
    leaves = [t for ty in types for t in (ty.fields if isinstance(ty, TupleType) else (ty,))]
    return any(not isinstance(d, int) for t in leaves if isinstance(t, TensorType) for d in t.shape)


def run_function(mod: Module | None, fn: Function, arrays: list[Any], outer_dims: dict[str, int] | None = None,
                 _depth: int = 0) -> Any:
    """Run ``fn``; its symbolic dims bind from its inputs, and a dim no input binds (the length
    of ``arange(end=seq)`` in a fused group) takes its value from ``outer_dims``: the caller's
    dims, or those a backend read off the destination buffers."""
    if len(arrays) != len(fn.params):
        names = ", ".join(p.name for p in fn.params)
        raise InterpretError(f"function '{fn.name}' takes {len(fn.params)} inputs ({names}), got {len(arrays)}")
    dims: dict[str, int] = {}
    frame = _Frame(mod, fn, dims, _depth)
    inputs = []
    for p, a in zip(fn.params, arrays):
        a = _as_value(p.ty, a)
        inputs.append((p.ty, a, f"parameter '{p.name}' of '{fn.name}'"))
        frame.env[id(p)] = a
    _bind_types(inputs, dims, outer_dims)
    for b in fn.bindings:
        try:
            frame.env[id(b.var)] = frame.eval(b.value)
        except MemoryError:  # a shape within the type limits may still exceed this machine
            raise InterpretError(f"not enough memory to compute '{b.var.name}': {b.var.ty} in function '{fn.name}'") from None
    return frame.eval(fn.ret)


def interpret(mod: Module | Function, *arrays: Any, entry: str = "main") -> Any:
    """Run ``entry`` of ``mod`` on NumPy arrays: an array, or a tuple for a tuple result."""
    if isinstance(mod, Function):
        return run_function(None, mod, list(arrays))
    if entry not in mod.functions:
        raise InterpretError(f"module has no function '{entry}' (it has: {', '.join(mod.functions)})")
    return run_function(mod, mod[entry], list(arrays))
