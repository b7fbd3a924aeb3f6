"""The canonical text form of the IR (the parser in :mod:`dpl.ir.parser` reads it back).

    const w0: f32[4, 4] = [...]            # module-level tensor constants, by name
    @primitive
    @composite("cublas.matmul_bias")
    func main(x: f32[n, 4], b: f32[4]) -> f32[n, 4] {
      lv0 = matmul(x, w0)
      lv1 = add(lv0, b)
      return lv1
    }

Scalar constants print inline (``2.0``, ``1:i32`` when not the literal's default dtype); calls
to module functions print by name; tuples as ``(a, b)``, items as ``t[0]``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from dpl import dtypes
from dpl.ir.dims import DimExpr, text as dim_text
from dpl.ir.expr import TEXT_FORM, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.types import Type
from dpl.syntax import escape_string

# a literal's dtype when no ':dtype' suffix is written
DEFAULT_LITERAL_DTYPE = {bool: "bool", int: "int64", float: "float32"}
# tensor constants up to this many elements print their values inline
INLINE_CONSTANT_LIMIT = 64

# function attribute <-> decorator spellings
DECORATORS = {"Primitive": "primitive", "Composite": "composite", "Codegen": "codegen", "global_symbol": "global_symbol"}


def format_type(ty: Type) -> str:
    return str(ty)


def format_scalar(value: Any) -> str:
    """A Python scalar as a literal the parser reads back exactly."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, np.floating) and value.dtype != np.float64:
        return _shortest(value, value.dtype)  # an f32 / f16 attribute: its own shortest form
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = repr(value)
    return text if any(c in text for c in ".en") else text + ".0"


def format_attr_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return escape_string(value)
    if isinstance(value, DimExpr):  # a dimension expression in a shape attribute: its text, which the op parses back
        return escape_string(dim_text(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attr_value(v) for v in value) + "]"
    return format_scalar(value)


def _shortest(value: Any, dtype: np.dtype) -> str:
    """The shortest literal that reads back to the same value of ``dtype``."""
    if dtype.kind != "f" or dtype == np.float64:
        return format_scalar(value.item() if isinstance(value, np.generic) else value)
    text = str(np.asarray(value, dtype=np.float32 if dtype.itemsize >= 4 else dtype)[()])
    if text in ("inf", "-inf", "nan"):
        return text
    return text if any(c in text for c in ".en") else text + ".0"


def format_scalar_constant(const: Constant) -> str:
    value = const.value.item()
    text = _shortest(const.value[()], const.value.dtype)
    default = DEFAULT_LITERAL_DTYPE[type(value)]
    return text if const.ty.dtype == default else f"{text}:{dtypes.short(const.ty.dtype)}"


def format_tensor_values(value: np.ndarray) -> str:
    def nest(a):
        if a.ndim == 0:
            return _shortest(a[()], a.dtype)
        return "[" + ", ".join(nest(x) for x in a) + "]"

    return nest(np.asarray(value))


# The op registry (a layer above the IR) tells the printer each op's attributes, which hold a
# dtype and their defaults: dpl.ops.registry sets ``op_attrs`` (op -> its attribute specs, each
# with ``kind`` and ``default``, or None) and ``NO_DEFAULT`` (a required attribute's default)
# when it is imported, which ``import dpl`` does.
op_attrs: Callable[[str], Mapping[str, Any] | None] = lambda op: None
NO_DEFAULT: Any = object()


def _attr_spec(op, key: str):
    found = op_attrs(op) if isinstance(op, str) else None
    return found.get(key) if found is not None else None


def _is_default(op, key: str, value: Any) -> bool:
    """Attributes equal to the op's default are left out of the text (the parser fills them)."""
    spec = _attr_spec(op, key)
    return spec is not None and spec.default is not NO_DEFAULT and type(spec.default) is type(value) and spec.default == value


class _Printer:
    def __init__(self, constant_names: dict[int, str]):
        self.constant_names = constant_names

    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Constant):
            if e.is_scalar:
                return format_scalar_constant(e)
            return self.constant_names[id(e)]
        if isinstance(e, GlobalVar):
            return e.name
        if isinstance(e, Tuple):
            inner = ", ".join(self.expr(f) for f in e.fields)
            return f"({inner},)" if len(e.fields) == 1 else f"({inner})"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, Call):
            op = e.op.name if isinstance(e.op, GlobalVar) else e.op
            parts = [self.expr(a) for a in e.args]
            parts += [f"{k}={self.attr_value(e.op, k, v)}" for k, v in e.attrs.items() if not _is_default(e.op, k, v)]
            return f"{op}({', '.join(parts)})"
        raise TypeError(f"cannot print {type(e).__name__}")

    @staticmethod
    def attr_value(op, key: str, value: Any) -> str:
        if isinstance(value, str):
            spec = _attr_spec(op, key)
            if spec is not None and spec.kind == "dtype":
                return dtypes.short(value)
        return format_attr_value(value)

    def function(self, fn: Function) -> str:
        lines = [self.decorator(k, v) for k, v in fn.attrs.items()]
        params = ", ".join(f"{p.name}: {format_type(p.ty)}" for p in fn.params)
        lines.append(f"func {fn.name}({params}) -> {format_type(fn.ret_type)} {{")
        for b in fn.bindings:
            lines.append(f"  {b.var.name} = {self.expr(b.value)}")
        lines.append(f"  return {self.expr(fn.ret)}")
        lines.append("}")
        return "\n".join(lines)

    @staticmethod
    def decorator(key: str, value: Any) -> str:
        name = DECORATORS.get(key)
        if name == "primitive" and value is True:
            return "@primitive"
        if name is not None and name != "primitive":
            return f"@{name}({format_attr_value(value)})"
        return f"@attr({key}={format_attr_value(value)})"


def collect_constants(mod_or_fn) -> list[Constant]:
    """Every non-scalar constant, in first-use order, each once."""
    seen: dict[int, Constant] = {}

    def visit(e):
        if isinstance(e, Constant) and not e.is_scalar:
            seen.setdefault(id(e), e)
        elif isinstance(e, Call):
            for a in e.args:
                visit(a)
        elif isinstance(e, Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)

    fns = mod_or_fn.functions.values() if isinstance(mod_or_fn, Module) else [mod_or_fn]
    for fn in fns:
        for b in fn.bindings:
            visit(b.value)
        visit(fn.ret)
    return list(seen.values())


def constant_names(constants: list[Constant]) -> dict[int, str]:
    """Stable names for constants: their own where unique, else ``c<i>``."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for c in constants:
        name = c.name if c.name and c.name not in taken else None
        i = 0
        while name is None or name in taken:
            name, i = f"c{i}", i + 1
        names[id(c)] = name
        taken.add(name)
    return names


def print_module(mod: Module, inline_limit: int | None = INLINE_CONSTANT_LIMIT) -> str:
    """The module's text. Constants larger than ``inline_limit`` print without values
    (``dpl.save`` writes those to the sidecar ``.npz``)."""
    constants = collect_constants(mod)
    names = constant_names(constants)
    printer = _Printer(names)
    chunks = []
    for c in constants:
        head = f"const {names[id(c)]}: {format_type(c.ty)}"
        if inline_limit is None or c.value.size <= inline_limit:
            head += f" = {format_tensor_values(c.value)}"
        chunks.append(head)
    if constants:
        chunks.append("")
    text = "\n".join(chunks)
    return text + "\n\n".join(printer.function(fn) for fn in mod.functions.values()) + "\n"


def print_function(fn: Function) -> str:
    return _Printer(constant_names(collect_constants(fn))).function(fn)


TEXT_FORM.update(function=print_function, module=print_module)
