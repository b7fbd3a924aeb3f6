"""Channels-last ``nn.conv2d`` (NHWC data, OHWI weights: what dpl's convert-layout pass makes)
for the CPU backend.

- A 1x1 convolution with stride 1 and no padding is one matrix product of the data as it lies:
  ``(N*H*W, C) @ (O, C)^T`` written straight into the NHWC output.
- Others by torch's oneDNN on channels-last views of the arrays (no copy: see
  ``TorchProducts.convolution``) where the products' provider has torch's convolutions, else by
  im2col: each output pixel's window gathered as one row ``(KH*KW*C)`` (channels innermost,
  as the weights' rows are), then one product per group, again written as NHWC.

:func:`takes` says which convolutions this runs (float32 or float64 throughout); the others
stay with the kernel IR.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from dpl import dtypes
from dpl.backends.cpu.im2col import BLAS_DTYPES, Conv2d, _pair, _pads
from dpl.ir.expr import Call


def takes(call: Call) -> bool:
    """Whether ``call`` is a channels-last convolution this module runs."""
    if not isinstance(call, Call) or call.op != "nn.conv2d" or len(call.args) != 2:
        return False
    if call.attrs.get("data_layout") != "NHWC" or call.attrs.get("kernel_layout") != "OHWI":
        return False
    types = [x.ty for x in call.args] + [call.ty]
    return all(getattr(t, "dtype", None) == types[0].dtype for t in types) and types[0].dtype in BLAS_DTYPES


def is_pointwise(call: Call) -> bool:
    """A 1x1 convolution with stride 1, no padding and one group: a product of the data as it lies."""
    a = call.attrs
    return (tuple(call.args[1].ty.shape[1:3]) == (1, 1) and _pair(a.get("strides", 1)) == (1, 1)
            and not any(_pads(a.get("padding", 0))) and int(a.get("groups", 1)) == 1)


def uses_torch(call: Call, products) -> bool:
    """Whether ``products`` (backends/cpu/blas.py) runs ``call`` by torch's convolution."""
    if is_pointwise(call) or not getattr(products, "convolutions", False):
        return False
    top, left, bottom, right = _pads(call.attrs.get("padding", 0))
    return (top, left) == (bottom, right)


def runner(call: Call, products, matmul=None):
    """``fn(x, w, out)`` computing ``call`` into ``out`` (or a new array); ``matmul(a, b, out)``
    computes its products (default: the provider's)."""
    dtype = dtypes.to_numpy(call.ty.dtype)
    matmul = matmul or products.matmul
    if uses_torch(call, products):
        return products.convolution(call.attrs, dtype, channels_last=True)
    if is_pointwise(call):
        return _pointwise(dtype, matmul)
    conv = _Im2colNhwc(call.attrs, matmul)

    def run(x, w, out=None):
        return conv(x.astype(dtype, copy=False), w.astype(dtype, copy=False), out)

    return run


def _pointwise(dtype, matmul):
    def run(x, w, out=None):
        x, w = np.ascontiguousarray(x, dtype), np.ascontiguousarray(w, dtype)
        n, h, wd, c = x.shape
        o = w.shape[0]
        if out is None:
            out = np.empty((n, h, wd, o), dtype)
        flat = out.reshape(n * h * wd, o) if out.flags.c_contiguous else np.empty((n * h * wd, o), dtype)
        matmul(x.reshape(n * h * wd, c), w.reshape(o, c).T, flat)
        if not out.flags.c_contiguous:
            out[...] = flat.reshape(out.shape)
        return out

    return run


class _Im2colNhwc(Conv2d):
    """im2col for NHWC: rows of (KH, KW, C) windows, one per output pixel; the workspaces are
    im2col's own (per thread, kept from call to call)."""

    def __call__(self, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        n, h, wd, c = x.shape
        o, kh, kw, ci = w.shape
        (sh, sw), (dh, dw) = self.strides, self.dilation
        pt, pl, pb, pr = self.padding
        oh, ow = self.out_extent(h, wd, kh, kw)
        if out is None:
            out = np.empty((n, oh, ow, o), x.dtype)
        if any(self.padding):
            padded = self._workspace("padded", (n, h + pt + pb, wd + pl + pr, c), x.dtype, zero=True)
            padded[:, pt:pt + h, pl:pl + wd] = x
        else:
            padded = x
        s = padded.strides
        windows = as_strided(padded, (n, oh, ow, kh, kw, c), (s[0], s[1] * sh, s[2] * sw, s[1] * dh, s[2] * dw, s[3]),
                             writeable=False)
        flat = out.reshape(n * oh * ow, o) if out.flags.c_contiguous else np.empty((n * oh * ow, o), out.dtype)
        g, og = self.groups, o // self.groups
        for i in range(g):
            cols = self._workspace("cols", (n, oh, ow, kh, kw, ci), x.dtype, zero=False)
            np.copyto(cols, windows[..., i * ci:(i + 1) * ci])
            weights = np.ascontiguousarray(w[i * og:(i + 1) * og]).reshape(og, kh * kw * ci)
            if g == 1:
                self.matmul(cols.reshape(n * oh * ow, kh * kw * ci), weights.T, flat)
            else:
                part = np.empty((n * oh * ow, og), out.dtype)
                self.matmul(cols.reshape(n * oh * ow, kh * kw * ci), weights.T, part)
                flat[:, i * og:(i + 1) * og] = part
        if not out.flags.c_contiguous:
            out[...] = flat.reshape(out.shape)
        return out
