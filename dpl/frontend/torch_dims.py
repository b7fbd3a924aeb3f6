"""torch's symbolic sizes as dpl dimension expressions.

A ``torch.SymInt`` holds a sympy expression over torch's shape symbols (``s27``): ``256*s27``,
``s0 + s1``, ``FloorDiv(s0 - 3, 2) + 1``, ``Min(s0, 64)``. :func:`sympy_dim` rebuilds it with
the operations of :mod:`dpl.ir.dims`, so the result is canonical and compares equal to the
dim an op's shape inference derives (``reshape``'s ``4 * batch``, ``conv1d``'s
``(n - 3) // 2 + 1``). A symbol becomes the name of the ``torch.export.Dim`` the user gave
(``dim_names``), or torch's own name. What dims cannot express (a true division, a power with
a symbolic exponent, a float) is a FrontendError naming the part.

sympy and torch are imported only here, and only when called (torch is an optional extra).
"""

from __future__ import annotations

from typing import Callable, Mapping

from dpl.frontend.errors import FrontendError
from dpl.ir import dims
from dpl.ir.dims import Dim
from dpl.ops.image import scaled_size


def sympy_dim(expr, symbol: Callable[[str], str], where: str, ranges: Mapping | None = None) -> Dim:
    """The dpl dim of sympy expression ``expr``; ``symbol(torch_name)`` is a symbol's dpl name.
    ``ranges`` (torch's ``shape_env.var_to_range``) drops the operands of a min or max that
    torch's ranges rule out: dpl knows only that sizes are >= 0, so ``Max(1, s//10)`` with ``s``
    in [277, 4096] would stay a max that no other dim of the program equals."""
    import sympy
    import torch.utils._sympy.functions as tf

    def convert(e) -> Dim:
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            return symbol(str(e))
        args = e.args
        if isinstance(e, sympy.Add):
            return _fold(dims.add, [convert(a) for a in args])
        if isinstance(e, sympy.Mul):
            return _fold(dims.mul, [convert(a) for a in args])
        if isinstance(e, (sympy.Pow, tf.PowByNatural)) and args[1].is_Integer and int(args[1]) >= 0:
            return _fold(dims.mul, [convert(args[0])] * int(args[1]), 1)
        if isinstance(e, (tf.FloorDiv, tf.CleanDiv)):
            return dims.floordiv(convert(args[0]), convert(args[1]))
        if isinstance(e, (tf.Mod, tf.PythonMod)):  # torch's Mod is taken over sizes >= 0: floor and C agree
            return dims.mod(convert(args[0]), convert(args[1]))
        if isinstance(e, tf.ModularIndexing):  # (base // divisor) % modulus
            return dims.mod(dims.floordiv(convert(args[0]), convert(args[1])), convert(args[2]))
        if isinstance(e, (tf.Min, sympy.Min)):
            args = _undominated(args, ranges, least=True)
            return dims.dmin(*(convert(a) for a in args)) if len(args) > 1 else convert(args[0])
        if isinstance(e, (tf.Max, sympy.Max)):
            args = _undominated(args, ranges, least=False)
            return dims.dmax(*(convert(a) for a in args)) if len(args) > 1 else convert(args[0])
        if isinstance(e, tf.Identity):
            return convert(args[0])
        if isinstance(e, (tf.TruncToInt, tf.FloorToInt)) and _scaled(args[0]) is not None:
            size, factor = _scaled(args[0])  # an interpolation's floor(h * 1.5): trunc is floor for a size
            return scaled_size(convert(size), factor)
        raise FrontendError(f"{where} is the size {expr}, whose part {e} ({type(e).__name__}) no dpl dimension "
                            "expression holds (dpl's dims have + - * // %, min and max over integers)",
                            hint="compute sizes with integer arithmetic (// rather than /, no floats)")

    try:
        return convert(expr)
    except dims.DimError as err:
        raise FrontendError(f"{where} is the size {expr}, which dpl cannot hold: {err.message}") from None


def _scaled(e):
    """``(size, factor)`` of ``factor * ToFloat(size)`` with a positive float factor, else None."""
    import sympy
    import torch.utils._sympy.functions as tf

    factor, rest = (e.args[0], e.args[1:]) if isinstance(e, sympy.Mul) and len(e.args) == 2 else (sympy.Float(1.0), (e,))
    if not (factor.is_Number and factor > 0) or not isinstance(rest[0], tf.ToFloat):
        return None
    return rest[0].args[0], float(factor)


def _undominated(args: tuple, ranges: Mapping | None, least: bool) -> tuple:
    """The operands of a min (``least``) or max that torch's value ranges leave possible: one
    that is never below (above) another over ``ranges`` is dropped."""
    if not ranges:
        return args
    from torch.utils._sympy.value_ranges import bound_sympy

    spans = [bound_sympy(a, ranges) for a in args]
    kept = []
    for i, span in enumerate(spans):
        if least and any(spans[j].upper <= span.lower for j in kept):
            continue
        if not least and any(spans[j].lower >= span.upper for j in kept):
            continue
        kept = [j for j in kept if not (spans[i].upper <= spans[j].lower if least else spans[i].lower >= spans[j].upper)]
        kept.append(i)
    return tuple(args[i] for i in kept)


def _fold(op, parts: list, start=None) -> Dim:
    out = parts[0] if start is None else start
    for p in parts if start is not None else parts[1:]:
        out = op(out, p)
    return out
