"""Which library computes the CPU backend's matrix products (and the product of its im2col
convolutions): NumPy's BLAS by default, or torch's (MKL) when the backend is asked for it.

The generated C is the same either way; only the products change hands. On the bench host the
Llama decoder of ``bench/bench_models.py`` spends 85% of its time in products, and MKL computes
the skinny ones of a short sequence (128 x 1024 @ 1024 x 2816) about 1.3x faster than the
OpenBLAS NumPy ships, which is most of the gap between dpl and torch there. torch is imported
only by :class:`TorchProducts`, never by ``import dpl``.

A provider is ``matmul(a, b, out)``: NumPy's ``matmul`` semantics (broadcast batches, 1-D
operands), written into ``out`` (whose dtype is the result's), returning ``out``; and
``thread_pool``, the name of the worker pool it runs on (see :mod:`dpl.runtime.threads`).
"""

from __future__ import annotations

import warnings

import numpy as np

from dpl.backends.registry import BackendError
from dpl.runtime.threads import BLAS

TORCH_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class NumpyProducts:
    name = "numpy"
    thread_pool = BLAS

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        if np.result_type(a, b) == out.dtype:
            return np.matmul(a, b, out=out)
        out[...] = np.matmul(a, b)
        return out


class TorchProducts:
    """Products by ``torch.matmul`` on zero-copy tensors of the arrays (float32 and float64; other
    dtypes by NumPy). Read-only arrays (the weights ``dpl.from_torch`` binds) are wrapped once
    and the tensors kept, as torch warns about wrapping a read-only array."""

    name = "torch"
    thread_pool = "torch"
    KEEP = 256  # read-only arrays whose tensors are kept

    def __init__(self):
        try:
            import torch
        except ImportError:
            raise BackendError("products='torch' needs torch (pip install -e '.[torch]')") from None
        self.torch = torch
        self._kept: dict[int, tuple[np.ndarray, object]] = {}
        self._numpy = NumpyProducts()

    def _tensor(self, a: np.ndarray):
        if a.flags.writeable:
            return self.torch.from_numpy(a)
        kept = self._kept.get(id(a))
        if kept is not None and kept[0] is a:
            return kept[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable": torch only reads it
            t = self.torch.from_numpy(a)
        if len(self._kept) >= self.KEEP:
            self._kept.pop(next(iter(self._kept)))
        self._kept[id(a)] = (a, t)  # the array is kept alive with its tensor, so its id is not reused
        return t

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        if not (a.dtype == b.dtype == out.dtype and a.dtype in TORCH_DTYPES and a.ndim and b.ndim
                and out.flags.writeable and out.flags.c_contiguous):
            return self._numpy.matmul(a, b, out)
        self.torch.matmul(self._tensor(a), self._tensor(b), out=self.torch.from_numpy(out))
        return out


def products(name: str):
    """The provider called ``name``: ``"numpy"`` or ``"torch"``."""
    if name == "numpy":
        return NumpyProducts()
    if name == "torch":
        return TorchProducts()
    raise BackendError(f"unknown products library {name!r}", hint="products='numpy' (default) or 'torch'")
