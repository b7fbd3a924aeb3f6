"""``nn.max_pool2d`` for the CPU backend as one C routine whose inner loop runs along an output
row in vectors.

The kernel IR's pooling reduces each output element's window in turn, with a bounds test on
every read (the padding), and its window loops are too short to vectorise: ResNet's stem pool
(3x3, stride 2, 64 x 112² -> 56²) took 0.68 ms that way. Here each output row is first the
running maximum of its window's input rows down the columns (contiguous, in vectors), then the
window across that one row, read at the stride, the columns whose windows stay inside the
input without a test and in vectors, the few at the edges with one (0.32 ms with the window
across every input row, 0.23 with the rows first, one thread).

The interpreter's rules hold: the padding is -inf (never chosen over a real value, the result
of a window all padding), and a NaN anywhere in a window makes its output NaN (a row that met
one is recomputed element by element). float32 and float64, NCHW, any window, stride, padding
and dilation; ``ceil_mode`` is whatever the output shape says. NHWC pools (the convert-layout
pass's) the same way, whole rows of pixels down the columns, then each pixel's window across,
all channels at once in vectors. Other dtypes stay with the kernel IR (:func:`takes`).
"""

from __future__ import annotations

import ctypes

import numpy as np

from dpl import dtypes
from dpl.ir.expr import Call
from dpl.backends.cpu.call_list import KERNEL, entry_address
from dpl.runtime.prepared import CCall
from dpl.runtime.threads import openmp_kernel

DTYPES = {"float32": "float", "float64": "double"}
SYMBOL = "dpl_kernel"  # what the CPU backend's library cache checks a library for
PARALLEL_MIN_OUTPUTS = 32768  # output elements from which the planes are shared by an OpenMP team

# the NHWC row, shared with the convolution that pools its own rows (conv_lanes: ``T`` its float)
NHWC_ROW = r"""/* NHWC (channels last), as the NCHW kernel: each output row the running maximum of its window's
   input rows first (whole rows of pixels, all channels, in vectors), then each pixel the window
   across that one row (its channels in vectors); a row that met a NaN is marked where its windows
   hold one. Output row oy of an image of H rows into yr, the rows its window reads at
   xn + (iy - first) W C (a conv's rows held from row `first` on: backends/cpu/conv_lanes.py);
   xr: W C values of scratch (NULL: each pixel's window in turn) */
static void dpl_pool_row_nhwc(const T *restrict xn, int64_t first, T *restrict yr, T *restrict xr, int64_t oy,
                              int64_t H, int64_t W, int64_t C, int64_t OW, int64_t KH, int64_t KW, int64_t SH,
                              int64_t SW, int64_t PT, int64_t PL, int64_t DH, int64_t DW) {
  int nan = 0, rows = 0;
  for (int64_t ky = 0; ky < KH && xr; ++ky) {
    const int64_t iy = oy * SH + ky * DH - PT;
    if (iy < 0 || iy >= H) continue;
    const T *restrict row = xn + (iy - first) * W * C;
    if (rows++ == 0) {
      #pragma omp simd reduction(|:nan)
      for (int64_t i = 0; i < W * C; ++i) { const T v = row[i]; xr[i] = v; nan |= v != v; }
    } else {
      #pragma omp simd reduction(|:nan)
      for (int64_t i = 0; i < W * C; ++i) { const T v = row[i]; xr[i] = v > xr[i] ? v : xr[i]; nan |= v != v; }
    }
  }
  for (int64_t ox = 0; ox < OW; ++ox) {
    T *restrict yc = yr + ox * C;
    int64_t k0 = 0, k1 = KW;  /* the window's columns inside the input */
    while (k0 < KW && ox * SW + k0 * DW - PL < 0) ++k0;
    while (k1 > k0 && ox * SW + (k1 - 1) * DW - PL >= W) --k1;
    if (!xr) {  /* no buffer: the window pixel by pixel */
      for (int64_t c = 0; c < C; ++c) yc[c] = -INFINITY;
      for (int64_t ky = 0; ky < KH; ++ky) {
        const int64_t iy = oy * SH + ky * DH - PT;
        if (iy < 0 || iy >= H) continue;
        for (int64_t kx = k0; kx < k1; ++kx) {
          const T *restrict xc = xn + ((iy - first) * W + ox * SW + kx * DW - PL) * C;
          #pragma omp simd reduction(|:nan)
          for (int64_t c = 0; c < C; ++c) { const T v = xc[c]; yc[c] = v > yc[c] ? v : yc[c]; nan |= v != v; }
        }
      }
      continue;
    }
    const T *restrict xc = xr + (ox * SW + k0 * DW - PL) * C;  /* the window's first column inside */
    if (rows == 0 || k0 == k1) {  /* a window all padding */
      for (int64_t c = 0; c < C; ++c) yc[c] = -INFINITY;
    } else if (k1 - k0 == 3 && DW == 1) {
      const T *restrict a = xc, *restrict b = a + C, *restrict e = b + C;
      #pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        T m = a[c];
        m = b[c] > m ? b[c] : m;
        yc[c] = e[c] > m ? e[c] : m;
      }
    } else {
      #pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        T m = -INFINITY;
        for (int64_t kx = 0; kx < k1 - k0; ++kx) { const T v = xc[kx * DW * C + c]; m = v > m ? v : m; }
        yc[c] = m;
      }
    }
  }
  if (!nan) return;
  for (int64_t ox = 0; ox < OW; ++ox) {  /* the channels whose window holds a NaN are NaN */
    for (int64_t ky = 0; ky < KH; ++ky) {
      const int64_t iy = oy * SH + ky * DH - PT;
      if (iy < 0 || iy >= H) continue;
      for (int64_t kx = 0; kx < KW; ++kx) {
        const int64_t ix = ox * SW + kx * DW - PL;
        if (ix < 0 || ix >= W) continue;
        const T *restrict xc = xn + ((iy - first) * W + ix) * C;
        for (int64_t c = 0; c < C; ++c) if (xc[c] != xc[c]) yr[ox * C + c] = NAN;
      }
    }
  }
}
"""

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
typedef %(ctype)s T;

static int64_t dpl_lo(int64_t pad, int64_t stride) {  /* first output whose window starts inside */
  return pad <= 0 ? 0 : (pad + stride - 1) / stride;
}

static int64_t dpl_hi(int64_t size, int64_t span, int64_t pad, int64_t stride) {  /* one past the last whose window ends inside */
  const int64_t last = size - 1 - span + pad;
  return last < 0 ? 0 : last / stride + 1;
}

/* columns [from, to) of an output row, each window column tested against the input's edges;
   whether a NaN was met */
static int dpl_edge(const T *restrict xr, T *restrict yr, int64_t from, int64_t to, int64_t W, int64_t KW,
                    int64_t SW, int64_t DW, int64_t PL) {
  int nan = 0;
  for (int64_t ox = from; ox < to; ++ox) {
    for (int64_t kx = 0; kx < KW; ++kx) {
      const int64_t ix = ox * SW + kx * DW - PL;
      if (ix < 0 || ix >= W) continue;
      const T v = xr[ix];
      yr[ox] = v > yr[ox] ? v : yr[ox];
      nan |= v != v;
    }
  }
  return nan;
}

/* the columns whose windows stay inside the input: no test, in vectors; literal strides and
   window widths let the compiler load by shuffles, not gathers */
#define DPL_INTERIOR(S, K, D) \
  { _Pragma("omp simd reduction(|:nan)") \
    for (int64_t ox = lo; ox < hi; ++ox) { \
      const T *restrict c = xr + ox * (S) - PL; \
      T m = yr[ox]; \
      for (int64_t kx = 0; kx < (K); ++kx) { \
        const T v = c[kx * (D)]; \
        m = v > m ? v : m; \
        nan |= v != v; \
      } \
      yr[ox] = m; \
    } }

/* the window across one input row xr, into the running maxima yr: the edge columns tested, the
   interior in vectors; whether a NaN was met */
static inline int dpl_across(const T *restrict xr, T *restrict yr, int64_t lo, int64_t hi, int64_t OW, int64_t W,
                             int64_t KW, int64_t SW, int64_t DW, int64_t PL) {
  int nan = dpl_edge(xr, yr, 0, lo, W, KW, SW, DW, PL);
  if (DW == 1 && KW == 3 && SW == 2) DPL_INTERIOR(2, 3, 1)
  else if (DW == 1 && KW == 3 && SW == 1) DPL_INTERIOR(1, 3, 1)
  else if (DW == 1 && KW == 2 && SW == 2) DPL_INTERIOR(2, 2, 1)
  else DPL_INTERIOR(SW, KW, DW)
  return nan | dpl_edge(xr, yr, hi, OW, W, KW, SW, DW, PL);
}

/* d: planes, H, W, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW. Each output row: the running maximum
   of its window's input rows down the columns first (contiguous, in vectors), then the window
   across that one row (the shuffles once a row, not once per window row) */
void dpl_kernel(const T *restrict x, T *restrict y, const int64_t *d) {
  const int64_t planes = d[0], H = d[1], W = d[2], OH = d[3], OW = d[4], KH = d[5], KW = d[6];
  const int64_t SH = d[7], SW = d[8], PT = d[9], PL = d[10], DH = d[11], DW = d[12];
  int64_t lo = dpl_lo(PL, SW), hi = dpl_hi(W, (KW - 1) * DW, PL, SW);
  if (lo > OW) lo = OW;
  if (hi > OW) hi = OW;
  if (hi < lo) hi = lo;
  #pragma omp parallel if(planes * OH * OW >= %(parallel)d)
  {
  /* the column maxima of one output row; without it (no memory) the window goes across each input row */
  T *restrict xr = malloc((size_t)(W > 0 ? W : 1) * sizeof(T));
  #pragma omp for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const T *restrict xp = x + p * H * W;
    T *restrict yr0 = y + p * OH * OW;
    for (int64_t oy = 0; oy < OH; ++oy) {
      T *restrict yr = yr0 + oy * OW;
      int nan = 0, rows = 0;
      for (int64_t ox = 0; ox < OW; ++ox) yr[ox] = -INFINITY;
      for (int64_t ky = 0; ky < KH; ++ky) {
        const int64_t iy = oy * SH + ky * DH - PT;
        if (iy < 0 || iy >= H) continue;
        const T *restrict row = xp + iy * W;
        if (!xr) {
          nan |= dpl_across(row, yr, lo, hi, OW, W, KW, SW, DW, PL);
        } else if (rows++ == 0) {
          #pragma omp simd reduction(|:nan)
          for (int64_t i = 0; i < W; ++i) { const T v = row[i]; xr[i] = v; nan |= v != v; }
        } else {
          #pragma omp simd reduction(|:nan)
          for (int64_t i = 0; i < W; ++i) { const T v = row[i]; xr[i] = v > xr[i] ? v : xr[i]; nan |= v != v; }
        }
      }
      if (rows > 0) dpl_across(xr, yr, lo, hi, OW, W, KW, SW, DW, PL);  /* none: a window all padding, or no buffer */
      if (nan) {  /* the outputs whose window holds a NaN are NaN */
        for (int64_t ox = 0; ox < OW; ++ox) {
          int here = 0;
          for (int64_t ky = 0; ky < KH; ++ky) {
            const int64_t iy = oy * SH + ky * DH - PT;
            if (iy < 0 || iy >= H) continue;
            for (int64_t kx = 0; kx < KW; ++kx) {
              const int64_t ix = ox * SW + kx * DW - PL;
              if (ix >= 0 && ix < W) here |= xp[iy * W + ix] != xp[iy * W + ix];
            }
          }
          if (here) yr[ox] = NAN;
        }
      }
    }
  }
  free(xr);
  }
}

""" + NHWC_ROW.replace("%", "%%") + r"""
/* d: N, H, W, C, OH, OW, KH, KW, SH, SW, PT, PL, DH, DW */
void dpl_kernel_nhwc(const T *restrict x, T *restrict y, const int64_t *d) {
  const int64_t N = d[0], H = d[1], W = d[2], C = d[3], OH = d[4], OW = d[5], KH = d[6], KW = d[7];
  const int64_t SH = d[8], SW = d[9], PT = d[10], PL = d[11], DH = d[12], DW = d[13];
  #pragma omp parallel if(N * OH * OW * C >= %(parallel)d)
  {
  /* the column maxima of one output row; without it (no memory) each pixel's window in turn */
  T *restrict xr = malloc((size_t)(W * C > 0 ? W * C : 1) * sizeof(T));
  #pragma omp for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oy = 0; oy < OH; ++oy)
      dpl_pool_row_nhwc(x + n * H * W * C, 0, y + (n * OH + oy) * OW * C, xr, oy, H, W, C, OW, KH, KW, SH, SW, PT, PL, DH, DW);
  free(xr);
  }
}

/* the call list's way in (backends/cpu/call_list.py's KERNEL): p holds x and y */
void dpl_kernel_list(void **p, const int64_t *d) { dpl_kernel((const T *)p[0], (T *)p[1], d); }
void dpl_kernel_nhwc_list(void **p, const int64_t *d) { dpl_kernel_nhwc((const T *)p[0], (T *)p[1], d); }
"""



def _pair(v) -> tuple[int, int]:
    v = (v,) if isinstance(v, int) else tuple(v)
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def window(call) -> tuple[int, ...]:
    """Max pool ``call``'s window as the routines read it: KH, KW, SH, SW, PT, PL, DH, DW (the
    top and left padding; the output's shape says the rest)."""
    kh, kw = _pair(call.attrs.get("pool_size", 1))
    sh, sw = _pair(call.attrs.get("strides", 1))
    dh, dw = _pair(call.attrs.get("dilation", 1))
    pad = call.attrs.get("padding", 0)
    pad = (pad,) if isinstance(pad, int) else tuple(pad)
    pt, pl = (pad[0], pad[0]) if len(pad) == 1 else (pad[0], pad[1])
    return kh, kw, sh, sw, int(pt), int(pl), dh, dw


def takes(call, layouts=("NCHW", "NHWC"), dtypes=tuple(DTYPES)) -> bool:
    """Whether ``call`` is a max pool this routine runs: one of ``layouts`` (NCHW or NHWC), one of
    ``dtypes`` (float32 or float64)."""
    if not isinstance(call, Call) or call.op != "nn.max_pool2d" or len(call.args) != 1:
        return False
    x = call.args[0].ty
    return (call.attrs.get("layout", "NCHW") in layouts and getattr(x, "dtype", None) in dtypes
            and getattr(call.ty, "dtype", None) == x.dtype and len(x.shape) == 4)


def source(dtype: str) -> str:
    return SOURCE % {"ctype": DTYPES[dtype], "parallel": PARALLEL_MIN_OUTPUTS}


def runner(call: Call, lib, threads: int | None = None):
    """``fn(x, out)`` pooling ``x`` as ``call`` says into ``out`` (its shape is the output's), with
    the routine of ``lib`` (compiled from :func:`source`); ``threads`` caps its OpenMP team."""
    nhwc = call.attrs.get("layout", "NCHW") == "NHWC"
    entry = getattr(lib, SYMBOL + "_nhwc" if nhwc else SYMBOL)
    entry.restype = None
    entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    get_threads = getattr(lib, "omp_get_max_threads", None)
    set_threads = getattr(lib, "omp_set_num_threads", None) if threads and get_threads is not None else None
    listed = getattr(lib, (SYMBOL + "_nhwc" if nhwc else SYMBOL) + "_list")
    kh, kw, sh, sw, pt, pl, dh, dw = window(call)
    dtype = dtypes.to_numpy(call.ty.dtype)

    def dims_of(x_shape, out_shape) -> tuple[int, ...]:
        if nhwc:
            n, h, w, c = x_shape
            return (n, h, w, c, *out_shape[1:3], kh, kw, sh, sw, pt, pl, dh, dw)
        n, c, h, w = x_shape
        return (n * c, h, w, *out_shape[2:], kh, kw, sh, sw, pt, pl, dh, dw)

    def run(x, out):
        x = np.ascontiguousarray(x, dtype)
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        d = dims_of(x.shape, target.shape)
        dims = (ctypes.c_int64 * len(d))(*d)
        if set_threads is None:
            entry(x.ctypes.data, target.ctypes.data, dims)
        else:
            before = get_threads()
            set_threads(threads)
            try:
                entry(x.ctypes.data, target.ctypes.data, dims)
            finally:
                set_threads(before)
        if target is not out:
            np.copyto(out, target)
        return out

    def prepare(operands, outputs):
        """The call as a record of a prepared call (dpl.runtime.prepared), the call list's
        ``KERNEL`` way in: its team capped by the list, as ``run`` caps it."""
        (x, x_shape), = operands
        (y, y_shape), = outputs
        return [CCall(entry_address(listed), KERNEL, (x, y), dims_of(tuple(x_shape), tuple(y_shape)), int(threads or 0))]

    run.prepare = prepare  # type: ignore[attr-defined]
    return openmp_kernel(run, f"cpu:max-pool {kh}x{kw}", source(call.ty.dtype), threads, lambda n: runner(call, lib, n))

