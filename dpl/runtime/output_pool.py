"""Outputs of plain calls from memory that is already mapped.

A large array NumPy allocates fresh is mapped fresh: a call that returns a new 64 MiB output
pays for faulting in every page of it (the 4096² chain of ``bench/bench_cpu.py``: 13.6 ms
that way against 9.3 ms with ``out=``). So a plan keeps, per output position, a few raw
buffers it has handed out, and a plain call takes one the caller no longer holds.

"No longer holds" is decided by reference counts, never by guessing: every array handed out is
a view of a pooled raw buffer, and every view NumPy derives from it (slices, reshapes, views of
views; ``torch.from_numpy`` and memoryviews keep the array) holds a reference to that raw
buffer. A buffer whose only references are the pool's own is free; one the caller still holds
in any form is never handed out again. A caller that keeps every result gets a fresh buffer
each time (the pool keeps at most :data:`KEEP` per position, and only those it made).
Claiming is done under the pool's lock, so two threads never take the same buffer.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Sequence

import numpy as np

KEEP = 2  # raw buffers kept per output position


def _refs(buffers: list, i: int) -> int:
    return sys.getrefcount(buffers[i])


_FREE_REFS = _refs([np.empty(1, np.uint8)], 0)  # what _refs says of a buffer only the pool holds


class OutputPool:
    """Raw buffers for the outputs of one plan, ``specs`` = [(shape, numpy dtype)] by position."""

    def __init__(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]]):
        self.specs = [(tuple(s), np.dtype(d)) for s, d in specs]
        self._nbytes = [math.prod(s) * d.itemsize for s, d in self.specs]
        self._buffers: list[list[np.ndarray]] = [[] for _ in self.specs]
        self._lock = threading.Lock()
        self.reused = 0  # how many outputs came from the pool (for tests and reports)

    def take(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None) -> list[np.ndarray]:
        """One array per output position, none of them memory a caller still holds; ``specs``:
        other shapes, at most the pool's own bytes at each position (the plans of one bucket
        share the pool of the plan sized for its largest binding, dpl.runtime.rebinding)."""
        with self._lock:
            if specs is None:
                return [self._take(pos, *spec) for pos, spec in enumerate(self.specs)]
            return [self._take(pos, tuple(shape), np.dtype(dtype)) for pos, (shape, dtype) in enumerate(specs)]

    def _take(self, pos: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        # math.prod and one ndarray over the raw buffer (its base): a decode step takes nine
        # outputs, and np.prod plus a slice, a view and a reshape each cost 31 us of its call
        n, buffers = math.prod(shape) * dtype.itemsize, self._buffers[pos]
        for i in range(len(buffers)):
            if _refs(buffers, i) <= _FREE_REFS and buffers[i].size >= n:
                self.reused += 1
                return np.ndarray(shape, dtype, buffers[i])
        raw = np.empty(max(1, n, self._nbytes[pos]), np.uint8)
        if len(buffers) < KEEP:
            buffers.append(raw)
        return np.ndarray(shape, dtype, raw)
