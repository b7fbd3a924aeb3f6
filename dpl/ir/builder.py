"""Write IR in Python: a function builder that checks and types every binding as it goes.

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 64))
    w = fb.param("w", "f32", (64, 32))
    y = fb.emit("matmul", x, w)
    z = fb.emit("nn.relu", y, name="z")
    mod = Module([fb.ret(z)])
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from dpl.ir.types import TensorType, Type
from dpl.ops.registry import call_function, make_call


def const(value, dtype: str | None = None, name: str | None = None) -> Constant:
    """A constant from a Python scalar or array. Python floats default to f32, ints to i64."""
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int64"
        elif isinstance(value, float):
            dtype = "float32"
        else:
            dtype = dtypes.from_numpy(np.asarray(value).dtype)
    array = np.asarray(value, dtype=dtypes.to_numpy(dtypes.canonical(dtype)))
    return Constant(array, name=name)


def _atom(value: Any) -> Expr:
    """Python scalars used as operands become constants; expressions pass through."""
    if isinstance(value, (bool, int, float)):
        return const(value)
    if isinstance(value, (list, tuple)):
        return Tuple(tuple(_atom(v) for v in value))
    return value


class FunctionBuilder:
    def __init__(self, name: str, attrs: Mapping[str, Any] | None = None):
        self.name = name
        self.attrs = dict(attrs or {})
        self.params: list[Var] = []
        self.bindings: list[Binding] = []
        self._names: set[str] = set()
        self._counter = 0

    def _claim(self, name: str | None) -> str:
        if name is None:
            while f"lv{self._counter}" in self._names:
                self._counter += 1
            name = f"lv{self._counter}"
        if name in self._names:
            raise DplError(f"function '{self.name}' already defines '{name}'")
        self._names.add(name)
        return name

    def param(self, name: str, dtype_or_type: str | Type, shape: Sequence[int | str] | None = None) -> Var:
        ty = dtype_or_type if shape is None and not isinstance(dtype_or_type, str) else TensorType(tuple(shape or ()), dtype_or_type)
        var = Var(self._claim(name), ty)
        self.params.append(var)
        return var

    def bind(self, value: Expr, name: str | None = None) -> Var:
        """Bind an already built expression to a new variable."""
        var = Var(self._claim(name), value.ty)
        self.bindings.append(Binding(var, value))
        return var

    def emit(self, op: str, *args: Any, name: str | None = None, **attrs: Any) -> Var:
        """Bind ``op(args, attrs)``; Python scalars become constants, lists become tuples."""
        return self.bind(make_call(op, [_atom(a) for a in args], attrs), name)

    def call(self, callee: Function, *args: Expr, name: str | None = None) -> Var:
        """Bind a call of another function of the module."""
        return self.bind(call_function(GlobalVar(callee.name), args, callee.ret_type), name)

    def item(self, tup: Expr, index: int, name: str | None = None) -> Var:
        return self.bind(TupleGetItem(tup, index), name)

    def ret(self, *values: Expr) -> Function:
        """Finish the function; several values return a tuple."""
        ret = values[0] if len(values) == 1 else Tuple(values)
        return Function(self.name, self.params, self.bindings, ret, self.attrs)


def call(op: str, *args: Any, **attrs: Any) -> Call:
    """A checked, typed call that is not bound (for nested expressions and tests)."""
    return make_call(op, [_atom(a) for a in args], attrs)
