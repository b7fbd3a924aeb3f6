"""dpl: rewrite and fuse tensor-program graphs, with a textual pattern language.

The user API is re-exported here; each concept lives in its own module.
"""

from dpl import dtypes
from dpl.errors import DplError
from dpl.interpret import interpret
from dpl.ir import (
    Binding, Call, Constant, Function, FunctionBuilder, GlobalVar, Module, TensorType, Tuple,
    TupleGetItem, TupleType, Var, const, structural_equal, structural_hash,
)
from dpl.ops import OpPatternKind, make_call, op_kind
from dpl.backends.registry import register_codegen
from dpl.runtime import FusionConfig, build

__version__ = "0.1.0"

__all__ = [
    "Binding", "Call", "Constant", "DplError", "Function", "FunctionBuilder", "GlobalVar", "Module",
    "OpPatternKind", "TensorType", "Tuple", "TupleGetItem", "TupleType", "Var", "const", "dtypes",
    "interpret", "make_call", "op_kind", "structural_equal", "structural_hash",
    "FusionConfig", "build", "register_codegen",
]
