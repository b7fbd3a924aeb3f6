"""Graph patterns: several roots tied by use edges (TVM's ``PatternContext``).

``a ^ b`` (``a.used_by(b)``) says the value ``a`` matched is used by the binding ``b``
matched; ``a >> b`` (``a.only_used_by(b)``) says it is used by that binding and no other.
Both take an argument ``index``: the position of ``a`` among the variables ``b`` uses.
Uses in the function's return value are not counted, as in TVM.

Edges build an immutable :class:`GraphPattern`; chains (``a >> b >> c``) and
``p.fork_to(x, y)`` compose, and ``GraphPattern.union`` joins several. A
:class:`PatternContext` (``with PatternContext() as ctx:``) also collects every edge built
while it is active, for code written in TVM's style.

Matching assigns each pattern of the graph a distinct variable of the function (one pattern,
one variable, never shared: this is what tells a diamond from two parallel branches).

**The first answer** (the one :func:`match_graph` returns, which is TVM's for the cases the
tests compare) is found by a depth-first search that
1. takes the roots (patterns with no incoming edge) in the order they were first written, and
   tries for the first root every variable used by some binding, parameters first, then
   bindings in program order;
2. then assigns the other patterns, walking the edges breadth-first from what is assigned:
   a consumer is tried on the users of its producer in program order, a producer on the
   variables its consumer uses, left to right;
3. backtracks on the first constraint that fails.
:func:`iter_graph_matches` continues the same search and yields every further consistent
assignment, in that order (beyond TVM, which stops at the first).
"""

from __future__ import annotations

import threading
from typing import Iterator

import attrs

from dpl.ir.expr import Expr, Function, Var
from dpl.ir.traverse import vars_in
from dpl.pattern import nodes as n
from dpl.pattern.match import Matcher, NoMatch

USED_BY = "used_by"
ONLY_USED_BY = "only_used_by"


@attrs.frozen(eq=False)
class Edge:
    producer: n.Pattern
    consumer: n.Pattern
    kind: str  # USED_BY or ONLY_USED_BY
    index: int = -1

    def __repr__(self):
        op = ">>" if self.kind == ONLY_USED_BY else "^"
        at = "" if self.index == -1 else f" (at {self.index})"
        return f"{self.producer!r} {op} {self.consumer!r}{at}"


@attrs.frozen(eq=False)
class GraphPattern:
    """Patterns tied by edges. ``patterns`` lists them in the order first written, so a chain
    ``g = a >> b >> c`` gives ``g[0] is a``; chaining continues from the last one."""

    edges: tuple[Edge, ...]
    patterns: tuple[n.Pattern, ...]

    def __getitem__(self, i: int) -> n.Pattern:
        return self.patterns[i]

    @property
    def first(self) -> n.Pattern:
        return self.patterns[0]

    @property
    def last(self) -> n.Pattern:
        return self.patterns[-1]

    def used_by(self, other, index: int = -1) -> "GraphPattern":
        return edge(self, other, USED_BY, index)

    def only_used_by(self, other, index: int = -1) -> "GraphPattern":
        return edge(self, other, ONLY_USED_BY, index)

    __xor__ = used_by
    __rshift__ = only_used_by

    @staticmethod
    def union(*graphs: "GraphPattern") -> "GraphPattern":
        edges: list[Edge] = []
        pats: list[n.Pattern] = []
        for g in graphs:
            for e in g.edges:
                if all(e is not x for x in edges):
                    edges.append(e)
            for p in g.patterns:
                if all(p is not q for q in pats):
                    pats.append(p)
        return GraphPattern(tuple(edges), tuple(pats))

    def dup(self) -> "GraphPattern":
        """The same graph over fresh pattern objects (TVM's ``PatternSeq.dup``), e.g. to ask
        for two independent copies of a chain."""
        memo: dict = {}
        pats = tuple(p.dup(memo) for p in self.patterns)
        edges = tuple(Edge(e.producer.dup(memo), e.consumer.dup(memo), e.kind, e.index) for e in self.edges)
        return GraphPattern(edges, pats)

    def __add__(self, other: "GraphPattern") -> "GraphPattern":
        return GraphPattern.union(self, other)

    def roots(self) -> list[n.Pattern]:
        consumers = {id(e.consumer) for e in self.edges}
        return [p for p in self.patterns if id(p) not in consumers]

    def __repr__(self):
        return "GraphPattern(" + "; ".join(repr(e) for e in self.edges) + ")"


def edge(a, b, kind: str, index: int = -1) -> GraphPattern:
    """The graph ``a -> b``. ``a`` may be a graph (its last pattern produces), ``b`` a graph
    (its first pattern consumes). The new edge is also added to the active PatternContext."""
    if isinstance(index, bool) or not isinstance(index, int) or index < -1:
        raise n.PatternError(f"{kind}: index must be an argument position or -1, got {index!r}")
    left = a if isinstance(a, GraphPattern) else GraphPattern((), (_pattern(a),))
    right = b if isinstance(b, GraphPattern) else GraphPattern((), (_pattern(b),))
    e = Edge(left.last, right.first, kind, index)
    ctx = PatternContext.current()
    if ctx is not None:
        ctx.add(e)
    g = GraphPattern.union(left, right)
    return GraphPattern((*g.edges, e), g.patterns)


def _pattern(p) -> n.Pattern:
    if not isinstance(p, n.Pattern):
        raise n.PatternError(f"graph edges join patterns, got {type(p).__name__}")
    return p


class PatternContext:
    """Collects the edges built while it is active (``with PatternContext() as ctx``).
    ``incremental=True`` starts from the enclosing context's edges."""

    _local = threading.local()

    def __init__(self, incremental: bool = False):
        self.edges: list[Edge] = []
        self.incremental = incremental

    @classmethod
    def _stack(cls) -> list["PatternContext"]:
        if not hasattr(cls._local, "stack"):
            cls._local.stack = []
        return cls._local.stack

    @classmethod
    def current(cls) -> "PatternContext | None":
        stack = cls._stack()
        return stack[-1] if stack else None

    def __enter__(self):
        parent = PatternContext.current()
        if self.incremental and parent is not None:
            self.edges = list(parent.edges)
        self._stack().append(self)
        return self

    def __exit__(self, *exc):
        self._stack().pop()

    def add(self, e: Edge) -> None:
        for x in self.edges:
            if x.producer is e.producer and x.consumer is e.consumer and x.kind == e.kind and x.index == e.index:
                raise n.PatternError(f"the edge {e!r} is already in this context")
        self.edges.append(e)

    def graph(self) -> GraphPattern:
        pats: list[n.Pattern] = []
        for e in self.edges:
            for p in (e.producer, e.consumer):
                if all(p is not q for q in pats):
                    pats.append(p)
        return GraphPattern(tuple(self.edges), tuple(pats))

    def match_function(self, func: Function):
        return match_graph(self.graph(), func)

    match_dfb = match_function


# -- matching -------------------------------------------------------------------------------

def _leaf_vars(e: Expr, out: list[Var]) -> None:
    out.extend(vars_in(e))


class UseDef:
    """Who uses whom among a function's variables (the return value is not a user)."""

    def __init__(self, func: Function, skip: set | None = None):
        self.order: dict[Var, int] = {}
        for p in func.params:
            self.order[p] = len(self.order)
        self.users: dict[Var, list[Var]] = {}
        self.uses: dict[Var, list[Var]] = {}
        for b in func.bindings:
            self.order[b.var] = len(self.order)
            leaves: list[Var] = []
            _leaf_vars(b.value, leaves)
            self.uses[b.var] = leaves
            for v in dict.fromkeys(leaves):
                self.users.setdefault(v, []).append(b.var)

    def candidates(self) -> list[Var]:
        """Variables used by at least one binding, in definition order."""
        return sorted(self.users, key=self.order.__getitem__)


class _GraphSearch:
    def __init__(self, graph: GraphPattern, func: Function, exclude: set | None = None):
        self.graph, self.func = graph, func
        self.ud = UseDef(func)
        self.matcher = Matcher(func)
        self.exclude = exclude or set()
        self.node_ok: dict[tuple, bool] = {}
        self.best: NoMatch | None = None
        self.best_depth = -1
        self.order = self._order()

    def _order(self) -> list[n.Pattern]:
        """Roots in written order; from each, the rest breadth-first along edges."""
        order: list[n.Pattern] = []
        seen: set[int] = set()
        for root in self.graph.roots() or list(self.graph.patterns[:1]):
            if id(root) in seen:
                continue
            seen.add(id(root))
            queue = [root]
            while queue:
                p = queue.pop(0)
                order.append(p)
                for e in self.graph.edges:
                    for a, b in ((e.producer, e.consumer), (e.consumer, e.producer)):
                        if a is p and id(b) not in seen:
                            seen.add(id(b))
                            queue.append(b)
        return order

    def note(self, depth: int, pattern, expr, kind, reason, failure: NoMatch | None = None) -> None:
        """Keep the failure of the deepest partial assignment: the most telling one."""
        if depth > self.best_depth:
            self.best_depth = depth
            self.best = failure if failure is not None else NoMatch(pattern, expr, kind, reason)

    def node_matches(self, p: n.Pattern, v: Var, depth: int) -> bool:
        key = (p, v)
        ok = self.node_ok.get(key)
        if ok is None:
            m = self.matcher.match(p, v)
            ok = self.node_ok[key] = bool(m)
            if not ok:
                self.note(depth, None, None, None, None, failure=m)
        return ok

    def candidates(self, p: n.Pattern, assigned: dict) -> list[Var]:
        for e in self.graph.edges:
            if e.consumer is p and e.producer in assigned:
                return self.ud.users.get(assigned[e.producer], [])
            if e.producer is p and e.consumer in assigned:
                return list(dict.fromkeys(self.ud.uses.get(assigned[e.consumer], [])))
        return self.ud.candidates()

    def edge_ok(self, e: Edge, assigned: dict, depth: int) -> bool:
        pv, cv = assigned[e.producer], assigned[e.consumer]
        users = self.ud.users.get(pv, [])
        if cv not in users:
            self.note(depth, e.consumer, cv, "graph", lambda: f"{cv.name} does not use {pv.name} (edge {e!r})")
            return False
        if e.kind == ONLY_USED_BY and len(users) != 1:
            self.note(depth, e.producer, pv, "graph", lambda: (
                f"{pv.name} is used by {len(users)} bindings ({', '.join(u.name for u in users)}); "
                f"only_used_by (>>) needs exactly one"))
            return False
        if e.index != -1:
            uses = self.ud.uses.get(cv, [])
            if e.index >= len(uses) or uses[e.index] is not pv:
                self.note(depth, e.consumer, cv, "graph", lambda: f"{pv.name} is not operand {e.index} of {cv.name}")
                return False
        return True

    def search(self) -> Iterator[dict]:
        if not self.graph.edges:
            self.best = NoMatch(None, None, "graph", "the graph pattern has no edges")
            return
        yield from self._assign(0, {}, set())

    def _assign(self, i: int, assigned: dict, taken: set) -> Iterator[dict]:
        if i == len(self.order):
            yield dict(assigned)
            return
        p = self.order[i]
        for v in self.candidates(p, assigned):
            if v in self.exclude:
                continue
            if v in taken:
                self.note(i, p, v, "graph", lambda v=v: f"{v.name} is already matched by another pattern of the graph (one variable per pattern)")
                continue
            if not self.node_matches(p, v, i):
                continue
            assigned[p] = v
            if all(self.edge_ok(e, assigned, i) for e in self.graph.edges
                   if (e.producer is p and e.consumer in assigned) or (e.consumer is p and e.producer in assigned)):
                taken.add(v)
                yield from self._assign(i + 1, assigned, taken)
                taken.discard(v)
            del assigned[p]


def _as_graph(g) -> GraphPattern:
    if isinstance(g, GraphPattern):
        return g
    if isinstance(g, PatternContext):
        return g.graph()
    raise n.PatternError(f"expected a GraphPattern or PatternContext, got {type(g).__name__}")


def match_graph(graph: GraphPattern | PatternContext, func: Function):
    """The first assignment {pattern: Var} satisfying the graph (see the module docstring
    for the order), or a NoMatch naming the furthest failure."""
    search = _GraphSearch(_as_graph(graph), func)
    for found in search.search():
        return found
    if search.best is not None:
        return search.best
    return NoMatch(None, None, "graph", "no assignment of variables satisfies the graph")


def iter_graph_matches(graph: GraphPattern | PatternContext, func: Function, exclude=None) -> Iterator[dict]:
    """Every assignment satisfying the graph, the first one first."""
    yield from _GraphSearch(_as_graph(graph), func, exclude).search()


match_function = match_graph

n.LAYERS_ABOVE.update(edge=edge, union=GraphPattern.union)
