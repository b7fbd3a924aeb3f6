"""Dimension expressions: the algebra of symbolic tensor sizes.

A dimension (:data:`Dim`) is one of

- an ``int``;
- a ``str``, a lone shape symbol bound from the inputs at run time (``"n"``);
- a :class:`DimExpr`, an immutable, hashable expression over symbols and integers that is
  neither (``n * 4 + 2``, ``(n + 1) // 2``, ``min(n, 64)``).

Every function here returns the simplest of the three, so code that handles ``int`` and
``str`` dims keeps working where no arithmetic happened: ``floordiv(mul("n", 4), 4)`` is the
str ``"n"``, ``add(3, 4)`` is ``7``.

**Symbols are non-negative integers** (shape variables; TVM assumes the same of its shape
vars). Values computed from them may be negative (``n - 3`` at ``n = 0``), so ``//`` and ``%``
have floor semantics (Python's: ``-7 // 2 == -4``, ``-7 % 2 == 1``) wherever they appear.

**Canonical form.** A :class:`Poly` is a sum of monomials, each an integer coefficient times a
sorted tuple of atoms; an atom is a symbol or a canonical non-polynomial node
(:class:`FloorDiv`, :class:`Mod`, :class:`Min`, :class:`Max`) whose operands are canonical.
Monomials are sorted (highest degree first, the constant last) by a total order on atoms, so
two expressions equal as polynomials are equal objects (``==``, ``hash``). Nodes are built
only through the functions below, which apply the rules listed at each (every rule holds for
all integer values of the symbols >= 0, and for negative intermediates under floor
semantics; the tests check this on random expressions).

Everything else: :func:`evaluate`, :func:`free_symbols`, :func:`substitute`, :func:`text` /
:func:`parse` (the printed form, ``parse(text(d)) == d``), :func:`solve` (bind a symbol from a
given size), :func:`to_c` with :data:`C_HELPERS` (floor division in C), and the sound but
incomplete proofs :func:`provably_equal` and :func:`provably_nonnegative`.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable, Iterable, Union

from dpl.errors import DplError, Span
from dpl.limits import MAX_NESTING, LimitError, check_int_digits, excerpt

# nodes one dimension expression may hold (symbols, integers, terms, operators); each
# operation checks its result, so `(a + b) * (a + b) * ...` ends in a LimitError, not a hang
MAX_DIM_SIZE = 256

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FUNCTIONS = ("min", "max")


class DimError(DplError):
    """A dimension expression that cannot be built or evaluated (a bad symbol, a division by
    zero, an unbound symbol, a size no binding gives)."""


class DimSyntaxError(DimError):
    """The text of a dimension expression does not parse; the span points at the bad token."""


# -- values ----------------------------------------------------------------------------------


class DimExpr:
    """A dimension that is neither an int nor a lone symbol. Immutable and hashable; equal
    canonical forms are equal objects. Build one with the functions of this module (or the
    operators, which call them), never with a constructor: those skip the simplifier."""

    __slots__ = ("_key", "_hash", "size")

    def _init(self, key: tuple, size: int) -> None:
        if size > MAX_DIM_SIZE:
            raise LimitError(f"a dimension expression grew to {size} nodes; the limit is MAX_DIM_SIZE = {MAX_DIM_SIZE}",
                             hint="a shape this complicated is almost certainly a frontend bug")
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))
        object.__setattr__(self, "size", size)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._key == self._key

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # pickles (disk cache, build pool) as its text: parse(text(d)) == d
        return parse, (text(self),)

    def __str__(self) -> str:
        return text(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {text(self)}>"

    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __floordiv__(self, other): return floordiv(self, other)
    def __rfloordiv__(self, other): return floordiv(other, self)
    def __mod__(self, other): return mod(self, other)
    def __rmod__(self, other): return mod(other, self)
    def __neg__(self): return mul(-1, self)
    def __pos__(self): return self


Dim = Union[int, str, DimExpr]
Mono = tuple  # a monomial: its atoms (symbols and nodes), sorted by _key, repeated for powers


class Poly(DimExpr):
    """A sum of ``(monomial, coefficient)`` terms, sorted, no zero coefficient, and never a
    lone constant, a lone symbol or a lone node (those are returned as themselves)."""

    __slots__ = ("terms",)

    def __init__(self, terms: tuple[tuple[Mono, int], ...]):
        object.__setattr__(self, "terms", terms)
        key = (2, tuple((tuple(_key(a) for a in m), c) for m, c in terms))
        self._init(key, sum(1 + sum(_size(a) for a in m) for m, _ in terms))


class FloorDiv(DimExpr):
    """``a // b``, rounding towards minus infinity."""

    __slots__ = ("a", "b")

    def __init__(self, a: Dim, b: Dim):
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)
        self._init((3, _key(a), _key(b)), 1 + _size(a) + _size(b))


class Mod(DimExpr):
    """``a % b`` with floor semantics (the sign of ``b``)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Dim, b: Dim):
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)
        self._init((4, _key(a), _key(b)), 1 + _size(a) + _size(b))


class MinMax(DimExpr):
    """The base of :class:`Min` and :class:`Max`: two or more operands, sorted, distinct, none
    provably dominated by another."""

    __slots__ = ("args",)
    _rank = 0

    def __init__(self, args: tuple[Dim, ...]):
        object.__setattr__(self, "args", args)
        self._init((self._rank, tuple(_key(a) for a in args)), 1 + sum(_size(a) for a in args))


class Min(MinMax):
    """The least of its operands."""

    __slots__ = ()
    _rank = 5


class Max(MinMax):
    """The greatest of its operands."""

    __slots__ = ()
    _rank = 6


def _key(d: Dim) -> tuple:
    """A total order on canonical dims (ints, then symbols, then nodes by kind)."""
    if type(d) is int:
        return (0, d)
    if type(d) is str:
        return (1, d)
    return d._key


def _size(d: Dim) -> int:
    return d.size if isinstance(d, DimExpr) else 1


def _dim(value) -> Dim:
    """``value`` checked as a dim: an int (not a bool), a symbol name, or a DimExpr."""
    if type(value) is int or isinstance(value, DimExpr):
        return value
    if isinstance(value, str):
        if not _SYMBOL.fullmatch(value) or value in _FUNCTIONS:
            raise DimError(f"'{excerpt(value, 40)}' is not a symbol name (a letter or _, then letters, digits or _; not min or max)")
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if not isinstance(value, bool) and hasattr(value, "__index__"):  # NumPy integers
        return value.__index__()
    raise DimError(f"{excerpt(repr(value), 60)} is not a dimension (an int, a symbol name or a DimExpr)")


# -- polynomials -----------------------------------------------------------------------------
# Internally a polynomial is a dict {monomial: coefficient}; () is the constant's monomial.


def _poly(d: Dim) -> dict:
    if type(d) is int:
        return {(): d} if d else {}
    if isinstance(d, Poly):
        return dict(d.terms)
    return {(d,): 1}


def _mono(atoms: Iterable) -> Mono:
    return tuple(sorted(atoms, key=_key))


def _term_order(term) -> tuple:
    m = term[0]
    return (len(m) == 0, -len(m), tuple(_key(a) for a in m))


def _from_poly(p: dict) -> Dim:
    p = _merge_divmod({m: c for m, c in p.items() if c})
    if not p:
        return 0
    if len(p) == 1:
        ((m, c),) = p.items()
        if not m:
            return c
        if c == 1 and len(m) == 1:
            return m[0]
    return Poly(tuple(sorted(p.items(), key=_term_order)))


def _padd(p: dict, q: dict, scale: int = 1) -> dict:
    out = dict(p)
    for m, c in q.items():
        out[m] = out.get(m, 0) + scale * c
    return out


def _pmul(p: dict, q: dict) -> dict:
    out: dict = {}
    for m1, c1 in p.items():
        for m2, c2 in q.items():
            m = _mono(m1 + m2) if m1 and m2 else m1 or m2
            out[m] = out.get(m, 0) + c1 * c2
    return out


def _merge_divmod(p: dict) -> dict:
    """``t * (x // k) * k + t * (x % k) -> t * x`` (``x == k * (x // k) + x % k`` for every
    integer x and k != 0), the same factor ``t`` (a coefficient times other atoms) on both."""
    changed = True
    while changed:
        changed = False
        for m, c in p.items():
            for i, atom in enumerate(m):
                if not (isinstance(atom, Mod) and type(atom.b) is int):
                    continue
                rest = m[:i] + m[i + 1:]
                quotient = floordiv(atom.a, atom.b)  # canonical: (x // 2) // 2 is x // 4
                if not isinstance(quotient, (str, DimExpr)) or isinstance(quotient, Poly):
                    continue
                partner = _mono(rest + (quotient,))
                if p.get(partner) != c * atom.b:
                    continue
                p = {k: v for k, v in p.items() if k not in (m, partner)}
                p = {k: v for k, v in _padd(p, _pmul({rest: c}, _poly(atom.a))).items() if v}
                changed = True
                break
            if changed:
                break
    return p


# -- operations ------------------------------------------------------------------------------


def simplify(d: Dim) -> Dim:
    """The canonical form of ``d`` (rebuilt through the rules; a canonical dim is returned
    unchanged)."""
    return substitute(d, {})


def add(a: Dim, b: Dim) -> Dim:
    a, b = _dim(a), _dim(b)
    if type(a) is int and type(b) is int:
        return a + b
    return _from_poly(_padd(_poly(a), _poly(b)))


def sub(a: Dim, b: Dim) -> Dim:
    a, b = _dim(a), _dim(b)
    if type(a) is int and type(b) is int:
        return a - b
    return _from_poly(_padd(_poly(a), _poly(b), -1))


def neg(a: Dim) -> Dim:
    return mul(-1, a)


def mul(a: Dim, b: Dim) -> Dim:
    a, b = _dim(a), _dim(b)
    if type(a) is int and type(b) is int:
        return a * b
    return _from_poly(_pmul(_poly(a), _poly(b)))


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` (floor). By an integer constant ``k > 0``, with ``a = k*q + r + c``, where
    ``q`` collects the parts of every coefficient that are multiples of ``k``, ``r`` the
    remainders (in ``0 .. k-1``) and ``c`` the constant's remainder: ``a // k = q + (r + c) // k``
    (exact: ``k*q`` is a multiple of k). Then ``(r + c) // k`` is reduced by the gcd of k and
    its coefficients, ``(x // j + c) // k -> (x + j*c) // (j*k)`` (floor of floor), and folded
    to a constant where the bounds of ``r + c`` lie in one multiple of k. A negative divisor
    becomes positive (``a // -k == -a // k``). A symbolic divisor ``b`` gives
    0 where ``0 <= a < b`` is provable, else ``a // b = t + (a - t*b) // b`` for an integer ``t``
    read off the leading coefficients (where ``a - t*b >= 0`` is provable); otherwise an opaque
    node. A symbolic divisor is assumed nonzero (the original is undefined where it is 0)."""
    a, b = _dim(a), _dim(b)
    if type(b) is int:
        return _floordiv_const(a, b)
    return _divmod_symbolic(a, b, FloorDiv)


def mod(a: Dim, b: Dim) -> Dim:
    """``a % b`` (floor: the result has the sign of b). By a constant ``k > 0`` every
    coefficient and the constant are reduced modulo k (``(k*t*m + s) % k == s % k``), atoms
    ``x % j`` with ``k | j`` become ``x`` (``x % j ≡ x`` modulo k), a common factor g of k and
    every coefficient comes out (``(g*s) % (g*k) == g * (s % k)``), and the result is ``s``
    itself (less a multiple of k) where the bounds of ``s`` lie in one multiple of k.
    ``a % -k == -(-a % k)``. A symbolic divisor as in :func:`floordiv`."""
    a, b = _dim(a), _dim(b)
    if type(b) is int:
        return _mod_const(a, b)
    return _divmod_symbolic(a, b, Mod)


def _floordiv_const(a: Dim, k: int) -> Dim:
    if k == 0:
        raise DimError(f"division by zero: {text(a)} // 0")
    if k < 0:
        return _floordiv_const(neg(a), -k)
    if type(a) is int:
        return a // k
    if k == 1:
        return a
    quotient, rest = {}, {}
    for m, c in _poly(a).items():
        quotient[m], rest[m] = divmod(c, k)
    rest = {m: c for m, c in rest.items() if c}
    if not any(rest):  # only the constant (0 <= c < k) is left: its quotient is 0
        return _from_poly(quotient)
    return add(_from_poly(quotient), _floordiv_reduced(rest, k))


def _floordiv_reduced(r: dict, k: int) -> Dim:
    """``r // k`` where every coefficient of r (and its constant) lies in 1 .. k-1."""
    g = math.gcd(k, *r.values())
    if g > 1:
        return floordiv(_from_poly({m: c // g for m, c in r.items()}), k // g)
    c = r.get((), 0)
    inner = [m for m in r if m]
    if len(inner) == 1 and r[inner[0]] == 1 and len(inner[0]) == 1:
        atom = inner[0][0]
        if isinstance(atom, FloorDiv) and type(atom.b) is int:  # (x // j + c) // k
            return floordiv(add(atom.a, atom.b * c), atom.b * k)
    s = _from_poly(r)
    lo, hi = _bounds(s)
    if _finite(lo, hi) and lo // k == hi // k:
        return lo // k
    return FloorDiv(s, k)


def _mod_const(a: Dim, k: int) -> Dim:
    if k == 0:
        raise DimError(f"modulo by zero: {text(a)} % 0")
    if k < 0:
        return neg(_mod_const(neg(a), -k))
    if type(a) is int:
        return a % k
    if k == 1:
        return 0
    r = {m: c % k for m, c in _poly(a).items()}
    if any(isinstance(x, Mod) and type(x.b) is int and x.b % k == 0 for m in r for x in m):
        return _mod_const(_from_poly(_pmul_atoms(r, lambda x: x.a if isinstance(x, Mod) and type(x.b) is int and x.b % k == 0 else x)), k)
    r = {m: c for m, c in r.items() if c}
    if not any(r):
        return r.get((), 0)
    g = math.gcd(k, *r.values())
    if g > 1:
        return mul(g, mod(_from_poly({m: c // g for m, c in r.items()}), k // g))
    s = _from_poly(r)
    lo, hi = _bounds(s)
    if _finite(lo, hi) and lo // k == hi // k:
        return sub(s, k * (lo // k))
    return Mod(s, k)


def _pmul_atoms(p: dict, change: Callable[[Dim], Dim]) -> dict:
    """``p`` with every atom replaced by ``change(atom)`` (a dim), multiplied out."""
    out: dict = {}
    for m, c in p.items():
        term = {(): c}
        for atom in m:
            term = _pmul(term, _poly(change(atom)))
        out = _padd(out, term)
    return out


def _divmod_symbolic(a: Dim, b: Dim, node: type) -> Dim:
    """``a // b`` or ``a % b`` for a symbolic b, assumed nonzero (where it is zero the original
    is undefined, so any value is sound there)."""
    if a == 0:
        return 0
    if provably_nonnegative(a) and provably_nonnegative(sub(sub(b, a), 1)):  # 0 <= a < b
        return 0 if node is FloorDiv else a
    pb, pa = _poly(b), _poly(a)
    lead, cb = sorted(pb.items(), key=_term_order)[0]
    if lead and pa.get(lead, 0) and pa[lead] % cb == 0:  # a = t*b + rest: a // b = t + rest // b
        t = pa[lead] // cb
        rest = sub(a, mul(t, b))
        if provably_nonnegative(rest):  # only where the rest stays a size, e.g. (n + m) // n
            return add(t, floordiv(rest, b)) if node is FloorDiv else mod(rest, b)
    return node(a, b)


def dmin(a: Dim, b: Dim, *more: Dim) -> Dim:
    """The least of the operands. Nested mins are flattened (``min(min(x, y) + p, z) =
    min(x + p, y + p, z)``); an operand provably >= another is dropped (the bounds of their
    difference, with symbols >= 0, say so): ``min(n, 0) -> 0``, ``min(n, n + 2) -> n``; then
    a part common to the rest comes out (``min(x + p, y + p) = min(x, y) + p`` for any p; p
    takes of each monomial the least coefficient an operand has: ``min(n + 1, m + 1) ->
    min(m, n) + 1``)."""
    return _minmax(Min, (a, b) + more)


def dmax(a: Dim, b: Dim, *more: Dim) -> Dim:
    """The greatest of the operands; as :func:`dmin`: ``max(n, n + 2) -> n + 2``."""
    return _minmax(Max, (a, b) + more)


def _minmax(node: type, args: tuple) -> Dim:
    ops = []
    for a in map(_dim, args):
        ops.extend(_flatten(node, a))
    kept: list = []
    for x in sorted(set(ops), key=_arg_order):
        if any(_dominated(node, x, y) for y in kept):
            continue
        kept = [y for y in kept if not _dominated(node, y, x)] + [x]
    if len(kept) == 1:
        return kept[0]
    # the common part comes out after pruning (it keeps their order): of each monomial, the
    # least coefficient any operand has (0 where one lacks it), so min(n + m, n * 2) is
    # n + min(m, n), and what _flatten distributes comes back out. A monomial that holds a min
    # (in a min) comes out only where all operands have it alike, lest an operand be left with
    # one that _flatten would take apart
    polys = [_poly(a) for a in kept]
    common = {}
    for m in {m for p in polys for m in p}:
        coefficients = [p.get(m, 0) for p in polys]
        if not any(type(atom) is node for atom in m) or len(set(coefficients)) == 1:
            common[m] = min(coefficients)
    rest = sorted((_from_poly(_padd(p, common, -1)) for p in polys), key=_arg_order)
    return add(node(tuple(rest)), _from_poly(common))


def _arg_order(d: Dim) -> tuple:
    return (type(d) is int, _key(d))  # constants last: min(n, 64)


def _flatten(node: type, a: Dim) -> list:
    """The operands ``a`` stands for in a min (max): ``min(x, y) + p`` is ``x + p, y + p``."""
    p = _poly(a)
    inner = [m for m, c in p.items() if c == 1 and len(m) == 1 and type(m[0]) is node]
    if len(inner) != 1 or any(inner[0][0] in m for m in p if m != inner[0]):
        return [a]
    offset = _from_poly({m: c for m, c in p.items() if m != inner[0]})
    return [add(x, offset) for x in inner[0][0].args]


def _dominated(node: type, x: Dim, y: Dim) -> bool:
    """Whether x can be dropped from a min (x >= y) or a max (x <= y) beside y."""
    return provably_nonnegative(sub(x, y) if node is Min else sub(y, x))


# -- bounds and proofs -----------------------------------------------------------------------
# An interval (lo, hi) of ints, with -inf / inf for no bound; symbols lie in [0, inf).


def _finite(lo, hi) -> bool:
    return lo != -math.inf and hi != math.inf


def _times(x, y):
    return 0 if x == 0 or y == 0 else x * y  # 0 * inf is 0: the interval hull stays right


def _imul(a: tuple, b: tuple) -> tuple:
    products = [_times(x, y) for x in a for y in b]
    return min(products), max(products)


def _ifloordiv(x, k: int):
    return x if x in (math.inf, -math.inf) else x // k


@functools.lru_cache(maxsize=16384)
def _bounds(d: Dim) -> tuple:
    if type(d) is int:
        return d, d
    if type(d) is str:
        return 0, math.inf
    if isinstance(d, Poly):
        lo = hi = 0
        for m, c in d.terms:
            term = (c, c)
            for atom in m:
                term = _imul(term, _bounds(atom))
            lo, hi = lo + term[0], hi + term[1]
        return lo, hi
    if isinstance(d, MinMax):
        bounds = [_bounds(a) for a in d.args]
        pick = min if type(d) is Min else max
        return pick(b[0] for b in bounds), pick(b[1] for b in bounds)
    (alo, ahi), (blo, bhi) = _bounds(d.a), _bounds(d.b)
    if isinstance(d, FloorDiv):
        if type(d.b) is int:
            return _ifloordiv(alo, d.b), _ifloordiv(ahi, d.b)
        if blo >= 1 and alo >= 0:
            return 0, _ifloordiv(ahi, blo)
        return -math.inf, math.inf
    if blo >= 1:  # Mod with a positive divisor: 0 .. b - 1, and no more than a if a >= 0
        return 0, min(bhi - 1, ahi) if alo >= 0 else bhi - 1
    return -math.inf, math.inf


def bounds(d: Dim) -> tuple:
    """An interval ``(lo, hi)`` that holds every value of ``d`` with symbols >= 0 (``-inf`` /
    ``inf`` where unbounded). Sound, not tight: terms are bounded one by one."""
    return _bounds(_dim(d))


def provably_nonnegative(d: Dim) -> bool:
    """True only if ``d >= 0`` for every binding of its symbols to integers >= 0 (False when
    unsure)."""
    return _bounds(_dim(d))[0] >= 0


def provably_equal(a: Dim, b: Dim) -> bool:
    """True only if ``a == b`` for every binding of the symbols >= 0 (False when unsure)."""
    d = sub(a, b)
    return d == 0 or _bounds(d) == (0, 0)


# -- evaluation and substitution -------------------------------------------------------------


def evaluate(d: Dim, bindings: dict[str, int]) -> int:
    """The value of ``d`` with its symbols bound, exactly (Python ints, floor semantics)."""
    d = _dim(d)
    if type(d) is int:
        return d
    if type(d) is str:
        if d not in bindings:
            raise DimError(f"symbol '{d}' is not bound")
        value = bindings[d]
        if type(value) is not int or value < 0:
            raise DimError(f"symbol '{d}' is bound to {excerpt(repr(value), 40)}; a shape symbol is an integer >= 0")
        return value
    if isinstance(d, Poly):
        return sum(c * math.prod(evaluate(a, bindings) for a in m) for m, c in d.terms)
    if isinstance(d, MinMax):
        values = [evaluate(a, bindings) for a in d.args]
        return min(values) if type(d) is Min else max(values)
    a, b = evaluate(d.a, bindings), evaluate(d.b, bindings)
    if b == 0:
        raise DimError(f"division by zero in {text(d)}: {text(d.b)} is 0")
    return a // b if isinstance(d, FloorDiv) else a % b


def free_symbols(d: Dim) -> frozenset[str]:
    d = _dim(d)
    if type(d) is int:
        return frozenset()
    if type(d) is str:
        return frozenset((d,))
    if isinstance(d, Poly):
        return frozenset().union(*(free_symbols(a) for m, _ in d.terms for a in m))
    if isinstance(d, MinMax):
        return frozenset().union(*map(free_symbols, d.args))
    return free_symbols(d.a) | free_symbols(d.b)


def substitute(d: Dim, mapping: dict[Dim, Dim]) -> Dim:
    """``d`` with each symbol in ``mapping`` replaced by its dim, simplified. A key may also be
    a node atom (``(n + 1) // 2``, ``min(n, 64)``), replaced wherever it occurs as an atom;
    sound as long as the replacement has the atom's value."""
    d = _dim(d)
    if type(d) is int:
        return d
    if type(d) is str:
        return _dim(mapping.get(d, d))
    if not isinstance(d, Poly) and d in mapping:
        return _dim(mapping[d])
    if isinstance(d, Poly):
        return _from_poly(_pmul_atoms(dict(d.terms), lambda atom: substitute(atom, mapping)))
    if isinstance(d, MinMax):
        return _minmax(type(d), tuple(substitute(a, mapping) for a in d.args))
    a, b = substitute(d.a, mapping), substitute(d.b, mapping)
    return floordiv(a, b) if isinstance(d, FloorDiv) else mod(a, b)


def solve(d: Dim, value: int) -> dict[str, int] | None:
    """The binding ``{n: v}`` that makes ``d`` equal ``value``, when ``d`` is linear in one
    symbol (``a*n + b``); ``{}`` when ``d`` is the constant ``value``. None when ``d`` is not of
    that form (the caller must bind its symbols elsewhere). Raises DimError when no binding
    with ``n >= 0`` gives ``value``."""
    d = _dim(d)
    if type(d) is int:
        if d != value:
            raise DimError(f"expected a dimension of {d}, got {value}")
        return {}
    p = _poly(d)
    symbols = [m for m in p if m]
    if len(symbols) != 1 or len(symbols[0]) != 1 or type(symbols[0][0]) is not str:
        return None
    (symbol,), a, b = symbols[0], p[symbols[0]], p.get((), 0)
    n, remainder = divmod(value - b, a)
    if remainder:
        raise DimError(f"no value of {symbol} makes {text(d)} equal {value}: {value - b} is not a multiple of {a}")
    if n < 0:
        raise DimError(f"{text(d)} equals {value} only at {symbol} = {n}; a shape symbol is >= 0")
    return {symbol: n}


# -- text ------------------------------------------------------------------------------------
# Precedences: sums, products (* // %, left-associative), unary minus, atoms.
_ADD, _MUL, _NEG, _ATOM = 1, 2, 3, 4


def text(d: Dim) -> str:
    """The printed form: ``n * 4 + 2``, ``(n + 1) // 2 - 1``, ``min(n, 64)``."""
    return _fmt(_dim(d))[0]


def _wrap(part: tuple, need: bool) -> str:
    return f"({part[0]})" if need else part[0]


def _fmt(d: Dim) -> tuple[str, int]:
    if type(d) is int:
        return (str(d), _ATOM) if d >= 0 else (str(d), _NEG)
    if type(d) is str:
        return d, _ATOM
    if isinstance(d, Poly):
        terms = [t for t in d.terms if t[1] > 0] + [t for t in d.terms if t[1] < 0]
        out = _fmt_term(*terms[0])
        for m, c in terms[1:]:
            part = _fmt_term(m, abs(c))
            out = (f"{out[0]} {'+' if c > 0 else '-'} {_wrap(part, part[1] <= _ADD)}", _ADD)
        return out
    if isinstance(d, MinMax):
        name = "min" if type(d) is Min else "max"
        inner = text(d.args[-1])
        for a in reversed(d.args[:-1]):
            inner = f"{name}({text(a)}, {inner})"
        return inner, _ATOM
    op = "//" if isinstance(d, FloorDiv) else "%"
    left, right = _fmt(d.a), _fmt(d.b)
    return f"{_wrap(left, left[1] < _MUL)} {op} {_wrap(right, right[1] <= _MUL)}", _MUL


def _fmt_term(m: Mono, c: int) -> tuple[str, int]:
    """``c * m`` as a left-associative product, the coefficient last (``n * m * 4``)."""
    if not m:
        return _fmt(c)
    first = _fmt(m[0])
    if c < 0:
        first = (f"-{_wrap(first, first[1] < _NEG)}", _NEG)
    out = first
    for factor in list(m[1:]) + ([abs(c)] if abs(c) != 1 else []):
        part = _fmt(factor)
        out = (f"{_wrap(out, out[1] < _MUL)} * {_wrap(part, part[1] <= _MUL)}", _MUL)
    return out


_TOKEN = re.compile(r"\s*(?:(?P<int>[0-9]+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*%(),])|(?P<bad>\S))")


def parse(source: str, file: str = "<dim>", line: int = 1, column: int = 1) -> Dim:
    """The dim that ``source`` writes (``n * 4 + 2``, ``min(n, 64)``), simplified. Symbols are
    identifiers, integers non-negative literals (``-`` is an operator), operators ``+ - * // %``
    with Python's precedence, calls ``min(a, b)`` and ``max(a, b)``, and parentheses. A
    DimSyntaxError names the bad token and its column (``column`` is that of the first
    character, where ``source`` sits inside a longer line)."""
    return _Parser(source, file, line, column).parse()


class _Parser:
    """Recursive descent over ``sum := product (('+' | '-') product)*``,
    ``product := unary (('*' | '//' | '%') unary)*``, ``unary := '-' unary | atom``,
    ``atom := INT | NAME | ('min' | 'max') '(' sum ',' sum ')' | '(' sum ')'``."""

    def __init__(self, source: str, file: str, line: int, column: int):
        self.source, self.file, self.line, self.column = source, file, line, column
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while (match := _TOKEN.match(source, pos)) is not None:  # None: only spaces are left
            kind = match.lastgroup
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            pos = match.end()
        self.tokens.append(("end", "", len(source.rstrip())))
        self.pos = 0
        self.depth = 0

    def parse(self) -> Dim:
        if self.tokens[0][0] == "end":
            self.fail(self.tokens[0], "expected a dimension")
        value = self.sum()
        if self.peek()[0] != "end":
            self.fail(self.peek(), "expected an operator or the end of the dimension")
        return value

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.pos]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expect(self, op: str) -> None:
        if self.peek()[1] != op or self.peek()[0] != "op":
            self.fail(self.peek(), f"expected '{op}'")
        self.take()

    def span(self, token) -> Span:
        col = self.column + token[2]
        return Span(self.file, self.line, col, col + max(1, len(token[1])), self.source)

    def fail(self, token, why: str):
        found = "the end of the dimension" if token[0] == "end" else f"'{token[1]}'"
        col = self.column + token[2]
        hint = "floor division is written //" if token[1] == "/" else None
        raise DimSyntaxError(f"{why}, found {found} at column {col} of dimension '{excerpt(self.source, 80)}'",
                             self.span(token), hint)

    def nest(self, token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise LimitError(f"dimension nests deeper than MAX_NESTING = {MAX_NESTING}", self.span(token))

    def sum(self) -> Dim:
        value = self.product()
        while self.peek()[0] == "op" and self.peek()[1] in "+-":
            op = self.take()[1]
            value = (add if op == "+" else sub)(value, self.product())
        return value

    def product(self) -> Dim:
        value = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in ("*", "//", "%"):
            token = self.take()
            right = self.unary()
            try:
                value = {"*": mul, "//": floordiv, "%": mod}[token[1]](value, right)
            except DimError as err:  # a division by the constant 0
                raise err.with_span(self.span(token))
        return value

    def unary(self) -> Dim:
        token = self.peek()
        if token[0] == "op" and token[1] == "-":
            self.take()
            self.nest(token)
            value = neg(self.unary())
            self.depth -= 1
            return value
        return self.atom()

    def atom(self) -> Dim:
        token = self.take()
        kind, value = token[0], token[1]
        if kind == "int":
            check_int_digits(value, self.span(token), "dimension")
            return int(value)
        if kind == "name" and value in _FUNCTIONS:
            self.nest(token)
            self.expect("(")
            first = self.sum()
            self.expect(",")
            second = self.sum()
            if self.peek()[1] == "," and self.peek()[0] == "op":
                self.fail(self.peek(), f"{value} takes two arguments (nest it for more: {value}(a, {value}(b, c)))")
            self.expect(")")
            self.depth -= 1
            return (dmin if value == "min" else dmax)(first, second)
        if kind == "name":
            return value
        if kind == "op" and value == "(":
            self.nest(token)
            inner = self.sum()
            self.expect(")")
            self.depth -= 1
            return inner
        self.fail(token, "expected a dimension (an integer, a symbol, min(a, b), max(a, b) or '(')")


# -- C ---------------------------------------------------------------------------------------

C_HELPERS = r"""#ifndef DPL_DIM_HELPERS
#define DPL_DIM_HELPERS
#ifndef __CUDACC_RTC__
#include <stdint.h>
#endif
#ifdef __CUDACC__
#define DPL_DIM_FN static inline __host__ __device__
#else
#define DPL_DIM_FN static inline
#endif
/* floor division and modulo (C's / and % truncate towards zero; dims use floor semantics) */
DPL_DIM_FN int64_t dpl_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
DPL_DIM_FN int64_t dpl_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
DPL_DIM_FN int64_t dpl_min(int64_t a, int64_t b) { return a < b ? a : b; }
DPL_DIM_FN int64_t dpl_max(int64_t a, int64_t b) { return a > b ? a : b; }
#endif
"""


def to_c(d: Dim, symbol: Callable[[str], str]) -> str:
    """``d`` as a C expression of type int64_t; ``symbol(name)`` is the C expression of a
    symbol's value. Floor division, modulo, min and max call the functions of
    :data:`C_HELPERS`, which the translation unit must include (under NVRTC, which has no
    <stdint.h>, after its own ``int64_t`` typedef, as the CUDA emitter's prelude has)."""
    d = _dim(d)
    if type(d) is int:
        return f"((int64_t){d})"
    if type(d) is str:
        return f"((int64_t)({symbol(d)}))"
    if isinstance(d, Poly):
        parts = []
        for m, c in d.terms:
            factors = ([f"((int64_t){abs(c)})"] if abs(c) != 1 or not m else []) + [to_c(a, symbol) for a in m]
            parts.append(("- " if c < 0 else "+ ") + " * ".join(factors))
        head = parts[0][2:] if parts[0][0] == "+" else "-" + parts[0][2:]
        return "(" + " ".join([head] + parts[1:]) + ")"
    if isinstance(d, MinMax):
        name = "dpl_min" if type(d) is Min else "dpl_max"
        out = to_c(d.args[-1], symbol)
        for a in reversed(d.args[:-1]):
            out = f"{name}({to_c(a, symbol)}, {out})"
        return out
    name = "dpl_floordiv" if isinstance(d, FloorDiv) else "dpl_mod"
    return f"{name}({to_c(d.a, symbol)}, {to_c(d.b, symbol)})"
