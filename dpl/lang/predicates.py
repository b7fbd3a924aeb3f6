"""The ``where`` language: a small, safe predicate language over a match.

It can read what a match bound — ranks, shapes, dtypes, constant values, call attributes,
uses — and compare, combine and do integer arithmetic. It cannot call anything else, so a
pattern file never runs code. Predicates compile to closures over a :class:`MatchView`.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

import numpy as np

from dpl import dtypes
from dpl.errors import DplError, Span
from dpl.ir.expr import Call, Constant, Expr, Var
from dpl.ir.types import TensorType
from dpl.lang import ast
from dpl.limits import MAX_WHERE_LIST, LimitError


class WhereError(DplError):
    """A ``where`` clause is malformed (unknown function, wrong arity, undefined name)."""


class _Unknown(Exception):
    """A predicate could not be evaluated on this match (e.g. value() of a non-constant)."""


class MatchView:
    """What a predicate sees: the expression each pattern name matched and, when the caller
    knows the function, who uses each value (``users(expr)`` -> binding vars)."""

    def __init__(self, exprs: Mapping[str, Expr], users: Callable[[Expr], list] | None = None,
                 users_from: Callable[[], Callable[[Expr], list]] | None = None):
        """``users_from()`` makes ``users`` when a predicate first asks (most never do)."""
        self.exprs = exprs
        self._users = users
        self._users_from = users_from

    def expr(self, name: str) -> Expr:
        if name not in self.exprs:
            raise _Unknown(f"'{name}' is not part of this match")
        return self.exprs[name]

    def users(self, e: Expr) -> list:
        """The values of the bindings that use ``e`` (the function's return is not a use)."""
        if self._users is None and self._users_from is not None:
            self._users = self._users_from()
        if self._users is None:
            raise _Unknown("uses are not known here (only fusion patterns see the function's uses)")
        return self._users(e)


def _tensor(e: Expr, fn: str) -> TensorType:
    if not isinstance(e.ty, TensorType):
        raise _Unknown(f"{fn}() of a value of type {e.ty}")
    return e.ty


def _value(e: Expr) -> Any:
    if not isinstance(e, Constant):
        raise _Unknown("value() of a value that is not a constant")
    if e.value.ndim != 0:
        raise _Unknown("value() of a constant that is not a scalar")
    return e.value.item()


def _attr(e: Expr, key: str) -> Any:
    if not isinstance(e, Call):
        raise _Unknown("attr() of a value that is not a call")
    if key not in e.attrs:
        raise _Unknown(f"the call has no attribute '{key}'")
    return e.attrs[key]


def _only_used_by(view: MatchView, a: Expr, b: Expr) -> bool:
    users = view.users(a)
    return len(users) == 1 and users[0] is b


def _used_by(view: MatchView, a: Expr, b: Expr) -> bool:
    return any(u is b for u in view.users(a))


# name -> (number of arguments, which arguments are pattern names, implementation)
FUNCTIONS: dict[str, tuple[int, tuple[bool, ...], Callable]] = {
    "rank": (1, (True,), lambda view, e: _tensor(e, "rank").ndim),
    "shape": (1, (True,), lambda view, e: _tensor(e, "shape").shape),
    "dtype": (1, (True,), lambda view, e: _tensor(e, "dtype").dtype),
    "is_const": (1, (True,), lambda view, e: isinstance(e, Constant)),
    "value": (1, (True,), lambda view, e: _value(e)),
    "attr": (2, (True, False), lambda view, e, key: _attr(e, key)),
    "only_used_by": (2, (True, True), _only_used_by),
    "used_by": (2, (True, True), _used_by),
    "len": (1, (False,), lambda view, v: len(v)),
}

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "==": lambda a, b: _norm(a) == _norm(b),
    "!=": lambda a, b: _norm(a) != _norm(b),
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "+": lambda a, b: operator.add(*_sized(a, b, "+")), "-": operator.sub,
    "*": lambda a, b: operator.mul(*_sized(a, b, "*")), "/": operator.truediv, "%": operator.mod,
    "in": lambda a, b: _norm(a) in [_norm(x) for x in b],
    "not in": lambda a, b: _norm(a) not in [_norm(x) for x in b],
}


def _result_size(a: Any, b: Any, op: str) -> int:
    """Items of the list or string ``a op b`` would build (0 for numbers), before building it."""
    seqs = (list, tuple, str)
    if op == "*" and isinstance(a, int) and isinstance(b, seqs):
        a, b = b, a
    if op == "*" and isinstance(a, seqs) and isinstance(b, int) and not isinstance(b, bool):
        return len(a) * max(b, 0)
    if op == "+" and isinstance(a, seqs) and isinstance(b, seqs):
        return len(a) + len(b)
    return 0


def _sized(a: Any, b: Any, op: str) -> tuple[Any, Any]:
    n = _result_size(a, b, op)
    if n > MAX_WHERE_LIST:
        raise _Unknown(f"the list would have {n} items; the limit is MAX_WHERE_LIST = {MAX_WHERE_LIST}")
    return a, b


def _norm(v: Any) -> Any:
    t = type(v)
    if t is int or t is str or t is bool or t is float:  # the common case: already plain
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


Compiled = Callable[[MatchView], Any]


class PredicateCompiler:
    """Compile predicate syntax to closures; names are the pattern's names or dtype names."""

    def __init__(self, names: set[str], errors: list[DplError]):
        self.names = names
        self.errors = errors

    def error(self, message: str, span: Span, hint: str | None = None) -> Compiled:
        self.errors.append(WhereError(message, span, hint))
        return lambda view: None

    def compile(self, p: ast.Pred, as_name: bool = False) -> Compiled:
        if isinstance(p, ast.PLiteral):
            value = p.value
            return lambda view: value
        if isinstance(p, ast.PList):
            items = [self.compile(i) for i in p.items]
            return lambda view: [f(view) for f in items]
        if isinstance(p, ast.PName):
            return self._name(p, as_name)
        if isinstance(p, ast.PIndex):
            base, index = self.compile(p.base), p.index

            def at(view):
                seq = base(view)
                if not -len(seq) <= index < len(seq):
                    raise _Unknown(f"index {index} out of range for {len(seq)} items")
                return seq[index]

            return at
        if isinstance(p, ast.PNot):
            inner = self.compile(p.operand)
            return lambda view: not inner(view)
        if isinstance(p, ast.PBinary):
            return self._binary(p)
        if isinstance(p, ast.PCall):
            return self._call(p)
        raise AssertionError(p)

    def _name(self, p: ast.PName, as_name: bool) -> Compiled:
        name = p.name
        if as_name or name in self.names:
            if name not in self.names:
                return self.error(f"undefined name '{name}' in where clause", p.span)
            return lambda view: view.expr(name)
        try:
            dtype = dtypes.canonical(name)
        except DplError:
            return self.error(f"undefined name '{name}' in where clause", p.span,
                              hint="names in a where clause are the pattern's names or dtypes such as f32")
        return lambda view: dtype

    def _binary(self, p: ast.PBinary) -> Compiled:
        left, right = self.compile(p.left), self.compile(p.right)
        if p.op == "and":
            return lambda view: bool(left(view)) and bool(right(view))
        if p.op == "or":
            return lambda view: bool(left(view)) or bool(right(view))
        fn = _BINARY[p.op]
        static = (_static(p.left), _static(p.right))
        if None not in static and _result_size(*static, p.op) > MAX_WHERE_LIST:
            self.errors.append(LimitError(f"this list would have {_result_size(*static, p.op)} items; the limit is "
                                          f"MAX_WHERE_LIST = {MAX_WHERE_LIST}", p.span))
            return lambda view: None
        return lambda view: fn(left(view), right(view))

    def _call(self, p: ast.PCall) -> Compiled:
        if p.fn not in FUNCTIONS:
            known = ", ".join(sorted(FUNCTIONS))
            return self.error(f"unknown function '{p.fn}' in where clause", p.span, hint=f"the where language has: {known}")
        arity, name_args, impl = FUNCTIONS[p.fn]
        if len(p.args) != arity:
            return self.error(f"'{p.fn}' takes {arity} argument{'s' if arity != 1 else ''}, got {len(p.args)}", p.span)
        args = []
        for arg, is_name in zip(p.args, name_args):
            if is_name and not isinstance(arg, ast.PName):
                return self.error(f"argument of '{p.fn}' must be a pattern name", p.span)
            args.append(self.compile(arg, as_name=is_name))
        if len(args) == 1:  # rank(x), dtype(x), is_const(x): without a generator per call
            (only,) = args
            return lambda view: impl(view, only(view))
        return lambda view: impl(view, *(a(view) for a in args))


def _static(p: ast.Pred) -> Any:
    """The value of a literal or a list of literals (what the compiler can size), else None."""
    if isinstance(p, ast.PLiteral):
        return p.value
    if isinstance(p, ast.PList) and all(isinstance(i, ast.PLiteral) for i in p.items):
        return [i.value for i in p.items]
    return None


def conjuncts(p: ast.Pred) -> list[ast.Pred]:
    """The conjuncts of a where clause (``a and b and c`` -> a, b, c), each checked and
    reported on its own."""
    if isinstance(p, ast.PBinary) and p.op == "and":
        return conjuncts(p.left) + conjuncts(p.right)
    return [p]


def show_pred(p: ast.Pred) -> str:
    """A predicate as written (normalised spacing)."""
    if isinstance(p, ast.PName):
        return p.name
    if isinstance(p, ast.PLiteral):
        return {True: "true", False: "false"}.get(p.value, repr(p.value)) if isinstance(p.value, bool) else repr(p.value)
    if isinstance(p, ast.PList):
        return "[" + ", ".join(show_pred(i) for i in p.items) + "]"
    if isinstance(p, ast.PCall):
        return f"{p.fn}({', '.join(show_pred(a) for a in p.args)})"
    if isinstance(p, ast.PIndex):
        return f"{show_pred(p.base)}[{p.index}]"
    if isinstance(p, ast.PNot):
        return f"not {show_pred(p.operand)}"
    if isinstance(p, ast.PBinary):
        return f"{show_pred(p.left)} {p.op} {show_pred(p.right)}"
    raise AssertionError(p)


def _operands(p: ast.Pred) -> list[ast.Pred]:
    """The parts of a conjunct whose values explain why it failed (literals say nothing)."""
    if isinstance(p, ast.PNot):
        return _operands(p.operand)
    if isinstance(p, ast.PBinary):
        if p.op in ("and", "or"):
            return _operands(p.left) + _operands(p.right)
        return [q for q in (p.left, p.right) if not isinstance(q, (ast.PLiteral, ast.PList))]
    if isinstance(p, ast.PCall):
        return [p] + [a for a in p.args if isinstance(a, ast.PName)]
    return [p]


def _fmt(value: Any) -> str:
    if isinstance(value, Var):
        return f"variable {value.name}: {value.ty}"
    if isinstance(value, (Constant, Call)):
        from dpl.pattern.match import show

        return show(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(_norm(value))


def compile_conjunct(compiler: "PredicateCompiler", p: ast.Pred) -> Compiled:
    """``p`` compiled, carrying ``text`` (the conjunct as written) and ``values(view)`` (the
    values of its parts on a match: ``rank(w) = 2``), for the report when it fails."""
    whole = compiler.compile(p)
    quiet = PredicateCompiler(compiler.names, [])  # the parts' errors are the whole's, reported once
    parts = []
    for q in _operands(p):
        text = show_pred(q)
        if all(text != t for t, _ in parts) and not (isinstance(q, ast.PName) and q.name not in compiler.names):
            parts.append((text, quiet.compile(q)))

    def values(view: MatchView) -> str:
        out = []
        for text, part in parts:
            try:
                out.append(f"{text} = {_fmt(part(view))}")
            except Exception:  # a part that cannot be evaluated on this match
                out.append(f"{text} = ?")
        return ", ".join(out)

    def check(view):
        return whole(view)

    check.text = show_pred(p)  # type: ignore[attr-defined]
    check.values = values  # type: ignore[attr-defined]
    return check


def evaluate(pred: Compiled, view: MatchView) -> tuple[bool, str | None]:
    """(holds, why not) — a predicate that cannot be evaluated on this match does not hold."""
    try:
        return bool(pred(view)), None
    except _Unknown as why:
        return False, str(why)
    except (TypeError, ZeroDivisionError) as why:
        return False, f"cannot evaluate: {why}"
