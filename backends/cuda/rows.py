"""Row kernels that know the hardware: what the CUDA emitter adds to a block-per-row nest
(softmax, RMSNorm, LayerNorm, add+RMSNorm, any row reduction ``cuda.emitter`` gives a block).

- **Staged rows.** An input row that several passes over the row read (softmax reads ``x``
  for its maximum, its sum and its output; RMSNorm twice; add+RMSNorm ``x`` and the residual
  twice) is copied once into shared memory at the start of the row, by 16-byte vectors
  (``uint4``: four floats, eight halves or bfloat16s, two doubles) where the row starts on a
  16-byte boundary and element by element otherwise (an odd length puts every other row off
  it; a view at an offset, every row); the passes then read shared memory, so the row leaves
  global memory once. A static row is staged when the staged rows of the nest fit in
  ``STAGE_BYTES``; a symbolic row gets an equal share of it, and a run-time test on the
  row's length (uniform across the block) reads global memory instead when the row is longer.
  The budget is the kernel's, shared by all its block nests (static shared memory is per
  kernel: 48 KiB at most, which ptxas enforces; ``nvrtc.compile_cubin`` checks it).
  Two barriers per row: before the copy (the previous row's readers are done) and after it.
- **Vector stores.** A row loop whose body is lets and stores, storing contiguously into
  outputs (``out[row..., i]``, the row part free of ``i``), runs ``VECTOR / itemsize`` lanes
  per thread: the lanes' values go to a register array (``__align__(16)``, unrolled), then out
  as 16-byte stores. The lanes start at the row's first 16-byte boundary (an odd length or a
  view at an offset moves it): the elements before it are a head chunk and the ones past the
  last whole vector a tail, both stored element by element; so are all of a row whose vector
  outputs do not share a boundary (different offsets modulo 16 bytes). The whole lanes go out
  through ``__stcg`` (``st.global.cg.v4``): a plain ``uint4`` assignment is merged with the
  element-by-element branch and split into scalar stores by NVVM.

Which rows and which loops is decided here from the kernel IR alone (:func:`staged_rows`,
:func:`vector_stores`); the decisions are correct for every input the IR allows because
whatever depends on the data's address or a symbolic length is tested at run time.
"""

from __future__ import annotations

import attrs

from dpl.kernel.ir import Const, Let, Load, Loop, Reduce, Select, Store, Var, dim_expr, free_vars, walk, walk_exprs

STAGE_BYTES = 32 << 10  # shared memory a block's staged rows may take (of a block's 48 KiB of static shared memory)
VECTOR = 16  # bytes per vector load or store (uint4)
MIN_STAGE = 256  # a symbolic row's share below this many elements is not worth a stage

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}
VECTOR_STORE_DTYPES = frozenset(d for d, n in ITEMSIZE.items() if n >= 2)  # at most 8 lanes


@attrs.frozen
class Staged:
    """One input's row held in shared memory: ``buffer[prefix..., 0:extent]`` in ``array``
    (``capacity`` elements); ``fits`` is the C condition for using it (``"1"`` when static)."""

    buffer: str
    prefix: tuple = attrs.field(converter=tuple)
    extent: object = None
    capacity: int = 0
    array: str = ""
    fits: str = "1"


def _row_passes(body) -> list[tuple[str, object]]:
    """(variable, extent) of each walk over the row among a block nest's statements: a
    one-axis reduction, or a loop."""
    passes = []
    for s in body:
        if isinstance(s, Reduce) and len(s.axes) == 1:
            passes.append((s.axes[0].var.name, s.axes[0].extent))
        elif isinstance(s, Loop):
            passes.append((s.var.name, s.extent))
    return passes


def _loads(stmts):
    """Every Load in the statements (values, indices, extents, nested bodies)."""
    for s in walk(stmts):
        exprs = []
        if isinstance(s, Let):
            exprs = [s.value]
        elif isinstance(s, Store):
            exprs = [s.value, *s.indices]
        elif isinstance(s, Reduce):
            exprs = [s.value, s.init, *(a.extent for a in s.axes)]
        elif isinstance(s, Loop):
            exprs = [s.extent]
        for e in exprs:
            for x in walk_exprs(e):
                if isinstance(x, Load):
                    yield x


def _same_extent(extent, dim) -> bool:
    """The IR extent of a row walk is the buffer dim ``dim`` (an int or a symbolic name)."""
    if isinstance(dim, str):
        return isinstance(extent, Var) and extent.name == dim
    if not isinstance(dim, int):  # an expression: the lowering spells it as dim_expr does
        return extent == dim_expr(dim)
    return isinstance(extent, Const) and int(extent.value) == int(dim)


def staged_rows(kernel, loops, body, names, itemsize=ITEMSIZE, budget: int = STAGE_BYTES) -> list[Staged]:
    """The input rows of a block nest (its collapsed ``loops``, its row ``body``) to stage.

    A parameter qualifies when every load of it in the body reads ``x[l..., v]``: ``l`` the
    nest's loop variables, each running over exactly the buffer's dim there (so the whole row
    is in bounds whatever guards the loads), the same for every load, and ``v`` the variable
    of a row pass whose extent is the buffer's last dim; and when two or more passes read it.
    ``names`` is the emitter's ``CNames`` (for the shared arrays' names)."""
    passes = dict(_row_passes(body))
    nest = {lp.var.name: lp.extent for lp in loops}
    params = {b.name: b for b in kernel.params}
    found: dict[str, tuple] = {}  # buffer -> prefix, or None when disqualified
    readers: dict[str, set] = {}
    for load in _loads(body):
        buf = params.get(load.buffer)
        if buf is None or found.get(load.buffer, ()) is None:
            continue
        *prefix, last = load.indices
        ok = (len(load.indices) == len(buf.shape) >= 1 and isinstance(last, Var) and last.name in passes
              and _same_extent(passes[last.name], buf.shape[-1])
              and all(isinstance(p, Var) and p.name in nest and _same_extent(nest[p.name], d)
                      for p, d in zip(prefix, buf.shape[:-1])))
        if not ok or found.setdefault(load.buffer, tuple(prefix)) != tuple(prefix):
            found[load.buffer] = None
            continue
        readers.setdefault(load.buffer, set())
    for k, s in enumerate(body):  # which passes read each candidate
        for load in _loads([s]):
            if found.get(load.buffer) is not None:
                readers[load.buffer].add(k)
    chosen = [b for b in params if found.get(b) is not None and len(readers[b]) >= 2]
    out, left = [], budget
    static = [b for b in chosen if isinstance(params[b].shape[-1], int)]
    symbolic = [b for b in chosen if not isinstance(params[b].shape[-1], int)]
    for b in static:
        size = max(1, params[b].shape[-1]) * itemsize[params[b].dtype]
        size = -(-size // VECTOR) * VECTOR
        if size > left:
            continue
        left -= size
        out.append(Staged(b, found[b], _extent(params[b].shape[-1]), size // itemsize[params[b].dtype],
                          names.internal("row"), "1"))
    for b in symbolic:
        share = left // len(symbolic) // VECTOR * VECTOR
        capacity = share // itemsize[params[b].dtype]
        if capacity < MIN_STAGE:
            continue
        out.append(Staged(b, found[b], _extent(params[b].shape[-1]), capacity, names.internal("row"),
                          names.internal("fits")))
    return out


def _extent(dim):
    return dim_expr(dim)


def vector_stores(kernel, loop: Loop) -> list[Store]:
    """The stores of a row loop written by vectors: its body only lets and stores, each such
    store into an output of at least two bytes an element, at ``[p..., i]`` with ``p`` free of
    the loop variable ``i`` and of the body's lets. Empty when none qualifies."""
    if not all(isinstance(s, (Let, Store)) for s in loop.body):
        return []
    outputs = {b.name: b for b in kernel.outputs}
    local = {loop.var.name} | {s.name for s in loop.body if isinstance(s, Let)}
    found = []
    for s in loop.body:
        if not isinstance(s, Store) or s.buffer not in outputs or not s.indices:
            continue
        buf = outputs[s.buffer]
        *prefix, last = s.indices
        if buf.dtype not in VECTOR_STORE_DTYPES or not (isinstance(last, Var) and last.name == loop.var.name):
            continue
        if any(free_vars(p) & local for p in prefix) or any(isinstance(x, Select) for p in prefix for x in walk_exprs(p)):
            continue
        if sum(1 for t in loop.body if isinstance(t, Store) and t.buffer == s.buffer) != 1:
            continue  # one store per output and lane: the register array holds it
        found.append(s)
    return found


__all__ = ["MIN_STAGE", "STAGE_BYTES", "Staged", "VECTOR", "staged_rows", "vector_stores"]
