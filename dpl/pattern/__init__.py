"""The Dataflow Pattern Language: pattern objects, matcher, graph patterns, rewriting,
fusion-pattern sets and "why not?" reports, with TVM Relax's semantics.

    nodes.py    pattern objects and their constructors (wildcard, is_op, is_const, ...)
    printer.py  patterns printed back in the syntax that builds them
    match.py    Match / NoMatch and the matcher (look-through, commutativity, memo)
    context.py  graph patterns (used_by ^, only_used_by >>), PatternContext, match_graph
    rewrite.py  rewrite_call, rewrite_bindings
    fusion.py   FusionPattern, PatternSet, RewriteRule, CheckContext
    explain.py  explain(pattern, expr, func): why (not)

(``dpl.pattern.match`` the attribute is the ``match`` function; the module is imported as
``from dpl.pattern.match import ...``.)
"""

from dpl.pattern.nodes import (
    AndPattern, AttrPattern, CallPattern, ConstantPattern, DTypePattern, ExprPattern, GlobalVarPattern,
    NotPattern, OpPattern, OptionalPattern, OrPattern, Pattern, PatternError, ShapePattern, TupleGetItemPattern,
    TuplePattern, VarPattern, WildcardPattern, has_attr, has_dtype, has_shape, is_const, is_expr, is_gv, is_op,
    is_tuple, is_tuple_get_item, is_var, root_ops, wildcard,
)
from dpl.pattern.match import COMMUTATIVE_OPS, Match, Matcher, NoMatch, PatternIndex, match, match_bindings
from dpl.pattern.context import (
    Edge, GraphPattern, PatternContext, UseDef, iter_graph_matches, match_function, match_graph,
)
from dpl.pattern.rewrite import (
    RewriteError, RewriteNotConverged, RewriteTypeError, remove_dead_bindings, rewrite_bindings, rewrite_call,
)
from dpl.pattern.fusion import FUNCTION_RETURN, CheckContext, FusionPattern, PatternSet, RewriteRule
from dpl.pattern.explain import Explanation, explain
from dpl.pattern import printer as _printer  # noqa: F401,E402 (a pattern's text)

__all__ = [
    "AndPattern", "AttrPattern", "COMMUTATIVE_OPS", "CallPattern", "CheckContext", "ConstantPattern", "DTypePattern",
    "Edge", "Explanation", "FUNCTION_RETURN", "ExprPattern", "FusionPattern", "GlobalVarPattern", "GraphPattern", "Match", "Matcher",
    "NoMatch", "NotPattern", "OpPattern", "OptionalPattern", "OrPattern", "Pattern", "PatternContext",
    "PatternError", "PatternIndex", "PatternSet", "RewriteError", "RewriteNotConverged", "RewriteRule",
    "RewriteTypeError", "ShapePattern", "TupleGetItemPattern", "TuplePattern", "UseDef", "VarPattern",
    "WildcardPattern", "explain", "has_attr", "has_dtype", "has_shape", "is_const", "is_expr", "is_gv", "is_op",
    "is_tuple", "is_tuple_get_item", "is_var", "iter_graph_matches", "match", "match_bindings", "match_function",
    "match_graph", "remove_dead_bindings", "rewrite_bindings", "rewrite_call", "root_ops", "wildcard",
]
