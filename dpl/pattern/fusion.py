"""What the ``.dpl`` compiler produces and FuseOpsByPattern consumes: named fusion patterns
and ordered sets of them, plus rewrite rules.

``FusionPattern(name, pattern, annotation_patterns, check, attrs_getter)`` is TVM's
``FusionPattern``: ``name`` is the composite name (``"cublas.matmul_bias"``, the codegen
prefix before the first dot), ``annotation_patterns`` names sub-patterns whose matched
expressions the check and the attrs getter see, ``check(ctx)`` may veto a match and answers a
bool or a :class:`Match`/:class:`NoMatch` (a NoMatch keeps its reason), and
``attrs_getter(annotated)`` returns extra attributes for the composite function.

A :class:`PatternSet` keeps fusion patterns in priority order (earlier wins, as in TVM) and
rewrite rules (applied before fusion, in order).
"""

from __future__ import annotations

import collections.abc
import logging
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import attrs

from dpl.errors import Span
from dpl.ir.expr import Expr, Function, Module, Var
from dpl.ir.types import TupleType
from dpl.pattern import nodes as n
from dpl.pattern.match import Match, NoMatch

_log = logging.getLogger(__name__)

FUNCTION_RETURN = Var("<return>", TupleType(()))
"""The user that :attr:`CheckContext.var_usages` lists for a variable the function returns.

In TVM a returned value leaves its dataflow block through a non-dataflow variable, which
``has_leaking_intermediate_variables`` counts as a leak; dpl has one kind of variable, so the
return is counted as a user instead, and the same check (users outside ``matched_bindings``)
rejects a returned intermediate. It is never a binding's variable."""


def _mapping(value) -> Mapping[str, n.Pattern]:
    return MappingProxyType(dict(value or {}))


class BindingIndex:
    """value -> (index, var) and var -> (index, value) over a function's bindings, built on
    first use and shared by every :class:`BoundSoFar` view of that function."""

    __slots__ = ("_bindings", "_by_value", "_by_var")

    def __init__(self, bindings):
        self._bindings = bindings
        self._by_value: dict | None = None
        self._by_var: dict | None = None

    @property
    def by_value(self) -> dict:
        if self._by_value is None:
            self._by_value = {b.value: (i, b.var) for i, b in enumerate(self._bindings)}
        return self._by_value

    @property
    def by_var(self) -> dict:
        if self._by_var is None:
            self._by_var = {b.var: (i, b.value) for i, b in enumerate(self._bindings)}
        return self._by_var


class BoundSoFar(collections.abc.Mapping):
    """value -> bound var over a function's bindings up to ``limit`` (TVM's partitioner hands a
    check the map of the bindings it has visited so far): a view of one index built per
    function (on first use), so making a check context costs nothing however long the
    function is."""

    __slots__ = ("_index", "_limit")

    def __init__(self, index: BindingIndex, limit: int):
        self._index, self._limit = index, limit

    @classmethod
    def index(cls, bindings) -> BindingIndex:
        """The index of ``bindings`` the views share."""
        return BindingIndex(bindings)

    def __getitem__(self, value: Expr) -> Var:
        i, var = self._index.by_value[value]
        if i > self._limit:
            raise KeyError(value)
        return var

    def __iter__(self):
        return (value for value, (i, _) in self._index.by_value.items() if i <= self._limit)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def value_of(self, var: Var) -> Expr | None:
        """The value ``var`` is bound to, if that binding is in view."""
        hit = self._index.by_var.get(var)
        return hit[1] if hit is not None and hit[0] <= self._limit else None


@attrs.frozen
class CheckContext:
    """What a check sees (TVM's ``PatternCheckContext``): the matched root value, the
    annotated expressions by name, the matched bindings {var: value}, the users of every
    variable of the function (:data:`FUNCTION_RETURN` among them for a returned variable),
    and value -> bound variable for the bindings seen so far."""

    matched_expr: Expr
    annotated_expr: Mapping[str, Expr]
    matched_bindings: Mapping[Var, Expr]
    var_usages: Mapping[Var, tuple[Var, ...]]
    value_to_bound_var: Mapping[Expr, Var]
    match: Match | None = None


@attrs.frozen(eq=False)
class FusionPattern:
    name: str
    pattern: n.Pattern
    annotation_patterns: Mapping[str, n.Pattern] = attrs.field(factory=dict, converter=_mapping)
    check: Callable[[CheckContext], Any] | None = None
    attrs_getter: Callable[[Mapping[str, Expr]], Mapping[str, Any]] | None = None
    # sub-patterns whose values the fused function also returns (beyond TVM: a multi-output
    # fusion such as Add+RMSNorm whose sum is used later); other intermediates must not leak
    outputs: tuple[n.Pattern, ...] = attrs.field(default=(), converter=tuple, kw_only=True)
    # beyond TVM: ``pattern`` is a tuple pattern of several roots, each matched to its own
    # binding (shared sub-patterns bind the same value); the composite returns every root
    multi_root: bool = attrs.field(default=False, kw_only=True)
    origin: str = attrs.field(factory=n._origin, kw_only=True)

    def __attrs_post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise n.PatternError(f"a fusion pattern needs a non-empty name, got {self.name!r}")
        if not isinstance(self.pattern, n.Pattern):
            raise n.PatternError(f"fusion pattern '{self.name}': expected a pattern, got {type(self.pattern).__name__}")
        for key, p in self.annotation_patterns.items():
            if not isinstance(p, n.Pattern):
                raise n.PatternError(f"fusion pattern '{self.name}': annotation '{key}' is not a pattern")
        if self.multi_root and not isinstance(self.pattern, n.TuplePattern):
            raise n.PatternError(f"fusion pattern '{self.name}': a multi-root pattern is a tuple pattern of its roots")
        if self.check is not None and not callable(self.check):
            raise n.PatternError(f"fusion pattern '{self.name}': check must be callable")
        if self.attrs_getter is not None and not callable(self.attrs_getter):
            raise n.PatternError(f"fusion pattern '{self.name}': attrs_getter must be callable")

    @property
    def codegen(self) -> str | None:
        """The codegen prefix: the name up to its first dot (None without a dot)."""
        return self.name.split(".", 1)[0] if "." in self.name else None

    def annotated(self, m: Match) -> dict[str, Expr]:
        """Each annotation present in the match -> the expression it bound."""
        if isinstance(m, Match):
            m = m.as_dict()
        return {key: m[p] for key, p in self.annotation_patterns.items() if p in m}

    def run_check(self, ctx: CheckContext) -> Match | NoMatch:
        """The check's verdict as a Match or a NoMatch with a reason."""
        if self.check is None:
            return ctx.match if ctx.match is not None else Match({})
        verdict = self.check(ctx)
        if isinstance(verdict, (Match, NoMatch)):
            return verdict
        if verdict:
            return ctx.match if ctx.match is not None else Match({})
        return NoMatch(self.pattern, ctx.matched_expr, "check",
                       f"the check of fusion pattern '{self.name}' (built at {self.origin}) rejected the match")

    def __repr__(self):
        return f"FusionPattern({self.name!r}, {self.pattern!r})"


@attrs.frozen(eq=False)
class RewriteRule:
    """``pattern`` rewritten by ``rewriter(value, match)`` (see :func:`dpl.pattern.rewrite_call`)."""

    name: str
    pattern: n.Pattern
    rewriter: Callable[[Expr, Match], Expr | None]
    origin: str = attrs.field(factory=n._origin, kw_only=True)
    span: Span | None = attrs.field(default=None, kw_only=True)  # where a .dpl rule was written, for its errors

    def apply(self, target: Function | Module, *, cse_keys: dict | None = None) -> Function | Module:
        from dpl.pattern.rewrite import rewrite_call

        return rewrite_call(self.pattern, self.rewriter, target, cse_keys=cse_keys, rule=self.name, span=self.span)


@attrs.frozen(eq=False)
class PatternSet:
    """Fusion patterns in priority order plus rewrite rules; names are unique."""

    patterns: tuple[FusionPattern, ...] = attrs.field(default=(), converter=tuple)
    rewrites: tuple[RewriteRule, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self):
        seen: dict[str, str] = {}
        for item in (*self.patterns, *self.rewrites):
            if item.name in seen:
                raise n.PatternError(f"the pattern set has two rules named '{item.name}' "
                                     f"(built at {seen[item.name]} and {item.origin})")
            seen[item.name] = item.origin
        for p in self.patterns:
            if not isinstance(p, FusionPattern):
                raise n.PatternError(f"PatternSet.patterns holds FusionPatterns, got {type(p).__name__}")
        for r in self.rewrites:
            if not isinstance(r, RewriteRule):
                raise n.PatternError(f"PatternSet.rewrites holds RewriteRules, got {type(r).__name__}")

    def __iter__(self) -> Iterator[FusionPattern]:
        return iter(self.patterns)

    def __len__(self) -> int:
        return len(self.patterns)

    def __getitem__(self, name: str) -> FusionPattern | RewriteRule:
        for item in (*self.patterns, *self.rewrites):
            if item.name == name:
                return item
        raise KeyError(name)

    def __add__(self, other: "PatternSet") -> "PatternSet":
        """Both sets, ``self`` first (so its patterns take priority). A rule of ``other`` named
        like one of ``self`` is left out, with a logged note: the earlier one wins, as for
        pattern files given in order (``dpl fuse -p mine.dpl -p cublas``)."""
        earlier = {item.name: item for item in (*self.patterns, *self.rewrites)}

        def kept(item) -> bool:
            first = earlier.get(item.name)
            if first is None:
                return True
            _log.warning("rule '%s' (%s) is shadowed by the earlier rule of that name (%s); the earlier one wins",
                         item.name, item.origin, first.origin)
            return False

        return PatternSet(self.patterns + tuple(p for p in other.patterns if kept(p)),
                          self.rewrites + tuple(r for r in other.rewrites if kept(r)))

    def apply_rewrites(self, target: Function | Module) -> Function | Module:
        from dpl.ir.collector import paused_collector

        keys: dict = {}  # the rules simplify versions of the same functions: CSE keys are shared
        with paused_collector():  # once around all the rules (see dpl.ir.collector)
            for rule in self.rewrites:
                target = rule.apply(target, cse_keys=keys)
        return target
