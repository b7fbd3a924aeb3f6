"""Turn groups of bindings into module-level functions and calls of them (TVM's OperatorFusor).

Given a function and disjoint groups of its bindings, each group becomes a function:

* parameters: the values the group uses but does not define, in order of first use, named
  like the outer values (constants stay inside unless ``lift_constants``: then each becomes a
  parameter ``param_<i>``, scalars included, as in TVM);
* outputs: the group's values returned by the function first, then those used by bindings
  outside the group, in order of first use there; one output is returned directly, several
  as a tuple that the caller unpacks with tuple items bound to the original variables;
* the body keeps the original binding names; the caller calls the function where the group's
  last binding was, in an order that is topological over groups and otherwise the original;
* the name is ``fused_`` + the ops of the group, and structurally identical functions are
  shared (one function, several calls).
"""

from __future__ import annotations

import heapq
from typing import Any, Mapping, Sequence

import attrs

from dpl.errors import DplError
from dpl.ir.expr import _frozen_mapping, Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.traverse import leaves, substitute
from dpl.ops.registry import call_function
from dpl.transform.uses import FunctionUses, read_leaves


class CycleError(DplError):
    """Fusing the groups as given would make a group depend on itself."""


@attrs.frozen
class Group:
    """Bindings (by index into ``func.bindings``) that become one function with ``attrs``."""

    members: tuple[int, ...]
    attrs: Mapping[str, Any]


def op_names(bindings: Sequence[Binding]) -> list[str]:
    """The part of a fused function's name each binding gives (TVM's naming)."""
    names = []
    for b in bindings:
        v = b.value
        if isinstance(v, Call):
            if isinstance(v.op, GlobalVar):
                names.append(v.op.name.removeprefix("fused_"))
            else:
                names.append(v.op.replace(".", "_"))
    return names


def _value_key(v: Any) -> Any:
    return tuple(_value_key(x) for x in v) if isinstance(v, tuple) else (type(v).__name__, v)


def function_key(fn: Function) -> tuple:
    """A hashable key equal for exactly the functions that are structurally equal up to the
    names of their variables: shared fused functions are found by a dict lookup."""
    slot = {id(p): i for i, p in enumerate(fn.params)}
    return _structure_key(fn.attrs, [p.ty for p in fn.params], slot, [(b.var, b.value) for b in fn.bindings], fn.ret)


def _structure_key(fn_attrs, param_types, slot: dict[int, int], body, ret) -> tuple:
    """:func:`function_key` of a function given in parts: ``slot`` numbers what the
    parameters stand for (by id), ``body`` is its (variable, value) pairs, in order."""
    out = []
    for var, value in body:
        out.append(_ref(value, slot))
        slot[id(var)] = len(slot)
    return (tuple((k, _value_key(v)) for k, v in fn_attrs.items()), tuple(param_types), tuple(out), _ref(ret, slot))


def _ref(e: Expr, slot: dict[int, int]):
    """The structure key of ``e`` (a module-level function: a recursive closure would be a
    reference cycle per outlined group, left to the cyclic collector)."""
    t = type(e)
    if t is Var:
        return ("v", slot[id(e)])
    if t is Call:
        op = e.op if type(e.op) is str else ("@", e.op.name)
        attrs_key = tuple([(k, _value_key(v)) for k, v in e.attrs.items()]) if e.attrs else ()
        return ("call", op, e.ty, attrs_key, tuple([_ref(a, slot) for a in e.args]))
    if isinstance(e, Constant):
        if id(e) in slot:  # a constant the function takes as a parameter
            return ("v", slot[id(e)])
        return ("c", e.ty, e.value.tobytes())
    if isinstance(e, Tuple):
        return ("t", tuple(_ref(f, slot) for f in e.fields))
    if isinstance(e, TupleGetItem):
        return ("i", _ref(e.tuple_value, slot), e.index)
    if isinstance(e, GlobalVar):
        return ("g", e.name)
    op = e.op if isinstance(e.op, str) else ("@", e.op.name)
    return ("call", op, e.ty, tuple((k, _value_key(v)) for k, v in e.attrs.items()), tuple(_ref(a, slot) for a in e.args))


class FunctionTable:
    """The module's functions plus new ones: shares structurally identical functions and gives
    new ones unique names (``name``, ``name1``, ``name2`` ... as TVM's BlockBuilder does)."""

    def __init__(self, mod: Module):
        self.functions: dict[str, Function] = dict(mod.functions)
        self._by_key: dict[tuple, str] = {}
        self._next: dict[str, int] = {}  # base name -> the first number that may be free

    def add(self, fn: Function, key: tuple | None = None) -> str:
        """The name of ``fn`` in the table (an equal function's, or a new one); ``key`` is its
        :func:`function_key` when the caller has it."""
        if key is None:
            key = function_key(fn)
        if key in self._by_key:
            return self._by_key[key]
        name, i = fn.name, self._next.get(fn.name, 0)  # the numbers below are taken already
        if i or name in self.functions:
            i = max(i, 1)
            while f"{fn.name}{i}" in self.functions:
                i += 1
            name = f"{fn.name}{i}"
        self._next[fn.name] = i + 1
        self.functions[name] = attrs.evolve(fn, name=name)
        self._by_key[key] = name
        return name

    def name_of(self, key: tuple) -> str | None:
        """The name of the function of key ``key`` already in the table, if any."""
        return self._by_key.get(key)

    def module(self) -> Module:
        return Module(self.functions)


def _ret_vars(func: Function) -> list[Var]:
    return [e for e in leaves(func.ret) if isinstance(e, Var)]


def outline(func: Function, groups: Sequence[Group], table: FunctionTable, *, lift_constants: bool,
            lift_scalars: bool = True, uses: FunctionUses | None = None) -> Function:
    """``func`` with every group replaced by a call of a new (or shared) function in ``table``.
    ``uses`` is ``func``'s use index when the caller has one (it is made here otherwise): the
    work beyond one pass over the bindings is proportional to the groups and their users."""
    return outline_with_uses(func, groups, table, lift_constants=lift_constants, lift_scalars=lift_scalars, uses=uses)[0]


def outline_with_uses(func: Function, groups: Sequence[Group], table: FunctionTable, *, lift_constants: bool,
                      lift_scalars: bool = True, uses: FunctionUses | None = None) -> tuple[Function, FunctionUses | None]:
    """:func:`outline`, and the result's use index when it keeps the original order (derived
    from ``uses`` by :meth:`FunctionUses.outlined`, without rescanning the function), else
    ``None``: a caller that goes on asking about the result (FuseOpsByPattern's next pattern)
    then builds no index of its own."""
    if not groups:
        return func, uses
    if uses is None or uses.func is not func:
        uses = FunctionUses(func)
    bindings = func.bindings
    users = uses.users
    groups = [_without_outer_items(bindings, g) for g in groups]
    owner: dict[int, int] = {}  # binding index -> group number
    for g, group in enumerate(groups):
        for i in group.members:
            owner[i] = g
    returned = uses.returned

    # outputs of each group: returned values first (binding order), then external uses in
    # order of first use there (by using binding, then by operand)
    outputs: list[list[Var]] = []
    outside: list[list[int]] = []  # per group: the bindings outside it that read it, in order
    for g, group in enumerate(groups):
        members = sorted(group.members)
        outs = [bindings[i].var for i in members if id(bindings[i].var) in returned]
        readers = sorted({u for i in members for u in users[i] if owner.get(u) != g})
        for u in readers:
            for leaf in read_leaves(bindings[u].value):
                j = uses.index_of.get(leaf)
                if j is not None and owner.get(j) == g and leaf not in outs:
                    outs.append(leaf)
        outputs.append(outs)
        outside.append(readers)

    calls: dict[int, list[Binding]] = {}  # group -> the caller's new bindings
    taken = _Names(func)
    for g, group in enumerate(groups):
        members = sorted(group.members)
        if not outputs[g]:
            calls[g] = []  # a dead group: dropped, as TVM does
            continue
        calls[g] = _make_call([bindings[i] for i in members], outputs[g], group.attrs, table, lift_constants and lift_scalars, lift_constants, taken)

    # emit: units are groups and single bindings; topological, else in original order. Each
    # group sits at its last binding; when every reader of a group comes after that, the
    # original order is already topological and is kept as it is.
    last = [max(group.members, default=-1) for group in groups]
    if all((last[owner[u]] if u in owner else u) > last[g] for g, readers in enumerate(outside) for u in readers):
        out: list[Binding] = []
        new_of = [-1] * len(bindings)  # old binding index -> new one (-1: a group member)
        at = [-1] * len(groups)  # group -> new index of its call (-1: a dead group, dropped)
        done = 0
        for i in sorted(owner):  # the bindings between groups' members are copied a slice at a time
            new_of[done:i] = range(len(out), len(out) + i - done)
            out.extend(bindings[done:i])
            g = owner[i]
            if last[g] == i and calls[g]:
                at[g] = len(out)
                out.extend(calls[g])
            done = i + 1
        new_of[done:] = range(len(out), len(out) + len(bindings) - done)
        out.extend(bindings[done:])
        result = attrs.evolve(func, bindings=tuple(out))
        return result, uses.outlined(result, new_of, owner, at, [calls[g] for g in range(len(groups))])
    return attrs.evolve(func, bindings=tuple(_reordered(func, uses, owner, calls))), None


def _reordered(func: Function, uses: FunctionUses, owner: dict[int, int], calls: dict[int, list[Binding]]) -> list[Binding]:
    """The caller's bindings, groups as units, in an order topological over the units that
    otherwise follows the original one (a unit's place is its last binding)."""
    bindings = func.bindings
    unit_of = lambda i: ("g", owner[i]) if i in owner else ("b", i)  # noqa: E731
    position: dict[tuple, int] = {}
    for i in range(len(bindings)):
        u = unit_of(i)
        position[u] = max(position.get(u, -1), i)
    deps: dict[tuple, set] = {u: set() for u in position}
    users: dict[tuple, set] = {u: set() for u in position}
    for j, readers in enumerate(uses.users):
        for i in readers:
            u, d = unit_of(i), unit_of(j)
            if d != u:
                deps[u].add(d)
                users[d].add(u)
    missing = {u: len(d) for u, d in deps.items()}
    ready = [(position[u], u) for u, n in missing.items() if n == 0]
    heapq.heapify(ready)
    out: list[Binding] = []
    done = 0
    while ready:
        _, u = heapq.heappop(ready)
        done += 1
        out.extend(calls[u[1]] if u[0] == "g" else [bindings[u[1]]])
        for v in users[u]:
            missing[v] -= 1
            if missing[v] == 0:
                heapq.heappush(ready, (position[v], v))
    if done != len(position):
        stuck = sorted({bindings[i].var.name for i, g in owner.items() if missing[("g", g)]})
        raise CycleError(f"fusing the groups of '{func.name}' would create a cyclic dependency (involving {', '.join(stuck)})")
    return out


class _Names:
    """Names taken in a function; ``fresh(base)`` gives the first free ``base<k>`` (k = 0, 1,
    ...) and takes it, without rescanning the numbers it has already given out."""

    def __init__(self, func: Function):
        self.func = func
        self.taken: set[str] | None = None  # the function's names, collected on first use
        self.next: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        if self.taken is None:
            self.taken = {p.name for p in self.func.params} | {b.var.name for b in self.func.bindings}
        k = self.next.get(base, 0)
        while f"{base}{k}" in self.taken:
            k += 1
        self.next[base] = k + 1
        name = f"{base}{k}"
        self.taken.add(name)
        return name


def _without_outer_items(bindings: Sequence[Binding], group: Group) -> Group:
    """TVM splits a tuple parameter that the group only reads items of into one parameter per
    item, and the items are taken in the caller: a tuple item of a value from outside the group
    stays outside it."""
    if not any(type(bindings[i].value) is TupleGetItem for i in group.members):
        return group
    inside = {id(bindings[i].var) for i in group.members}
    keep = tuple(i for i in group.members
                 if not (isinstance(bindings[i].value, TupleGetItem) and isinstance(bindings[i].value.tuple_value, Var)
                         and id(bindings[i].value.tuple_value) not in inside))
    return group if len(keep) == len(group.members) else attrs.evolve(group, members=keep)


def _make_call(members: list[Binding], outputs: list[Var], group_attrs, table: FunctionTable, lift_scalars: bool,
               lift_constants: bool, taken: "_Names") -> list[Binding]:
    defined = {id(b.var) for b in members}
    args: list[Expr] = []  # what the function's parameters stand for, in order of first use
    taken_args: set[int] = set()
    for b in members:
        for leaf in read_leaves(b.value):
            if id(leaf) in defined or id(leaf) in taken_args:
                continue
            if type(leaf) is Constant and not (lift_scalars if leaf.is_scalar else lift_constants):
                continue
            taken_args.add(id(leaf))
            args.append(leaf)
    fn_attrs = _frozen_mapping({"Primitive": True, **group_attrs})
    # the key of the function this group becomes, read off the group itself: a group equal to
    # one outlined before (most of them, in a model of repeated layers) builds nothing
    slot = {id(a): i for i, a in enumerate(args)}
    ret_parts = outputs[0] if len(outputs) == 1 else Tuple(tuple(outputs))
    key = _structure_key(fn_attrs, [a.ty for a in args], slot, [(b.var, b.value) for b in members], ret_parts)
    name = table.name_of(key)
    if name is None:
        params: list[Var] = []
        renamed: dict[int, Expr] = {}
        lifted = 0
        for a in args:
            if type(a) is Constant:
                p = Var(f"param_{lifted}", a.ty)
                lifted += 1
            else:
                p = Var(a.name, a.ty)
            renamed[id(a)] = p
            params.append(p)
        inner: list[Binding] = []
        for b in members:
            var = Var(b.var.name, b.var.ty)
            inner.append(Binding(var, substitute(b.value, renamed)))
            renamed[id(b.var)] = var
        ret = renamed[id(outputs[0])] if len(outputs) == 1 else Tuple(tuple(renamed[id(v)] for v in outputs))
        name = table.add(Function("fused_" + "_".join(op_names(members)), params, inner, ret, fn_attrs), key)
    call = call_function(GlobalVar(name), args, ret_parts.ty)
    if len(outputs) == 1:
        return [Binding(outputs[0], call)]
    tup = Var(taken.fresh("lv"), call.ty)
    order = {id(b.var): i for i, b in enumerate(members)}
    items = [Binding(tup, call)]
    for v in sorted(outputs, key=lambda v: order[id(v)]):
        items.append(Binding(v, TupleGetItem(tup, outputs.index(v))))
    return items
