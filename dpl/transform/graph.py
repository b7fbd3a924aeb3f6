"""TVM's IndexedForwardGraph over one function: the dataflow graph FuseOps partitions.

Nodes come in topological order: the parameters, then for each binding the constants it meets
for the first time and the binding itself. Parameters and the values the function returns are
``extern_ref`` (used from outside). Each edge carries its *consumer's* op-pattern kind, as in
Relax (no per-edge refinement); tuple arguments are flattened into one edge per field.
"""

from __future__ import annotations

import attrs

from dpl.ir.expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from dpl.ir.traverse import read_leaves
from dpl.ops.registry import OpPatternKind, op_kind


@attrs.define(eq=False)
class Node:
    index: int
    ref: Var | Constant
    pattern: OpPatternKind
    extern_ref: bool
    binding: int | None  # index into func.bindings, None for params and constants
    outputs: list[tuple["Node", OpPatternKind]] = attrs.field(factory=list)


# ops that move no data: a row-major tensor reinterpreted with another shape (dpl's tensors are
# contiguous, so every reshape is one), an axis of 1 dropped or added
VIEW_OPS = frozenset({"reshape", "squeeze", "expand_dims"})


def is_view(value: Expr) -> bool:
    return isinstance(value, Call) and isinstance(value.op, str) and value.op in VIEW_OPS


def is_view_group(func: Function) -> bool:
    """A function of nothing but view ops: the runtime runs it as views, no kernel."""
    return bool(func.bindings) and all(is_view(b.value) for b in func.bindings)


def binding_kind(value: Expr, views: bool = False) -> OpPatternKind:
    """The pattern kind of a binding's value, as Relax's graph builder assigns it. With
    ``views`` (beyond TVM) a view op is ElemWise, symbolic shapes included: one output element
    per input element at the same flat offset, so it joins a group wherever an elementwise op
    could (TVM makes a reshape Injective, which ends a product's epilogue, and Opaque when a
    dimension is symbolic)."""
    if isinstance(value, Call):
        if isinstance(value.op, GlobalVar):
            return OpPatternKind.OPAQUE  # a call of a module function
        if views and is_view(value):
            return OpPatternKind.ELEMWISE
        return op_kind(value)
    if isinstance(value, TupleGetItem):
        return OpPatternKind.INJECTIVE
    return OpPatternKind.OPAQUE  # a tuple, an alias, a constant


def _returned(e: Expr):
    if isinstance(e, Var):
        yield e
    elif isinstance(e, Tuple):
        for f in e.fields:
            yield from _returned(f)


def build_graph(func: Function, views: bool = False) -> list[Node]:
    nodes: list[Node] = []
    by_ref: dict[int, Node] = {}

    def add(ref, pattern, extern, binding=None) -> Node:
        node = Node(len(nodes), ref, pattern, extern, binding)
        nodes.append(node)
        by_ref[id(ref)] = node
        return node

    returned = {id(v) for v in _returned(func.ret)}
    for p in func.params:
        add(p, OpPatternKind.OPAQUE, True)
    for i, b in enumerate(func.bindings):
        kind = binding_kind(b.value, views)
        sources = []
        for leaf in read_leaves(b.value):
            if id(leaf) not in by_ref:  # a constant met for the first time: never fused
                add(leaf, OpPatternKind.OPAQUE, False)
            sources.append(by_ref[id(leaf)])
        node = add(b.var, kind, id(b.var) in returned, i)
        for src in sources:
            src.outputs.append((node, kind))
    return nodes
