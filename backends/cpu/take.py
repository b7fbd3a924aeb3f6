"""A lone ``take`` along an axis in C: an embedding lookup, a position table's rows.

Every text model's call starts with one or two lookups. As NumPy's take into the output each
took 10-30 us on the bench host (the index range checked by ``min`` and ``max``, then the
take), and, having no C call, it cut the call's prepared program (``dpl.runtime.prepared``) in
two with Python between the runs. Here one C routine (compiled once per backend, through its
kernel cache) copies the rows: for each block before the axis and each index, the block of
bytes after it, for any data of a fixed-size dtype and integer indices of any width. Negative
indices count from the end, as NumPy's do. Every index is checked before anything is written;
one out of range leaves the routine's error word set, which the caller turns into NumPy's
IndexError (a prepared call after its program, through ``CCall.check``), as the reference
backend raises it. Where the routine does not load, NumPy's take runs as before.
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

from dpl import dtypes
from dpl.backends.cpu import call_list
from dpl.backends.cpu.addresses import address
from dpl.backends.cpu.index_put import INDEX_AT, INDEX_CODES
from dpl.ir.expr import Call, Constant
from dpl.runtime.prepared import Address, CCall

SOURCE = INDEX_AT + r"""
/* p: x, indices, out, error word (int64[2]: set, the index). d: the blocks before the axis, the
   axis' size, the bytes after it (one row), how many indices, their code (index_at) */
void dpl_kernel(void **p, const int64_t *d) {  /* the kernel cache's entry name */
  const int64_t outer = d[0], n = d[1], row = d[2], count = d[3], code = d[4];
  const char *x = (const char *)p[0];
  const void *idx = p[1];
  char *out = (char *)p[2];
  int64_t *err = (int64_t *)p[3];
  err[0] = 0;
  for (int64_t j = 0; j < count; j++) {
    const int64_t v = index_at(idx, j, code);
    if (v < -n || v >= n) { err[0] = 1; err[1] = v; return; }
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < count; j++) {
      const int64_t v = index_at(idx, j, code);
      memcpy(out + (o * count + j) * row, x + (o * n + (v < 0 ? v + n : v)) * row, (size_t)row);
    }
}
"""


def routine(load) -> call_list.LoadedEntry:
    """The compiled routine of one backend (its kernel cache's ``load``), loaded at its first
    use; where it cannot be, NumPy's take runs."""
    return call_list.LoadedEntry(load, SOURCE, [ctypes.c_void_p, ctypes.c_void_p],
                                 "a lone take runs as NumPy's take: its C routine did not load")


def dims_of(x_shape, index_shape, axis: int, itemsize: int, index_dtype: str) -> tuple[int, ...] | None:
    """The routine's dims for these operands, or None where it does not apply (an index dtype
    of its own, uint64, which NumPy casts)."""
    if index_dtype not in INDEX_CODES:
        return None
    row = math.prod(x_shape[axis + 1:]) * itemsize
    return (math.prod(x_shape[:axis]), x_shape[axis], row, math.prod(index_shape), INDEX_CODES[index_dtype])


def _raise(word: np.ndarray, axis: int, size: int) -> None:
    index = int(word[1])
    word[0] = 0
    raise IndexError(f"index {index} is out of bounds for axis {axis} with size {size}")  # NumPy's words


def runner(function, routine: call_list.LoadedEntry | None = None, calls: call_list.CallList | None = None):
    """A lone ``take`` along an axis (the module text) as ``run(inputs, outputs)``, with
    ``run.prepare`` for a prepared call; or None for any other function."""
    if len(function.bindings) != 1 or function.ret is not function.bindings[0].var:
        return None
    call = function.bindings[0].value
    if not (isinstance(call, Call) and call.op == "take" and call.attrs.get("axis") is not None):
        return None
    params = {id(p): k for k, p in enumerate(function.params)}
    if len(call.args) != 2 or not all(isinstance(a, Constant) or id(a) in params for a in call.args):
        return None
    x_arg, index_arg = call.args
    axis = int(call.attrs["axis"]) % len(x_arg.ty.shape)
    operands = [(None, np.ascontiguousarray(a.value)) if isinstance(a, Constant) else (params[id(a)], None) for a in call.args]
    index_dtype, itemsize = index_arg.ty.dtype, np.dtype(dtypes.to_numpy(x_arg.ty.dtype)).itemsize
    word = np.zeros(2, np.int64)  # the error word of the unprepared path's calls
    lock = threading.Lock()

    def numpy_take(x, idx, out):
        n = x.shape[axis]
        if (idx.size and (idx.min() < -n or idx.max() >= n)) or not out.flags.c_contiguous or out.dtype != x.dtype:
            np.copyto(out, np.take(x, idx, axis=axis))  # NumPy's IndexError for an index out of range
            return
        np.take(x, idx, axis=axis, out=out, mode="wrap")  # every index in range: wrap only takes the negative ones

    def run(inputs, outputs):
        x, idx = (value if k is None else inputs[k] for k, value in operands)
        out = outputs[0]
        entry = routine() if routine is not None else None
        dims = dims_of(x.shape, idx.shape, axis, x.itemsize, index_dtype) if entry is not None else None
        if dims is None or not out.flags.c_contiguous or out.dtype != x.dtype:
            return numpy_take(x, idx, out)
        x, idx = np.ascontiguousarray(x), np.ascontiguousarray(idx)
        with lock:
            entry((ctypes.c_void_p * 4)(address(x), address(idx), address(out), word.ctypes.data),
                  (ctypes.c_int64 * len(dims))(*dims))
            if word[0]:
                _raise(word, axis, x.shape[axis])

    def prepare(inputs, outputs):
        entry = routine() if routine is not None else None
        if entry is None:
            return None
        (out_ref, _), = outputs
        spec = [inputs[k] if k is not None else (Address.of(v), v.shape) for k, v in operands]
        (_, x_shape), (_, index_shape) = spec
        dims = dims_of(tuple(x_shape), tuple(index_shape), axis, itemsize, index_dtype)
        if dims is None:
            return None
        error = np.zeros(2, np.int64)  # this call's error word, read after the program
        return [CCall(call_list.entry_address(entry), call_list.KERNEL, (spec[0][0], spec[1][0], out_ref, Address.of(error)),
                      dims, check=lambda: _raise(error, axis, x_shape[axis]) if error[0] else None)]

    run.__qualname__ = f"cpu-take:{function.name}"
    if calls is not None and routine is not None:
        run.prepare, run.call_list = prepare, calls  # type: ignore[attr-defined]
    return run
