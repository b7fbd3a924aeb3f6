"""Use lists of a function's values (who consumes each var), for ``only_used_by``."""

from __future__ import annotations

from dpl.ir.expr import Call, Expr, Function, Tuple, TupleGetItem, Var


def vars_in(e: Expr):
    if isinstance(e, Var):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from vars_in(a)
    elif isinstance(e, Tuple):
        for f in e.fields:
            yield from vars_in(f)
    elif isinstance(e, TupleGetItem):
        yield from vars_in(e.tuple_value)


def users_of(func: Function) -> dict[int, list[Var]]:
    """id(var) -> binding vars whose value uses it (the return is not a use, as in TVM)."""
    users: dict[int, list[Var]] = {}
    for b in func.bindings:
        for v in vars_in(b.value):
            lst = users.setdefault(id(v), [])
            if not lst or lst[-1] is not b.var:
                lst.append(b.var)
    return users
