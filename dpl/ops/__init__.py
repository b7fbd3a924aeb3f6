"""The op registry and its catalogues. ``make_call`` builds a checked, typed call.

The catalogues register their ops when imported, here, so the registry (below them) never
imports them: importing any ``dpl.ops`` module runs this package first."""

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
from dpl.ops import elementwise, manipulation, nn, reduce  # noqa: F401,E402 (they register their ops)
from dpl.ops import image  # noqa: F401,E402 (interpolation, convolutions of any rank, group norm)
from dpl.ops import indexing  # noqa: F401,E402 (argmax, topk, sort, histc, gathers, scatters)
from dpl.ops import experts  # noqa: F401,E402 (the grouped product of mixture-of-experts layers)

__all__ = ["AttrSpec", "CallInfo", "OpDef", "OpPatternKind", "all_ops", "call_function", "get_op", "lookup", "make_call", "op_kind", "register"]
