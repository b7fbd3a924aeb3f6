"""Two adjacent loops that every access reads as one run of memory become one loop, where that
turns a nest into a transpose the emitter tiles.

A channels-last map sent back to NCHW (``permute_dims`` of [N, H, W, C] to [N, C, H, W], what
the convert-layout pass leaves where a CNN's values leave it) is lowered as ``for c: for h: for
w: out[c, h, w] = x[h, w, c]``: the innermost loop stores contiguously and reads at a stride of
C, and no two of its loops form the pair the emitter turns in tiles (its ``transposes`` wants
an outer loop read contiguously right around the innermost one). Every access takes ``h`` and
``w`` as adjacent dims, ``w`` the full extent of its dim, so ``h W + w`` is one index ``j``:
``for c: for j: out[c, j] = x[j, c]``, a transpose of [H W, C] that the emitter tiles (ResNet's
output, [1, 28, 28, 128]: see bench figures in the issue notes).

The loops of a kernel nest are parallel, so merging two of them computes the same values. A
pair is merged only in a perfect nest (each level one loop, an innermost loop of lets and
stores), where both extents are constants, neither variable appears anywhere but as a bare
index of adjacent dims ``(outer, inner)`` of every load and store that reads it, the inner one's
dim has the inner loop's extent, and the merged loop is the innermost one, its stores contiguous
in it while some load's last index is an outer loop's variable (the transpose the merge is for).
An index ``(outer, inner)`` becomes ``(0, j)``: the same element of the row-major buffer, as
the C emitter addresses it (a flat offset); the pass is the emitter's, after lowering, and its
indices are not for the NumPy evaluator, which checks each dim's bounds.
"""

from __future__ import annotations

import attrs

from dpl.kernel.ir import INDEX, Bin, Const, Kernel, Let, Load, Loop, Op, Select, Store, Var, free_vars, walk_exprs
from dpl.kernel.loop_split import buffer_shapes, fresh, names_in, perfect_nest


def collapse_transposes(kernel: Kernel) -> Kernel:
    """``kernel`` with the pair of loops of each such nest merged (see the module docstring);
    the kernel itself when there is none."""
    shapes = buffer_shapes(kernel)
    taken = names_in(kernel)
    body = tuple(_nest(s, shapes, taken) for s in kernel.body)
    return kernel if body == tuple(kernel.body) else attrs.evolve(kernel, body=body)


def _nest(s, shapes: dict, taken: set[str]):
    chain = perfect_nest(s)
    if chain is None or len(chain) < 3:
        return s
    outer, inner = chain[-2], chain[-1]
    if not all(isinstance(x.extent, Const) and isinstance(x.extent.value, int) for x in (outer, inner)):
        return s
    p, q, n = outer.var.name, inner.var.name, inner.extent.value
    body = inner.body
    accesses = [x for x in body if isinstance(x, Store)] + [e for x in body for e in walk_exprs(x.value) if isinstance(e, Load)]
    if any(not _pair_at(a.indices, p, q, shapes.get(a.buffer), n) for a in accesses):
        return s
    uses = sum(sum(v in (p, q) for v in _var_names(i)) for a in accesses for i in a.indices)
    if uses != _all_uses(body, p, q) or any({p, q} & free_vars(x.extent) for x in chain):
        return s  # p or q read elsewhere than as such an index
    stores = [x for x in body if isinstance(x, Store)]
    outer_vars = {x.var.name for x in chain[:-2]}
    if not stores or not all(_is(x.indices[-1], q) for x in stores) or not any(
            isinstance(e, Load) and e.indices and free_vars(e.indices[-1]) & outer_vars
            for x in body for e in walk_exprs(x.value)):
        return s  # no transpose to make
    j = Var(fresh(f"{p}_{q}", taken), INDEX)
    merged = Loop(j, Const(outer.extent.value * n, INDEX), tuple(_merged(x, p, q, j) for x in body))
    for level in reversed(chain[:-2]):
        merged = attrs.evolve(level, body=(merged,))
    return merged


def _is(e, name: str) -> bool:
    return isinstance(e, Var) and e.name == name


def _var_names(e) -> list[str]:
    return [x.name for x in walk_exprs(e) if isinstance(x, Var)]


def _all_uses(body, p: str, q: str) -> int:
    """How many times ``p`` or ``q`` is read in ``body`` (indices and values alike)."""
    count = 0
    for x in body:
        exprs = [x.value] + (list(x.indices) if isinstance(x, Store) else [])
        count += sum(sum(v in (p, q) for v in _var_names(e)) for e in exprs)
    return count


def _pair_at(indices, p: str, q: str, shape, n: int) -> bool:
    """Whether ``indices`` reads ``p`` and ``q`` as adjacent bare dims ``(p, q)``, ``q``'s dim of
    extent ``n`` (or reads neither)."""
    names = [_var_names(i) for i in indices]
    if not any(p in v or q in v for v in names):
        return True
    if shape is None or len(shape) != len(indices):
        return False
    at = [k for k, i in enumerate(indices) if _is(i, p)]
    if len(at) != 1 or at[0] + 1 >= len(indices) or not _is(indices[at[0] + 1], q) or shape[at[0] + 1] != n:
        return False
    return sum(p in v or q in v for v in names) == 2


def _merged(x, p: str, q: str, j: Var):
    """``x`` with each index ``(p, q)`` read as ``(0, j)``."""
    def indices(ix):
        ix = list(ix)
        for k in range(len(ix) - 1):
            if _is(ix[k], p) and _is(ix[k + 1], q):
                ix[k], ix[k + 1] = Const(0, INDEX), j
        return tuple(ix)

    def expr(e):
        if isinstance(e, Load):
            return attrs.evolve(e, indices=indices(tuple(expr(i) for i in e.indices)))
        if isinstance(e, Op):
            return attrs.evolve(e, args=tuple(expr(a) for a in e.args))
        if isinstance(e, Bin):
            return attrs.evolve(e, a=expr(e.a), b=expr(e.b))
        if isinstance(e, Select):
            return attrs.evolve(e, cond=expr(e.cond), a=expr(e.a), b=expr(e.b))
        return e

    if isinstance(x, Store):
        return Store(x.buffer, indices(x.indices), expr(x.value))
    return Let(x.name, expr(x.value))
