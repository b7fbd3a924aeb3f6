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

    __slots__ = ("func", "index_of", "_position", "users", "other_users", "returned", "by_op", "calls", "_usages")

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
    from a :class:`FunctionUses`."""

    __slots__ = ("_uses", "_cache")

    def __init__(self, uses: FunctionUses):
        self._uses = uses
        self._cache: dict[int, tuple[Var, ...]] = {}

    def _users(self, var) -> list[int] | None:
        uses = self._uses
        i = uses.index_of.get(var)
        if i is not None and uses.func.bindings[i].var is var:
            return uses.users[i]
        entry = uses.other_users.get(id(var))
        if entry is not None and entry[0] is var:
            return entry[1]
        return None

    def __getitem__(self, var) -> tuple[Var, ...]:
        hit = self._cache.get(id(var))
        if hit is not None and hit[0] is var:
            return hit[1]
        found = self._users(var)
        if found is None:
            raise KeyError(var)
        bindings = self._uses.func.bindings
        out = tuple(bindings[u].var for u in found)
        if id(var) in self._uses.returned:
            out += (FUNCTION_RETURN,)
        self._cache[id(var)] = (var, out)
        return out

    def __contains__(self, var) -> bool:
        return self._users(var) is not None

    def __iter__(self) -> Iterator[Var]:
        uses = self._uses
        yield from uses.func.params
        for b in uses.func.bindings:
            yield b.var
        params = {id(p) for p in uses.func.params}
        for key, (var, _) in uses.other_users.items():
            if key not in params:
                yield var

    def __len__(self) -> int:
        return len(self._uses.func.bindings) + len(self._uses.other_users)
