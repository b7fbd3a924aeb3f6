"""Matching one pattern against one expression, with TVM Relax's semantics.

* **Look-through of bindings** ("autojump"): before any pattern meets an expression, a
  variable bound in the function is replaced by its bound value, repeatedly, so aliases
  (``y1 = y``) are followed too. Match results hold the unwrapped expressions, as TVM's
  ``extract_matched_expr`` does; ``is_var`` therefore fails on a bound variable.
* **Commutativity**: only ``add`` and ``multiply`` retry with reversed arguments.
* **Memo**: a pattern object met twice must meet the *same* expression object both times
  (``add(a, a)`` does not match ``add(e1, e2)`` even if ``e1`` and ``e2`` look alike).
  A failed branch (an ``|`` alternative, the commutative retry) rolls the memo and the
  symbolic-dimension bindings back, so each branch starts clean.
* Attributes a pattern does not mention are unconstrained; mentioned ones match exactly.

A result is a :class:`Match` (pattern -> expression) or a falsy :class:`NoMatch` carrying the
failing sub-pattern, the expression it met and a reason built only when asked for.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from dpl import dtypes
from dpl.ir.dims import DimExpr, floordiv, free_symbols, provably_equal, sub, substitute
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from dpl.ir.types import TensorType
from dpl.pattern import nodes as n

COMMUTATIVE_OPS = frozenset({"add", "multiply"})
_MISSING = object()


class Match(Mapping):
    """A successful match: each matched pattern node -> the (unwrapped) expression it bound.

    ``symbols`` holds the symbolic dimensions bound by ``has_shape``.
    """

    __slots__ = ("_map", "symbols")

    def __init__(self, mapping: dict, symbols: Mapping[str, Any] | None = None):
        self._map = mapping
        self.symbols = dict(symbols or {})

    def __getitem__(self, p: n.Pattern):
        return self._map[p]

    def __iter__(self):
        return iter(self._map)

    def __len__(self):
        return len(self._map)

    # the dict's own (read-only) views and lookups: Mapping's generic ones call back per item
    def __contains__(self, p) -> bool:
        return p in self._map

    def get(self, p, default=None):
        return self._map.get(p, default)

    def items(self):
        return self._map.items()

    def keys(self):
        return self._map.keys()

    def values(self):
        return self._map.values()

    def as_dict(self) -> Mapping:
        """The pattern -> expression dict itself, read-only by convention (for hot loops that
        look many patterns up)."""
        return self._map

    def __bool__(self):
        return True

    def __repr__(self):
        items = ", ".join(f"{p!r}: {show(e)}" for p, e in self._map.items())
        return f"Match({{{items}}})"


class NoMatch:
    """A failed match, falsy. ``pattern`` is the sub-pattern that failed, ``expr`` the
    expression it met (as written: a bound variable stays a variable), ``kind`` a short
    category (``op``, ``attribute``, ``dtype``, ``shape``, ``consistency``, ``bound-var``...)
    and ``reason`` a message built lazily. ``causes`` holds each alternative's failure."""

    __slots__ = ("pattern", "expr", "kind", "_reason", "_args", "causes")

    def __init__(self, pattern, expr, kind: str, reason: str | Callable[..., str], causes: tuple = (), args: tuple = ()):
        self.pattern, self.expr, self.kind, self.causes = pattern, expr, kind, causes
        self._reason, self._args = reason, args

    def __bool__(self):
        return False

    @property
    def reason(self) -> str:
        if callable(self._reason):
            self._reason, self._args = self._reason(*self._args), ()
        return self._reason

    def leaves(self) -> list["NoMatch"]:
        """The innermost failures (one per alternative tried)."""
        if not self.causes:
            return [self]
        return [leaf for c in self.causes for leaf in c.leaves()]

    def __str__(self):
        if self.pattern is None:
            return f"no match: {self.reason}"
        where = getattr(self.pattern, "origin", "?")
        return f"{where}: no match: {self.pattern!r} met {show(self.expr)}: {self.reason}"

    __repr__ = __str__


NO_REASON = NoMatch(None, None, "unrecorded", "the matcher was made with reasons=False, which records no reason")
"""The failure of every match a ``Matcher(..., reasons=False)`` rejects."""


# -- showing expressions in messages ------------------------------------------------------

def show(e: Any, depth: int = 2) -> str:
    """A short text for an expression: variables by name, calls one or two levels deep."""
    if isinstance(e, str):
        return f"op {e}"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, GlobalVar):
        return f"@{e.name}"
    if isinstance(e, Constant):
        if e.is_scalar:
            return f"{e.value.item()!r}:{e.ty}"
        return f"constant {e.name or ''}: {e.ty}".replace("  ", " ")
    if isinstance(e, Tuple):
        return "(" + ", ".join(show(f, depth - 1) for f in e.fields) + ")"
    if isinstance(e, TupleGetItem):
        return f"{show(e.tuple_value, depth)}[{e.index}]"
    if isinstance(e, Call):
        op = e.op if isinstance(e.op, str) else f"@{e.op.name}"
        if depth <= 0:
            return f"{op}(...)"
        parts = [show(a, depth - 1) for a in e.args] + [f"{k}={v!r}" for k, v in e.attrs.items()]
        return f"{op}({', '.join(parts)})"
    return repr(e)


def attr_equal(a: Any, b: Any) -> bool:
    t = type(a)
    if t is type(b) and (t is int or t is str or t is bool):  # the common case
        return a == b
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(attr_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def expr_equal(a: Expr, b: Expr) -> bool:
    """Structural equality of expressions; variables compare by identity."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, GlobalVar):
        return a.name == b.name
    if isinstance(a, Constant):
        return a.ty == b.ty and np.array_equal(a.value, b.value)
    if isinstance(a, Call):
        return (a.op == b.op and len(a.args) == len(b.args) and set(a.attrs) == set(b.attrs)
                and all(attr_equal(a.attrs[k], b.attrs[k]) for k in a.attrs)
                and all(expr_equal(x, y) for x, y in zip(a.args, b.args)))
    if isinstance(a, Tuple):
        return len(a.fields) == len(b.fields) and all(expr_equal(x, y) for x, y in zip(a.fields, b.fields))
    if isinstance(a, TupleGetItem):
        return a.index == b.index and expr_equal(a.tuple_value, b.tuple_value)
    return False


def _kind_name(e: Any) -> str:
    if isinstance(e, str):
        return "an op"
    if isinstance(e, Var):
        return f"variable {e.name}"
    return {Call: "a call", Constant: "a constant", Tuple: "a tuple", TupleGetItem: "a tuple item",
            GlobalVar: "a function reference"}.get(type(e), type(e).__name__)


def _cacheable(root: n.Pattern) -> set[int]:
    """Ids of the composite nodes of ``root`` whose result can be cached per expression: those
    whose result does not depend on the rest of the match (see :func:`_shared_or_symbolic`)."""
    dependent = _shared_or_symbolic(root)
    return {id(p) for p in root.walk() if type(p) in _CACHED_KINDS and id(p) not in dependent}


def _shared_or_symbolic(root: n.Pattern) -> set[int]:
    """Ids of the nodes whose result depends on the rest of the match (they contain a node
    used twice in ``root``, or a symbolic dimension). The others can be cached per expression."""
    uses: dict[int, int] = {}
    order: list[n.Pattern] = []  # post-order: every node after all of its children

    # iterative (a recursive closure is a reference cycle, left to the cyclic collector per call)
    stack: list[tuple[n.Pattern, bool]] = [(root, False)]
    while stack:
        p, done = stack.pop()
        if done:
            order.append(p)
            continue
        uses[id(p)] = uses.get(id(p), 0) + 1
        if uses[id(p)] == 1:
            stack.append((p, True))
            stack.extend((c, False) for c in reversed(tuple(p.children())))
    dependent: set[int] = set()
    for p in order:
        if uses[id(p)] > 1 or (isinstance(p, n.ShapePattern) and any(d is not None and not isinstance(d, int) for d in p.shape)) \
                or any(id(c) in dependent for c in p.children()):
            dependent.add(id(p))
    return dependent


class Matcher:
    """Matches patterns against expressions of one function (or of none).

    One matcher serves many ``match`` calls: results of context-free sub-patterns are cached
    per (pattern node, expression), so matching every binding against a set of patterns costs
    time linear in the number of bindings.

    ``reasons=False`` is for callers that only ask whether a pattern matches (the rewrite
    driver, FuseOpsByPattern's candidate search): a failure is then the one falsy
    :data:`NO_REASON`, and no failure object is built along the way. Matches are the same.
    """

    def __init__(self, func: Function | None = None, bindings: Iterable[Binding] | None = None, *, reasons: bool = True,
                 var2val: dict | None = None):
        self.reasons = reasons
        if var2val is not None:  # the caller's {var: value} of the bindings (FuseOpsByPattern derives it)
            self.var2val: dict[Var, Expr] = var2val
        else:
            self.var2val = {}
            for b in (func.bindings if func is not None else bindings or ()):
                self.var2val[b.var] = b.value
        self._cache: dict[tuple, Any] = {}
        self._cacheable: dict[int, tuple[n.Pattern, set[int]]] = {}
        self._arg_ops_of: dict[int, tuple] = {}  # id(call pattern) -> (it, its _arg_ops)
        self.memo: dict = {}
        # what the memo and the symbols gained, in order, for rollback: a pattern node (a memo
        # key) or a symbolic dimension's name (a str, a key of ``syms``)
        self.log: list = []
        self.syms: dict[str, Any] = {}
        self.failure: NoMatch | None = None

    # -- public ---------------------------------------------------------------------------
    def match(self, pattern: n.Pattern, expr: Expr) -> Match | NoMatch:
        if not isinstance(pattern, n.Pattern):
            raise n.PatternError(f"match: expected a pattern, got {type(pattern).__name__}")
        entry = self._cacheable.get(id(pattern))
        if entry is None or entry[0] is not pattern:
            entry = self._cacheable[id(pattern)] = (pattern, _cacheable(pattern))
        self.cacheable = entry[1]
        self.memo.clear()
        self.log.clear()
        self.syms.clear()
        self.failure = None
        if self.visit(pattern, expr):
            return Match(dict(self.memo), self.syms)
        return self.failure

    def label(self, e) -> str:
        """``lv1 = exp(x)`` for a bound value, else the expression (for messages)."""
        if not hasattr(self, "_var_of"):
            self._var_of = {id(v): k for k, v in self.var2val.items()}
        var = self._var_of.get(id(e))
        return f"{var.name} = {show(e)}" if var is not None else show(e)

    def unwrap(self, e):
        while isinstance(e, Var):
            value = self.var2val.get(e)
            if value is None:
                break
            e = value
        return e

    # -- machinery ------------------------------------------------------------------------
    def fail(self, p, expr, kind: str, why, *args, causes=()) -> bool:
        """Record a failure; the reason is ``why(*args)``, built only when read."""
        self.failure = NoMatch(p, expr, kind, why, causes, args) if self.reasons else NO_REASON
        return False

    def mark(self) -> int:
        return len(self.log)

    def rollback(self, mark: int) -> None:
        log = self.log
        while len(log) > mark:
            key = log.pop()
            (self.syms if type(key) is str else self.memo).pop(key)

    def remember(self, p, e) -> None:
        self.memo[p] = e
        self.log.append(p)

    def visit(self, p: n.Pattern, raw) -> bool:
        e = raw
        while type(e) is Var:  # look through bindings (the hot path of unwrap)
            value = self.var2val.get(e)
            if value is None:
                break
            e = value
        memo = self.memo
        prev = memo.get(p, _MISSING)
        if prev is not _MISSING:
            if prev is e or (isinstance(e, str) and prev == e):
                return True
            return self.fail(p, raw, "consistency", _why_repeated, self, prev, e)
        kind = type(p)
        if kind is n.WildcardPattern:  # the commonest leaf: matches anything, nothing to cache
            memo[p] = e
            self.log.append(p)
            return True
        if kind is n.CallPattern and type(p.op) is n.OpPattern:
            # the commonest failure, a call of another op (or no call), as _call reports it,
            # without the cache's bookkeeping
            if type(e) is not Call:
                return self.fail(p, raw, "kind", _why_kind, "a call", e)
            if e.op != p.op.name:
                return self.fail(p, raw, "op", _why_op, p.op.name, e.op)
        cacheable = id(p) in self.cacheable
        if cacheable:
            hit = self._cache.get((p, id(e)))
            if hit is not None and hit[0] is e:
                if type(hit[1]) is NoMatch:
                    self.failure = hit[1]
                    return False
                log = self.log
                for q, v in hit[1]:
                    memo[q] = v
                    log.append(q)
                return True
        mark = len(self.log)
        method = _DISPATCH.get(kind)
        if method is None:
            raise n.PatternError(f"cannot match a {type(p).__name__}: not a pattern kind the matcher knows")
        ok = method(self, p, e, raw)
        if ok:
            memo[p] = e
            self.log.append(p)
            if cacheable:
                self._cache[(p, id(e))] = (e, tuple(self.memo_since(mark)))
        else:
            if len(self.log) > mark:
                self.rollback(mark)
            if cacheable:
                self._cache[(p, id(e))] = (e, self.failure)
        return ok

    def memo_since(self, mark: int) -> Iterator[tuple]:
        for key in self.log[mark:]:
            if type(key) is not str:
                yield key, self.memo[key]

    # -- one method per pattern kind --------------------------------------------------------
    def _wildcard(self, p, e, raw):
        return True

    def _op(self, p, e, raw):
        if isinstance(e, str) and e == p.name:
            return True
        return self.fail(p, raw, "op", _why_op, p.name, e)

    def _global_var(self, p, e, raw):
        if not isinstance(e, GlobalVar):
            return self.fail(p, raw, "kind", _why_kind, "a function reference", e)
        if p.name is not None and e.name != p.name:
            return self.fail(p, raw, "name", "expected @{}, found @{} (names compare exactly)".format, p.name, e.name)
        return True

    def _var(self, p, e, raw):
        if isinstance(raw, Var) and raw in self.var2val:
            return self.fail(p, raw, "bound-var", _why_bound, raw, e)
        if not isinstance(e, Var):
            return self.fail(p, raw, "kind", _why_kind, "a variable", e)
        if p.name is not None and e.name != p.name:
            return self.fail(p, raw, "name", "expected variable {}, found {}".format, p.name, e.name)
        return True

    def _const(self, p, e, raw):
        if not isinstance(e, Constant):
            return self.fail(p, raw, "kind", _why_kind, "a constant", e)
        if p.value is not None and not _same_constant(e.value, p.value):
            return self.fail(p, raw, "value", _why_value, p.value, e.value)
        return True

    def _expr(self, p, e, raw):
        if raw is p.expr or e is p.expr or expr_equal(p.expr, e) or expr_equal(p.expr, raw):
            return True
        return self.fail(p, raw, "expr", _why_expr, p.expr, e)

    def _call(self, p: n.CallPattern, e, raw):
        if not isinstance(e, Call):
            return self.fail(p, raw, "kind", _why_kind, "a call", e)
        op = p.op
        if isinstance(op, n.OpPattern):  # fast path of the common case, same result as visit()
            if e.op != op.name:
                return self.fail(p, raw, "op", _why_op, op.name, e.op)
            prev = self.memo.get(op, _MISSING)
            if prev is _MISSING:
                self.memo[op] = e.op
                self.log.append(op)
            elif prev != e.op:
                return self.fail(op, e.op, "consistency", "this op pattern already matched {}".format, prev)
        elif not self.visit(op, e.op):
            return False
        want, got = len(p.args), len(e.args)
        if (got < want) if p.varg_default_wildcard else (got != want):
            return self.fail(p, raw, "arity", _why_arity, p.varg_default_wildcard, want, got)
        if p.attrs and not self.check_attrs(p, e, raw, p.attrs):
            return False
        mark = len(self.log)
        commutative = e.op in COMMUTATIVE_OPS and want == 2 and got == 2
        ops = None
        if not self.reasons:
            # only the verdict is asked for: an order of the arguments in which some argument
            # cannot be what its pattern's root must call is not tried at all
            hit = self._arg_ops_of.get(id(p))
            ops = hit[1] if hit is not None and hit[0] is p else self._arg_ops(p)
        straight = ops is None or self._could_match(ops, e.args)
        if straight:
            for q, a in zip(p.args, e.args):
                if not self.visit(q, a):
                    break
            else:
                return True
        if commutative and (ops is None or self._could_match(ops, (e.args[1], e.args[0]))):
            first = self.failure if straight else NO_REASON
            if len(self.log) > mark:
                self.rollback(mark)
            if self.visit(p.args[0], e.args[1]) and self.visit(p.args[1], e.args[0]):
                return True
            self.failure = first  # report the failure of the arguments as written
        elif ops is not None:
            self.failure = NO_REASON
        return False

    def _arg_ops(self, p: n.CallPattern) -> tuple | None:
        """Per argument of ``p``, the ops its pattern's root must call (None: anything may
        match it); None when no argument says. (Remembered per pattern node.)"""
        ops = tuple(n.root_ops(q) for q in p.args)
        if all(o is None for o in ops):
            ops = None
        self._arg_ops_of[id(p)] = (p, ops)
        return ops

    def _could_match(self, ops: tuple, args) -> bool:
        """Whether each argument (looked through) calls an op its pattern's root may call: a
        necessary condition of matching, checked without visiting anything."""
        var2val = self.var2val
        for want, a in zip(ops, args):
            if want is None:
                continue
            while type(a) is Var:
                value = var2val.get(a)
                if value is None:
                    break
                a = value
            if type(a) is not Call or a.op not in want:
                return False
        return True

    def check_attrs(self, p, e, raw, constraints) -> bool:
        if not isinstance(e, Call):
            return self.fail(p, raw, "attribute", _why_no_attrs, e)
        for key, want in constraints.items():
            if key not in e.attrs:
                return self.fail(p, raw, "attribute", _why_missing_attr, e.op, key)
            got = e.attrs[key]
            if not attr_equal(want, got):
                return self.fail(p, raw, "attribute", "attribute {}: expected {!r}, found {!r}".format, key, want, got)
        return True

    def _attr(self, p, e, raw):
        return self.visit(p.inner, raw) and self.check_attrs(p, e, raw, p.attrs)

    def _tuple(self, p: n.TuplePattern, e, raw):
        if not isinstance(e, Tuple):
            return self.fail(p, raw, "kind", _why_kind, "a tuple", e)
        if len(e.fields) != len(p.fields):
            return self.fail(p, raw, "arity", "expected a tuple of {}, found {} fields".format, len(p.fields), len(e.fields))
        if not p.unordered:
            return all(self.visit(q, f) for q, f in zip(p.fields, e.fields))
        if self._permute(p.fields, list(e.fields), 0, [False] * len(e.fields)):
            return True
        return self.fail(p, raw, "unordered", "no assignment of the tuple's fields to the patterns matches",
                         causes=(self.failure,) if self.failure is not None else ())

    def _permute(self, pats, fields, i, used) -> bool:
        if i == len(pats):
            return True
        for j, f in enumerate(fields):
            if used[j]:
                continue
            mark = self.mark()
            if self.visit(pats[i], f):
                used[j] = True
                if self._permute(pats, fields, i + 1, used):
                    return True
                used[j] = False
            self.rollback(mark)
        return False

    def _item(self, p: n.TupleGetItemPattern, e, raw):
        if not isinstance(e, TupleGetItem):
            return self.fail(p, raw, "kind", _why_kind, "a tuple item", e)
        if p.index is not None:
            size = len(e.tuple_value.ty.fields)
            if e.index % size != p.index % size:
                return self.fail(p, raw, "index", "expected item {}, found item {}".format, p.index, e.index)
        return self.visit(p.tuple, e.tuple_value)

    def _tensor_type(self, p, e, raw, what: str):
        ty = None if isinstance(e, (str, GlobalVar)) else getattr(e, "ty", None)
        if isinstance(ty, TensorType):
            return ty
        self.fail(p, raw, what, _why_not_tensor, what, e)
        return None

    def _dtype(self, p: n.DTypePattern, e, raw):
        ty = self._tensor_type(p, e, raw, "dtype")
        if ty is None:
            return False
        if ty.dtype != p.dtype:
            return self.fail(p, raw, "dtype", _why_dtype, p.dtype, e, ty)
        return self.visit(p.inner, raw)

    def _shape(self, p: n.ShapePattern, e, raw):
        ty = self._tensor_type(p, e, raw, "shape")
        if ty is None:
            return False
        if ty.ndim != len(p.shape):
            return self.fail(p, raw, "shape", "expected rank {}, found {} of rank {}".format, len(p.shape), ty, ty.ndim)
        mark = self.mark()
        # names first, then expressions ("n * 4"), which compare once their names are bound
        order = sorted(range(len(p.shape)), key=lambda a: isinstance(p.shape[a], DimExpr))
        for axis, want, got in ((a, p.shape[a], ty.shape[a]) for a in order):
            if want is None:
                continue
            if isinstance(want, DimExpr):
                if not self._dim_expr(want, got):
                    self.rollback(mark)
                    return self.fail(p, raw, "shape", _why_shape, p.shape, ty, axis, got, want)
                continue
            if isinstance(want, int):
                if want != got:
                    self.rollback(mark)
                    return self.fail(p, raw, "shape", _why_shape, p.shape, ty, axis, got, want)
                continue
            bound = self.syms.get(want, _MISSING)
            if bound is _MISSING:
                self.syms[want] = got
                self.log.append(want)
            elif bound != got:
                self.rollback(mark)
                return self.fail(p, raw, "consistency",
                                 "symbolic dimension '{}' is already bound to {}, but dimension {} of {} is {}".format,
                                 want, bound, axis, ty, got)
        return self.visit(p.inner, raw)

    def _dim_expr(self, want, got) -> bool:
        """Whether the pattern's expression ``want`` is the graph's dim ``got``, binding the one
        name it may leave unbound where ``want`` is linear in it (``n * 4`` against ``b * 64``
        binds n to ``b * 16``)."""
        bound = {s: self.syms[s] for s in free_symbols(want) if s in self.syms}
        unknown = sorted(free_symbols(want) - bound.keys())
        if not unknown:
            return provably_equal(substitute(want, bound), got)
        if len(unknown) != 1:
            return False
        s = unknown[0]  # renamed apart: the graph's dims may use the pattern's names
        known = substitute(want, {**bound, s: _UNKNOWN})
        offset = substitute(known, {_UNKNOWN: 0})
        scale = sub(substitute(known, {_UNKNOWN: 1}), offset)
        if type(scale) is not int or scale == 0:
            return False
        value = floordiv(sub(got, offset), scale)
        if not provably_equal(substitute(known, {_UNKNOWN: value}), got):
            return False
        self.syms[s] = value
        self.log.append(s)
        return True

    # (a failed visit has rolled back what it added itself: the rollbacks below are guards)
    def _or(self, p: n.OrPattern, e, raw):
        mark = len(self.log)
        if self.visit(p.left, raw):
            return True
        first = self.failure
        if len(self.log) > mark:
            self.rollback(mark)
        if self.visit(p.right, raw):
            return True
        if not self.reasons:
            self.failure = NO_REASON
            return False
        return self.fail(p, raw, "alternatives", "no alternative matches", causes=(first, self.failure))

    def _optional(self, p: n.OptionalPattern, e, raw):
        mark = len(self.log)
        if self.visit(p.outer, raw):
            return True
        if len(self.log) > mark:
            self.rollback(mark)
        return self.visit(p.inner, raw)

    def _and(self, p: n.AndPattern, e, raw):
        return self.visit(p.left, raw) and self.visit(p.right, raw)

    def _not(self, p: n.NotPattern, e, raw):
        mark = self.mark()
        ok = self.visit(p.inner, raw)
        self.rollback(mark)
        if ok:
            return self.fail(p, raw, "not", "{} matches {!r}, which is excluded".format, show(e), p.inner)
        return True


# -- failure reasons, formatted only when read ---------------------------------------------------

def _why_repeated(matcher, prev, e) -> str:
    return (f"this pattern object is used more than once; it already matched {matcher.label(prev)}, "
            f"and here meets {matcher.label(e)}, a different value (a repeated pattern must bind the same value)")


def _why_op(want, found) -> str:
    return f"expected op {want}, found {_op_text(found)}"


def _why_kind(want, e) -> str:
    return f"expected {want}, found {_kind_name(e)}"


def _why_bound(var, value) -> str:
    return f"{var.name} is bound in the function (= {show(value)}); is_var matches only unbound variables such as parameters"


def _why_value(want, got) -> str:
    return f"expected the constant {want.tolist()!r}, found {got.tolist()!r}"


def _why_expr(want, e) -> str:
    return f"expected the expression {show(want)}, found {show(e)}"


def _why_arity(at_least, want, got) -> str:
    return f"expected {'at least ' if at_least else ''}{want} argument{'s' if want != 1 else ''}, found {got}"


def _why_no_attrs(e) -> str:
    return f"attributes are asked of {_kind_name(e)}, which has none"


def _why_missing_attr(op, key) -> str:
    return f"{_op_text(op)} has no attribute '{key}'"


def _why_not_tensor(what, e) -> str:
    return f"a {what} is asked of {_kind_name(e)}, which is not a tensor"


def _why_dtype(want, e, ty) -> str:
    return f"expected dtype {want}, found {ty.dtype} ({show(e, 0)}: {ty})"


_UNKNOWN = "__dpl_pattern_unknown"  # no frontend or parser names a dim so


def _why_shape(shape, ty, axis, got, want) -> str:
    return f"expected shape {_dims(shape)}, found {ty}: dimension {axis} is {got}, not {want}"


def _op_text(op) -> str:
    if isinstance(op, str):
        return op
    if isinstance(op, GlobalVar):
        return f"@{op.name}"
    return _kind_name(op)


def _same_constant(value: np.ndarray, wanted: np.ndarray) -> bool:
    """A constant equals a pattern's value when they agree in the constant's own dtype:
    ``is_const(0.7071067811865476)`` matches the f32 constant 0.70710677. A fractional
    value never matches an integer constant."""
    if value.shape != wanted.shape:
        return False
    if value.ndim == 0 and value.dtype.kind == "f" and wanted.dtype.kind in "fiub":  # the common case, without array_equal
        with np.errstate(all="ignore"):
            v, w = value[()], wanted.astype(value.dtype)[()]
        return bool(v == w) or bool(v != v and w != w)
    if value.dtype.kind in "iub" and wanted.dtype.kind == "f" and not np.all(wanted == np.round(wanted)):
        return False
    with np.errstate(all="ignore"):
        return bool(np.array_equal(value, wanted.astype(value.dtype), equal_nan=dtypes.is_float_numpy(value.dtype)))


def _dims(shape) -> str:
    return "[" + ", ".join("_" if d is None else str(d) for d in shape) + "]"


# leaves are cheaper to match again than to look up; composite patterns are cached
_CACHED_KINDS = frozenset({n.CallPattern, n.TuplePattern, n.TupleGetItemPattern, n.OrPattern, n.AndPattern,
                           n.NotPattern, n.OptionalPattern, n.AttrPattern, n.DTypePattern, n.ShapePattern})

_DISPATCH = {
    n.WildcardPattern: Matcher._wildcard,
    n.OpPattern: Matcher._op,
    n.GlobalVarPattern: Matcher._global_var,
    n.VarPattern: Matcher._var,
    n.ConstantPattern: Matcher._const,
    n.ExprPattern: Matcher._expr,
    n.CallPattern: Matcher._call,
    n.AttrPattern: Matcher._attr,
    n.TuplePattern: Matcher._tuple,
    n.TupleGetItemPattern: Matcher._item,
    n.DTypePattern: Matcher._dtype,
    n.ShapePattern: Matcher._shape,
    n.OrPattern: Matcher._or,
    n.OptionalPattern: Matcher._optional,
    n.AndPattern: Matcher._and,
    n.NotPattern: Matcher._not,
}


def match(pattern: n.Pattern, expr: Expr, func: Function | None = None) -> Match | NoMatch:
    """Match ``pattern`` against ``expr``, looking through the bindings of ``func``."""
    return Matcher(func).match(pattern, expr)


class PatternIndex:
    """Patterns indexed by the op their root must call: a binding only tries the patterns
    that could apply to it."""

    def __init__(self, patterns: Iterable[n.Pattern]):
        self.patterns = tuple(patterns)
        self.by_op: dict[str, list[tuple[int, n.Pattern]]] = {}
        self.anywhere: list[tuple[int, n.Pattern]] = []
        for i, p in enumerate(self.patterns):
            ops = n.root_ops(p)
            if ops is None:
                self.anywhere.append((i, p))
            else:
                for op in ops:
                    self.by_op.setdefault(op, []).append((i, p))

    def candidates(self, value: Expr) -> list[n.Pattern]:
        """The patterns that may match ``value``, in the order they were given."""
        specific = self.by_op.get(value.op, ()) if isinstance(value, Call) and isinstance(value.op, str) else ()
        if not self.anywhere:
            return [p for _, p in specific]
        if not specific:
            return [p for _, p in self.anywhere]
        return [p for _, p in sorted([*specific, *self.anywhere], key=lambda ip: ip[0])]


def match_bindings(patterns: Iterable[n.Pattern], func: Function) -> list[tuple[Binding, n.Pattern, Match]]:
    """Every (binding, pattern, match) of ``func``, bindings in order, patterns in the order
    given. Linear in the number of bindings (patterns indexed by root op, results cached)."""
    index = patterns if isinstance(patterns, PatternIndex) else PatternIndex(patterns)
    matcher = Matcher(func)
    found = []
    for b in func.bindings:
        for p in index.candidates(b.value):
            m = matcher.match(p, b.value)
            if m:
                found.append((b, p, m))
    return found
