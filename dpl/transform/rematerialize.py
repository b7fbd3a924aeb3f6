"""Cheap sources computed where they are read (beyond TVM, opt-in): an op that reads no tensor
(``arange``, ``full``; scalar constants at most) and that several bindings read is copied once
per reader, so each copy can join its reader's group as an index expression.

FuseOps fuses a node only into its post-dominator. T5's ``arange(seq)`` is read by the
relative-position-bucket group and by the mask group; it has no post-dominator and runs as a
kernel of its own, whose result both groups read back. A copy in each group costs an index
computation where it is read (XLA duplicates its iotas and broadcasts into their consumers
the same way). :func:`copy_sources` makes the copies; ``fuse_ops(..., rematerialize=True)``
keeps them only when every copy ends up inside a group, else the function is grouped as it was.
"""

from __future__ import annotations

import attrs

from dpl.ir.expr import Binding, Call, Constant, Function, Var
from dpl.ir.traverse import leaves, substitute
from dpl.ops.registry import OpPatternKind, op_kind


def _reads_no_tensor(value) -> bool:
    """A call of an op whose leaves are all scalar constants (the first test of a source; a
    binding reading a variable, nearly every one, fails at that argument)."""
    if type(value) is not Call or type(value.op) is not str:
        return False
    for a in value.args:
        if type(a) is Var:
            return False
    return all(isinstance(leaf, Constant) and leaf.value.ndim == 0 for leaf in leaves(value))


def copy_sources(func: Function) -> tuple[Function, list[list[int]]]:
    """``func`` with each cheap source read by two or more bindings copied once per reader, and
    the binding indices of each source's copies (``func`` itself and ``[]`` when there is none).
    The readers are indexed only when some binding reads no tensor (most functions have none)."""
    bindings = func.bindings
    maybe = [i for i, b in enumerate(bindings) if _reads_no_tensor(b.value)]
    if not maybe:
        return func, []
    returned = {id(v) for v in leaves(func.ret)}
    readers: dict[int, list[int]] = {}
    for i, b in enumerate(bindings):
        for key in {id(leaf) for leaf in leaves(b.value)}:
            readers.setdefault(key, []).append(i)
    sources = {i for i in maybe if id(bindings[i].var) not in returned and len(readers.get(id(bindings[i].var), ())) > 1
               and op_kind(bindings[i].value) <= OpPatternKind.INJECTIVE}
    if not sources:
        return func, []
    taken = {p.name for p in func.params} | {b.var.name for b in func.bindings}
    table: dict[int, dict[int, Var]] = {}  # reader binding -> {id(source var): its copy}
    out: list[Binding] = []
    copies: list[list[int]] = []
    for i, b in enumerate(func.bindings):
        if i not in sources:
            value = b.value if i not in table else substitute(b.value, table[i])
            out.append(b if value is b.value else Binding(b.var, value))
            continue
        indices = []
        for k, reader in enumerate(readers[id(b.var)]):
            name = next(n for n in (f"{b.var.name}_{j}" for j in range(k, k + len(taken) + 1)) if n not in taken)
            taken.add(name)
            copy = Var(name, b.var.ty)
            table.setdefault(reader, {})[id(b.var)] = copy
            indices.append(len(out))
            out.append(Binding(copy, b.value))
        copies.append(indices)
    return attrs.evolve(func, bindings=tuple(out)), copies
