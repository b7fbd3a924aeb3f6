"""The typed, immutable dataflow IR: types, expressions, functions, modules, builder."""

from dpl.ir.builder import FunctionBuilder, call, const
from dpl.ir import printer as _printer  # noqa: F401 (gives Function and Module their text form)
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var, replace
from dpl.ir.structural import structural_equal, structural_hash
from dpl.ir.types import Dim, TensorType, TupleType, Type

__all__ = [
    "Binding", "Call", "Constant", "Dim", "Expr", "Function", "FunctionBuilder", "GlobalVar", "Module",
    "TensorType", "Tuple", "TupleGetItem", "TupleType", "Type", "Var", "call", "const", "replace",
    "structural_equal", "structural_hash",
]
