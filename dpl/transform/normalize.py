"""A-normal form: every call's operands are variables, constants or tuples of them.

The text form and the builder accept nested calls (``b = add(exp(a), 1.0)``), but the graph
FuseOps partitions has one node per binding: a nested call would travel inside its user's node
with the user's op kind, and an opaque op could end up inside a fused group. TVM never sees
such a graph, because Relax's BlockBuilder normalizes every nested call into a binding of its
own; this pass does the same before the fusion passes, naming each new binding after the one
it came out of (``b_0``, ``b_1``, ...). A function already in this form is returned as is.
"""

from __future__ import annotations

import attrs

from dpl.ir.expr import Binding, Call, Constant, Function, GlobalVar, Module, Tuple, TupleGetItem, Var


def normalize(mod: Module) -> Module:
    """``mod`` with every function in A-normal form (the input is not changed)."""
    functions = {name: normalize_function(fn) for name, fn in mod.functions.items()}
    if all(functions[name] is fn for name, fn in mod.functions.items()):
        return mod
    return Module(functions)


def normalize_function(func: Function) -> Function:
    """``func`` with each nested call, and each tuple item used as an operand, bound to a
    variable of its own just before the binding that uses it."""
    if _is_flat(func):
        return func
    taken = {p.name for p in func.params} | {b.var.name for b in func.bindings}
    out: list[Binding] = []

    def fresh(base: str) -> str:
        i = 0
        while f"{base}_{i}" in taken:
            i += 1
        taken.add(f"{base}_{i}")
        return f"{base}_{i}"

    def operand(e, owner: str):
        """``e`` as an operand: a leaf or a tuple of operands; anything else is bound first."""
        if isinstance(e, (Var, Constant, GlobalVar)):
            return e
        if isinstance(e, Tuple):
            fields = tuple(operand(f, owner) for f in e.fields)
            return e if all(x is y for x, y in zip(fields, e.fields)) else Tuple(fields)
        inner = value(e, owner)  # its own operands first: bindings are numbered in order
        var = Var(fresh(owner), e.ty)
        out.append(Binding(var, inner))
        return var

    def value(e, owner: str):
        """``e`` as the value of a binding: its own operands normalized."""
        if isinstance(e, Call):
            args = tuple(operand(a, owner) for a in e.args)
            return e if all(x is y for x, y in zip(args, e.args)) else attrs.evolve(e, args=args)
        if isinstance(e, TupleGetItem):
            inner = operand(e.tuple_value, owner)
            return e if inner is e.tuple_value else TupleGetItem(inner, e.index)
        return operand(e, owner)

    for b in func.bindings:
        new = value(b.value, b.var.name)
        out.append(b if new is b.value else Binding(b.var, new))
    ret = operand(func.ret, "ret")
    return attrs.evolve(func, bindings=tuple(out), ret=ret)


def _is_flat(func: Function) -> bool:
    """Whether ``func`` is normal already (the common case, a call of leaves, read inline)."""
    for b in func.bindings:
        value = b.value
        if type(value) is Call:
            for a in value.args:
                t = type(a)
                if t is not Var and t is not Constant and t is not GlobalVar and not (t is Tuple and _leaf_or_tuple(a)):
                    return False
        elif not _flat(value, top=True):
            return False
    return _leaf_or_tuple(func.ret)


def _leaf_or_tuple(e) -> bool:
    if isinstance(e, Tuple):
        return all(_leaf_or_tuple(f) for f in e.fields)
    return isinstance(e, (Var, Constant, GlobalVar))


def _flat(e, top: bool = False) -> bool:
    if isinstance(e, Call):
        return top and all(_leaf_or_tuple(a) for a in e.args)
    if isinstance(e, TupleGetItem):
        return top and isinstance(e.tuple_value, (Var, Constant))
    return _leaf_or_tuple(e)
