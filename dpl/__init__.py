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
from dpl.ir.parser import parse
from dpl.ir.serialize import load, save
from dpl.ops import OpPatternKind, make_call, op_kind
from dpl import pattern
from dpl.pattern import (
    FusionPattern, GraphPattern, Match, NoMatch, PatternContext, PatternSet, explain, is_const, is_expr, is_gv, is_op,
    is_tuple, is_tuple_get_item, is_var, match, match_graph, rewrite_bindings, rewrite_call, wildcard,
)
from dpl.lang import check_hook, load_patterns, parse_patterns
from dpl.trace import Trace
from dpl.apply import apply
from dpl.transform import fold_constants, fuse_ops, fuse_ops_by_pattern
from dpl.backends.registry import register_codegen
from dpl.runtime import FusionConfig, build
from dpl.viz.draw import draw
from dpl.frontend.onnx_import import from_onnx  # imports onnx only when a model is imported

__version__ = "0.1.0"


def __getattr__(name: str):
    # frontends import their framework; importing dpl must not (torch takes seconds to load)
    if name == "from_torch":
        from dpl.frontend.torch_export import from_torch

        return from_torch
    if name in ("save_package", "load_package", "PackageError"):  # they import the CPU backend (0.3 s)
        from dpl import package

        return getattr(package, name)
    if name == "compile":  # torch.compile(model, backend=dpl's backend)
        from dpl.frontend.dynamo import compile

        return compile
    raise AttributeError(f"module 'dpl' has no attribute {name!r}")


__all__ = [
    "Binding", "Call", "Constant", "DplError", "Function", "FunctionBuilder", "GlobalVar", "Module",
    "OpPatternKind", "TensorType", "Tuple", "TupleGetItem", "TupleType", "Var", "const", "dtypes",
    "interpret", "load", "make_call", "op_kind", "parse", "save", "structural_equal", "structural_hash",
    # dpl.pattern
    "FusionPattern", "GraphPattern", "Match", "NoMatch", "PatternContext", "PatternSet", "explain", "is_const",
    "is_expr", "is_gv", "is_op", "is_tuple", "is_tuple_get_item", "is_var", "match", "match_graph", "pattern",
    "rewrite_bindings", "rewrite_call", "wildcard",
    # dpl.lang
    "check_hook", "load_patterns", "parse_patterns",
    # passes
    "Trace", "apply", "fold_constants", "fuse_ops", "fuse_ops_by_pattern",
    # runtime
    "FusionConfig", "build", "register_codegen",
    # a built executable in one file, run where no C compiler is
    "PackageError", "load_package", "save_package",
    # pictures of what fusion did
    "draw",
    # frontends (each loads its framework on first use)
    "from_onnx", "from_torch",
    # torch.compile with dpl's backend (loads torch on first use)
    "compile",
]
