"""The op registry and its catalogues. ``make_call`` builds a checked, typed call."""

from dpl.ops.registry import (
    AttrSpec,
    CallInfo,
    OpDef,
    OpPatternKind,
    all_ops,
    call_function,
    get_op,
    lookup,
    make_call,
    op_kind,
    register,
)

__all__ = ["AttrSpec", "CallInfo", "OpDef", "OpPatternKind", "all_ops", "call_function", "get_op", "lookup", "make_call", "op_kind", "register"]
