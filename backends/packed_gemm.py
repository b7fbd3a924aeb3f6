"""float32 products by a model's weights as dpl's own C routine, on weights packed once.

A BLAS packs the right operand of every product into panels before it multiplies, at every
call; a model's weights are the same at every call, so here they are packed when the plan is
built: ``ceil(N / NR)`` column panels, each ``K x NR`` contiguous (the last padded with zeros,
never stored). The routine walks the panels and, inside each, the rows ``MR`` at a time: an
``MR x NR`` tile of the result lives in vector registers while the rows of ``A`` are
broadcast against the panel's rows (a K-block of ``KC`` rows at a time, so that a panel's block
stays in L2 while every row block reads it). GCC's vector types spell the tile, so the same C
is 16-wide on AVX-512 (6 x 64), 8-wide on AVX (6 x 16) and 4-wide elsewhere (4 x 8).

On the 2-core AVX-512 bench host, one thread, a decoder layer's four products (128 x 256 by
weights 256x512, 256x256, 256x1024, 512x256, then the next layer's), in sequence as a model
calls them: OpenBLAS 3.63 ms, this routine 3.15 (0.87x); at 1024 rows 26.5 and 24.8 ms. It
loses where a product is small or narrow (197 x 64 @ 64 x 64: 1.48x, the call and the tile's
set-up dominate; N = 77 pads its second panel by 40%): :func:`takes` leaves those to the BLAS,
and ``products="auto"`` uses the routine only where it measured faster on this machine
(:mod:`dpl.backends.products_choice`).

The arithmetic is the product's: every result element sums ``a[i, k] * w[k, j]`` over ``k`` in
order (fused multiply-adds, one K-block after another), so infinities and NaNs propagate as a
BLAS's do; the zeros of a padded panel column meet only results that are never stored.
"""

from __future__ import annotations

import ctypes
import math
import threading

import numpy as np

from dpl.ir.expr import Call, Constant
from dpl.runtime.threads import OPENMP, openmp_kernel

SYMBOL = "dpl_kernel"  # what the CPU backend's library cache checks a library for
MIN_MACS = 1 << 21  # multiply-adds from which a product comes here (below: the call and tiles' set-up lose)
MAX_PAD = 0.125  # the share of padded panel columns a product may waste

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
enum { VL = 16, NV = 4, MR = 6 };
#elif defined(__AVX__)
enum { VL = 8, NV = 2, MR = 6 };
#else
enum { VL = 4, NV = 2, MR = 4 };
#endif
enum { NR = VL * NV, KC = 256 };
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));

/* rows [0, mr) of the MR x NR tile at C: A's rows (stride lda) times the panel's kc rows at P,
   stored (add = 0) or added (a later K-block); ncols < NR: the last panel, partly padding */
static inline __attribute__((always_inline)) void tile(const float *restrict A, int64_t lda,
    const float *restrict P, int64_t kc, float *restrict C, int64_t ldc, int mr, int64_t ncols, int add) {
  vf c[MR][NV];
  for (int r = 0; r < MR; r++)
    for (int q = 0; q < NV; q++) c[r][q] = (vf){0};
  for (int64_t k = 0; k < kc; k++) {
    vf b[NV];
    for (int q = 0; q < NV; q++) b[q] = *(const vf *)(P + k * NR + q * VL);
    for (int r = 0; r < MR; r++)
      if (r < mr) {
        float a = A[r * lda + k];
        for (int q = 0; q < NV; q++) c[r][q] += a * b[q];
      }
  }
  if (ncols == NR) {
    for (int r = 0; r < MR; r++)
      for (int q = 0; q < NV && r < mr; q++) {
        vf *o = (vf *)(C + r * ldc + q * VL);
        if (add) *o += c[r][q]; else *o = c[r][q];
      }
  } else {
    for (int r = 0; r < MR && r < mr; r++) {
      float t[NR];
      memcpy(t, c[r], sizeof t);
      for (int64_t j = 0; j < ncols; j++) C[r * ldc + j] = add ? C[r * ldc + j] + t[j] : t[j];
    }
  }
}

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int64_t, int);
#define TILE(m) static void tile##m(const float *A, int64_t lda, const float *P, int64_t kc, float *C, \
                                    int64_t ldc, int64_t ncols, int add) { tile(A, lda, P, kc, C, ldc, m, ncols, add); }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
static const tile_fn tiles[7] = {0, tile1, tile2, tile3, tile4, tile5, tile6};  /* [mr], mr <= MR */

int64_t dpl_panel_width(void) { return NR; }

/* C[M, N] = A[M, K] @ W[K, N], W packed as ceil(N / NR) panels of K x NR; at most `threads`
   threads sharing the (panel, row block) tiles of each K-block (one: no team) */
static void gemm(const float *A, const float *P, float *C, int64_t M, int64_t K, int64_t N, int threads) {
  const int64_t panels = (N + NR - 1) / NR, blocks = (M + MR - 1) / MR, tiles_n = panels * blocks;
  if (K == 0) {
    memset(C, 0, (size_t)(M * N) * sizeof(float));
    return;
  }
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = K - k0 < KC ? K - k0 : KC;
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && tiles_n > 1)
    for (int64_t t = 0; t < tiles_n; t++) {
      const int64_t p = t / blocks, i = (t % blocks) * MR;
      const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
      const int mr = M - i < MR ? (int)(M - i) : MR;
      tiles[mr](A + i * K + k0, K, P + (p * K + k0) * NR, kc, C + i * N + p * NR, N, ncols, k0 > 0);
    }
  }
}

static int team(int threads) {
#ifdef _OPENMP
  return threads > 0 ? threads : omp_get_max_threads();
#else
  return 1;
#endif
}

/* W[K, N] (row-major) as the panels gemm reads */
static void pack(const float *W, float *P, int64_t K, int64_t N) {
  for (int64_t p = 0; p * NR < N; p++) {
    const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
    for (int64_t k = 0; k < K; k++) {
      float *to = P + (p * K + k) * NR;
      memcpy(to, W + k * N + p * NR, (size_t)ncols * sizeof(float));
      memset(to + ncols, 0, (size_t)(NR - ncols) * sizeof(float));
    }
  }
}

/* dims: M, K, N; P: the weights, packed */
void dpl_kernel(const float *A, const float *P, float *C, const int64_t *dims, int threads) {
  gemm(A, P, C, dims[0], dims[1], dims[2], team(threads));
}

/* dims: M, K, N (W[K, N] row-major into P) */
void dpl_pack(const float *W, float *P, const int64_t *dims) {
  pack(W, P, dims[1], dims[2]);
}

/* C[b] = A[b] @ B[b] for b < batch, each B[b] (K x N, row-major) packed into scratch[b] first;
   dims: batch, M, K, N. Batches shared by the team where there are enough, else the tiles */
void dpl_batched(const float *A, const float *B, float *C, const int64_t *dims, int threads, float *scratch) {
  const int64_t batch = dims[0], M = dims[1], K = dims[2], N = dims[3];
  const int64_t packed = (N + NR - 1) / NR * NR * K;
  threads = team(threads);
  if (batch >= threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t b = 0; b < batch; b++) {
      pack(B + b * K * N, scratch + b * packed, K, N);
      gemm(A + b * M * K, scratch + b * packed, C + b * M * N, M, K, N, 1);
    }
  } else {
    for (int64_t b = 0; b < batch; b++) {
      pack(B + b * K * N, scratch + b * packed, K, N);
      gemm(A + b * M * K, scratch + b * packed, C + b * M * N, M, K, N, threads);
    }
  }
}
"""


def takes(call: Call, panel_width: int = 64) -> bool:
    """Whether ``call`` is a float32 product this routine computes: of a tensor (any leading
    dims) by a constant matrix (packed once), or of two tensors of static shapes with the same
    batch dims, or by a matrix (packed at each call); large enough, and wide enough that little
    of its last panel is padding."""
    if call.op != "matmul" or len(call.args) != 2 or panel_width <= 0:
        return False
    a, b = call.args
    sa, sb = a.ty.shape, b.ty.shape
    if not (a.ty.dtype == b.ty.dtype == call.ty.dtype == "float32") or len(sa) < 2 or len(sb) < 2:
        return False
    if len(call.ty.shape) != len(sa) or not isinstance(sa[-1], int):
        return False
    if isinstance(b, Constant):
        if len(sb) != 2:
            return False
    elif any(not isinstance(d, int) for d in (*sa, *sb)) or (len(sb) > 2 and tuple(sa[:-2]) != tuple(sb[:-2])):
        return False
    k, n = sb[-2:]
    macs = math.prod(d for d in sa[:-1] if isinstance(d, int)) * k * n  # a symbolic dim counts as 1
    padded = -n % panel_width
    return macs >= MIN_MACS and padded <= MAX_PAD * (n + padded)


def pack(w: np.ndarray, lib) -> np.ndarray:
    """``w`` (K x N) as the routine of ``lib`` reads it: ``ceil(N / NR)`` contiguous K x NR
    panels, the last one's padding zeros."""
    k, n = w.shape
    nr = panel_width(lib)
    packed = np.empty((-(-n // nr), k, nr), np.float32)
    fn = lib.dpl_pack
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    fn(np.ascontiguousarray(w, np.float32).ctypes.data, packed.ctypes.data, (ctypes.c_int64 * 3)(0, k, n))
    return packed


def panel_width(lib) -> int:
    fn = lib.dpl_panel_width
    fn.restype, fn.argtypes = ctypes.c_int64, []
    return int(fn())


class _Packed:
    """A constant's packed panels, made at the first call that needs them (a warm build stays
    quick: packing a small model's 4.7 MB of weights took 4 ms, mostly first-touch page
    faults) and shared by every thread cap of the product's runner."""

    def __init__(self, w: np.ndarray, lib):
        self.w, self.lib = w, lib
        self.panels: np.ndarray | None = None
        self.lock = threading.Lock()

    def get(self) -> np.ndarray:
        if self.panels is None:
            with self.lock:
                if self.panels is None:
                    self.panels = pack(self.w, self.lib)
                    self.w = None
        return self.panels


def runner(call: Call, lib, threads: int | None = None, _packed: _Packed | None = None):
    """``fn(a, b, out)`` computing ``call`` (:func:`takes`) into ``out`` with the routine of
    ``lib`` (compiled from :data:`SOURCE`). A constant ``b`` is packed once, at the first call
    (the segment runner passes it again at each call, and it is not read again), a variable
    one at each call. ``threads`` caps the team."""
    if not isinstance(call.args[1], Constant):
        return _variable_runner(call, lib, threads)
    entry = getattr(lib, SYMBOL)
    entry.restype = None
    entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    packed = _packed or _Packed(call.args[1].value, lib)
    k, n = call.args[1].ty.shape
    cap = int(threads or 0)

    def run(a, w, out):
        a = np.ascontiguousarray(a, np.float32)
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        dims = (ctypes.c_int64 * 3)(a.size // k if k else math.prod(a.shape[:-1]), k, n)
        entry(a.ctypes.data, packed.get().ctypes.data, target.ctypes.data, dims, cap)
        if target is not out:
            np.copyto(out, target)
        return out

    return openmp_kernel(run, f"cpu:packed-matmul {k}x{n}", SOURCE, threads, lambda t: runner(call, lib, t, packed))


def _variable_runner(call: Call, lib, threads: int | None):
    """:func:`runner` for a variable right operand: each batch's matrix packed into a scratch
    buffer (per thread, kept from call to call) and multiplied, the batches shared by the team."""
    entry = lib.dpl_batched
    entry.restype = None
    entry.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                      ctypes.c_void_p]
    a_shape, b_shape = call.args[0].ty.shape, call.args[1].ty.shape
    k, n = b_shape[-2:]
    if len(b_shape) == 2:  # one matrix for every row of ``a``
        batch, m = 1, math.prod(a_shape[:-1])
    else:
        batch, m = math.prod(a_shape[:-2]), a_shape[-2]
    nr = panel_width(lib)
    scratch = threading.local()
    size = max(1, batch * k * (-(-n // nr) * nr))
    dims = (ctypes.c_int64 * 4)(batch, m, k, n)
    cap = int(threads or 0)

    def run(a, b, out):
        a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
        buf = getattr(scratch, "buf", None)
        if buf is None:
            buf = scratch.buf = np.empty(size, np.float32)
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        entry(a.ctypes.data, b.ctypes.data, target.ctypes.data, dims, cap, buf.ctypes.data)
        if target is not out:
            np.copyto(out, target)
        return out

    return openmp_kernel(run, f"cpu:packed-matmul {batch}x {m}x{k}x{n}", SOURCE, threads,
                         lambda t: _variable_runner(call, lib, t))
