"""A lone ``index_put`` in C: a static cache written at a decode step's positions.

Hugging Face's static cache writes each layer's new keys and values with ``index_copy_``, which
AOTAutograd hands dpl as ``index_put(cache, (i0, i1, position), values)``: 8 such steps in a
4-layer Llama's decode step. As NumPy's fancy indexing each took 30-70 us (index checks, the
broadcast of three index arrays, the copy of the cache) on one thread, and, having no C call, cut
the step's prepared call (``dpl.runtime.prepared``) into nine runs with Python between them.

Here one C routine (compiled once per backend, through its kernel cache) does the op for any
data of a fixed-size dtype: the index arrays (int8 to int64, each broadcast to their common
shape), negative indices counted from the end, values broadcast to the indexed shape, ``out``
a copy of ``data`` (none where they are one buffer) with the values written (``accumulate``:
added, for float32, float64, int32 and int64). Every index is checked before anything is
written; one out of range leaves the routine's error word set, which the caller turns into the
interpreter's error (a prepared call after its program, through ``CCall.check``). Repeated
indices: the last write wins, or they all add up in order, as NumPy's ``out[index] = values``
and ``np.add.at`` do. Where the routine does not apply (another accumulating dtype, tuple
parameters) the step runs as the op's NumPy reference.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import numpy as np

from dpl import dtypes
from dpl.backends.cpu import call_list
from dpl.backends.cpu.addresses import address
from dpl.errors import InterpretError
from dpl.ir.expr import Call, Constant, Tuple as TupleExpr, Var
from dpl.ir.types import TensorType, TupleType
from dpl.ops.indexing import index_put_into
from dpl.runtime.prepared import Address, CCall


# element e of an integer index array of the dtype INDEX_CODES gives `code`: the backend's index
# readers share it (take.py's too)
INDEX_AT = r"""
#include <stdint.h>
#include <string.h>

static int64_t index_at(const void *p, int64_t e, int64_t code) {
  switch (code) {
    case 0: return ((const int64_t *)p)[e];
    case 1: return ((const int32_t *)p)[e];
    case 2: return ((const int16_t *)p)[e];
    case 3: return ((const int8_t *)p)[e];
    case 4: return ((const uint8_t *)p)[e];
    case 5: return (int64_t)((const uint16_t *)p)[e];
    default: return (int64_t)((const uint32_t *)p)[e];
  }
}
"""
INDEX_CODES = {"int64": 0, "int32": 1, "int16": 2, "int8": 3, "uint8": 4, "uint16": 5, "uint32": 6}

SOURCE = INDEX_AT + r"""

/* p: data, K index arrays, values, out, error word (int64[3]: set, axis, index).
   d: K, nd, shape[nd], nb, bshape[nb], index strides[K][nb], index codes[K],
      value strides[nb + nd - K], itemsize, mode (0 write, 1 add), add code (0 f32, 1 f64, 2 i32, 3 i64) */
void dpl_kernel(void **p, const int64_t *d) {  /* the kernel cache's entry name */
  const int64_t K = d[0], nd = d[1];
  const int64_t *shape = d + 2;
  const int64_t nb = d[2 + nd];
  const int64_t *bshape = d + 3 + nd, *istr = bshape + nb, *icode = istr + K * nb, *vstr = icode + K;
  const int64_t nt = nd - K, item = vstr[nb + nt], mode = vstr[nb + nt + 1], code = vstr[nb + nt + 2];
  const char *data = (const char *)p[0], *vals = (const char *)p[K + 1];
  char *out = (char *)p[K + 2];
  int64_t *err = (int64_t *)p[K + 3];
  int64_t pos[16], dstr[16], nidx = 1, inner = 1, total = 1;
  for (int64_t b = 0; b < nb; b++) nidx *= bshape[b];
  for (int64_t a = nd - 1; a >= 0; a--) { dstr[a] = total; total *= shape[a]; }
  for (int64_t a = K; a < nd; a++) inner *= shape[a];
  err[0] = 0;
  for (int pass = 0; pass < 2; pass++) {  /* every index checked, then the writes */
    if (pass == 1) {
      if (out != data) memcpy(out, data, (size_t)(total * item));
      if (nidx == 0 || inner == 0) return;
    }
    for (int64_t b = 0; b < nb; b++) pos[b] = 0;
    for (int64_t n = 0; n < nidx; n++) {
      int64_t off = 0, voff = 0;
      for (int64_t a = 0; a < K; a++) {
        int64_t e = 0;
        for (int64_t b = 0; b < nb; b++) e += pos[b] * istr[a * nb + b];
        int64_t v = index_at(p[1 + a], e, icode[a]);
        if (v < -shape[a] || v >= shape[a]) { err[0] = 1; err[1] = a; err[2] = v; return; }
        off += (v < 0 ? v + shape[a] : v) * dstr[a];
      }
      if (pass == 1) {
        for (int64_t b = 0; b < nb; b++) voff += pos[b] * vstr[b];
        for (int64_t t = 0; t < inner; t++) {  /* the trailing block, its value offsets by its own index */
          int64_t rest = t, vo = voff;
          for (int64_t a = nt - 1; a >= 0; a--) { vo += (rest % shape[K + a]) * vstr[nb + a]; rest /= shape[K + a]; }
          char *dst = out + (off + t) * item;
          const char *src = vals + vo * item;
          if (mode == 0) memcpy(dst, src, (size_t)item);
          else if (code == 0) *(float *)dst += *(const float *)src;
          else if (code == 1) *(double *)dst += *(const double *)src;
          else if (code == 2) *(int32_t *)dst += *(const int32_t *)src;
          else *(int64_t *)dst += *(const int64_t *)src;
        }
      }
      for (int64_t b = nb - 1; b >= 0; b--) {  /* the next position of the broadcast indices */
        if (++pos[b] < bshape[b]) break;
        pos[b] = 0;
      }
    }
  }
}
"""

MAX_RANK = 16  # the routine's position and stride arrays
ADD_CODES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3}


def routine(load) -> call_list.LoadedEntry:
    """The compiled routine of one backend (its kernel cache's ``load``), loaded at its first
    use; where it cannot be, the NumPy reference runs, said once as a warning (a perf cliff)."""
    return call_list.LoadedEntry(load, SOURCE, [ctypes.c_void_p, ctypes.c_void_p],
                                 "a lone index_put runs as NumPy's indexing: its C routine did not load", logging.WARNING)


def _strides(shape, target) -> list[int] | None:
    """Element strides of a C-contiguous array of ``shape`` broadcast (right-aligned) to
    ``target``; None where it does not broadcast."""
    if len(shape) > len(target):
        return None
    own, step = [], 1
    for d in reversed(shape):
        own.append(step)
        step *= d
    own.reverse()
    out = [0] * (len(target) - len(shape))
    for d, t, s in zip(shape, target[len(target) - len(shape):], own):
        if d != t and d != 1:
            return None
        out.append(0 if d == 1 and t != 1 else s)
    return out


def dims_of(data_shape, index_shapes, index_dtypes, values_shape, dtype: str, accumulate: bool) -> tuple[int, ...] | None:
    """The routine's dims for these operands, or None where it does not apply."""
    K, nd = len(index_shapes), len(data_shape)
    if not 1 <= K <= nd or nd > MAX_RANK or any(t not in INDEX_CODES for t in index_dtypes):
        return None
    if accumulate and dtype not in ADD_CODES:
        return None
    nb = max(len(s) for s in index_shapes)
    bshape = []
    for b in range(nb):
        sizes = {s[b - nb + len(s)] for s in index_shapes if b - nb + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        bshape.append(sizes.pop() if sizes else 1)
    if nb > MAX_RANK:
        return None
    istr = []
    for s in index_shapes:
        istr += _strides(tuple(s), tuple(bshape))
    vstr = _strides(tuple(values_shape), (*bshape, *data_shape[K:]))
    if vstr is None:
        return None
    itemsize = np.dtype(dtypes.to_numpy(dtype)).itemsize
    return (K, nd, *data_shape, nb, *bshape, *istr, *(INDEX_CODES[t] for t in index_dtypes), *vstr, itemsize,
            int(accumulate), ADD_CODES.get(dtype, 0))


def _raise(word: np.ndarray, data_shape) -> None:
    axis, index = int(word[1]), int(word[2])
    word[0] = 0
    raise InterpretError(f"'index_put': index {index} is out of range for axis {axis} of size {data_shape[axis]}")


def runner(function, routine: call_list.LoadedEntry | None = None, calls: call_list.CallList | None = None):
    """A lone ``index_put`` (see the module text) as ``run(inputs, outputs)``, with ``run.prepare``
    for a prepared call where the routine applies; or None for any other function."""
    if len(function.bindings) != 1 or function.ret is not function.bindings[0].var:
        return None
    call = function.bindings[0].value
    if not (isinstance(call, Call) and call.op == "index_put"):
        return None
    flat, at = {}, 0  # a parameter's first position among the flat inputs (a tuple's fields in order)
    for p in function.params:
        flat[id(p)] = at
        at += len(p.ty.fields) if isinstance(p.ty, TupleType) else 1

    def operand(a):
        if isinstance(a, Constant):
            return None, np.ascontiguousarray(a.value)
        if isinstance(a, Var) and id(a) in flat and isinstance(a.ty, TensorType):
            return flat[id(a)], None
        return None

    data_arg, index_arg, values_arg = call.args
    if isinstance(index_arg, TupleExpr):
        fields = [operand(f) for f in index_arg.fields]
        index_dtypes = [f.ty.dtype for f in index_arg.fields]
    elif isinstance(index_arg, Var) and id(index_arg) in flat and isinstance(index_arg.ty, TupleType):
        fields = [(flat[id(index_arg)] + i, None) for i in range(len(index_arg.ty.fields))]
        index_dtypes = [t.dtype for t in index_arg.ty.fields]
    else:
        return None
    operands = [operand(data_arg), *fields, operand(values_arg)]
    if any(o is None for o in operands) or not all(isinstance(t, str) for t in index_dtypes):
        return None
    accumulate = bool(call.attrs.get("accumulate", False))
    dtype = function.ret.ty.dtype
    K = len(fields)
    word = np.zeros(3, np.int64)  # the error word of the general path's calls
    lock = threading.Lock()

    def value(o, inputs):
        k, v = o
        return v if k is None else inputs[k]

    def run(inputs, outputs):
        data, *indices, values = (value(o, inputs) for o in operands)
        out = outputs[0]
        dims = None
        entry = routine() if routine is not None else None
        if entry is not None and out.flags.c_contiguous and out.dtype == data.dtype:
            dims = dims_of(data.shape, [i.shape for i in indices], index_dtypes, values.shape, dtype, accumulate)
        if dims is None:
            index_put_into(out, data, indices, values, accumulate)
            return
        arrays = [np.ascontiguousarray(a) for a in (data, *indices, values)]
        with lock:
            ptrs = (ctypes.c_void_p * (K + 4))(*map(address, arrays), address(out), word.ctypes.data)
            entry(ptrs, (ctypes.c_int64 * len(dims))(*dims))
            if word[0]:
                _raise(word, data.shape)

    def prepare(inputs, outputs):
        entry = routine() if routine is not None else None
        if entry is None:
            return None
        (out_ref, out_shape), = outputs
        spec = [(inputs[k] if k is not None else (Address.of(v), v.shape)) for k, v in operands]
        shapes = [tuple(s) for _, s in spec]
        if shapes[0] != tuple(out_shape):
            return None
        dims = dims_of(shapes[0], shapes[1:-1], index_dtypes, shapes[-1], dtype, accumulate)
        if dims is None:
            return None
        error = np.zeros(3, np.int64)  # this call's error word, read after the program
        return [CCall(call_list.entry_address(entry), call_list.KERNEL, (*[ref for ref, _ in spec], out_ref, Address.of(error)),
                      dims, check=lambda: _raise(error, shapes[0]) if error[0] else None)]

    run.__qualname__ = f"cpu-index_put:{function.name}"
    # out may be data itself (dpl.runtime.plan.Plan.in_place): no copy then. Not when adding: a
    # call that failed after the write would be run again by torch on the values added to
    run.in_place = not accumulate  # type: ignore[attr-defined]
    if calls is not None and routine is not None:
        run.prepare, run.call_list = prepare, calls  # type: ignore[attr-defined]
    return run
