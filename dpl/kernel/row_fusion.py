"""Row fusion (``fuse_reductions``): group row-wise chains into Primitive functions.

TVM's FuseOps stops a group at a reduction's output unless only elementwise work follows in
the same group, so a decomposed softmax (max, subtract, exp, sum, divide), RMSNorm or
LayerNorm ends up as several kernels, each re-reading the row from memory. All of that work
is on the same rows, though: a reduction over the last axis with ``keepdims`` gives one value
per row, and the elementwise ops around it read and write either whole rows or those
per-row values. This pass finds such chains and makes each one a Primitive function, which
:mod:`dpl.kernel.lower` turns into one row kernel (one pass over each row, the row kept in
cache).

The grouping is greedy from each seed reduction, in binding order: a neighbour (producer or
consumer) joins when it is row-compatible with the seed (an elementwise op whose result is a
full row ``rows + [n]`` or a per-row value ``rows + [1]``, or another last-axis ``keepdims``
reduction over the same rows) and the group stays convex (no path leaves it and comes
back). A group needs at least two bindings; anything used outside it becomes an output.
"""

from __future__ import annotations

import heapq

import attrs

from dpl.ir.traverse import substitute, vars_in
from dpl.ir.expr import Binding, Call, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.types import TensorType
from dpl.ops.registry import call_function, get_op

ROW_REDUCTIONS = frozenset({"sum", "max", "min", "mean", "variance"})


def fuse_reductions(mod: Module) -> Module:
    """Every plain function of ``mod`` with its row-wise chains moved into Primitive functions."""
    return FuseReductions()(mod)


@attrs.frozen
class FuseReductions:
    """The pass object: ``FuseReductions()(mod)``; ``min_size`` is the smallest group made."""

    min_size: int = 2

    def __call__(self, mod: Module) -> Module:
        functions = dict(mod.functions)
        for name, fn in mod.functions.items():
            if fn.attrs.get("Primitive") or fn.attrs.get("Composite") or fn.attrs.get("Codegen"):
                continue
            graph = _Graph(fn)
            groups = [g for g in find_row_groups(fn) if len(g) >= self.min_size and _outputs(fn, graph, set(g))]
            if not groups:
                continue
            new_fn, made = _outline(fn, groups, set(functions))
            functions[name] = new_fn
            functions.update({f.name: f for f in made})
        return Module(functions)


# -- finding groups ----------------------------------------------------------------------------


def row_reduction(b: Binding):
    """``(rows, n)`` when ``b`` reduces the last axis of a ``rows + [n]`` tensor with keepdims."""
    c = b.value
    if not isinstance(c, Call) or c.op not in ROW_REDUCTIONS or not c.attrs["keepdims"]:
        return None
    x = c.args[0].ty
    if not isinstance(x, TensorType) or x.ndim == 0:
        return None
    axis = c.attrs["axis"]
    if axis is None or len(axis) != 1 or axis[0] % x.ndim != x.ndim - 1:
        return None
    return x.shape[:-1], x.shape[-1]


def _row_compatible(b: Binding, rows: tuple, n) -> bool:
    if row_reduction(b) == (rows, n):
        return True
    c = b.value
    if not isinstance(c, Call) or isinstance(c.op, GlobalVar) or get_op(c.op).c_expr is None:
        return False
    ty = c.ty
    return isinstance(ty, TensorType) and ty.shape in (rows + (n,), rows + (1,))


class _Graph:
    def __init__(self, fn: Function):
        self.bindings = fn.bindings
        self.index = {id(b.var): i for i, b in enumerate(fn.bindings)}
        self.deps = [sorted({self.index[id(v)] for v in vars_in(b.value) if id(v) in self.index}) for b in fn.bindings]
        self.users: list[list[int]] = [[] for _ in fn.bindings]
        for i, ds in enumerate(self.deps):
            for d in ds:
                self.users[d].append(i)

    def convex(self, group: set[int]) -> bool:
        """No binding outside ``group`` both depends on it and feeds it."""
        tainted: set[int] = set()
        for i in range(min(group), max(group) + 1):
            reached = any(d in tainted or (d in group and i not in group) for d in self.deps[i])
            if i in group:
                if any(d in tainted for d in self.deps[i]):
                    return False
            elif reached:
                tainted.add(i)
        return True


def find_row_groups(fn: Function) -> list[list[int]]:
    """Groups of binding indices (ascending), one per row-wise chain."""
    g = _Graph(fn)
    owner: dict[int, int] = {}
    groups: list[list[int]] = []
    for seed, b in enumerate(fn.bindings):
        key = row_reduction(b)
        if key is None or seed in owner:
            continue
        rows, n = key
        group = {seed}
        grown = True
        while grown:
            grown = False
            frontier = sorted({j for i in group for j in g.deps[i] + g.users[i]} - group)
            for j in frontier:
                if j in owner or not _row_compatible(fn.bindings[j], rows, n):
                    continue
                if g.convex(group | {j}):
                    group.add(j)
                    grown = True
        for i in group:
            owner[i] = len(groups)
        groups.append(sorted(group))
    return groups


# -- outlining ---------------------------------------------------------------------------------


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def _outputs(fn: Function, g: _Graph, group: set[int]) -> list[Var]:
    """Members whose value is needed outside the group (a dead chain has none)."""
    ret_ids = {id(v) for v in vars_in(fn.ret)}
    return [fn.bindings[i].var for i in sorted(group) if id(fn.bindings[i].var) in ret_ids or any(u not in group for u in g.users[i])]


def _outline(fn: Function, groups: list[list[int]], taken_fns: set[str]):
    g = _Graph(fn)
    member_of = {i: k for k, grp in enumerate(groups) for i in grp}
    made: list[Function] = []
    nodes = []  # (priority, deps as binding indices, new bindings)
    taken_vars = {p.name for p in fn.params} | {b.var.name for b in fn.bindings}
    for k, grp in enumerate(groups):
        members = [fn.bindings[i] for i in grp]
        inside = {id(b.var) for b in members}
        inputs: list[Var] = []
        for b in members:
            for v in vars_in(b.value):
                if id(v) not in inside and all(v is not u for u in inputs):
                    inputs.append(v)
        outputs = _outputs(fn, g, set(grp))
        env = {id(v): Var(v.name, v.ty) for v in inputs}
        body = []
        for b in members:
            var = Var(b.var.name, b.var.ty)
            body.append(Binding(var, substitute(b.value, env)))
            env[id(b.var)] = var
        ret = env[id(outputs[0])] if len(outputs) == 1 else Tuple(tuple(env[id(v)] for v in outputs))
        ops = "_".join(dict.fromkeys(b.value.op.replace(".", "_") for b in members))
        name = _fresh(f"fused_row_{ops}"[:64], taken_fns)
        callee = Function(name, [env[id(v)] for v in inputs], body, ret, {"Primitive": True})
        made.append(callee)
        call = call_function(GlobalVar(name), inputs, callee.ret_type)
        if len(outputs) == 1:
            new = [Binding(outputs[0], call)]
        else:
            tup = Var(_fresh(f"{name}_out", taken_vars), callee.ret_type)
            new = [Binding(tup, call)] + [Binding(v, TupleGetItem(tup, j)) for j, v in enumerate(outputs)]
        deps = {d for i in grp for d in g.deps[i] if member_of.get(d) != k}
        nodes.append((grp[0], deps, new, set(grp)))
    for i, b in enumerate(fn.bindings):
        if i not in member_of:
            nodes.append((i, set(g.deps[i]), [b], {i}))
    return attrs.evolve(fn, bindings=_schedule(nodes)), made


def _schedule(nodes) -> list[Binding]:
    """Bindings in dependence order, otherwise in the original order (Kahn with a heap)."""
    node_of = {i: n for n, (_, _, _, covers) in enumerate(nodes) for i in covers}
    waiting = [len({node_of[d] for d in deps} - {n}) for n, (_, deps, _, _) in enumerate(nodes)]
    dependents: list[set[int]] = [set() for _ in nodes]
    for n, (_, deps, _, _) in enumerate(nodes):
        for d in {node_of[d] for d in deps} - {n}:
            dependents[d].add(n)
    ready = [(nodes[n][0], n) for n in range(len(nodes)) if waiting[n] == 0]
    heapq.heapify(ready)
    out: list[Binding] = []
    while ready:
        _, n = heapq.heappop(ready)
        out.extend(nodes[n][2])
        for m in dependents[n]:
            waiting[m] -= 1
            if waiting[m] == 0:
                heapq.heappush(ready, (nodes[m][0], m))
    return out

