"""A short outer axis that an innermost loop reads interleaved is unrolled into that loop.

T5's position bias is a ``permute_dims`` of a [S, S, H] table to [H, S, S] with H = 4: the
nest runs ``for h < 4: for i: for j`` and reads ``table[(i * S + j) * 4 + h]``, a gather of
stride 4 in the vectorised loop over ``j`` (0.73 ms at S = 512, or no vectors at all when the
read sits under a select). With the ``h`` loop unrolled inside the ``j`` loop, the four reads
of one ``j`` are adjacent: GCC loads them as one group of whole vectors and separates them
with shuffles, and each of the four stores is still contiguous in ``j`` (0.13 ms).

The loops of a kernel nest are parallel (the outermost runs as an OpenMP loop, the innermost
as ``omp simd``), so any order of their iterations computes the same values. A nest is
changed only where it is perfect (each level one loop, down to an innermost loop of lets and
stores); the short loop is any level above the innermost (a batch loop may enclose it) whose
extent ``A`` is a constant of at most ``MAX_UNROLL`` and no inner extent reads, some read
steps by 1 element with the short variable and by exactly ``A`` with the innermost one, and
every store steps by 1 element with the innermost variable.

The mirror case: a short *innermost* loop whose stores interleave, as a permute to channels
last writes an image of three channels (``x[c, i, j] -> y[i, j, c]``: ``for j: for c < 3``,
the vectors three lanes wide, each a gather from three planes). The short loop is unrolled into
the loop above it, which becomes the innermost: each of its reads is contiguous in ``j`` and
GCC stores the three values of a ``j`` as one interleaved group (ResNet's 3 x 224 x 224 input
79 -> 29 us, one thread, a Zen 3 core). It applies where the innermost extent ``A`` is a
constant of at most ``MAX_UNROLL``, every store steps by 1 element with it and by ``A`` with the
loop above, and some read steps by 1 element with the loop above and not with the short one.
"""

from __future__ import annotations

import attrs

from dpl.kernel.ir import INDEX, Bin, Const, Kernel, Let, Load, Store, Var, free_vars, substitute, walk_exprs
from dpl.kernel.loop_split import buffer_shapes, fresh, names_in, perfect_nest

# below the transposing tiles' side (cgen.emitter.TRANSPOSE_TILE): two axes of 16 and more are a
# transpose, which the emitter runs in tiles turned in registers
MAX_UNROLL = 15


def unroll_short_axes(kernel: Kernel) -> Kernel:
    """``kernel`` with each such nest's short loop unrolled into its innermost loop (see
    the module docstring); the kernel itself when there is none."""
    taken = names_in(kernel)
    shapes = buffer_shapes(kernel)
    body = tuple(_nest(s, taken, shapes) for s in kernel.body)
    return kernel if body == tuple(kernel.body) else attrs.evolve(kernel, body=body)


def _short(loop) -> int | None:
    """The loop's extent where it is a constant from 2 to ``MAX_UNROLL``."""
    n = loop.extent.value if isinstance(loop.extent, Const) else None
    return n if isinstance(n, int) and 2 <= n <= MAX_UNROLL else None


def _nest(s, taken: set[str], shapes: dict):
    chain = perfect_nest(s)
    if chain is None:
        return s
    inner = chain[-1]
    for at, short in enumerate(chain[:-1]):
        n = _short(short)
        if n is None:
            continue
        a, b = short.var.name, inner.var.name
        if not any(a in free_vars(x.extent) for x in chain[at + 1:]) and _interleaved(inner.body, a, b, n, shapes):
            nest = attrs.evolve(inner, body=_unrolled(inner.body, a, n, taken))
            for level in reversed(chain[:at] + chain[at + 1:-1]):  # the short loop taken out of the nest
                nest = attrs.evolve(level, body=(nest,))
            return nest
    n, above = _short(inner), chain[-2]
    if n is not None and _stores_interleaved(inner.body, above.var.name, inner.var.name, n, shapes):
        nest = attrs.evolve(above, body=_unrolled(inner.body, inner.var.name, n, taken))  # the loop above innermost now
        for level in reversed(chain[:-2]):
            nest = attrs.evolve(level, body=(nest,))
        return nest
    return s


def _unrolled(body, a: str, n: int, taken: set[str]) -> tuple:
    """``body`` once for each value 0 .. n - 1 of loop variable ``a``, its lets renamed apart."""
    copies = []
    for k in range(n):
        renamed: dict[str, Var] = {}
        for x in body:
            env = {a: Const(k, INDEX), **renamed}
            if isinstance(x, Let):
                name = fresh(f"{x.name}_{k}", taken)
                copies.append(Let(name, substitute(x.value, env)))
                renamed[x.name] = Var(name, x.value.dtype)
            else:
                copies.append(Store(x.buffer, tuple(substitute(i, env) for i in x.indices), substitute(x.value, env)))
    return tuple(copies)


def _stores_interleaved(body, a: str, b: str, n: int, shapes: dict) -> bool:
    """Whether every store of the innermost body (short variable ``b`` of extent ``n``, ``a``
    the loop above) steps by 1 with ``b`` and by ``n`` with ``a``, and some read by 1 with ``a``
    and not with ``b``."""
    stores = [x for x in body if isinstance(x, Store)]
    if not stores or any(_flat_step(x.buffer, x.indices, b, shapes) != 1 or _flat_step(x.buffer, x.indices, a, shapes) != n
                         for x in stores):
        return False
    return any(isinstance(e, Load) and _flat_step(e.buffer, e.indices, a, shapes) == 1
               and _flat_step(e.buffer, e.indices, b, shapes) != 1 for x in body for e in walk_exprs(x.value))


def _interleaved(body, a: str, b: str, n: int, shapes: dict) -> bool:
    stores = [x for x in body if isinstance(x, Store)]
    if not stores or any(_flat_step(x.buffer, x.indices, b, shapes) != 1 for x in stores):
        return False
    for x in body:
        for e in walk_exprs(x.value):
            if isinstance(e, Load) and _flat_step(e.buffer, e.indices, a, shapes) == 1 \
                    and _flat_step(e.buffer, e.indices, b, shapes) == n:
                return True
    return False


def _flat_step(buffer: str, indices, v: str, shapes: dict) -> int | None:
    """How far apart in memory (in elements, row-major) the elements that ``indices`` of
    ``buffer`` reads at ``v`` and ``v + 1`` lie, where that is a constant; None otherwise."""
    shape = shapes.get(buffer)
    if shape is None or len(shape) != len(indices):
        return None
    total, stride = 0, 1
    for index, dim in zip(reversed(indices), reversed(shape)):
        step = _step(index, v)
        if step is None or (step and stride is None):
            return None
        total += step * (stride or 0)
        stride = stride * dim if isinstance(stride, int) and isinstance(dim, int) else None
    return total


def _step(e, v: str) -> int | None:
    """How much ``e`` grows when loop variable ``v`` grows by one, where that is a constant
    (an index linear in ``v``); None otherwise."""
    if v not in free_vars(e):
        return 0
    if isinstance(e, Var):
        return 1
    if isinstance(e, Bin) and e.op in "+-":
        x, y = _step(e.a, v), _step(e.b, v)
        return None if x is None or y is None else x + y if e.op == "+" else x - y
    if isinstance(e, Bin) and e.op == "*":
        for f, c in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const) and isinstance(c.value, int):
                x = _step(f, v)
                return None if x is None else x * c.value
    return None
