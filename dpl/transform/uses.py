"""Who uses what in one function: one scan, shared by everything that asks about that version
of the function (FuseOpsByPattern's candidate search, its check contexts, its leak and cycle
checks, and outlining), so that no pattern or match rescans the function.

``FunctionUses(func)`` holds, by binding index: the bindings that read each binding's
variable (program order, no repeats), which bindings call each op, where each binding's value
and variable sit, and which variables the function returns. :class:`VarUsages` is the
``{var: users}`` mapping a check context exposes, read lazily from it.
"""

from __future__ import annotations

import collections.abc
from typing import Iterator

from dpl.ir.expr import Call, Constant, Function, Var
from dpl.ir.traverse import leaves, read_leaves  # noqa: F401 (read_leaves: used from here too)
from dpl.pattern.fusion import FUNCTION_RETURN


class FunctionUses:
    """The use index of one function (see the module docstring). Read-only once built."""

    __slots__ = ("func", "index_of", "_position", "users", "other_users", "returned", "by_op", "calls", "_usages", "change")

    def __init__(self, func: Function):
        self.func = func
        bindings = func.bindings
        index_of = {b.var: i for i, b in enumerate(bindings)}
        users: list[list[int]] = [[] for _ in bindings]
        # variables that are not bindings' (parameters, and free ones): id -> (var, users)
        other: dict[int, tuple[Var, list[int]]] = {id(p): (p, []) for p in func.params}
        by_op: dict[str, list[int]] = {}
        calls: list[int] = []
        get = index_of.get
        for i, b in enumerate(bindings):
            value = b.value
            if type(value) is Call:
                calls.append(i)
                op = value.op
                if type(op) is str:
                    bucket = by_op.get(op)
                    if bucket is None:
                        by_op[op] = [i]
                    else:
                        bucket.append(i)
                read = value.args
                for a in read:
                    t = type(a)
                    if t is not Var and t is not Constant:
                        read = read_leaves(value)
                        break
            else:
                read = read_leaves(value)
            for leaf in read:
                if type(leaf) is not Var:
                    continue
                j = get(leaf)
                if j is not None:
                    lst = users[j]
                else:
                    entry = other.get(id(leaf))
                    if entry is None:
                        entry = other[id(leaf)] = (leaf, [])
                    lst = entry[1]
                if not lst or lst[-1] != i:
                    lst.append(i)
        self.index_of = index_of  # binding var -> binding index
        self._position: dict[int, int] | None = None
        self.users = users  # binding index -> indices of the bindings that read its variable
        self.other_users = other  # id(param or free var) -> (var, user indices)
        self.returned = {id(v) for v in leaves(func.ret) if isinstance(v, Var)}
        self.by_op = by_op  # op name -> indices of the bindings that call it
        self.calls = calls  # indices of the bindings whose value is a call
        self._usages: VarUsages | None = None
        # (variables no longer bound, new bindings) when derived by ``outlined``, else None
        self.change: tuple[list[Var], list] | None = None

    def outlined(self, func: Function, new_of: list[int], owner: dict[int, int], at: list[int], made: list[list]) -> "FunctionUses":
        """The use index of ``func``, which is this index's function with groups outlined in
        place (:func:`dpl.transform.outline.outline`'s order-keeping case), derived from this
        one without reading the bindings that stayed: ``new_of`` maps each old binding index
        to its new one (-1 for a group member), ``owner`` each member to its group, ``at`` each
        group to the new index of its first new binding (-1 for a dropped dead group), and
        ``made`` holds each group's new bindings (its call, then any tuple items). Equal to
        ``FunctionUses(func)``; the work beyond one remap of the index lists is proportional
        to the groups."""
        old_bindings = self.func.bindings
        reader = list(new_of)  # old reader index -> new reader index (-1: gone)
        for i, g in owner.items():
            reader[i] = at[g]
        # the lists a member read from (they lose it, or gain its group's call, out of order)
        index_of = self.index_of
        dirty: set[int] = set()
        dirty_other: set[int] = set()
        for i in owner:
            for leaf in read_leaves(old_bindings[i].value):
                if type(leaf) is Var:
                    j = index_of.get(leaf)
                    if j is not None:
                        dirty.add(j)
                    else:
                        dirty_other.add(id(leaf))

        def fixed(lst: list[int], drop: int = -1) -> list[int]:
            return sorted({u for u in lst if u != -1 and u != drop})

        users: list = [None] * len(func.bindings)
        for k, lst in zip(new_of, self.users):
            if k >= 0:
                users[k] = [reader[u] for u in lst]
        for j in dirty:
            k = new_of[j]
            if k >= 0:
                users[k] = fixed(users[k])
        new_index_of = {v: k for v, i in index_of.items() if (k := new_of[i]) >= 0}
        calls = [k for i in self.calls if (k := new_of[i]) >= 0]
        for g, bs in enumerate(made):
            k0 = at[g]
            if k0 < 0:
                continue
            calls.append(k0)
            for d, b in enumerate(bs):
                k = k0 + d
                new_index_of[b.var] = k
                j = index_of.get(b.var)
                if j is not None:  # a group output, read outside the group (or returned)
                    users[k] = fixed([reader[u] for u in self.users[j]], drop=k0)
                else:  # the tuple of a multi-output call: read by its items
                    users[k] = list(range(k0 + 1, k0 + len(bs)))
        calls.sort()
        other = {}
        params = {id(p) for p in func.params}
        for key, (var, lst) in self.other_users.items():
            if key in dirty_other:
                mapped = fixed([reader[u] for u in lst])
                if not mapped and key not in params:
                    continue  # a free variable only a dropped dead group read
            else:
                mapped = [reader[u] for u in lst]
            other[key] = (var, mapped)
        by_op = {}
        for op, bucket in self.by_op.items():
            kept = [k for i in bucket if (k := new_of[i]) >= 0]
            if kept:
                by_op[op] = kept
        new = FunctionUses.__new__(FunctionUses)
        new.func = func
        new.index_of = new_index_of
        new._position = None
        new.users = users
        new.other_users = other
        new.returned = self.returned  # the returned variables stay bound (a member's, as an output)
        new.by_op = by_op
        new.calls = calls
        new._usages = None
        if self._position is not None:
            position = {key: k for key, i in self._position.items() if (k := new_of[i]) >= 0}
            for g, bs in enumerate(made):
                for d, b in enumerate(bs):
                    position[id(b.value)] = at[g] + d
            new._position = position
        new.change = ([old_bindings[i].var for i in owner if old_bindings[i].var not in new_index_of],
                      [b for bs in made for b in bs])
        return new

    @property
    def position(self) -> dict[int, int]:
        """id(binding value) -> binding index."""
        if self._position is None:
            self._position = {id(b.value): i for i, b in enumerate(self.func.bindings)}
        return self._position

    def with_ops(self, ops: frozenset[str] | None) -> list[int]:
        """Indices (in order) of the call bindings whose op is one of ``ops``; every call
        binding for ``None`` (a pattern whose root may be any call)."""
        if ops is None:
            return self.calls
        buckets = [self.by_op[op] for op in ops if op in self.by_op]
        if len(buckets) == 1:
            return buckets[0]
        return sorted(i for bucket in buckets for i in bucket)

    @property
    def var_usages(self) -> "VarUsages":
        if self._usages is None:
            self._usages = VarUsages(self)
        return self._usages


class VarUsages(collections.abc.Mapping):
    """``{var: the variables of the bindings that use it}`` for every parameter and binding of
    a function, in program order, a returned variable also listing
    :data:`dpl.pattern.fusion.FUNCTION_RETURN` (last): TVM's ``var_usages``, read lazily
    from a :class:`FunctionUses`. It holds the index's parts, not the index (which caches it):
    no reference cycle, so that a dropped index is freed at once with its per-binding lists
    instead of waiting, for every one of them, for the cyclic collector."""

    __slots__ = ("_func", "_index_of", "_users", "_other", "_returned", "_cache")

    def __init__(self, uses: FunctionUses):
        self._func, self._index_of, self._users = uses.func, uses.index_of, uses.users
        self._other, self._returned = uses.other_users, uses.returned
        self._cache: dict[int, tuple[Var, tuple[Var, ...]]] = {}

    def _users_of(self, var) -> list[int] | None:
        i = self._index_of.get(var)
        if i is not None and self._func.bindings[i].var is var:
            return self._users[i]
        entry = self._other.get(id(var))
        if entry is not None and entry[0] is var:
            return entry[1]
        return None

    def __getitem__(self, var) -> tuple[Var, ...]:
        hit = self._cache.get(id(var))
        if hit is not None and hit[0] is var:
            return hit[1]
        found = self._users_of(var)
        if found is None:
            raise KeyError(var)
        bindings = self._func.bindings
        out = tuple(bindings[u].var for u in found)
        if id(var) in self._returned:
            out += (FUNCTION_RETURN,)
        self._cache[id(var)] = (var, out)
        return out

    def __contains__(self, var) -> bool:
        return self._users_of(var) is not None

    def __iter__(self) -> Iterator[Var]:
        func = self._func
        yield from func.params
        for b in func.bindings:
            yield b.var
        params = {id(p) for p in func.params}
        for key, (var, _) in self._other.items():
            if key not in params:
                yield var

    def __len__(self) -> int:
        return len(self._func.bindings) + len(self._other)
