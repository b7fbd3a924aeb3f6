"""Binding shape symbols from concrete sizes, and checking every dim against them.

The interpreter and the runtime's memory plan both meet the same question: given the declared
shapes of some values (dims of :mod:`dpl.ir.dims`: ints, symbols, expressions) and their
concrete sizes, what is each symbol, and do the sizes agree with the types? The order is fixed
so that the answer does not depend on which input comes first:

1. every plain symbol binds from the first size it meets (a later disagreement is an error);
2. a dim that is an expression with one unbound symbol, linear in it (``n * 2``, ``n + m``
   once ``m`` is bound), is solved for it (:func:`dpl.ir.dims.solve`), repeated while that
   binds something;
3. ``fallback`` fills symbols nothing above bound (the caller's dims, for a fused group whose
   ``arange(end=seq)`` no input sizes);
4. every expression is evaluated and compared with its size.

A mismatch raises :class:`DimMismatch` with a message that names the value, the axis, the
expression and the bindings it used ("input 'x' dim 0 is 7, but its type says n * 2 with
n = 4"); each caller re-raises it as its own error class.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from dpl.ir.dims import Dim, DimError, DimExpr, evaluate, free_symbols, solve, substitute, text


class DimMismatch(DimError):
    """Sizes that do not fit the declared dims, or a symbol the sizes do not determine."""


def _with(d: Dim, dims: Mapping[str, int]) -> str:
    used = sorted(free_symbols(d) & dims.keys())
    return f" with {', '.join(f'{s} = {dims[s]}' for s in used)}" if used else ""


def bind_shapes(entries: Sequence[tuple[Sequence[Dim], Sequence[int], str]], dims: dict[str, int] | None = None,
                fallback: Mapping[str, int] | None = None) -> dict[str, int]:
    """Bind the symbols of ``entries``, each ``(declared shape, concrete shape, what)`` of one
    rank (the caller checks ranks), into ``dims`` (updated and returned), and check every dim.
    ``what`` names the value in messages ("input 'x'")."""
    dims = {} if dims is None else dims
    pending: list[tuple[Dim, int, str, int]] = []
    for shape, sizes, what in entries:
        for axis, (want, got) in enumerate(zip(shape, sizes)):
            got = int(got)
            if type(want) is str:
                bound = dims.setdefault(want, got)
                if bound != got:
                    raise DimMismatch(f"{what} has {got} in dimension {axis}, but '{want}' is already {bound}")
            elif isinstance(want, DimExpr):
                pending.append((want, got, what, axis))
            elif want != got:
                raise DimMismatch(f"{what} dim {axis} is {got}, but its type says {want}")
    progress = True
    while progress:
        progress = False
        for want, got, what, axis in pending:
            unknown = free_symbols(want) - dims.keys()
            if len(unknown) != 1:
                continue
            known = substitute(want, {s: dims[s] for s in free_symbols(want) & dims.keys()})
            try:
                found = solve(known, got)
            except DimError as err:
                raise DimMismatch(f"{what} dim {axis} is {got}, but its type says {text(want)}{_with(want, dims)}: "
                                  f"{err.message}") from None
            if found:
                dims.update(found)
                progress = True
    for symbol, value in (fallback or {}).items():
        dims.setdefault(symbol, value)
    for want, got, what, axis in pending:
        unknown = sorted(free_symbols(want) - dims.keys())
        if unknown:
            raise DimMismatch(f"{what} dim {axis} is {got}, and its type says {text(want)}, but nothing determines "
                              f"{', '.join(unknown)} (a symbol binds from a dim that is the symbol alone, or linear "
                              "in it)")
        try:
            value = evaluate(want, dims)
        except DimError as err:
            raise DimMismatch(f"{what} dim {axis}: its type says {text(want)}{_with(want, dims)}, which cannot be "
                              f"evaluated: {err.message}") from None
        if value != got:
            raise DimMismatch(f"{what} dim {axis} is {got}, but its type says {text(want)}{_with(want, dims)}, "
                              f"which is {value}")
    return dims


def concrete_shape(shape: Sequence[Dim], dims: Mapping[str, int], what: str) -> tuple[int, ...]:
    """``shape`` evaluated with ``dims``; an unbound symbol or a negative size is a
    DimMismatch naming ``what``."""
    out = []
    for axis, d in enumerate(shape):
        if type(d) is int:
            out.append(d)
            continue
        if type(d) is str and d in dims:  # a lone symbol, whatever its spelling (a model's 'a.b')
            out.append(dims[d])
            continue
        unbound = [d] if type(d) is str else sorted(free_symbols(d) - dims.keys())
        if unbound:
            raise DimMismatch(f"dim '{unbound[0]}' of {what} is not determined by the inputs")
        try:
            value = evaluate(d, dims)
        except DimError as err:
            raise DimMismatch(f"dim {axis} of {what}, {text(d)}{_with(d, dims)}: {err.message}") from None
        if value < 0:
            raise DimMismatch(f"dim {axis} of {what} is {text(d)}, which is {value}{_with(d, dims)}: a size is never negative")
        out.append(value)
    return tuple(out)


def dim_symbols(d: Dim) -> frozenset[str]:
    """The symbols of a dim; a lone symbol is itself whatever its spelling (a model's ``a.b``)."""
    if type(d) is str:
        return frozenset((d,))
    return frozenset() if type(d) is int else free_symbols(d)


def undetermined(shapes: Sequence[Sequence[Dim]]) -> list[str]:
    """The symbols of ``shapes`` that :func:`bind_shapes` cannot bind from their sizes, sorted:
    it binds lone symbols, then dims linear in their one unbound symbol, until nothing changes
    (``n`` of ``(n + 1) // 2`` or ``n * m`` alone is undetermined)."""
    dims = [d for shape in shapes for d in shape]
    known = {d for d in dims if type(d) is str}
    progress = True
    while progress:
        progress = False
        for d in dims:
            if not isinstance(d, DimExpr):
                continue
            rest = free_symbols(d) - known
            if len(rest) != 1:
                continue
            probe = substitute(d, {s: 1 for s in known})  # linear in the one left, whatever they are?
            try:
                linear = solve(probe, 0) is not None
            except DimError:
                linear = True  # linear, with no solution at this value
            if linear:
                known |= rest
                progress = True
    return sorted({s for d in dims for s in dim_symbols(d)} - known)
