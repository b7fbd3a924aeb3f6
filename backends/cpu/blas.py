"""Which library computes the CPU backend's matrix products and convolutions: NumPy's BLAS
(OpenBLAS, the floor), or torch's (MKL for products, oneDNN for convolutions) when torch is
installed and measures faster here (``products="auto"``, the default: :mod:`dpl.backends.cpu.products_choice`).

The generated C is the same either way; only the products change hands. torch is imported only
by :class:`TorchProducts`, at the first product or convolution it gives torch, and by the
measurement when torch is installed; never by ``import dpl``.

A provider is ``matmul(a, b, out)``: NumPy's ``matmul`` semantics (broadcast batches, 1-D
operands), written into ``out`` (whose dtype is the result's), returning ``out``;
``conv2d(call)``: ``fn(x, w, out)`` computing the convolution ``call`` into ``out``, or None
for im2col and ``matmul`` (backends/cpu/im2col.py); ``thread_pool``, the name of the worker pool it
runs on (see :mod:`dpl.runtime.threads`); and ``why``, how it was chosen (``exe.summary()``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np

from dpl import dtypes
from dpl.backends.registry import BackendError
from dpl.runtime.threads import BLAS, OPENMP, TORCH

TORCH_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
NAMES = ("auto", "numpy", "torch", "dpl")
PACKED = "float32 products (and im2col's): dpl's packed-weight routine (backends/cpu/packed_gemm.py)"


class NumpyProducts:
    name = "numpy"
    library = "NumPy's BLAS"
    thread_pool = BLAS
    why = "products='numpy' asked for"
    packs = False  # float32 products by backends/cpu/packed_gemm.py instead

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        if np.result_type(a, b) == out.dtype:
            return np.matmul(a, b, out=out)
        out[...] = np.matmul(a, b)
        return out

    def conv2d(self, call):
        return None  # im2col and matmul

    def pool_of(self, call) -> str:
        """The thread pool a product (``matmul``) or convolution ``call`` runs on."""
        return BLAS


@lru_cache(maxsize=None)
def _compiler_links_libgomp(cc: str) -> bool:
    """Whether ``cc -fopenmp`` links GNU's libgomp (GCC does; clang links its own libomp)."""
    try:
        out = subprocess.run([cc, "-fopenmp", "-print-file-name=libgomp.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and Path(out.stdout.strip()).is_absolute()


def torch_shares_openmp(torch, cc: str) -> bool:
    """Whether torch's threads are the generated kernels' OpenMP threads: torch's ATen runs on
    OpenMP from a ``libgomp.so.1`` (the soname the kernels of a GCC ``-fopenmp`` need, so the
    dynamic linker loads it once, whichever comes first) and MKL's threads are its threads. Then
    a plan with torch's products and C kernels uses one pool, and nothing spins against anything
    (:mod:`dpl.runtime.threads`)."""
    info = torch.__config__.parallel_info()
    bundled = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    return "parallel backend: OpenMP" in info and bundled.exists() and _compiler_links_libgomp(cc)


class TorchProducts:
    """Products by ``torch.matmul`` on zero-copy tensors of the arrays (float32 and float64; other
    dtypes by NumPy), convolutions by ``torch.nn.functional.conv2d`` (oneDNN). Read-only arrays
    (the weights ``dpl.from_torch`` binds) are wrapped once and the tensors kept, as torch warns
    about wrapping a read-only array. ``matmuls=False`` leaves the products to NumPy's BLAS,
    ``convolutions=False`` the convolutions to im2col (``products="auto"`` takes each from
    whichever measured faster)."""

    KEEP = 256  # read-only arrays whose tensors are kept

    def __init__(self, cc: str = "cc", why: str = "products='torch' asked for", matmuls: bool = True,
                 convolutions: bool = True):
        if importlib.util.find_spec("torch") is None:
            raise BackendError("products='torch' needs torch (pip install -e '.[torch]')")
        self.cc = cc
        self.why = why
        self.matmuls, self.convolutions = matmuls, convolutions
        self.name = "torch" if matmuls and convolutions else "numpy+torch conv" if convolutions else "torch+im2col"
        self.library = {"torch": "torch's MKL products and oneDNN convolutions",
                        "numpy+torch conv": "NumPy's BLAS products, torch's oneDNN convolutions",
                        "torch+im2col": "torch's MKL products, im2col convolutions"}[self.name]
        self._torch = None
        self._pool: str | None = None
        self._kept: dict[int, tuple[np.ndarray, object]] = {}
        self._finite_kept: dict[int, tuple[np.ndarray, bool]] = {}
        self._numpy = NumpyProducts()
        self.packs = False  # float32 products by backends/cpu/packed_gemm.py instead

    @property
    def torch(self):
        """torch, imported at the first product or convolution it computes (a plan whose
        products all stay with NumPy never imports it)."""
        if self._torch is None:
            import torch

            self._torch = torch
        return self._torch

    @property
    def thread_pool(self) -> str:
        """torch's threads: the OpenMP team the C kernels share, or a pool of its own."""
        if self._pool is None:
            self._pool = OPENMP if torch_shares_openmp(self.torch, self.cc) else TORCH
        return self._pool

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

    def _finite(self, w: np.ndarray) -> bool:
        """Whether every value of ``w`` is finite; remembered for a read-only (constant) weight."""
        if w.flags.writeable:
            return bool(np.isfinite(w).all())
        found = self._finite_kept.get(id(w))
        if found is not None and found[0] is w:
            return found[1]
        if len(self._finite_kept) >= self.KEEP:
            self._finite_kept.pop(next(iter(self._finite_kept)))
        finite = bool(np.isfinite(w).all())
        self._finite_kept[id(w)] = (w, finite)
        return finite

    def pool_of(self, call) -> str:
        """The thread pool a product (``matmul``) or convolution ``call`` runs on."""
        if call.op == "matmul" or self.conv2d(call) is None:
            return self.thread_pool if self.matmuls else BLAS
        return self.thread_pool

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        if not (self.matmuls and a.dtype == b.dtype == out.dtype and a.dtype in TORCH_DTYPES and a.ndim and b.ndim
                and out.flags.writeable and out.flags.c_contiguous):
            return self._numpy.matmul(a, b, out)
        self.torch.matmul(self._tensor(a), self._tensor(b), out=self.torch.from_numpy(out))
        return out

    def conv2d(self, call):
        """``fn(x, w, out)`` by torch's convolution for a float32/float64 NCHW/OIHW ``call`` with
        symmetric padding (what ``torch.nn.functional.conv2d`` takes) and a window wider than one
        pixel; else None (im2col).

        A 1x1 convolution is a product of the weights and the input as it lies (strided: one
        gather), and that product beats oneDNN's convolution, which reorders its NCHW input into
        blocks first: on the bench host, one thread, CPU ms, ResNet's 1x1s at 56² and 28²
        (6.4-51 MFLOP) took 1.17-1.40x im2col's time by torch, while its 3x3s (0.49-0.78x) and the
        7x7 stem (0.68x) took less."""
        from dpl.backends.cpu import im2col

        top, left, bottom, right = im2col._pads(call.attrs.get("padding", 0))
        if not self.convolutions or not im2col.takes(call) or (top, left) != (bottom, right):
            return None
        if tuple(call.args[1].ty.shape[2:]) == (1, 1):
            return None
        return self.convolution(call.attrs, dtypes.to_numpy(call.ty.dtype))

    def convolution(self, attrs, dtype, channels_last: bool = False):
        """``fn(x, w, out)``: ``torch.nn.functional.conv2d`` with ``attrs`` (symmetric padding)
        in ``dtype``, written into ``out``; with ``out=None`` the result is torch's own array
        (no copy: the segment runner passes None where the result is not a group's output).

        NCHW arrays, or with ``channels_last`` NHWC data and OHWI weights (what dpl's
        convert-layout pass makes), read in place as torch's channels-last views, whose
        convolution oneDNN runs without reordering its input: the copies torch.compile makes
        (3x3, 64 channels at 56x56, one thread, CPU ms: 2.26 vs 2.46 for the convolution alone,
        2.75 vs 2.63 with the copies) are not made."""
        from dpl.backends.cpu import im2col

        top, left, _, _ = im2col._pads(attrs.get("padding", 0))
        stride, dilation = im2col._pair(attrs.get("strides", 1)), im2col._pair(attrs.get("dilation", 1))
        groups = int(attrs.get("groups", 1))
        conv, torch = self.torch.nn.functional.conv2d, self.torch

        def nchw(t):  # an NHWC array as torch's channels-last view of its NCHW shape
            return t.permute(0, 3, 1, 2) if channels_last else t

        def run(x, w, out=None):
            x, w = np.ascontiguousarray(x, dtype), np.ascontiguousarray(w, dtype)
            xt, wt = nchw(self._tensor(x)), nchw(self._tensor(w))
            if (top or left) and not self._finite(w):
                # oneDNN skips the padding, so a NaN or infinite weight never meets its zeros;
                # the interpreter's 0 * inf = NaN there needs the zeros written out
                xt = torch.nn.functional.pad(xt, (left, left, top, top))
                y = conv(xt, wt, None, stride, 0, dilation, groups)
            else:
                y = conv(xt, wt, None, stride, (top, left), dilation, groups)
            if channels_last:
                y = y.permute(0, 2, 3, 1)  # NHWC: contiguous where oneDNN kept channels last
            if out is None:
                return y.contiguous().numpy()
            torch.from_numpy(out).copy_(y)
            return out

        run.returns_own = True  # type: ignore[attr-defined]  # out=None: its own array, no copy
        return run
