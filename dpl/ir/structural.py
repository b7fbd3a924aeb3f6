"""Structural equality and hashing of functions and modules.

Expressions themselves compare by identity; these functions say whether two pieces of IR
*mean* the same program. Parameters and bindings correspond positionally; with ``names=True``
(the default, because passes promise to keep binding names) their names must agree too.
Constants compare by dtype, shape and values (NaN equal to NaN), never by name.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from dpl import dtypes
from dpl.ir.expr import Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var


def _attr_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and a == b if not isinstance(a, tuple) else (
        isinstance(b, tuple) and len(a) == len(b) and all(_attr_equal(x, y) for x, y in zip(a, b))
    )


def _mapping_equal(a, b) -> bool:
    return list(a) == list(b) and all(_attr_equal(a[k], b[k]) for k in a)


class _Equal:
    def __init__(self, names: bool):
        self.names = names
        self.vars: dict[int, Var] = {}

    def define(self, a: Var, b: Var) -> bool:
        if a.ty != b.ty or (self.names and a.name != b.name):
            return False
        self.vars[id(a)] = b
        return True

    def expr(self, a: Expr, b: Expr) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, Var):
            return self.vars.get(id(a)) is b
        if isinstance(a, GlobalVar):
            return a.name == b.name
        if isinstance(a, Constant):
            return a.ty == b.ty and np.array_equal(a.value, b.value, equal_nan=dtypes.is_float_numpy(a.value.dtype))
        if isinstance(a, Call):
            return (
                a.op == b.op
                and a.ty == b.ty
                and len(a.args) == len(b.args)
                and _mapping_equal(a.attrs, b.attrs)
                and all(self.expr(x, y) for x, y in zip(a.args, b.args))
            )
        if isinstance(a, Tuple):
            return len(a.fields) == len(b.fields) and all(self.expr(x, y) for x, y in zip(a.fields, b.fields))
        if isinstance(a, TupleGetItem):
            return a.index == b.index and self.expr(a.tuple_value, b.tuple_value)
        raise TypeError(f"not an expression: {type(a).__name__}")

    def function(self, a: Function, b: Function) -> bool:
        if a.name != b.name or not _mapping_equal(a.attrs, b.attrs):
            return False
        if len(a.params) != len(b.params) or len(a.bindings) != len(b.bindings):
            return False
        if not all(self.define(x, y) for x, y in zip(a.params, b.params)):
            return False
        for x, y in zip(a.bindings, b.bindings):
            if not self.expr(x.value, y.value) or not self.define(x.var, y.var):
                return False
        return self.expr(a.ret, b.ret)


def structural_equal(a: Module | Function, b: Module | Function, *, names: bool = True) -> bool:
    """Whether ``a`` and ``b`` are the same program (see the module docstring)."""
    if isinstance(a, Module) and isinstance(b, Module):
        if list(a.functions) != list(b.functions):
            return False
        return all(_Equal(names).function(a[k], b[k]) for k in a.functions)
    if isinstance(a, Function) and isinstance(b, Function):
        return _Equal(names).function(a, b)
    return False


def structural_hash(x: Module | Function, *, names: bool = True) -> int:
    """A hash that agrees with :func:`structural_equal` (equal programs hash alike)."""
    h = hashlib.sha256()
    ids: dict[int, int] = {}

    def feed(*parts):
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")

    def var(v: Var, define: bool):
        if define:
            ids[id(v)] = len(ids)
            feed("def", str(v.ty), v.name if names else "")
        else:
            feed("var", ids.get(id(v), -1))

    def expr(e: Expr):
        if isinstance(e, Var):
            var(e, False)
        elif isinstance(e, GlobalVar):
            feed("gv", e.name)
        elif isinstance(e, Constant):
            feed("const", str(e.ty))
            h.update(np.ascontiguousarray(e.value).tobytes())
        elif isinstance(e, Call):
            feed("call", e.op if isinstance(e.op, str) else ("@", e.op.name), str(e.ty), sorted(e.attrs.items(), key=lambda kv: kv[0]))
            for arg in e.args:
                expr(arg)
        elif isinstance(e, Tuple):
            feed("tuple", len(e.fields))
            for f in e.fields:
                expr(f)
        elif isinstance(e, TupleGetItem):
            feed("item", e.index)
            expr(e.tuple_value)

    def function(fn: Function):
        ids.clear()
        feed("func", fn.name, sorted(fn.attrs.items(), key=lambda kv: kv[0]), len(fn.params))
        for p in fn.params:
            var(p, True)
        for b in fn.bindings:
            expr(b.value)
            var(b.var, True)
        expr(fn.ret)

    for fn in x.functions.values() if isinstance(x, Module) else [x]:
        function(fn)
    return int.from_bytes(h.digest()[:8], "little")
