"""``nn.conv2d`` as one matrix product through NumPy's BLAS (im2col), for the CPU backend.

The kernel IR's conv2d is a reduction over channels and window for every output element: right,
but its loops reach about 14 GFLOP/s where BLAS reaches 250 (a 3x3, 64-channel conv at 56x56:
16 ms against 1.5). Here the input is padded into a workspace, its windows are gathered into
columns ``(N, C*KH*KW, OH*OW)`` (one strided copy), and ``weights (O, C*KH*KW) @ columns``
writes the NCHW output directly, a product per group. A 1x1 conv with stride 1 and no padding
needs no gathering: the input already is its columns.

:func:`takes` says which convolutions this runs (NCHW data, OIHW weights, float32 or float64
throughout); the others stay with the kernel IR.
"""

from __future__ import annotations

import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dpl import dtypes
from dpl.ir.expr import Call

BLAS_DTYPES = ("float32", "float64")


def _pair(v) -> tuple[int, int]:
    v = (v,) if isinstance(v, int) else tuple(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _pads(v) -> tuple[int, int, int, int]:
    """(top, left, bottom, right), as the op's ``padding`` attribute spells it in 1, 2 or 4 numbers."""
    p = (v,) if isinstance(v, int) else tuple(v)
    return p * 4 if len(p) == 1 else (p[0], p[1], p[0], p[1]) if len(p) == 2 else p


def takes(call: Call) -> bool:
    """Whether ``call`` is a convolution this module runs."""
    if not isinstance(call, Call) or call.op != "nn.conv2d" or len(call.args) != 2:
        return False
    a = call.attrs
    if a.get("data_layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW":
        return False
    types = [x.ty for x in call.args] + [call.ty]
    return all(getattr(t, "dtype", None) == types[0].dtype for t in types) and types[0].dtype in BLAS_DTYPES


class Conv2d:
    """One convolution's attributes, and a per-thread workspace for its padded input and columns."""

    def __init__(self, attrs, matmul=None):
        self.matmul = matmul or (lambda a, b, out: np.matmul(a, b, out=out))  # a provider's (backends/cpu/blas.py)
        self.strides = _pair(attrs.get("strides", 1))
        self.dilation = _pair(attrs.get("dilation", 1))
        self.padding = _pads(attrs.get("padding", 0))
        self.groups = int(attrs.get("groups", 1))
        self._local = threading.local()

    def _workspace(self, key, shape, dtype, zero: bool) -> np.ndarray:
        """A buffer kept from call to call (a fresh 7 MB array costs its page faults each time);
        a zeroed one keeps its zeros wherever no call writes (the padding)."""
        cache = self._local.__dict__.setdefault("buffers", {})
        buf = cache.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
            cache[key] = buf
        return buf

    def out_extent(self, h: int, wd: int, kh: int, kw: int) -> tuple[int, int]:
        """The output's height and width over an input of ``h`` x ``wd`` and a ``kh`` x ``kw`` window."""
        (sh, sw), (dh, dw) = self.strides, self.dilation
        pt, pl, pb, pr = self.padding
        return (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1

    def __call__(self, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        n, c, h, wd = x.shape
        o, ci, kh, kw = w.shape
        (sh, sw), (dh, dw) = self.strides, self.dilation
        pt, pl, pb, pr = self.padding
        oh, ow = self.out_extent(h, wd, kh, kw)
        if out is None:
            out = np.empty((n, o, oh, ow), x.dtype)
        if kh == kw == 1 and sh == sw == 1 and not any(self.padding):
            cols = np.ascontiguousarray(x).reshape(n, c, h * wd)
        else:
            if any(self.padding):
                padded = self._workspace("padded", (n, c, h + pt + pb, wd + pl + pr), x.dtype, zero=True)
                padded[:, :, pt:pt + h, pl:pl + wd] = x
            else:
                padded = x
            s = padded.strides
            windows = as_strided(padded, (n, c, kh, kw, oh, ow), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw),
                                 writeable=False)
            cols = self._workspace("cols", (n, c * kh * kw, oh * ow), x.dtype, zero=False)
            np.copyto(cols.reshape(n, c, kh, kw, oh, ow), windows)
        contiguous = out.flags.c_contiguous
        flat_out = out.reshape(n, o, oh * ow) if contiguous else np.empty((n, o, oh * ow), out.dtype)
        g, og, k = self.groups, o // self.groups, ci * kh * kw
        weights = np.ascontiguousarray(w).reshape(o, k)
        if g == 1:
            self.matmul(weights, cols, flat_out)
        else:
            for i in range(g):
                self.matmul(weights[i * og:(i + 1) * og], cols[:, i * k:(i + 1) * k], flat_out[:, i * og:(i + 1) * og])
        if not contiguous:
            out[...] = flat_out.reshape(out.shape)
        return out


def conv2d_product(call: Call, matmul=None):
    """``fn(x, w, out)`` computing ``call`` (a convolution :func:`takes`) into ``out`` (or a new
    array); ``matmul(a, b, out)`` computes its product (default: NumPy's)."""
    conv = Conv2d(call.attrs, matmul)
    dtype = dtypes.to_numpy(call.ty.dtype)

    def run(x, w, out=None):
        return conv(x.astype(dtype, copy=False), w.astype(dtype, copy=False), out)

    return run
