"""A prepared call's C calls run in one call into C (``dpl.runtime.prepared``): a list of
records, each a C entry, how to call it, its pointer arguments as entries of a table of
addresses, its dims and two integers, walked by a small C routine compiled once per backend
(through the kernel cache, like the kernels).

Three ways of calling, the entries the CPU backend makes: :data:`KERNEL`, a generated kernel
``entry(void **ptrs, const int64_t *dims)``, its OpenMP team capped at ``threads`` for the call
(the calling thread's setting restored after, as the kernel's Python runner does); and the
packed product routine's (``backends/cpu/packed_gemm.py``): :data:`PACKED`,
``dpl_kernel(A, P, C, dims, threads, bias, res, act)``, and :data:`SCRATCH`, ``dpl_batched`` and
``dpl_glu`` ``(A, B, C, dims, threads, scratch)``.

Measured on the bench host (``bench/bench_dispatch.py``): ctypes' call of one entry with its
arguments converted costs about a microsecond of Python; the whole list costs one.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Callable, Sequence

import numpy as np

from dpl.backends.cpu.addresses import address
from dpl.backends.registry import CompileError
from dpl.runtime.prepared import CCall

log = logging.getLogger(__name__)

KERNEL, PACKED, SCRATCH = 0, 1, 2

SOURCE = r"""
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
  void *entry;          /* the C function */
  const int32_t *args;  /* its pointer arguments: entries of the table (-1: NULL) */
  void **ptrs;          /* where they are gathered (one array per record: a prepared call is one thread's) */
  const int64_t *dims;
  int32_t kind, nargs, threads, code;
} dpl_record;

typedef void (*kernel_fn)(void **, const int64_t *);
typedef void (*packed_fn)(void *, void *, void *, const int64_t *, int, void *, void *, int);
typedef void (*scratch_fn)(void *, void *, void *, const int64_t *, int, void *);

static void capped(const dpl_record *r) {
#ifdef _OPENMP
  if (r->threads > 0) {
    const int before = omp_get_max_threads();
    if (before != r->threads) {
      omp_set_num_threads(r->threads);
      ((kernel_fn)r->entry)(r->ptrs, r->dims);
      omp_set_num_threads(before);
      return;
    }
  }
#endif
  ((kernel_fn)r->entry)(r->ptrs, r->dims);
}

/* runs records [0, n) in order, their pointers read from table */
void dpl_kernel(const dpl_record *records, int64_t n, void *const *table) {
  for (int64_t i = 0; i < n; i++) {
    const dpl_record *r = records + i;
    void **p = r->ptrs;
    for (int32_t j = 0; j < r->nargs; j++) p[j] = r->args[j] < 0 ? 0 : table[r->args[j]];
    switch (r->kind) {
      case 0: capped(r); break;
      case 1: ((packed_fn)r->entry)(p[0], p[1], p[2], r->dims, r->threads, p[3], p[4], r->code); break;
      case 2: ((scratch_fn)r->entry)(p[0], p[1], p[2], r->dims, r->threads, p[3]); break;
    }
  }
}
"""

ARGS_OF = {KERNEL: None, PACKED: 5, SCRATCH: 4}  # pointer arguments a kind takes (KERNEL: any number)


# the C struct dpl_record, as NumPy lays it out (pointers as addresses)
RECORD = np.dtype([("entry", np.uintp), ("args", np.uintp), ("ptrs", np.uintp), ("dims", np.uintp), ("kind", np.int32),
                   ("nargs", np.int32), ("threads", np.int32), ("code", np.int32)], align=True)


def entry_address(fn) -> int:
    """The address of a ctypes function of a loaded library."""
    return ctypes.cast(fn, ctypes.c_void_p).value


class LoadedEntry:
    """``dpl_kernel`` of a C source of the backend's own, built through its kernel cache
    (``load``) and loaded at the first call; None where it cannot be had (a package's prebuilt
    kernels that lack it, a compile error), said once at ``level`` with ``why``."""

    def __init__(self, load: Callable[[str], ctypes.CDLL], source: str, argtypes: list, why: str, level=logging.DEBUG):
        self._load, self._source, self._argtypes, self._why, self._level = load, source, argtypes, why, level
        self._entry = None
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self._entry is None:
                try:
                    fn = self._load(self._source).dpl_kernel
                except (CompileError, OSError) as err:
                    log.log(self._level, "%s (%s)", self._why, err)
                    self._entry = False
                    return None
                fn.restype, fn.argtypes = None, self._argtypes
                self._entry = fn
        return self._entry or None


class CallList:
    """The routine of one backend (its kernel cache), compiled at the first prepared call; where
    it cannot be had, every plan runs the general path."""

    address = staticmethod(address)  # how a prepared call reads its arrays' addresses

    def __init__(self, load: Callable[[str], ctypes.CDLL]):
        self._routine = LoadedEntry(load, SOURCE, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
                                    "no prepared calls: the call-list routine did not load")

    def program(self, calls: Sequence[tuple[CCall, tuple]], fixed: Sequence[int], keep: list):
        """The table of addresses (``fixed`` its first values) and ``run()``: ``calls`` in
        order, each with its arguments' table entries (None: NULL). ``keep``: what the fixed
        addresses point into, kept by ``run``. None where the routine cannot be loaded."""
        routine = self._routine()
        if routine is None:
            return None
        table = (ctypes.c_void_p * max(1, len(fixed)))(*fixed)
        # every record's arguments, pointers and dims in three arrays, the records in a fourth:
        # a handful of objects per program (seven ctypes objects a record had the garbage
        # collector's full passes over torch's heap cost 0.27 s of a 32-token generate)
        nargs = [len(entries) for _, entries in calls]
        ndims = [len(call.dims) for call, _ in calls]
        args = np.array([-1 if e is None else e for _, entries in calls for e in entries] or [0], np.int32)
        ptrs = np.zeros(max(1, sum(nargs)), np.uintp)
        dims = np.array([d for call, _ in calls for d in call.dims] or [0], np.int64)
        records = np.zeros(max(1, len(calls)), RECORD)
        at_arg, at_dim = 0, 0
        args_at, ptrs_at, dims_at = args.ctypes.data, ptrs.ctypes.data, dims.ctypes.data
        for r, (call, entries) in enumerate(calls):
            want = ARGS_OF[call.kind]
            if want is not None and len(entries) != want:
                raise ValueError(f"internal: a call of kind {call.kind} takes {want} pointers, got {len(entries)}")
            records[r] = (call.entry, args_at + 4 * at_arg, ptrs_at + 8 * at_arg, dims_at + 8 * at_dim,
                          call.kind, nargs[r], call.threads, call.code)
            at_arg, at_dim = at_arg + nargs[r], at_dim + ndims[r]
        arrays = (args, ptrs, dims)  # kept by run
        n, held, address_of = len(calls), (records, arrays, keep), records.ctypes.data

        def run() -> None:
            routine(address_of, n, table)

        run.held = held  # type: ignore[attr-defined]
        return table, run
