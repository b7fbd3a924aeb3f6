"""Rewriting functions with patterns: ``rewrite_call`` (one root) and ``rewrite_bindings``
(graph patterns), as in TVM Relax.

``rewrite_call(pattern, rewriter, func)`` matches every binding's value; for a match it calls
``rewriter(value, match)``. Returning the original value (or ``None``) means "no match": if
the pattern is a top-level ``|``, its next alternative is then tried, as in TVM. Rounds repeat
until nothing changes (a fixed point), at most ``max_iterations`` times, else
:class:`RewriteNotConverged` names the pattern (and the rule, with its span, when the caller
gives them). The rounds are bounded by growth as well: a function that grows past
``MAX_REWRITE_GROWTH`` times its size plus ``MAX_REWRITE_EXTRA`` bindings (see
:mod:`dpl.limits`) raises :class:`RewriteGrowthError`, since a replacement that contains its own
match doubles the function each round and would exhaust memory long before the round limit.
After each round the function is simplified as Relax does (:func:`dpl.ir.simplify.simplify`:
CanonicalizeBindings, so ``d[0]`` of ``d = (a, b)`` is ``a`` and ``y = x`` disappears;
EliminateCommonSubexpr; dead bindings removed), so the next round sees what the rewrite exposed; a round whose simplified result
is the function it started from ends the loop.

A replacement may be any expression built from the matched values. Sub-expressions that are
values of existing bindings are replaced by those bindings' variables (so nothing is computed
twice), and new nested calls get new bindings with fresh names that clash with none of the
function's. A replacement whose type differs from the value it replaces is rejected with a
:class:`RewriteTypeError` naming both types. Functions and modules are never mutated: a new
function is returned, or the same object when nothing matched.
"""

from __future__ import annotations

from typing import Callable, Mapping

from dpl.errors import DplError, Span
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var, with_args
from dpl.ir.simplify import remove_dead_bindings, simplify, simplify_changed  # noqa: F401 (remove_dead_bindings: re-exported)
from dpl.ir.structural import structural_equal
from dpl.limits import MAX_REWRITE_EXTRA, MAX_REWRITE_GROWTH, LimitError
from dpl.pattern import nodes as n
from dpl.pattern.context import GraphPattern, PatternContext, _as_graph, _leaf_vars, iter_graph_matches
from dpl.pattern.match import Match, Matcher, PatternIndex

DEFAULT_MAX_ITERATIONS = 64


class RewriteError(DplError):
    """A rewriter returned something that cannot replace what it matched."""


class RewriteTypeError(RewriteError):
    """A replacement's type differs from the type of the value it replaces."""


class RewriteNotConverged(RewriteError):
    """Rewriting did not reach a fixed point within the iteration bound."""


class RewriteGrowthError(RewriteNotConverged, LimitError):
    """Rewriting grew a function past the limits of :mod:`dpl.limits` before a fixed point."""


def _where(p) -> str:
    return f"{p!r} (built at {getattr(p, 'origin', '?')})"


def _alternatives(p: n.Pattern) -> list[n.Pattern]:
    if isinstance(p, n.OrPattern):
        return _alternatives(p.left) + _alternatives(p.right)
    return [p]


def rewrite_call(pattern: n.Pattern, rewriter: Callable[[Expr, Match], Expr | None], func: Function | Module,
                 *, max_iterations: int = DEFAULT_MAX_ITERATIONS, cse_keys: dict | None = None,
                 rule: str | None = None, span: Span | None = None) -> Function | Module:
    """Rewrite every binding whose value ``pattern`` matches, to a fixed point. ``cse_keys``
    is a cache that calls on versions of the same module may share (CSE keys for the
    simplification between rounds, see :func:`dpl.ir.simplify.eliminate_common_subexpr`, and
    the ops each function calls); it changes no result. ``rule`` and ``span``: the name and
    source of the rule being applied, for the errors that stop the rounds."""
    if not isinstance(pattern, n.Pattern):
        raise n.PatternError(f"rewrite_call: expected a pattern, got {type(pattern).__name__}")
    if isinstance(func, Module):
        return _per_function(func, lambda f: rewrite_call(pattern, rewriter, f, max_iterations=max_iterations,
                                                          cse_keys=cse_keys, rule=rule, span=span))
    _check_function(func, "rewrite_call")
    with paused_collector():  # see dpl.ir.collector: the collector would make the pass superlinear
        return _rewrite_call(pattern, rewriter, func, max_iterations, {} if cse_keys is None else cse_keys, rule, span)


def _rewrite_call(pattern, rewriter, func: Function, max_iterations: int, keys: dict,
                  rule: str | None = None, span: Span | None = None) -> Function:
    alternatives = _alternatives(pattern)
    index = PatternIndex(alternatives)
    required = n.required_ops(pattern)
    largest = MAX_REWRITE_GROWTH * len(func.bindings) + MAX_REWRITE_EXTRA
    current = func
    for rounds in range(1, max_iterations + 1):
        if required and not _calls_all(current, required, keys):
            return current  # an op every match calls is called nowhere: no binding can match
        new, changed, removed, values = _round(pattern, alternatives, index, rewriter, current)
        if new is current or structural_equal(new, current, names=False):
            return current  # an equal rebuild is a fixed point too (Relax compares structurally)
        # Relax: CanonicalizeBindings, EliminateCommonSubexpr, RemoveAllUnused (what changed
        # is looked at, when ``current`` is simplify's own result)
        new = simplify_changed(current, new, changed, keys, removed, values)
        if structural_equal(new, current, names=False):
            return current
        current = new
        if len(current.bindings) > largest:
            raise RewriteGrowthError(
                f"{_who(pattern, rule, span)} grew function '{func.name}' from {len(func.bindings)} to {len(current.bindings)} "
                f"bindings in {rounds} rounds without reaching a fixed point; the limit is MAX_REWRITE_GROWTH = "
                f"{MAX_REWRITE_GROWTH} times the bindings before it plus MAX_REWRITE_EXTRA = {MAX_REWRITE_EXTRA}",
                span, hint="the replacement contains what the pattern matches, so every round matches it again")
    raise RewriteNotConverged(
        f"{_who(pattern, rule, span)} did not converge after {max_iterations} rounds on function '{func.name}'", span,
        hint="the rewriter probably builds an expression its own pattern matches again")


def _who(pattern, rule: str | None, span: Span | None = None) -> str:
    """The rule in an error: its name where the caller gave one, else the pattern and its origin."""
    if rule is not None:
        return f"rewrite '{rule}'" if span is not None else f"rewrite '{rule}' (pattern {_where(pattern)})"
    return f"rewrite_call with pattern {_where(pattern)}"


def _calls_all(func: Function, required: frozenset[str], cache: dict) -> bool:
    """Whether ``func`` calls every op of ``required`` (calls nested in values included). The
    bindings are read until all are found (in a model of repeated layers, within the first
    layer); a function read whole leaves its op names in ``cache`` for the next rule, as
    :func:`dpl.ir.simplify.simplify` does for what it returns."""
    hit = cache.get(("ops", id(func)))
    if hit is not None and hit[0] is func:
        return required <= hit[1]
    missing = set(required)
    ops: set[str] = set()
    nested: list = []
    for b in func.bindings:
        value = b.value
        if type(value) is Call:
            op = value.op
            if op in missing:
                missing.discard(op)
                if not missing:
                    return True
            if type(op) is str:
                ops.add(op)
            for a in value.args:
                if type(a) is not Var and type(a) is not Constant:
                    nested.append(a)
        elif type(value) is not Var and type(value) is not Constant:
            nested.append(value)
    _nested_ops(nested, ops)
    cache[("ops", id(func))] = (func, ops)
    return required <= ops


def _nested_ops(nested: list, ops: set[str]) -> None:
    """Adds the op names called in the expressions of ``nested`` (emptied) to ``ops``."""
    while nested:
        e = nested.pop()
        if isinstance(e, Call):
            if isinstance(e.op, str):
                ops.add(e.op)
            nested.extend(e.args)
        elif isinstance(e, Tuple):
            nested.extend(e.fields)
        elif isinstance(e, TupleGetItem):
            nested.append(e.tuple_value)


def _round(pattern, alternatives, index, rewriter, func: Function) -> tuple[Function, list[Binding], list[Binding], dict]:
    """One round: the rewritten function, its replacing and added bindings, the bindings they
    replaced, and {var: value} of ``func``'s bindings."""
    # {var: value} filled as the walk goes: a match at a binding looks only through the
    # bindings before it (a function defines every variable before its use), so the matcher
    # needs no walk of its own over the function
    bound: dict[Var, Expr] = {}
    matcher = Matcher(reasons=False, var2val=bound)  # a failed match is skipped, its reason never read
    replaced: dict[Var, Expr] = {}
    at: list[int] = []  # the replaced bindings' positions
    # per replaced variable, its value and match: what a replacement built from the match
    # nests is looked up among the bindings the match read, without mapping every binding
    near: dict[Var, tuple[Expr, Match]] = {}
    # each replacement reads, directly, only variables bound before it or parameters (checked
    # here, where ``bound`` holds exactly the bindings up to the replaced one), except perhaps
    # ``unseen``: variables no binding before it binds, each a parameter unless bound later
    params = None
    unseen: list[Var] = []
    # without root-less alternatives only calls of the indexed ops can match: their
    # alternatives, in order, per op
    by_op = None if index.anywhere else {op: [p for _, p in ps] for op, ps in index.by_op.items()}
    alts_of = by_op.get if by_op is not None else None  # bound once: the walk is the round's cost
    for i, b in enumerate(func.bindings):
        value = b.value
        bound[b.var] = value
        if alts_of is not None:
            if type(value) is not Call:
                continue
            alts = alts_of(value.op)
            if alts is None:
                continue
        elif isinstance(value, Var):
            continue  # an alias: its value is matched (and rewritten) at its own binding
        else:
            alts = index.candidates(value)
        for alt in alts:
            m = matcher.match(alt, value)
            if not m:
                continue
            if alt is not pattern:
                m._map[pattern] = value  # TVM also maps the top-level | to the value
            new = rewriter(value, m)
            if new is None or new is value:
                continue  # "no match": try the next alternative
            _check_replacement(b.var, value, new, pattern)
            replaced[b.var] = new
            at.append(i)
            near[b.var] = (value, m)
            for leaf in _replacement_leaves(new):
                if leaf not in bound:
                    if params is None:
                        params = set(func.params)
                    if leaf not in params:
                        unseen.append(leaf)
                elif leaf is b.var:
                    unseen.append(leaf)  # it reads itself: the rebuild's full check reports the cycle
            break
    if not replaced:
        return func, [], [], bound
    rebuild = _Rebuild(func, replaced, near, bound, in_order=not any(v in bound for v in unseen))
    new, made = rebuild.run(replaced, at, changed=True)
    return new, made, [func.bindings[i] for i in at], bound


def _bound_in_match(e: Expr, root: Expr, m: Match, bound: Mapping[Var, Expr]) -> Var | None:
    """A variable whose binding's value is ``e``, among those that ``root`` (a matched value)
    and the values its match bound read (the matcher looks through variables to values)."""
    get = bound.get
    for a in root.args if type(root) is Call else ():
        if type(a) is Var and get(a) is e:
            return a
    for c in m._map.values():
        kind = type(c)
        if kind is Call:
            kids = c.args
        elif kind is Tuple:
            kids = c.fields
        elif kind is TupleGetItem:
            kids = (c.tuple_value,)
        else:
            continue
        for a in kids:
            if type(a) is Var and get(a) is e:
                return a
    return _bound_in_match_slow(e, root, get)


def _bound_in_match_slow(e: Expr, root: Expr, get) -> Var | None:
    """:func:`_bound_in_match` for a root that is not a call (a tuple or a tuple item)."""
    kids = root.fields if type(root) is Tuple else (root.tuple_value,) if type(root) is TupleGetItem else ()
    for a in kids:
        if type(a) is Var and get(a) is e:
            return a
    return None


def _replacement_leaves(e: Expr) -> list[Var]:
    """The variables in ``e`` (a replacement), repeats included."""
    out: list[Var] = []
    stack = [e]
    while stack:
        e = stack.pop()
        kind = type(e)
        if kind is Var:
            out.append(e)
        elif kind is Call:
            stack.extend(e.args)
        elif kind is Tuple:
            stack.extend(e.fields)
        elif kind is TupleGetItem:
            stack.append(e.tuple_value)
    return out


def _check_replacement(var: Var, old: Expr, new, pattern) -> None:
    if not isinstance(new, (Var, Constant, Call, Tuple, TupleGetItem)):
        raise RewriteError(f"the rewriter of {_where(pattern)} returned {type(new).__name__} for {var.name}, not an expression")
    if new.ty is not old.ty and new.ty != old.ty:
        raise RewriteTypeError(
            f"the rewriter of {_where(pattern)} replaced {var.name}: {old.ty} with a value of type {new.ty}",
            hint="a replacement must have the type of the value it replaces")


def _check_function(func, who: str) -> None:
    if not isinstance(func, Function):
        raise DplError(f"{who}: expected a Function or Module, got {type(func).__name__}")


def _per_function(mod: Module, fn) -> Module:
    changed = {name: fn(f) for name, f in mod.functions.items()}
    if all(changed[k] is mod.functions[k] for k in changed):
        return mod
    return Module(changed)


class _Rebuild:
    """Builds a new function from ``func`` with some binding values replaced.

    ``near`` (from a rewrite round): per replaced variable, the value it had and its match;
    with ``bound``, the round's {var: value} of every binding, a replacement's nested
    expression is looked up among the bindings the match read (and among the replacements)
    before every binding's value is mapped. ``in_order``: the round found that each
    replacement reads directly only variables bound before it; the rebuild then knows its
    result is in order unless a nested expression is found elsewhere."""

    def __init__(self, func: Function, replaced: Mapping[Var, Expr], near: Mapping[Var, tuple[Expr, Match]] | None = None,
                 bound: Mapping[Var, Expr] | None = None, in_order: bool = False):
        self.func = func
        self._taken: set[str] | None = None  # every name of the function, made when first needed
        self.replaced = replaced
        self._bound_value: dict[int, Var] | None = None  # made when a replacement nests an expression
        self.out: list[Binding] = []
        self.fresh: dict[int, Var] = {}
        self.near = near
        self.bound = bound
        self.in_order = in_order and near is not None
        self._near_here: tuple[Expr, Match] | None = None  # near's entry for the binding being rebuilt
        self._replacements: dict[int, Var] | None = None  # id(replacement) -> its variable

    def nested(self, e: Expr) -> Var | None:
        """The variable bound to ``e`` (a replacement's nested expression), if any: what
        :attr:`bound_value` holds for it, read from the match's bindings where they have it."""
        if self.near is None:
            return self.bound_value.get(id(e))
        if self._replacements is None:
            self._replacements = {id(v): k for k, v in self.replaced.items()}
        var = self._replacements.get(id(e))  # a replacement's own variable comes first, as in bound_value
        if var is None:
            if self._near_here is not None:
                var = _bound_in_match(e, *self._near_here, self.bound)
                if var is not None:
                    return var  # read by the match of a later binding: bound before it
            var = self.bound_value.get(id(e))
        if var is not None:
            self.in_order = False  # a variable bound anywhere: the order is checked in full
        return var

    @property
    def bound_value(self) -> dict[int, Var]:
        """id(value) -> the variable bound to it (replacements included)."""
        if self._bound_value is None:
            self._bound_value = {id(b.value): b.var for b in self.func.bindings}
            self._bound_value.update({id(v): k for k, v in self.replaced.items()})
        return self._bound_value

    @property
    def taken(self) -> set[str]:
        if self._taken is None:
            self._taken = {p.name for p in self.func.params} | {b.var.name for b in self.func.bindings}
        return self._taken

    def fresh_name(self, base: str) -> str:
        i = 0
        while f"{base}_{i}" in self.taken:
            i += 1
        name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def normalize(self, e: Expr, owner: Var, top: bool) -> Expr:
        kind = type(e)
        if kind is Var or kind is Constant or kind is GlobalVar:
            return e
        if not top:
            bound = self.nested(e) or self.fresh.get(id(e))
            if bound is not None and bound is not owner:
                return bound
        if kind is Call:
            args = e.args
            for k, a in enumerate(args):
                image = self.normalize(a, owner, False)
                if image is not a:
                    if args is e.args:
                        args = list(args)
                    args[k] = image
            new = e if args is e.args else with_args(e, tuple(args))
        elif isinstance(e, Tuple):
            fields = tuple(self.normalize(f, owner, False) for f in e.fields)
            return e if all(x is y for x, y in zip(fields, e.fields)) else Tuple(fields)
        elif isinstance(e, TupleGetItem):
            inner = self.normalize(e.tuple_value, owner, False)
            return e if inner is e.tuple_value else TupleGetItem(inner, e.index)
        else:
            raise RewriteError(f"cannot place a {type(e).__name__} in a function body")
        if top:
            return new
        var = Var(self.fresh_name(owner.name), new.ty)
        self.out.append(Binding(var, new))
        self.fresh[id(e)] = var
        return var

    def run(self, replaced: Mapping[Var, Expr], at: list[int] | None = None, changed: bool = False):
        """The new function; ``at``: the positions of the replaced bindings, in order, when the
        caller knows them (the bindings between them are copied a slice at a time).
        ``changed=True`` returns (the function, its replaced and added bindings)."""
        bindings = self.func.bindings
        if at is None:
            at = [i for i, b in enumerate(bindings) if b.var in replaced]
        new: list[int] = []  # positions in ``out`` of the replaced and the fresh bindings
        out = self.out
        done = 0
        for i in at:
            out.extend(bindings[done:i])
            b = bindings[i]
            start = len(out)
            if self.near is not None:
                self._near_here = self.near.get(b.var)
            value = self.normalize(replaced[b.var], b.var, True)
            out.append(b if value is b.value else Binding(b.var, value))
            new.extend(range(start, len(out)))
            done = i + 1
        out.extend(bindings[done:])
        made = [out[i] for i in new]
        # in order when the round and the nested lookups say so (what a replacement reads:
        # variables bound before it, parameters, its match's bindings, new bindings before it)
        out = self.out if self.in_order or _new_in_order(self.out, new) else _topological(self.out)
        func = Function(self.func.name, self.func.params, out, self.func.ret, self.func.attrs)
        return (func, made) if changed else func


def _new_in_order(bindings: list[Binding], new: list[int]) -> bool:
    """Every binding at a position of ``new`` reads only variables defined before it (the
    others kept their order and their values, so they still do)."""
    if not new:
        return True
    position = {b.var: i for i, b in enumerate(bindings)}
    for i in new:
        value = bindings[i].value
        reads = value.args if type(value) is Call else (value,)
        for a in reads:
            t = type(a)
            if t is Var:
                if position.get(a, -1) >= i:
                    return False
            elif t is not Constant:
                deps: list[Var] = []
                _leaf_vars(a, deps)
                if any(position.get(d, -1) >= i for d in deps):
                    return False
    return True


def _rebuild(func: Function, replaced: Mapping[Var, Expr], at: list[int] | None = None) -> Function:
    return _Rebuild(func, replaced).run(replaced, at)


def _topological(bindings: list[Binding]) -> list[Binding]:
    """Bindings ordered so every variable is defined before use, keeping the given order
    wherever it already is (a graph rewrite may have a value use a later binding)."""
    by_var = {b.var: b for b in bindings}
    if _in_order(bindings, by_var):
        return bindings
    done: set = set()
    active: set = set()
    out: list[Binding] = []

    def emit(b: Binding):
        if b.var in done:
            return
        if b.var in active:
            raise RewriteError(f"the rewrite made {b.var.name} depend on itself (a cycle)")
        active.add(b.var)
        deps: list[Var] = []
        _leaf_vars(b.value, deps)
        for d in deps:
            if d in by_var:
                emit(by_var[d])
        active.discard(b.var)
        done.add(b.var)
        out.append(b)

    for b in bindings:
        emit(b)
    return out


def _in_order(bindings: list[Binding], by_var) -> bool:
    """Every variable a binding reads is defined by an earlier binding (or is not a binding's)."""
    defined: set = set()
    for b in bindings:
        value = b.value
        reads = value.args if type(value) is Call else (value,)
        for a in reads:
            t = type(a)
            if t is Var:
                if a in by_var and a not in defined:
                    return False
            elif t is not Constant:
                deps: list[Var] = []
                _leaf_vars(a, deps)
                if any(d in by_var and d not in defined for d in deps):
                    return False
        defined.add(b.var)
    return True


def rewrite_bindings(graph: GraphPattern | PatternContext, rewriter, func: Function | Module,
                     *, max_iterations: int | None = None) -> Function | Module:
    """Rewrite with a graph pattern: ``rewriter(matches: {pattern: Var}, bindings: {Var: Expr})``
    returns ``{Var: new value}`` for the bindings to replace. Matching repeats on the bindings
    not yet rewritten until the graph no longer matches."""
    g = _as_graph(graph)
    if isinstance(func, Module):
        return _per_function(func, lambda f: rewrite_bindings(g, rewriter, f, max_iterations=max_iterations))
    _check_function(func, "rewrite_bindings")
    bound = max_iterations if max_iterations is not None else len(func.bindings) + 1
    done: set = set()
    current = func
    for _ in range(bound):
        found = next(iter_graph_matches(g, current, exclude=done), None)
        if found is None:
            return simplify(current) if current is not func else func
        values = {b.var: b.value for b in current.bindings}
        out = rewriter(found, values)
        if out is None:
            out = {}
        if not isinstance(out, Mapping):
            raise RewriteError(f"the rewriter of {g!r} must return a mapping {{Var: new value}}, got {type(out).__name__}")
        replaced = {}
        for var, new in out.items():
            if var not in values:
                raise RewriteError(f"the rewriter of {g!r} returned a value for {getattr(var, 'name', var)!r}, "
                                   "which is not a binding of the function")
            if new is not values[var]:
                _check_replacement(var, values[var], new, g)
                replaced[var] = new
        done.update(replaced or found.values())
        if replaced:
            current = _rebuild(current, replaced)
    raise RewriteNotConverged(f"rewrite_bindings did not converge after {bound} rounds with {g!r}")
