"""Walking expressions: the leaves a value reads (one definition for every pass)."""

from __future__ import annotations

from typing import Iterator

from dpl.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var


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


def vars_in(e: Expr) -> Iterator[Var]:
    """The variables an expression reads, left to right (repeats included)."""
    return (x for x in leaves(e) if isinstance(x, Var))
