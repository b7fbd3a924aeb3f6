"""Symbols of its own for an extent that no buffer of a function determines.

A fused group runs alone: its kernel (or the reference running it op by op) binds its
symbols from the sizes of its own parameters and results (:mod:`dpl.ir.dim_binding`). A
group cut out of a strided conv1d may hold ``n`` only inside ``(n + 1) // 2 - 1``: no size
gives ``n`` back, because the division loses it. The group never needs ``n`` itself, only
that extent; so :func:`with_extent_symbols` gives each such atom (a floor division, modulo,
min or max over a symbol the buffers do not determine) a fresh symbol, and the dim reads
``ext0 - 1``, which binds by solving like any linear dim. A dim over several such symbols with
no atom to name (``m + n``, ``n * m``) becomes a symbol as a whole, being a size itself; where
it holds one of them alone (``m + n``), that one is solved for (``n = ext0 - m``) and substituted
everywhere, so the intermediates built from the dim (a merging reshape's ``(m + n) * 2``) read
the new symbol too.

Sound for every binding the IR allows: the atom ``A`` becomes ``e + lo``, where ``lo`` is
the least value :func:`dpl.ir.dims.bounds` proves ``A`` can take, so ``e = A - lo`` is a
symbol's value (an integer >= 0) and every simplification that holds for symbols >= 0 holds
at it. A function the rewrite cannot free of such symbols (``n`` in an intermediate dim or an
attribute too, in an atom of unbounded sign) is returned unchanged, and whoever binds it
reports what cannot be bound, as before.

Where no symbol of its own can stand for an extent (``arange(end=n // 10 - 1)``: its length is
``max(n // 10, 1) - 1``, which gives back neither ``n`` nor the end the reference needs), the
caller's value does: a plan is made for one signature, so the caller knows every symbol, and
:func:`with_caller_dims` writes its value into the function, a kernel of that size.
"""

from __future__ import annotations

import math
from typing import Mapping

from dpl.ir.dim_binding import dim_symbols, undetermined
from dpl.ir.dims import Dim, DimExpr, Poly, add, bounds, free_symbols, mul, sub, substitute
from dpl.ir.expr import Binding, Call, Constant, Function, GlobalVar, Tuple, TupleGetItem, Var, frozen_call
from dpl.ir.types import TensorType, TupleType, Type
from dpl.ops.registry import DIM_ATTR_KINDS, lookup

_PREFIX = "ext"  # ext0, ext1, ...: names of the fresh symbols (never one the function already uses)


def with_extent_symbols(fn: Function) -> Function:
    """``fn`` with a fresh symbol for every node atom of its parameters' and results' dims that
    holds a symbol those sizes cannot determine, or ``fn`` itself when none does or when the
    rewrite would leave such a symbol anywhere in the function."""
    boundary = [t.shape for t in _tensor_types(fn.params) + _tensor_types(_results(fn))]
    hidden = set(undetermined(boundary))
    if not hidden:
        return fn
    atoms = _atoms_over(hidden, [d for shape in boundary for d in shape])
    taken = _names(fn)
    mapping: dict[Dim, Dim] = {}
    for atom in atoms:
        lo = bounds(atom)[0]
        if lo == -math.inf:  # no symbol >= 0 holds it; the whole dim may still be one below
            continue
        name = _fresh(taken)
        mapping[atom] = add(name, int(lo))
    rewritten = _Rewrite(mapping).function(fn) if mapping else fn
    rewritten = _solve_whole_dims(rewritten, taken)
    # then a whole dim over symbols still hidden (n * m), a size, is a symbol itself
    boundary = [t.shape for t in _tensor_types(rewritten.params) + _tensor_types(_results(rewritten))]
    still = set(undetermined(boundary))
    whole = {d: _fresh(taken) for d in dict.fromkeys(d for shape in boundary for d in shape)
             if isinstance(d, DimExpr) and free_symbols(d) & still}
    if whole:
        rewritten = _Rewrite(whole, whole=True).function(rewritten)
        boundary = [t.shape for t in _tensor_types(rewritten.params) + _tensor_types(_results(rewritten))]
    if undetermined(boundary) or _symbols_of(rewritten) & hidden:
        return fn
    return rewritten


def with_caller_dims(fn: Function, dims: Mapping[str, int]) -> Function:
    """``fn`` with the value in ``dims`` (the caller's, at one signature) of each symbol that
    neither the sizes of its parameters and results nor :func:`with_extent_symbols` determine,
    or ``fn`` itself when there is none: the kernel then never needs what its buffers cannot tell.
    A symbol ``dims`` lacks is left as it is, for whoever binds the function to report."""
    hidden = _hidden_symbols(fn, dims)
    if not hidden or not _hidden_symbols(with_extent_symbols(fn), dims):
        return fn
    return _Rewrite({s: dims[s] for s in sorted(hidden)}).function(fn)


def _hidden_symbols(fn: Function, dims: Mapping[str, int]) -> set[str]:
    """The symbols of ``dims`` that ``fn`` uses (types, dim attributes) and its buffers' sizes do
    not determine."""
    used = _symbols_of(fn) & dims.keys()
    if not used:
        return set()
    boundary = [t.shape for t in _tensor_types(fn.params) + _tensor_types(_results(fn))]
    lone = {d for shape in boundary for d in shape if type(d) is str}
    if used <= lone:  # the common case: every symbol is some buffer's size
        return set()
    determined = {s for shape in boundary for d in shape for s in dim_symbols(d)} - set(undetermined(boundary))
    return used - determined


def _solve_whole_dims(fn: Function, taken: set[str]) -> Function:
    """``fn`` with each boundary dim that holds a hidden symbol ``s`` alone, with coefficient 1
    or -1 (``m + n``), made a fresh symbol by solving for ``s`` (``n = ext0 - m``) and substituting
    that everywhere: the intermediates' ``(m + n) * 2`` of a merging reshape then read
    ``ext0 * 2``. Sound: the substitution is an identity at the run-time values."""
    while True:
        boundary = [t.shape for t in _tensor_types(fn.params) + _tensor_types(_results(fn))]
        still = set(undetermined(boundary))
        found = next((f for d in dict.fromkeys(d for shape in boundary for d in shape)
                      if (f := _linear_in(d, still)) is not None), None)
        if found is None:
            return fn
        symbol, coefficient, rest = found
        fn = _Rewrite({symbol: mul(coefficient, sub(_fresh(taken), rest))}).function(fn)


def _linear_in(d: Dim, hidden: set[str]) -> tuple[str, int, Dim] | None:
    """``(s, c, rest)`` with ``d == c * s + rest``, ``s`` a symbol of ``hidden``, ``c`` 1 or -1 and
    ``rest`` free of ``s``; None when ``d`` has no such term."""
    if not isinstance(d, Poly):
        return None
    for mono, c in d.terms:
        if len(mono) == 1 and type(mono[0]) is str and mono[0] in hidden and c in (1, -1):
            rest = sub(d, mul(c, mono[0]))
            if mono[0] not in free_symbols(rest):
                return mono[0], c, rest
    return None


def _atoms_over(hidden: set[str], dims: list[Dim]) -> list[DimExpr]:
    """The outermost node atoms of ``dims`` that hold a symbol of ``hidden``, in order."""
    found: dict[DimExpr, None] = {}
    for d in dims:
        if not isinstance(d, DimExpr):
            continue
        for atom in ([a for m, _ in d.terms for a in m] if isinstance(d, Poly) else [d]):
            if isinstance(atom, DimExpr) and free_symbols(atom) & hidden:
                found.setdefault(atom)
    return list(found)


def _fresh(taken: set[str]) -> str:
    k = 0
    while f"{_PREFIX}{k}" in taken:
        k += 1
    taken.add(f"{_PREFIX}{k}")
    return f"{_PREFIX}{k}"


def _results(fn: Function) -> list:
    return list(fn.ret.fields) if isinstance(fn.ret, Tuple) else [fn.ret]


def _tensor_types(values) -> list[TensorType]:
    out: list[TensorType] = []

    def visit(ty: Type) -> None:
        if isinstance(ty, TupleType):
            for t in ty.fields:
                visit(t)
        elif isinstance(ty, TensorType):
            out.append(ty)

    for v in values:
        visit(v.ty)
    return out


def _dims_of_attr(value) -> list[Dim]:
    if isinstance(value, tuple):
        return [d for v in value for d in _dims_of_attr(v)]
    return [value] if isinstance(value, DimExpr) else []


def _symbols_of(fn: Function) -> set[str]:
    """Every symbol of ``fn``'s types and of its calls' dim attributes (``reshape(shape=[n * 2])``)."""
    dims = [d for t in _tensor_types(list(fn.params) + [b.var for b in fn.bindings] + _results(fn)) for d in t.shape]
    for b in fn.bindings:
        if isinstance(b.value, Call):
            dims += [d for v in b.value.attrs.values() for d in _dims_of_attr(v)]
            dims += [v for v in b.value.attrs.values() if type(v) is str]  # a lone symbol, arange(end="n")
    return {s for d in dims for s in dim_symbols(d)}  # a str attribute that is no dim only costs a name


def _names(fn: Function) -> set[str]:
    """Names a fresh symbol must not take: symbols, parameters and bindings (a kernel shares one
    namespace among them)."""
    return _symbols_of(fn) | {p.name for p in fn.params} | {b.var.name for b in fn.bindings}


class _Rewrite:
    """A copy of a function with ``mapping`` applied to every dim of its types and attributes."""

    def __init__(self, mapping: dict[Dim, Dim], whole: bool = False):
        self.mapping, self.whole = mapping, whole  # whole: only dims equal to a key are replaced
        self.vars: dict[int, Var] = {}

    def dim(self, d: Dim) -> Dim:
        if self.whole or type(d) is str:  # a lone symbol is replaced where the mapping solves for it
            return self.mapping.get(d, d)
        return substitute(d, self.mapping) if isinstance(d, DimExpr) else d

    def type(self, ty: Type) -> Type:
        if isinstance(ty, TupleType):
            return TupleType(tuple(self.type(t) for t in ty.fields))
        if isinstance(ty, TensorType):
            return TensorType(tuple(self.dim(d) for d in ty.shape), ty.dtype)
        return ty

    def attr(self, value, dims: bool):
        """An attribute's value with its dims mapped; ``dims``: its kind holds dims, so a string is a
        lone symbol (``arange(end="n")``), which must change with the types: a kernel is keyed
        by its attributes, and one that kept "n" beside a type of 4 rows was reused at 5."""
        if isinstance(value, tuple):
            return tuple(self.attr(v, dims) for v in value)
        return self.dim(value) if isinstance(value, DimExpr) or (dims and type(value) is str) else value

    def var(self, v: Var) -> Var:
        new = Var(v.name, self.type(v.ty))
        self.vars[id(v)] = new
        return new

    def expr(self, e):
        if isinstance(e, Var):
            return self.vars.get(id(e), e)
        if isinstance(e, (Constant, GlobalVar)):
            return e
        if isinstance(e, Call):
            op = lookup(e.op) if isinstance(e.op, str) else None
            attrs = {k: self.attr(v, op is not None and k in op.attrs and op.attrs[k].kind in DIM_ATTR_KINDS) for k, v in e.attrs.items()}
            return frozen_call(e.op, tuple(self.expr(a) for a in e.args), attrs, self.type(e.ty))
        if isinstance(e, Tuple):
            return Tuple(tuple(self.expr(f) for f in e.fields))
        if isinstance(e, TupleGetItem):
            return TupleGetItem(self.expr(e.tuple_value), e.index)
        return e

    def function(self, fn: Function) -> Function:
        params = tuple(self.var(p) for p in fn.params)
        bindings = []
        for b in fn.bindings:
            value = self.expr(b.value)
            bindings.append(Binding(self.var(b.var), value))
        return Function(fn.name, params, tuple(bindings), self.expr(fn.ret), fn.attrs)
