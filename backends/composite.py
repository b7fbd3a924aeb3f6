"""A composite as plain data, for backend authors: :func:`read_composite`.

A backend's ``compile`` is handed a ``Codegen`` wrapper or a composite (docs/writing-a-backend.md).
``read_composite`` follows the wrapper to its composite, as ``wrapped_composite`` does, and
gives it back as frozen Python values: the composite's name (``mylib.dense``), its codegen
prefix, its parameters, its bindings in order (op name, argument names, attributes, result
dtype and shape), its constants (name -> NumPy array) and its outputs. Nothing of
``dpl.ir.expr`` shows through, so a backend keeps working when the IR's classes change.

Every argument is a name: a parameter's, an earlier binding's, or a constant's. A tensor
constant has the name the module's text gives it (``c0``); a scalar constant, which the text
writes inline, is named after the binding that reads it (``y.0``, never an identifier of the IR)
and kept as a 0-d array, so its dtype is known. Two arguments are not plain names: a tuple literal
(``concat((a, b))``) is a Python tuple of arguments, and an item of a tuple value (``s[0]``) is an
:class:`Item`. Bindings that are not op calls use three reserved op names: ``tuple`` (a tuple
literal), ``tuple_item`` (``attrs["index"]``) and ``value`` (a name bound to another value).

This module sits below the backend registry: it reads the IR and imports nothing of
``dpl.backends``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Union

import attrs
import numpy as np

from dpl.errors import DplError
from dpl.ir.expr import Call, Constant, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.printer import collect_constants, constant_names
from dpl.ir.types import TensorType, TupleType, Type

__all__ = ["Binding", "Composite", "CompositeError", "Item", "Param", "read_composite"]

# the op names of bindings that are not op calls (no registered op is named so)
TUPLE, TUPLE_ITEM, VALUE = "tuple", "tuple_item", "value"


class CompositeError(DplError):
    """A function that is not a composite (nor a ``Codegen`` wrapper of one) was read as one.
    Raised from a backend's ``compile``, it makes dpl run the function on the next backend."""


@attrs.frozen
class Item:
    """Item ``index`` of the tuple value ``of`` (an argument written ``s[0]``)."""

    of: Any  # an argument: a name, a tuple of arguments, or an Item
    index: int


Arg = Union[str, tuple, Item]


@attrs.frozen
class Param:
    """A parameter of the composite. ``shape`` holds ints and symbolic dim names (``"n"``)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@attrs.frozen
class Binding:
    """``name = op(args, attrs)``, one statement of the composite, in order.

    ``dtype`` and ``shape`` are the result's; a tuple-valued result (``split``) has ``dtype``
    and ``shape`` None and one ``(dtype, shape)`` per field in ``fields``.
    """

    name: str
    op: str
    args: tuple[Arg, ...]
    attrs: Mapping[str, Any]  # plain values: int, float, bool, str, None, tuples of them
    dtype: str | None
    shape: tuple[int | str, ...] | None
    fields: tuple[tuple[str, tuple], ...] = ()


@attrs.frozen
class Composite:
    """A composite function read as plain data (see the module docstring)."""

    name: str  # the Composite attribute: "mylib.dense"
    prefix: str  # the codegen prefix: the wrapper's Codegen attribute, else the name up to its first dot
    function: str  # the composite function's name in the module
    params: tuple[Param, ...]
    bindings: tuple[Binding, ...]
    constants: Mapping[str, np.ndarray]  # read-only arrays; scalars are 0-d
    outputs: tuple[str, ...]  # the names returned, tuples flattened depth-first
    annotations: Mapping[str, Any] = MappingProxyType({})  # the function's other attributes

    def kind(self, name: str) -> str:
        """What ``name`` is: ``"param"``, ``"binding"`` or ``"constant"``."""
        if name in self.constants:
            return "constant"
        if any(p.name == name for p in self.params):
            return "param"
        if any(b.name == name for b in self.bindings):
            return "binding"
        raise KeyError(f"composite '{self.name}' has no value named '{name}'")

    def binding(self, name: str) -> Binding:
        for b in self.bindings:
            if b.name == name:
                return b
        raise KeyError(f"composite '{self.name}' has no binding '{name}'")


def read_composite(function: Function, module: Module | None = None) -> Composite:
    """``function`` read as a :class:`Composite`: a composite itself, or the ``Codegen`` wrapper
    that calls one (``module`` must then hold the composite). Anything else is a
    :class:`CompositeError` saying what the function is."""
    prefix = None
    if "Codegen" in function.attrs:
        prefix = str(function.attrs["Codegen"])
        function = _wrapped(function, module)
    if "Composite" not in function.attrs:
        what = "a fused group (Primitive)" if function.attrs.get("Primitive") else "a plain function"
        raise CompositeError(f"function '{function.name}' is not a composite: it is {what}, with no Composite attribute",
                             hint="a backend reads composites (functions of a pattern library) or Codegen wrappers of one")
    name = str(function.attrs["Composite"])
    return _Reader(function, module).read(name, prefix or name.split(".", 1)[0])


def _wrapped(wrapper: Function, module: Module | None) -> Function:
    """The composite a ``Codegen`` wrapper calls: its whole body is one call of it with the
    wrapper's parameters, as FuseOpsByPattern writes it."""
    body = wrapper.bindings
    call = body[0].value if len(body) == 1 else None
    if not (isinstance(call, Call) and isinstance(call.op, GlobalVar)):
        raise CompositeError(f"codegen function '{wrapper.name}' is not a plain call of one composite")
    if module is None or call.op.name not in module.functions:
        raise CompositeError(f"codegen function '{wrapper.name}' calls '{call.op.name}', which the module given does not hold",
                             hint="pass the module: read_composite(function, module)")
    if list(call.args) != list(wrapper.params) or wrapper.ret is not body[0].var:
        raise CompositeError(f"codegen function '{wrapper.name}' is not a plain call of one composite")
    return module[call.op.name]


class _Reader:
    """Names for every value of one composite, and its bindings as plain data."""

    def __init__(self, fn: Function, module: Module | None):
        self.fn = fn
        self.names: dict[int, str] = {}  # id(IR value) -> its name
        self.constants: dict[str, np.ndarray] = {}
        self.taken = {p.name for p in fn.params} | {b.var.name for b in fn.bindings}
        # a tensor constant is called what the module's text calls it (c0, or its own name)
        self.printed = constant_names(collect_constants(module if module is not None else fn))
        self.binding_name = ""  # the binding being read: its scalar constants are "<binding>.<k>"

    def read(self, name: str, prefix: str) -> Composite:
        fn = self.fn
        params = []
        for p in fn.params:
            self.names[id(p)] = p.name
            params.append(_param(p))
        bindings = []
        for b in fn.bindings:
            self.binding_name = b.var.name
            bindings.append(self.binding(b.var.name, b.var.ty, b.value))
            self.names[id(b.var)] = b.var.name
        self.binding_name = "return"
        outputs = tuple(self.outputs(fn.ret))
        others = {k: v for k, v in fn.attrs.items() if k not in ("Composite", "Primitive")}
        return Composite(name, prefix, fn.name, tuple(params), tuple(bindings), MappingProxyType(self.constants), outputs,
                         MappingProxyType(others))

    def binding(self, name: str, ty: Type, value) -> Binding:
        dtype, shape, fields = _type(ty)
        if isinstance(value, Call):
            if isinstance(value.op, GlobalVar):
                raise CompositeError(f"composite '{self.fn.name}': binding '{name}' calls function '{value.op.name}'; "
                                     "a composite's bindings are op calls")
            return Binding(name, value.op, tuple(self.arg(a) for a in value.args), dict(value.attrs), dtype, shape, fields)
        if isinstance(value, Tuple):
            return Binding(name, TUPLE, tuple(self.arg(f) for f in value.fields), {}, dtype, shape, fields)
        if isinstance(value, TupleGetItem):
            return Binding(name, TUPLE_ITEM, (self.arg(value.tuple_value),), {"index": value.index}, dtype, shape, fields)
        return Binding(name, VALUE, (self.arg(value),), {}, dtype, shape, fields)

    def arg(self, e) -> Arg:
        if isinstance(e, Tuple):
            return tuple(self.arg(f) for f in e.fields)
        if isinstance(e, TupleGetItem):
            return Item(self.arg(e.tuple_value), e.index)
        if isinstance(e, Constant):
            return self.constant(e)
        if isinstance(e, Var) and id(e) in self.names:
            return self.names[id(e)]
        raise CompositeError(f"composite '{self.fn.name}' reads {e!r}, which it does not define")

    def constant(self, c: Constant) -> str:
        if id(c) in self.names:
            return self.names[id(c)]
        if c.is_scalar:  # no name in the text form: "y.0" is the first scalar binding y reads
            name = next(f"{self.binding_name}.{k}" for k in range(len(self.constants) + 1)
                        if f"{self.binding_name}.{k}" not in self.constants)
        else:
            name = self.printed.get(id(c), c.name or "const")
            while name in self.taken:  # a parameter or binding of the same name
                name += "_"
        self.taken.add(name)
        self.names[id(c)] = name
        self.constants[name] = c.value  # read-only already
        return name

    def outputs(self, ret) -> list[str]:
        if isinstance(ret, Tuple):
            return [n for f in ret.fields for n in self.outputs(f)]
        arg = self.arg(ret)
        if not isinstance(arg, str):
            raise CompositeError(f"composite '{self.fn.name}' returns an item of a tuple; bind it to a name first")
        return [arg]


def _param(p: Var) -> Param:
    if not isinstance(p.ty, TensorType):
        raise CompositeError(f"parameter '{p.name}' is a tuple ({p.ty}); read_composite reads tensor parameters")
    return Param(p.name, p.ty.dtype, tuple(p.ty.shape))


def _type(ty: Type) -> tuple[str | None, tuple | None, tuple]:
    if isinstance(ty, TupleType):
        return None, None, tuple(_leaf(t) for t in ty.fields)
    return ty.dtype, tuple(ty.shape), ()


def _leaf(ty: Type) -> tuple:
    if isinstance(ty, TupleType):
        return tuple(_leaf(t) for t in ty.fields)
    return ty.dtype, tuple(ty.shape)
