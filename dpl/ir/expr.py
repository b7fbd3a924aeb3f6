"""Expressions and functions of the dataflow IR.

Every node is frozen and slotted. Expressions compare and hash by **identity**: two bindings
named alike are different values, and matching can memoise on nodes in O(1). Whole functions
and modules compare structurally through :mod:`dpl.ir.structural`. Change a node with
``attrs.evolve`` (re-exported as :func:`replace`); nothing is edited in place.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Union

import attrs
import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.ir.types import TensorType, TupleType, Type

replace = attrs.evolve

# The text form is the printer's, a layer above: dpl.ir.printer fills this when imported (the
# dpl.ir package imports it), so that ``fn.script()`` and ``str(mod)`` need no import upwards.
TEXT_FORM: dict = {}


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType({k: freeze_attr_value(v) for k, v in (value or {}).items()})


def freeze_attr_value(value: Any) -> Any:
    """Attribute values are scalars, strings, None or (nested) tuples: lists become tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr_value(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


@attrs.frozen(eq=False)
class GlobalVar:
    """A reference to a function of the module, by name."""

    name: str

    def __eq__(self, other):
        return isinstance(other, GlobalVar) and other.name == self.name

    def __hash__(self):
        return hash(("GlobalVar", self.name))

    def __repr__(self):
        return f"@{self.name}"


@attrs.frozen(eq=False)
class Var:
    """A function parameter or the variable a binding defines."""

    name: str
    ty: Type

    def __repr__(self):
        return f"%{self.name}: {self.ty}"


@attrs.frozen(eq=False)
class Constant:
    """A constant tensor. ``name`` is how the text form refers to a named (non-scalar) constant."""

    value: np.ndarray = attrs.field(converter=np.asarray)
    ty: TensorType = attrs.field(default=None)
    name: str | None = None

    def __attrs_post_init__(self):
        if self.ty is None:
            object.__setattr__(self, "ty", TensorType(self.value.shape, dtypes.from_numpy(self.value.dtype)))
        self.value.setflags(write=False)

    @property
    def is_scalar(self) -> bool:
        return self.value.ndim == 0

    def __repr__(self):
        return f"Constant({self.value!r})" if self.is_scalar else f"Constant({self.name or '?'}: {self.ty})"


@attrs.frozen(eq=False)
class Call:
    """``op(args, attrs)``: ``op`` is a registered op name or the GlobalVar of a module function.

    Build calls through :func:`dpl.ops.make_call` (or the builder), which checks the attributes
    and infers ``ty``.
    """

    op: Union[str, GlobalVar]
    args: tuple["Expr", ...] = attrs.field(converter=tuple)
    attrs: Mapping[str, Any] = attrs.field(converter=_frozen_mapping, factory=dict)
    ty: Type = None

    def __repr__(self):
        op = self.op if isinstance(self.op, str) else repr(self.op)
        return f"Call({op}, {len(self.args)} args)"


def with_args(call: Call, args: tuple) -> Call:
    """``call`` reading ``args`` instead: the same op, attributes and type. The attributes are
    frozen already, so they are shared, not converted again as ``replace(call, args=...)``
    would (passes that rebuild many calls, such as substitution, notice the difference)."""
    return frozen_call(call.op, args, call.attrs, call.ty)


def frozen_call(op, args: tuple, attrs: Mapping[str, Any], ty) -> Call:
    """``Call(op, args, attrs, ty)`` for attributes that are frozen already (a call's own, or
    what :func:`dpl.ops.registry.check_attrs` returns, every value frozen): they are wrapped,
    not converted again."""
    new = object.__new__(Call)
    object.__setattr__(new, "op", op)
    object.__setattr__(new, "args", args if type(args) is tuple else tuple(args))
    object.__setattr__(new, "attrs", attrs if type(attrs) is MappingProxyType else MappingProxyType(attrs))
    object.__setattr__(new, "ty", ty)
    return new


@attrs.frozen(eq=False)
class Tuple:
    fields: tuple["Expr", ...] = attrs.field(converter=tuple)

    @property
    def ty(self) -> TupleType:
        for f in self.fields:
            if isinstance(f, GlobalVar):  # a function reference has no value type (Relax cannot normalize it either)
                raise DplError(f"a tuple field is the function reference {f!r}, which is not a value")
        return TupleType(tuple(f.ty for f in self.fields))


@attrs.frozen(eq=False)
class TupleGetItem:
    tuple_value: "Expr"
    index: int

    def __attrs_post_init__(self):
        ty = self.tuple_value.ty
        if not isinstance(ty, TupleType):
            raise DplError(f"tuple item [{self.index}] taken from a non-tuple value of type {ty}")
        if not -len(ty.fields) <= self.index < len(ty.fields):
            raise DplError(f"tuple index {self.index} out of range for a tuple of {len(ty.fields)}")

    @property
    def ty(self) -> Type:
        return self.tuple_value.ty.fields[self.index]


Expr = Union[Var, Constant, Call, Tuple, TupleGetItem, GlobalVar]


@attrs.frozen(eq=False)
class Binding:
    """``var = value``: one statement of a function body."""

    var: Var
    value: Expr


@attrs.frozen(eq=False)
class Function:
    """A function: parameters, bindings in order, a returned expression and attributes.

    ``attrs`` keys used by passes: ``Primitive``, ``Composite``, ``Codegen``, ``global_symbol``.
    """

    name: str
    params: tuple[Var, ...] = attrs.field(converter=tuple)
    bindings: tuple[Binding, ...] = attrs.field(converter=tuple)
    ret: Expr
    attrs: Mapping[str, Any] = attrs.field(converter=_frozen_mapping, factory=dict)

    @property
    def ret_type(self) -> Type:
        return self.ret.ty

    def script(self) -> str:
        return TEXT_FORM["function"](self)

    def __str__(self) -> str:
        return self.script()


def _functions(value) -> Mapping[str, Function]:
    if isinstance(value, Mapping):
        items = dict(value)
    else:
        items = {f.name: f for f in value}
    for name, fn in items.items():
        if fn.name != name:
            raise DplError(f"module key '{name}' names function '{fn.name}'")
    return MappingProxyType(items)


@attrs.frozen(eq=False)
class Module:
    """Functions by name. ``main`` is the usual entry point."""

    functions: Mapping[str, Function] = attrs.field(converter=_functions)

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def with_function(self, fn: Function) -> "Module":
        """A new module with ``fn`` added or replacing the function of the same name."""
        return Module({**self.functions, fn.name: fn})

    def script(self) -> str:
        return TEXT_FORM["module"](self)

    def __str__(self) -> str:
        return self.script()
