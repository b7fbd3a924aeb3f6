"""Innermost loops whose variable is read divided and remaindered by one constant run as two
loops: ``for i < E`` reading ``i / c`` and ``i % c`` becomes ``for hi < E / c: for lo < c``.

A reshape that merges axes indexes its operand with ``i / c`` and ``i % c`` of the merged
axis (attention's [b, h, s, d] read as [b, s, h * d]). In a vectorised innermost loop those
lanes are not provably contiguous, so GCC loads them with gathers (BERT's attention output,
1 MB, 0.17 ms a layer); split, the inner loop reads ``lo`` contiguously. Every ``i / c`` is
``hi``, every ``i % c`` is ``lo`` and any other read of ``i`` is ``hi * c + lo``: exact, as
the kernel IR's index arithmetic is on non-negative integers (``/`` floors). Only a loop of
constant extent that ``c`` divides is split, and only where ``c`` is at least ``MIN_INNER``
(a vector of float32 lanes on AVX-512), so that the inner loop still fills vectors.
"""

from __future__ import annotations

from collections import Counter

import attrs

from dpl.kernel.ir import INDEX, Bin, Const, Kernel, Let, Load, Loop, Op, Reduce, Select, Store, Var, children, walk

MIN_INNER = 16


def split_index_loops(kernel: Kernel) -> Kernel:
    """``kernel`` with each innermost loop that reads its variable as ``i / c`` and ``i % c``
    split in two (see the module docstring); the kernel itself when there is none."""
    taken = names_in(kernel)
    body = tuple(_stmt(s, taken) for s in kernel.body)
    return kernel if body == tuple(kernel.body) else attrs.evolve(kernel, body=body)


def names_in(kernel: Kernel) -> set[str]:
    """Every name a kernel binds: dims, lets, reductions, loop and axis variables."""
    names = set(kernel.dims)
    for s in walk(kernel.body):
        if isinstance(s, (Let, Reduce)):
            names.add(s.name)
        if isinstance(s, Loop):
            names.add(s.var.name)
        if isinstance(s, Reduce):
            names.update(a.var.name for a in s.axes)
    return names


def _stmt(s, taken: set[str]):
    if isinstance(s, Reduce):
        return attrs.evolve(s, body=tuple(_stmt(x, taken) for x in s.body))
    if not isinstance(s, Loop):
        return s
    if any(isinstance(x, (Loop, Reduce)) for x in walk(s.body)):
        return attrs.evolve(s, body=tuple(_stmt(x, taken) for x in s.body))
    c = _divisor(s)
    if c is None:
        return s
    hi, lo = Var(fresh(f"{s.var.name}_hi", taken)), Var(fresh(f"{s.var.name}_lo", taken))
    name = s.var.name

    def sub(e):
        if isinstance(e, Bin) and e.op in "/%" and e.a == Var(name) and e.b == Const(c, INDEX):
            return hi if e.op == "/" else lo
        if isinstance(e, Var):
            return Bin("+", Bin("*", hi, Const(c, INDEX)), lo) if e.name == name else e
        if isinstance(e, Load):
            return attrs.evolve(e, indices=tuple(sub(i) for i in e.indices))
        if isinstance(e, Op):
            return attrs.evolve(e, args=tuple(sub(a) for a in e.args))
        if isinstance(e, Bin):
            return Bin(e.op, sub(e.a), sub(e.b))
        if isinstance(e, Select):
            return Select(sub(e.cond), sub(e.a), sub(e.b))
        return e

    def rewrite(x):
        if isinstance(x, Let):
            return Let(x.name, sub(x.value))
        return Store(x.buffer, tuple(sub(i) for i in x.indices), sub(x.value))

    inner = Loop(lo, Const(c, INDEX), tuple(rewrite(x) for x in s.body))
    return Loop(hi, Const(int(s.extent.value) // c, INDEX), (inner,))


def _divisor(s: Loop) -> int | None:
    """The constant the loop's variable is most often divided or remaindered by, where the
    loop can be split by it (see the module docstring)."""
    if not (isinstance(s.extent, Const) and isinstance(s.extent.value, int)):
        return None
    found: Counter = Counter()

    def visit(e):
        if isinstance(e, Bin) and e.op in "/%" and e.a == Var(s.var.name) and isinstance(e.b, Const):
            found[int(e.b.value)] += 1
        for child in children(e):
            visit(child)

    for x in s.body:
        if not isinstance(x, (Let, Store)):
            return None
        for e in (x.value,) if isinstance(x, Let) else (*x.indices, x.value):
            visit(e)
    extent = int(s.extent.value)
    for c, _ in found.most_common():
        if MIN_INNER <= c < extent and extent % c == 0:
            return c
    return None


def fresh(base: str, taken: set[str]) -> str:
    """``base``, numbered if taken; added to ``taken``."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def buffer_shapes(kernel: Kernel) -> dict[str, tuple]:
    """Each buffer's shape by name: the kernel's parameters, outputs and constants."""
    shapes = {b.name: tuple(b.shape) for b in (*kernel.params, *kernel.outputs)}
    shapes.update((name, value.shape) for name, value in kernel.constants.items())
    return shapes


def perfect_nest(s) -> list[Loop] | None:
    """The loops of the perfect nest ``s`` opens, outermost first (each level one loop, the
    innermost one of lets and stores); None where ``s`` opens none of two loops or more."""
    if not isinstance(s, Loop):
        return None
    chain = [s]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop):
        chain.append(chain[-1].body[0])
    if len(chain) < 2 or not all(isinstance(x, (Let, Store)) for x in chain[-1].body):
        return None
    return chain
