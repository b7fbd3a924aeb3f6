"""The op registry: every op is declared once, with all that passes and backends need of it.

An :class:`OpDef` holds the op's attribute schema, its type inference, its
:class:`OpPatternKind` *as a function of the call* (TVM's kind depends on argument shapes and
attributes, e.g. a bias add is ElemWise but a pure broadcast is Broadcast), its NumPy reference,
and, for elementwise ops, a scalar C expression template for the kernel emitters.
"""

from __future__ import annotations

import difflib
import enum
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import attrs

from dpl import dtypes
from dpl.errors import ArityError, AttributeValueError, DplError, TypeInferenceError, UnknownAttributeError, UnknownOpError
from dpl.ir import printer as _printer
from dpl.ir.dims import DimExpr, parse as parse_dim
from dpl.ir.expr import Call, Constant, Expr, GlobalVar, Tuple, TupleGetItem, Var, freeze_attr_value, frozen_call
from dpl.ir.types import TensorType, TupleType, Type


class OpPatternKind(enum.IntEnum):
    """TVM's op pattern kinds, with TVM's values: code compares them numerically."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


REQUIRED = object()  # an attribute default meaning "must be given"

# attribute kinds and what each accepts
ATTR_KINDS = ("int", "float", "bool", "str", "dtype", "ints", "axes", "axis", "shape", "scalar", "ints_or_int", "dims",
              "scalar_or_dim", "floats")
# kinds whose values may name symbolic dimensions, which run time binds (the interpreter resolves them)
DIM_ATTR_KINDS = ("shape", "dims", "scalar_or_dim")


@attrs.frozen
class AttrSpec:
    kind: str
    default: Any = REQUIRED
    optional: bool = False  # None is allowed

    def convert(self, op: str, key: str, value: Any) -> Any:
        """Check ``value`` against this spec and return its canonical form."""
        if value is None and (self.optional or self.default is None):
            return None

        value = freeze_attr_value(value)
        if type(value) is float and self.kind == "float":  # the common case (epsilon=...)
            return value

        def bad(expected: str):
            return AttributeValueError(f"op '{op}': attribute '{key}' must be {expected}, got {value!r}")

        if _beyond_int64(value):
            raise bad("within the 64-bit integer range")
        kind = self.kind
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad("an integer")
            return value
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad("a number")
            return float(value)
        if kind == "scalar":
            if not isinstance(value, (bool, int, float)):
                raise bad("a number or a boolean")
            return value
        if kind == "scalar_or_dim":
            if isinstance(value, bool) or not isinstance(value, (int, float, str, DimExpr)):
                raise bad("a number or a symbolic dimension")
            return _dim_attr(value, bad) if isinstance(value, str) else value
        if kind == "bool":
            if not isinstance(value, bool):
                raise bad("true or false")
            return value
        if kind == "str":
            if not isinstance(value, str):
                raise bad("a string")
            return value
        if kind == "dtype":
            if not isinstance(value, str):
                raise bad("a dtype")
            try:
                return dtypes.canonical(value)
            except DplError:
                raise bad("a dtype such as f32, f16 or i64") from None
        if kind in ("axis",):
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad("an integer axis")
            return value
        if kind in ("ints", "axes", "ints_or_int"):
            if kind in ("axes", "ints_or_int") and isinstance(value, int) and not isinstance(value, bool):
                return value if kind == "ints_or_int" else (value,)
            if not isinstance(value, tuple) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
                raise bad("a list of integers")
            return value
        if kind == "floats":
            if not isinstance(value, tuple) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
                raise bad("a list of numbers")
            return tuple(float(v) for v in value)
        if kind in ("shape", "dims"):
            if not isinstance(value, tuple) or any(
                isinstance(v, bool) or not isinstance(v, (int, str, DimExpr)) for v in value
            ):
                raise bad("a list of dimensions (integers, symbolic names or expressions such as \"n * 4\")")
            return tuple(_dim_attr(v, bad) if isinstance(v, str) else v for v in value)
        raise AssertionError(f"unknown attribute kind {kind}")


def _dim_attr(value: str, bad) -> Any:
    """A dimension written as text in an attribute (``"seq"``, ``"n * 4"``): its canonical
    form (the printer writes an expression back as that text)."""
    try:
        return parse_dim(value)
    except DplError:
        raise bad("a dimension: an integer, a symbolic name or an expression such as \"n * 4\"") from None


def _beyond_int64(value: Any) -> bool:
    """An integer (or one in a list) that no dtype holds: the kernels index with int64."""
    if type(value) is tuple:
        for v in value:
            if _beyond_int64(v):
                return True
        return False
    return isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63


@attrs.frozen
class CallInfo:
    """What an op's callbacks see: the op name, operand types and names, and the attributes."""

    op: str
    arg_types: tuple[Type, ...]
    attrs: Mapping[str, Any]
    arg_names: tuple[str, ...] = ()
    # which operands are Constants: TVM folds a scalar constant into the kernel, so it is no
    # load and cannot make a call Broadcast (``full`` of a constant is ElemWise)
    const_args: tuple[bool, ...] = ()

    def is_scalar_const(self, i: int) -> bool:
        ty = self.arg_types[i]
        return i < len(self.const_args) and self.const_args[i] and isinstance(ty, TensorType) and ty.ndim == 0

    def error(self, message: str) -> TypeInferenceError:
        return TypeInferenceError(f"op '{self.op}': {message}")

    def operand(self, i: int) -> str:
        """``name: type`` of operand i, for error messages."""
        name = self.arg_names[i] if i < len(self.arg_names) else f"operand {i}"
        return f"{name}: {self.arg_types[i]}"

    def tensor(self, i: int) -> TensorType:
        ty = self.arg_types[i]
        if not isinstance(ty, TensorType):
            raise self.error(f"operand {self.operand(i)} must be a tensor")
        return ty


@attrs.frozen
class OpDef:
    name: str
    num_args: tuple[int, int]  # (min, max); max -1 means any number
    attrs: Mapping[str, AttrSpec]
    infer: Callable[[CallInfo], Type]
    kind: Callable[[CallInfo, Type], OpPatternKind]
    ref: Callable[..., Any]  # ref(*numpy_arrays, **attrs) -> array or tuple of arrays
    c_expr: str | None = None  # scalar C template over {0}, {1}, ... for elementwise ops
    doc: str = ""


_REGISTRY: dict[str, OpDef] = {}


def register(
    name: str,
    *,
    num_args: int | tuple[int, int],
    infer: Callable[[CallInfo], Type],
    kind: OpPatternKind | Callable[[CallInfo, Type], OpPatternKind],
    ref: Callable[..., Any],
    attrs: Mapping[str, AttrSpec] | None = None,
    c_expr: str | None = None,
    doc: str = "",
) -> OpDef:
    """Declare an op. Every op is one call of this function."""
    if name in _REGISTRY:
        raise DplError(f"op '{name}' is already registered")
    arity = (num_args, num_args) if isinstance(num_args, int) else tuple(num_args)
    kind_fn = kind if callable(kind) else (lambda info, out, _k=kind: _k)
    op = OpDef(name, arity, dict(attrs or {}), infer, kind_fn, ref, c_expr, doc)
    _REGISTRY[name] = op
    return op


def lookup(name: str) -> OpDef | None:
    return _REGISTRY.get(name)


def get_op(name: str) -> OpDef:
    """The op called ``name``, or an :class:`UnknownOpError` that suggests the closest names."""
    op = lookup(name)
    if op is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else None
        if name.startswith("relax.") and name[6:] in _REGISTRY:
            hint = f"dpl op names have no 'relax.' prefix: write '{name[6:]}'"
        raise UnknownOpError(f"unknown op '{name}'", hint=hint)
    return op


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def describe(e: Expr) -> str:
    """A short name for an operand in error messages."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Constant):
        return f"constant {e.name}" if e.name else "constant"
    if isinstance(e, Call):
        return f"{e.op if isinstance(e.op, str) else e.op.name}(...)"
    if isinstance(e, Tuple):
        return "(" + ", ".join(describe(f) for f in e.fields) + ")"
    if isinstance(e, TupleGetItem):
        return f"{describe(e.tuple_value)}[{e.index}]"
    return type(e).__name__


def check_attrs(op: OpDef, given: Mapping[str, Any]) -> dict[str, Any]:
    """Validate attributes against the op's schema; fill in defaults, in schema order."""
    for key in given:
        if key not in op.attrs:
            known = ", ".join(op.attrs) or "none"
            raise UnknownAttributeError(f"op '{op.name}' has no attribute '{key}' (its attributes: {known})")
    out = {}
    for key, spec in op.attrs.items():
        if key in given:
            out[key] = spec.convert(op.name, key, given[key])
        elif spec.default is REQUIRED:
            raise AttributeValueError(f"op '{op.name}' needs attribute '{key}'")
        else:
            out[key] = freeze_attr_value(spec.default)
    return out  # every value frozen (see dpl.ir.expr.frozen_call)


def check_arity(op: OpDef, n: int) -> None:
    lo, hi = op.num_args
    if n < lo or (hi >= 0 and n > hi):
        want = str(lo) if lo == hi else f"{lo} to {hi}" if hi >= 0 else f"at least {lo}"
        raise ArityError(f"op '{op.name}' takes {want} argument{'s' if want != '1' else ''}, got {n}")


def make_call(op: str, args: Sequence[Expr], attrs: Mapping[str, Any] | None = None) -> Call:
    """A typed, checked call of a registered op."""
    opdef = get_op(op)
    args = tuple(args)
    check_arity(opdef, len(args))
    full = check_attrs(opdef, attrs or {})
    info = CallInfo(op, tuple([a.ty for a in args]), full, tuple([describe(a) for a in args]), _const_args(args))
    return frozen_call(op, args, full, opdef.infer(info))


def call_info(call: Call, names: bool = True) -> CallInfo:
    """What the op's callbacks see of ``call``; operand names (for errors) only when asked."""
    arg_names = tuple(describe(a) for a in call.args) if names else ()
    return CallInfo(call.op, tuple(a.ty for a in call.args), call.attrs, arg_names, _const_args(call.args))


def _const_args(args: Sequence[Expr]) -> tuple[bool, ...]:
    return tuple([type(a) is Constant for a in args])


def op_kind(call: Call) -> OpPatternKind:
    """TVM's pattern kind of this call. Calls of module functions are opaque."""
    if isinstance(call.op, GlobalVar):
        return OpPatternKind.OPAQUE
    return get_op(call.op).kind(call_info(call, names=False), call.ty)


def call_function(gv: GlobalVar, args: Sequence[Expr], ret_type: Type) -> Call:
    """A call of a module function (its return type comes from the callee)."""
    return frozen_call(gv, tuple(args), _NO_ATTRS, ret_type)


_NO_ATTRS = MappingProxyType({})


def is_tuple_type(ty: Type) -> bool:
    return isinstance(ty, TupleType)


def _printer_attrs(op: str):
    spec = lookup(op)
    return spec.attrs if spec is not None else None


# the IR's printer leaves default attributes out and prints dtypes short: it asks the registry
_printer.op_attrs, _printer.NO_DEFAULT = _printer_attrs, REQUIRED
