"""The Dataflow Pattern Language: pattern objects, matcher, graph patterns, rewriting,
fusion-pattern sets and "why not?" reports (TVM Relax semantics; see docs/architecture.md)."""

from dpl.pattern.nodes import (
    AndPattern, AttrPattern, CallPattern, ConstantPattern, DTypePattern, ExprPattern, GlobalVarPattern,
    NotPattern, OpPattern, OptionalPattern, OrPattern, Pattern, PatternError, ShapePattern, TupleGetItemPattern,
    TuplePattern, VarPattern, WildcardPattern, has_attr, has_dtype, has_shape, is_const, is_expr, is_gv, is_op,
    is_tuple, is_tuple_get_item, is_var, wildcard,
)
from dpl.pattern.match import Match, Matcher, NoMatch, PatternIndex, match, match_bindings
from dpl.pattern.context import Edge, GraphPattern, PatternContext, iter_graph_matches, match_graph
from dpl.pattern.rewrite import (
    RewriteError, RewriteNotConverged, RewriteTypeError, remove_dead_bindings, rewrite_bindings, rewrite_call,
)
from dpl.pattern.fusion import CheckContext, FusionPattern, PatternSet, RewriteRule
from dpl.pattern.explain import Explanation, explain
