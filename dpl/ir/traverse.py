"""Walking expressions: the leaves a value reads, and a value with its leaves replaced (one
definition of each for every pass)."""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence, Union

from dpl.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var, with_args


def leaves(e: Expr) -> Iterator[Var | Constant]:
    """The variables and constants an expression reads, left to right (repeats included)."""
    if isinstance(e, (Var, Constant)):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from leaves(a)
    elif isinstance(e, Tuple):
        for f in e.fields:
            yield from leaves(f)
    elif isinstance(e, TupleGetItem):
        yield from leaves(e.tuple_value)


def read_leaves(value) -> Sequence:
    """The leaves ``value`` reads (as :func:`leaves`), without a generator for the common case
    of a call whose arguments are all variables and constants."""
    if type(value) is Call:
        args = value.args
        for a in args:
            t = type(a)
            if t is not Var and t is not Constant:
                return tuple(leaves(value))
        return args
    return tuple(leaves(value))


def vars_in(e: Expr) -> Iterator[Var]:
    """The variables an expression reads, left to right (repeats included)."""
    return (x for x in leaves(e) if isinstance(x, Var))


def substitute(e: Expr, replace: Union[Mapping[int, Expr], Callable[[Expr], Expr]]) -> Expr:
    """``e`` with each leaf (variable or constant) replaced: ``replace`` maps ``id(leaf)`` to
    its replacement, or is a function of the leaf. Untouched subtrees are shared."""
    if not callable(replace):
        table = replace
        replace = lambda leaf: table.get(id(leaf), leaf)  # noqa: E731
    return _substitute(e, replace)


def _substitute(e: Expr, replace: Callable[[Expr], Expr]) -> Expr:
    if isinstance(e, (Var, Constant)):
        return replace(e)
    if isinstance(e, Call):
        args = tuple(_substitute(a, replace) for a in e.args)
        return e if all(x is y for x, y in zip(args, e.args)) else with_args(e, args)
    if isinstance(e, Tuple):
        fields = tuple(_substitute(f, replace) for f in e.fields)
        return e if all(x is y for x, y in zip(fields, e.fields)) else Tuple(fields)
    if isinstance(e, TupleGetItem):
        inner = _substitute(e.tuple_value, replace)
        return e if inner is e.tuple_value else TupleGetItem(inner, e.index)
    return e
