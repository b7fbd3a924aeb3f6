"""A plan made at one binding of the entry's symbols, made again at another without planning.

A plan is for one signature of concrete input shapes, and making one walks the module, asks the
fusion heuristics about every group and looks up every kernel: about 30 ms for a 4-layer Llama
decode step (issue 31). Generation calls that step at a new cache length every token, so a plan
per signature planned the whole time (29 tokens/s against 129 with plans reused). Yet the
kernels of a symbolic module read their sizes at run time, so another binding needs only the
buffers' shapes evaluated again and the memory planned again.

While the planner walks at one binding, it writes every buffer's shape over the entry's own
symbols: a callee's symbols are its parameters' dims matched against the caller's shapes (a lone
symbol, or a dim linear in one unknown with coefficient +-1, solved: ``n + 1`` against ``s``
gives ``n = s - 1``), then the caller's for what its parameters leave. Where the sizes were only
checked to agree (two parameters of one symbol, a static dim met by a symbolic one), the pair is
a *constraint*, evaluated at each new binding. A plan cannot be rebound (``Rebinding`` is None)
where a symbol could not be followed this way or a function had a caller's value written into it
(:func:`dpl.ir.extent_symbols.with_caller_dims`).

Which bindings share one plan (:func:`bucket`): those whose every symbol has the same bit length,
so a plan made at 130 serves 128 to 255. The fusion heuristics and the backends' choices of speed
(flash or two products from so many keys, decode kernels for one query row) were made at one size
of the bucket; a value of 0 or 1 (no keys, one query row) is a bucket of its own, as those
choices change what runs. Only kernels whose backend says they run right at every binding
(``Backend.shape_generic``) are shared; the runtime checks that (``dpl.runtime.executable``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import attrs

from dpl.ir.dims import Dim, DimError, DimExpr, add, evaluate, free_symbols, mul, sub, substitute

SymbolMap = dict  # a function's symbol -> its dim over the entry's symbols


@attrs.frozen
class Rebinding:
    """What makes a plan at another binding: each buffer's shape over the entry's symbols (None:
    static, the plan's own), the dims that must stay equal, and the buffer of each output."""

    shapes: tuple[tuple[Dim, ...] | None, ...]
    constraints: tuple[tuple[Dim, Dim], ...]
    outputs: tuple[int, ...]

    def shapes_at(self, dims: Mapping[str, int], planned: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
        """Every buffer's shape at ``dims`` (``planned``: the plan's own, for static ones), or
        None where a constraint fails or a size is negative (then planning says why)."""
        try:
            for a, b in self.constraints:
                if _value(a, dims) != _value(b, dims):
                    return None
            out = []
            for shape, own in zip(self.shapes, planned):
                if shape is None:
                    out.append(own)
                    continue
                values = tuple(_value(d, dims) for d in shape)
                if min(values, default=0) < 0:
                    return None
                out.append(values)
            return out
        except (DimError, KeyError):
            return None


def _value(d: Dim, dims: Mapping[str, int]) -> int:
    if type(d) is int:
        return d
    if type(d) is str:
        return dims[d]
    return evaluate(d, dims)  # type: ignore[arg-type]


def bucket(dims: Mapping[str, int]) -> tuple[int, ...]:
    """The bindings one plan serves: the bit length of every symbol's value, in name order."""
    return tuple(int(dims[s]).bit_length() for s in sorted(dims))


class Lifter:
    """The planner's record of shapes over the entry's symbols (see the module text). ``why_not``
    says why the plan cannot be rebound, once something made it so."""

    def __init__(self):
        self.constraints: list[tuple[Dim, Dim]] = []
        self.why_not: str | None = None

    def refuse(self, why: str) -> None:
        if self.why_not is None:
            self.why_not = why

    def lift(self, shape: Sequence[Dim], symbols: SymbolMap) -> tuple[Dim, ...] | None:
        """``shape`` over the entry's symbols, or None where a symbol has no dim there."""
        out = []
        for d in shape:
            if type(d) is int:
                out.append(d)
            elif type(d) is str:
                if d not in symbols:
                    self.refuse(f"symbol '{d}' is not followed to the entry's")
                    return None
                out.append(symbols[d])
            else:
                missing = free_symbols(d) - symbols.keys()
                if missing:
                    self.refuse(f"symbol '{sorted(missing)[0]}' of {d} is not followed to the entry's")
                    return None
                out.append(substitute(d, {s: symbols[s] for s in free_symbols(d)}))
        return tuple(out)

    def callee(self, params: Sequence[Sequence[Dim]], args: Sequence[tuple[Dim, ...] | None], caller: SymbolMap,
               bound: Mapping[str, int]) -> SymbolMap:
        """A callee's symbols over the entry's: its parameters' dims (``params``) against its
        arguments' lifted shapes (``args``), then the caller's symbols for the rest; every symbol
        of ``bound`` (what the planner bound for the callee) must be followed."""
        symbols: SymbolMap = {}
        pending: list[tuple[DimExpr, Dim]] = []
        for shape, arg in zip(params, args):
            if arg is None:
                self.refuse("an argument's shape is not followed")
                return symbols
            for want, got in zip(shape, arg):
                if type(want) is str:
                    if want not in symbols:
                        symbols[want] = got
                    elif symbols[want] != got:
                        self.constraints.append((symbols[want], got))
                elif type(want) is int:
                    if type(got) is not int:
                        self.constraints.append((got, want))
                else:
                    pending.append((want, got))
        progress = True
        while pending and progress:  # dims linear in their one unknown, as bind_dims solves them
            progress = False
            for want, got in list(pending):
                unknown = free_symbols(want) - symbols.keys()
                if len(unknown) > 1:
                    continue
                pending.remove((want, got))
                progress = True
                known = substitute(want, {s: symbols[s] for s in free_symbols(want) & symbols.keys()})
                if not unknown:
                    self.constraints.append((known, got))
                    continue
                (u,) = unknown
                solved = _solve_unit(known, u, got)
                if solved is None:
                    self.refuse(f"{want} is not linear in '{u}' with coefficient 1 or -1")
                    return symbols
                symbols[u] = solved
        for s, d in caller.items():
            symbols.setdefault(s, d)
        for s in bound:
            if s not in symbols:
                self.refuse(f"symbol '{s}' is not followed to the entry's")
                break
        return symbols


def _solve_unit(d: Dim, u: str, value: Dim) -> Dim | None:
    """``u`` such that ``d == value``, where ``d`` is ``c * u + r`` with ``c`` 1 or -1 and ``r``
    free of ``u``; else None."""
    try:
        rest = substitute(d, {u: 0})
        coefficient = sub(substitute(d, {u: 1}), rest)
    except DimError:
        return None
    if coefficient not in (1, -1) or sub(d, add(mul(coefficient, u), rest)) != 0:
        return None
    return sub(value, rest) if coefficient == 1 else sub(rest, value)
