"""float32 matrix products as dpl's own C routine, a model's weights packed once.

A BLAS packs the right operand of every product into panels before it multiplies, at every
call; a model's weights are the same at every call, so here a constant is packed once (at its
first call): ``ceil(N / NR)`` column panels, each ``K x NR`` contiguous (the last padded with
zeros, never stored; 64-byte aligned, so that no vector load straddles two cache lines). The
routine takes the rows in groups of at most ``MC``; a thread takes a group's panel and walks its
K-blocks of 512 rows and, in each, the group's rows ``MR`` at a time: an ``MR x NR`` tile of the
result lives in vector registers while the rows of ``A`` are broadcast against the panel's rows,
so the panel's block stays near while every row block reads it, and the panel's columns of the
result stay near from one K-block to the next. The first tiles of each block fetch the next
block into L2 while they compute: a model's weights come from L3, and without it the first
tiles of every block waited on them (a K = 256 product, its weights out of L2: 74% of the FMA
peak, and 83% with them in L2, on the AVX-512 bench host). Each tile's lines of the result are
prefetched for writing while it computes; a narrow last panel computes only the vectors it has.

The micro-kernel and blocking are the instruction set's the C is built for (``-march=native``:
the running CPU's, :mod:`dpl.backends.cpu.toolchain`), one ``#if`` in the source: AVX-512 6 x 64
(24 of the 32 zmm registers accumulate), AVX2 6 x 16 (12 of the 16 ymm registers, the tile BLIS
uses on Haswell and Zen), 4 x 8 elsewhere; B's rows prefetched 16 ahead on both. ``python
bench/bench_products.py --isa native,haswell`` measures both builds on one host against its FMA
peak (the table is in that script). A variable right operand (attention's keys and values,
im2col's columns) is read in place, row by row, only its narrow last panel copied.

It runs on the generated kernels' OpenMP team, so a plan whose products all come here uses one
thread pool: no BLAS workers spin beside the C kernels (:mod:`dpl.runtime.threads`), and two
threads run about twice as fast as one. That is why small products come here too, a few
microseconds slower each than the BLAS (197 x 64 @ 64 x 64: 23 against 15 us): ViT's one
1 x 256 pooler product on the BLAS capped every C kernel of its plan at one thread.

On the 2-core AVX-512 bench host, one thread, a decoder layer's four products (128 x 256 by
weights 256x512, 256x256, 256x1024, 512x256, then the next layer's), in sequence as a model
calls them: OpenBLAS 3.63 ms, this routine 3.15 (0.87x); at 1024 rows 26.5 and 24.8 ms.
``products="auto"`` uses the routine only where it measured faster on this machine
(:mod:`dpl.backends.cpu.products_choice`); :func:`takes` leaves to the BLAS what it cannot take
(float64, symbolic or broadcast batch shapes, a last vector mostly padding).

The arithmetic is the product's: every result element sums ``a[i, k] * w[k, j]`` over ``k`` in
order (fused multiply-adds, one K-block after another), so infinities and NaNs propagate as a
BLAS's do; the zeros of a padded panel column meet only results that are never stored.

A weight's product may carry the epilogue the segments folded into it (a bias over the last
dim, then a residual of its own shape: ``segments.fold_epilogues``): its last K-block adds them
to each tile right after storing it, while the tile is in L1, in that order and each sum
rounded as a separate add rounds it, so the result is bit-for-bit the product and the adds
run apart, without their pass over the product's output. (Inside the register tile they cost
the compiler 2.7 s over this source instead of 0.9; their gain was within this host's noise of this one.)

After them it may apply an activation (``ACTS``: ReLU, GELU and its tanh form, SiLU, tanh),
written as the generated kernels write it (the op's ``c_expr`` through ``dpl.kernel.ir.to_c``),
so the bits stay theirs.

A gated MLP's merged gate and up product may carry its gated unit instead (``glu_runner``): the
weight packed with gate and up panels alternating, ``dpl_glu`` computes each pair of tiles and
writes ``silu(gate) * up`` (the generated C's expression and, with :func:`source`'s
``vector_math``, its vector exp: the same bits), so the product's 2F columns are never stored
when K is at most ``KC`` rows, and are read back from L1 when it is more.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref

import numpy as np

from dpl.backends.cpu.addresses import address
from dpl.backends.cpu.call_list import PACKED, SCRATCH, entry_address
from dpl.ir.expr import Call, Constant
from dpl.runtime.prepared import Address, CCall
from dpl.runtime.threads import openmp_kernel

SYMBOL = "dpl_kernel"  # what the CPU backend's library cache checks a library for
KC = 256  # a gated unit of no more rows of W computes its tiles on the stack; more take a scratch (SOURCE's GLU_KC)
MAX_PAD = 0.125  # the share of its last vector's columns a product may waste as padding
VECTOR = 16  # columns of the widest vector the routine is built with (AVX-512); narrower ones pad less

SOURCE_HEAD = r"""
#include <tgmath.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* the micro-kernel and blocking of the instruction set this is built for (-march: the running CPU's):
   an MR x NR tile in vector registers (AVX-512: 24 of 32 zmm; AVX2: 12 of 16 ymm, BLIS's 6 x 16 of
   Haswell and Zen), K-blocks of KC rows (512: half the result's passes of 256, up to 10% faster
   on both builds), the rows MC at a time (their K-block of A stays in L2 while every panel reads
   it), B's rows PF ahead prefetched (0: none) */
#if defined(__AVX512F__)
enum { VL = 16, NV = 4, MR = 6, KC = 512, MC = 128, PF = 16 };
#elif defined(__AVX__)
enum { VL = 8, NV = 2, MR = 6, KC = 512, MC = 128, PF = 16 };
#else
enum { VL = 4, NV = 2, MR = 4, KC = 512, MC = 128, PF = 0 };
#endif
enum { NR = VL * NV, GLU_KC = KC_ROWS };
/* a gated unit of at most GLU_KC rows sums each tile in one chain on the stack: gemm's too */
_Static_assert((int)GLU_KC <= (int)KC, "the gated unit's tiles must round as gemm's");
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));

/* rows [0, mr) and vectors [0, nv) of the MR x NR tile at C: A's rows (stride lda) times the
   panel's kc rows at P (stride ldp: NR packed, the matrix's row length read in place), stored (add = 0) or added (a later K-block); ncols < nv * VL: the last
   panel's last vector is partly padding (a narrow last panel computes only the vectors it has) */
static inline __attribute__((always_inline)) void tile(const float *restrict A, int64_t lda,
    const float *restrict P, int64_t ldp, int64_t kc, float *restrict C, int64_t ldc, int mr, int nv, int64_t ncols, int add,
    const float *pre, int64_t npre) {
  vf c[MR][NV];
  for (int r = 0; r < MR; r++)
    for (int q = 0; q < NV; q++) c[r][q] = (vf){0};
  /* the tile's lines of C fetched for writing while it computes: their misses cost AVX2 a third
     of its rate where C outgrew L2 (1024 x 768 by 768 x 3072) */
  for (int r = 0; r < MR && r < mr; r++) {
    for (int j = 0; j < NR; j += 16) __builtin_prefetch(C + r * ldc + j, 1, 3);
    __builtin_prefetch(C + r * ldc + NR - 1, 1, 3);
  }
  for (int64_t k = 0; k < kc; k++) {
    vf b[NV];
    for (int q = 0; q < NV && q < nv; q++) b[q] = *(const vf *)(P + k * ldp + q * VL);
    for (int q = 0; PF && q < NV && q < nv; q++) __builtin_prefetch(P + (k + PF) * ldp + q * VL, 0, 3);
    if (k < npre) __builtin_prefetch(pre + k * 16, 0, 2);
    for (int r = 0; r < MR; r++)
      if (r < mr) {
        float a = A[r * lda + k];
        for (int q = 0; q < NV && q < nv; q++) c[r][q] += a * b[q];
      }
  }
  if (ncols == nv * VL) {
    for (int r = 0; r < MR && r < mr; r++)
      for (int q = 0; q < NV && q < nv; q++) {
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

/* the epilogue a product's last K-block applies to each tile it has just stored (the tile still
   in L1): plus bias[j] (NULL: none), then plus res[i, j] (NULL: none; row stride ldc), each sum
   rounded as the separate adds round it, then activation act (0: none; ACTS in packed_gemm.py,
   the generated kernels' own expressions); its pointers at the tile's first row and column */
typedef struct { const float *bias, *res; int act; } epi_t;

static void epilogue(float *restrict C, int64_t ldc, int mr, int64_t ncols, epi_t e) {
  for (int r = 0; r < mr; r++) {
    float *restrict row = C + r * ldc;
    if (e.bias) {
      #pragma omp simd
      for (int64_t j = 0; j < ncols; j++) row[j] += e.bias[j];
    }
    if (e.res) {
      const float *restrict res = e.res + r * ldc;
      #pragma omp simd
      for (int64_t j = 0; j < ncols; j++) row[j] += res[j];
    }
    switch (e.act) {
ACT_CASES
    }
  }
}

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t, int64_t, int,
                        const float *, int64_t);
#define TILE(m, v) static void tile##m##_##v(const float *A, int64_t lda, const float *P, int64_t ldp, int64_t kc, \
    float *C, int64_t ldc, int64_t ncols, int add, const float *pre, int64_t npre) { \
  tile(A, lda, P, ldp, kc, C, ldc, m, v, ncols, add, pre, npre); }
#define TILES(m) TILE(m, 1) TILE(m, 2) TILE(m, 3) TILE(m, 4)
TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6)
#define ROW(m) {0, tile##m##_1, tile##m##_2, tile##m##_3, tile##m##_4}
static const tile_fn tiles[7][5] = {{0}, ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6)};  /* [mr][nv], mr <= MR, nv <= NV */

int64_t dpl_panel_width(void) { return NR; }

/* Where gemm reads W's panels: panel p at P + p * ps, its row k at + k * ldp; a last panel
   narrower than NR from `tail` (rows of NR) when it is not NULL */
typedef struct { const float *P; int64_t ps, ldp; const float *tail; } panels_t;

/* C[M, N] = A[M, K] @ W[K, N] (then the epilogue e), W's ceil(N / NR) panels of K x NR as `w`
   says; at most `threads` threads sharing the (panel, row block) tiles of each K-block (one: no team) */
static void gemm(const float *A, panels_t w, float *C, int64_t M, int64_t K, int64_t N, int threads, epi_t e) {
  const int64_t panels = (N + NR - 1) / NR, blocks = (M + MR - 1) / MR;
  if (blocks == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float v = 0.0f;
        if (e.bias) v += e.bias[j];
        if (e.res) v += e.res[i * N + j];
        C[i * N + j] = v;
      }
    const epi_t act = {0, 0, e.act};
    for (int64_t i = 0; i < M; i++) epilogue(C + i * N, N, 1, N, act);
    return;
  }
  /* the rows in groups of at most MC, as even as whole row blocks make them (gb each, the last
     one's missing blocks skipped). The team takes items of (group, panel, a share of the group's
     row blocks: `split` shares where there are too few items for the team) in turn; each walks
     its panel's K-blocks and, in each, its row blocks, so its part of C stays near from block to
     block and every row block reads the panel's block from L2 */
  const int64_t groups = (M + MC - 1) / MC, gb = (blocks + groups - 1) / groups;
  int64_t split = 1;
  while (threads > 1 && groups * panels * split < 4 * threads && split < gb) split++;
  const int64_t per = (gb + split - 1) / split, items = groups * panels * split;
  const int64_t step = threads > 1 && items > 1 ? threads : 1;
  #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (step > 1)
  for (int64_t t = 0; t < items; t++) {
    const int64_t g = t / (panels * split), p = t / split % panels, s = t % split;
    const int64_t b0 = g * gb + s * per, b1 = b0 + per < (g + 1) * gb ? b0 + per : (g + 1) * gb;
    const int64_t ncols = N - p * NR < NR ? N - p * NR : NR;
    const int own = ncols < NR && w.tail != NULL;
    /* the panel this thread likely reads next: item t + step's (the team takes items in turn) */
    const int64_t pn = (t + step) / split % panels;
    const int next_packed = w.ldp == NR && t + step < items && !(N - pn * NR < NR && w.tail != NULL);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = K - k0 < KC ? K - k0 : KC;
      const float *panel = own ? w.tail + k0 * NR : w.P + p * w.ps + k0 * w.ldp;
      /* the block read after this one (this panel's next K-block, else the next item's first),
         fetched into L2 while this one computes, a line a k by each of its first `lines` tiles:
         a packed block is contiguous, and read from L3 its first tiles had run ~10% slower */
      const float *next = 0;
      int64_t knext = 0;
      if (k0 + kc < K && !own && w.ldp == NR) {
        next = w.P + p * w.ps + (k0 + kc) * NR;
        knext = K - k0 - kc < KC ? K - k0 - kc : KC;
      } else if (k0 + kc == K && next_packed) {
        next = w.P + pn * w.ps;
        knext = K < KC ? K : KC;
      }
      const int64_t lines = NR >= 16 ? NR / 16 : 1;  /* 64-byte lines in a packed row of NR floats */
      for (int64_t b = b0; b < b1 && b < blocks; b++) {
        const int64_t i = b * MR, q = b - b0;
        const int mr = M - i < MR ? (int)(M - i) : MR;
        const int fetch = next != 0 && q < lines;
        tiles[mr][(ncols + VL - 1) / VL](A + i * K + k0, K, panel, own ? NR : w.ldp, kc, C + i * N + p * NR, N, ncols,
                                         k0 > 0, fetch ? next + q * knext * 16 : 0, fetch ? knext : 0);
        if (k0 + kc == K && (e.bias || e.res || e.act)) {
          const epi_t te = {e.bias ? e.bias + p * NR : 0, e.res ? e.res + i * N + p * NR : 0, e.act};
          epilogue(C + i * N + p * NR, N, mr, ncols, te);
        }
      }
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

/* dims: M, K, N; P: the weights, packed; then plus bias[N] and plus res[M, N] where not NULL, then
   activation act (0: none) */
void dpl_kernel(const float *A, const float *P, float *C, const int64_t *dims, int threads, const float *bias,
                const float *res, int act) {
  const panels_t w = {P, dims[1] * NR, NR, NULL};
  const epi_t e = {bias, res, act};
  gemm(A, w, C, dims[0], dims[1], dims[2], team(threads), e);
}

/* dims: M, K, N (W[K, N] row-major into P) */
void dpl_pack(const float *W, float *P, const int64_t *dims) {
  pack(W, P, dims[1], dims[2]);
}

/* silu(g) * u into out, for the mr rows of a pair of NR-wide tiles (row stride ld; out's
   ldo): the gated unit as the generated C computes it, g / (1 + exp(-g)) times u */
static void glu_tile(const float *restrict g, const float *restrict u, int64_t ld, float *restrict out, int64_t ldo, int mr) {
  for (int r = 0; r < mr; r++) {
    #pragma omp simd
    for (int j = 0; j < NR; j++) {
      const float x = g[r * ld + j];
      out[r * ldo + j] = (x / (1 + expf(-x))) * u[r * ld + j];
    }
  }
}

/* out[M, F] = silu(gate) * up of A[M, K] @ W[K, 2F], W packed from its columns interleaved a
   panel at a time (panel 2p: the gate's columns [p NR, p NR + NR), panel 2p + 1: the up's; F a
   multiple of NR). One K-block: each pair of tiles accumulated on the stack and combined there,
   so the product's 2F columns are never stored. More: the whole product into scratch (M x 2F,
   interleaved), each pair of tiles combined as the last K-block stores it */
void dpl_glu(const float *A, const float *P, float *out, const int64_t *dims, int threads, float *scratch) {
  const int64_t M = dims[0], K = dims[1], F = dims[2], pairs = F / NR, blocks = (M + MR - 1) / MR;
  const int64_t ps = K * NR;
  threads = team(threads);
  if (K <= GLU_KC) {
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && pairs * blocks > 1)
    for (int64_t t = 0; t < pairs * blocks; t++) {
      const int64_t p = t / blocks, i = (t % blocks) * MR;
      const int mr = M - i < MR ? (int)(M - i) : MR;
      float g[MR * NR] __attribute__((aligned(64))), u[MR * NR] __attribute__((aligned(64)));
      if (K == 0) {
        memset(g, 0, sizeof g);
        memset(u, 0, sizeof u);
      } else {
        tiles[mr][NV](A + i * K, K, P + 2 * p * ps, NR, K, g, NR, NR, 0, 0, 0);
        tiles[mr][NV](A + i * K, K, P + (2 * p + 1) * ps, NR, K, u, NR, NR, 0, 0, 0);
      }
      glu_tile(g, u, NR, out + i * F + p * NR, F, mr);
    }
    return;
  }
  const panels_t w = {P, ps, NR, NULL};
  const epi_t none = {0, 0, 0};
  gemm(A, w, scratch, M, K, 2 * F, threads, none);
  #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t i = b * MR;
    const int mr = M - i < MR ? (int)(M - i) : MR;
    for (int64_t p = 0; p < pairs; p++)
      glu_tile(scratch + i * 2 * F + 2 * p * NR, scratch + i * 2 * F + (2 * p + 1) * NR, 2 * F, out + i * F + p * NR, F, mr);
  }
}

/* B[K, N] (row-major) read in place: its full panels where they lie, the narrow last one
   (N % NR columns) copied into `tail` (K x NR, zero-padded) */
static panels_t in_place(const float *B, int64_t K, int64_t N, float *tail) {
  const int64_t last = N / NR * NR, ncols = N - last;
  for (int64_t k = 0; ncols && k < K; k++) {
    memcpy(tail + k * NR, B + k * N + last, (size_t)ncols * sizeof(float));
    memset(tail + k * NR + ncols, 0, (size_t)(NR - ncols) * sizeof(float));
  }
  const panels_t w = {B, NR, N, ncols ? tail : NULL};
  return w;
}

/* C[b] = A[b] @ B[b / rep] for b < batch, B's matrices (K x N, row-major) read in place (the
   narrow last panel from scratch[b], K x NR); dims: batch, M, K, N, the elements between A's
   batches (0: one A for every batch) and rep, how many of A's batches in a row each of B's
   serves (1: its own; grouped-query attention's k and v: the group's size). Batches shared by
   the team where there are enough, else tiles */
void dpl_batched(const float *A, const float *B, float *C, const int64_t *dims, int threads, float *scratch) {
  const int64_t batch = dims[0], M = dims[1], K = dims[2], N = dims[3], as = dims[4], rep = dims[5];
  const epi_t none = {0, 0, 0};
  threads = team(threads);
  if (batch >= threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t b = 0; b < batch; b++)
      gemm(A + b * as, in_place(B + b / rep * K * N, K, N, scratch + b * K * NR), C + b * M * N, M, K, N, 1, none);
  } else {
    for (int64_t b = 0; b < batch; b++)
      gemm(A + b * as, in_place(B + b / rep * K * N, K, N, scratch + b * K * NR), C + b * M * N, M, K, N, threads, none);
  }
}
"""


# the activations a weight's product may apply after its bias (segments.fold_epilogues), as the
# generated kernels spell them (their ``c_expr`` through dpl.kernel.ir.to_c, float literals in
# single precision), numbered from 1 for the C's switch
ACTS = ("nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "tanh")


def _act_cases() -> str:
    from dpl.kernel.ir import Op, Var, to_c

    cases = []
    for code, name in enumerate(ACTS, 1):
        expr = to_c(Op(name, (Var("x", "float32"),), (), "float32"))
        cases.append(f"      case {code}:\n        #pragma omp simd\n        for (int64_t j = 0; j < ncols; j++) {{\n"
                     f"          const float x = row[j];\n          row[j] = (float)({expr});\n        }}\n        break;")
    return "\n".join(cases)


SOURCE = SOURCE_HEAD.replace("ACT_CASES", _act_cases()).replace("KC_ROWS", str(KC))  # the gated unit's bound, for C and Python


def source(vector_math: bool) -> str:
    """The routine's C; ``vector_math``: with glibc's vector exp declared (cgen.emitter.VECTOR_MATH),
    as the generated kernels have it, so that the gated unit's exp is theirs, lane for lane."""
    from dpl.backends.cgen.emitter import VECTOR_MATH

    return VECTOR_MATH + SOURCE if vector_math else SOURCE


def _broadcasts_after_a_prefix(sa, sb) -> bool:
    """Whether ``b``'s batch dims are ``a``'s, but for ones where ``a``'s are not after some
    prefix (the batch broadcast :func:`_repeats` counts: one matrix of ``b`` for a run of
    ``a``'s)."""
    lead_a, lead_b = tuple(sa[:-2]), tuple(sb[:-2])
    if len(lead_a) != len(lead_b):
        return False
    shared = len(lead_b)
    while shared and lead_b[shared - 1] == 1:
        shared -= 1
    return lead_a[:shared] == lead_b[:shared]


def takes(call: Call) -> bool:
    """Whether ``call`` is a float32 product this routine computes: of a tensor (any leading
    dims) by a constant matrix (packed once), or of two tensors of static shapes with the same
    batch dims (or the right one's broadcast after a prefix: grouped-query attention's), or by a
    matrix (read in place); wide enough that little of its last vector is
    padding (``VECTOR`` columns counted, the widest the routine is built with)."""
    if call.op != "matmul" or len(call.args) != 2:
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
    elif any(not isinstance(d, int) for d in (*sa, *sb)) or (len(sb) > 2 and not _broadcasts_after_a_prefix(sa, sb)):
        return False
    n = sb[-1]
    padded = -n % VECTOR
    return padded <= MAX_PAD * (n + padded)


_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]


class LibraryRoutine:
    """A routine of the backend's own in a library, or the future of one still compiling on the
    build pool (:mod:`dpl.runtime.build_pool`: the C compiler takes about a second over such a
    source, beside the model's kernels rather than before them), resolved at the first call
    (``_resolve``, the subclass's)."""

    def __init__(self, lib):
        self._lib = lib
        self._ready = None
        self._lock = threading.Lock()

    @property
    def failed(self) -> bool:
        """Whether the library's build finished with an error."""
        lib = self._lib
        return hasattr(lib, "result") and lib.done() and lib.exception() is not None


class Routine(LibraryRoutine):
    """The compiled product routine (see :class:`LibraryRoutine`)."""

    def __init__(self, lib):
        super().__init__(lib)
        self._scratch = threading.local()  # per thread: the narrow last panels of variable operands

    def _resolve(self):
        with self._lock:
            if self._ready is None:
                lib = self._lib.result() if hasattr(self._lib, "result") else self._lib
                for name, res, args in (("dpl_kernel", None, [*_ARGS, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]),
                                        ("dpl_batched", None, [*_ARGS, ctypes.c_void_p]),
                                        ("dpl_glu", None, [*_ARGS, ctypes.c_void_p]),
                                        ("dpl_pack", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]),
                                        ("dpl_panel_width", ctypes.c_int64, [])):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = res, args
                self._ready = (lib.dpl_kernel, lib.dpl_batched, lib.dpl_pack, int(lib.dpl_panel_width()), lib.dpl_glu)
        return self._ready

    @property
    def kernel(self):
        return (self._ready or self._resolve())[0]

    @property
    def panel_width(self) -> int:
        """NR, the columns of a tile."""
        return (self._ready or self._resolve())[3]

    def pack(self, w: np.ndarray) -> np.ndarray:
        """``w`` (K x N) as the routine reads it: ``ceil(N / NR)`` contiguous K x NR panels,
        the last one's padding zeros."""
        k, n = w.shape
        nr = self.panel_width
        packed = aligned_empty((-(-n // nr), k, nr))
        w = np.ascontiguousarray(w, np.float32)  # held while the routine reads it (a transposed constant is copied)
        (self._ready or self._resolve())[2](w.ctypes.data, packed.ctypes.data, (ctypes.c_int64 * 3)(0, k, n))
        return packed

    @property
    def glu(self):
        """``dpl_glu(A, P, out, dims, threads, scratch)``: the gated unit of a product whose
        weight :meth:`pack_glu` packed."""
        return (self._ready or self._resolve())[4]

    def pack_glu(self, w: np.ndarray, gate_first: bool) -> np.ndarray:
        """``w`` (K x 2F), the gate's and the up projection's columns side by side (the gate's
        first where ``gate_first``), packed with their panels alternating as ``dpl_glu`` reads
        them: gate, up, gate, up (F a multiple of the panel width)."""
        k, n = w.shape
        half, nr = n // 2, self.panel_width
        gate, up = (w[:, :half], w[:, half:]) if gate_first else (w[:, half:], w[:, :half])
        pairs = np.stack([gate.reshape(k, half // nr, nr), up.reshape(k, half // nr, nr)], axis=2)  # k, pair, 2, nr
        return self.pack(np.ascontiguousarray(pairs.reshape(k, n)))

    def batched(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, dims: tuple[int, ...], cap: int) -> None:
        """``out[i] = a[i] @ b[i // rep]`` for the ``dims = (batch, M, K, N, a's batch stride,
        rep)`` the arrays hold (contiguous float32), ``b`` read in place, each batch's narrow last
        panel copied into this thread's scratch (kept from call to call)."""
        batch, _, k, _, _, _ = dims
        size = max(1, batch * k * self.panel_width)
        buf = getattr(self._scratch, "buf", None)
        if buf is None or buf.size < size:
            buf = self._scratch.buf = aligned_empty((size,))  # the narrow last panels, read as the packed ones
        (self._ready or self._resolve())[1](address(a), address(b), address(out), (ctypes.c_int64 * 6)(*dims), cap, address(buf))


def aligned_empty(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    """An uninitialised float32 array whose first element lies on an ``align``-byte boundary: the
    routine's vector loads of the panels (a cache line each on AVX-512) then never straddle two
    lines; NumPy's own start 16 bytes in, which cost the products 15-20%."""
    size = math.prod(shape)
    raw = np.empty(size + align // 4, np.float32)
    skip = (-raw.ctypes.data % align) // 4
    return raw[skip:skip + size].reshape(shape)


def _into(out: np.ndarray, compute) -> np.ndarray:
    """``compute(target)`` writing a C-contiguous array, ``out`` itself where it is one."""
    target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
    compute(target)
    if target is not out:
        np.copyto(out, target)
    return out


class _Packed:
    """A constant's packed panels, made at the first call that needs them (a warm build stays
    quick: packing a small model's 4.7 MB of weights took 4 ms, mostly first-touch page
    faults) and shared by every runner of that constant (:func:`packed_weight`)."""

    def __init__(self, w: np.ndarray, routine: Routine):
        # the weight, weakly where it can be (its runners' calls hold it): a shared entry must
        # not keep a dead module's weight alive
        try:
            self.w = weakref.ref(w)
        except TypeError:
            self.w = lambda w=w: w
        self.routine = routine
        self.panels: np.ndarray | None = None
        self.lock = threading.Lock()

    def get(self, glu: bool | None = None) -> np.ndarray:
        """The panels; ``glu``: the gate-first flag of a gated unit's weight (``pack_glu``)."""
        if self.panels is None:
            with self.lock:
                if self.panels is None:
                    w = self.w()
                    self.panels = self.routine.pack(w) if glu is None else self.routine.pack_glu(w, glu)
        return self.panels


_SHARED: dict[tuple, tuple] = {}  # (id of the weight, id of the routine, how it is packed) -> (weakref of the weight, _Packed)
_SHARED_LOCK = threading.Lock()


def packed_weight(w: np.ndarray, routine: Routine, how: tuple = ()) -> _Packed:
    """The one :class:`_Packed` of constant ``w`` for ``routine`` (``how``: the gated unit's
    order), held while ``w`` lives: every plan's runner of a product of ``w`` shares its panels.
    A plan per bucket of sizes makes runners of its own, and packing a 4-layer Llama's weights
    again took 76 ms of each new bucket's first call (issue 31)."""
    key = (id(w), id(routine), how)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is not None and found[0]() is w:
            return found[1]
        packed = _Packed(w, routine)
        try:
            ref = weakref.ref(w, lambda _r, key=key, shared=_SHARED: shared.pop(key, None))
        except TypeError:  # not weakly referable: not shared
            return packed
        _SHARED[key] = (ref, packed)
        return packed


def glu_runner(call: Call, routine: Routine, gate_first: bool, threads: int | None = None, _packed: _Packed | None = None):
    """``fn(a, w, out)``: ``silu(gate) * up`` of product ``call`` (a constant weight of 2F
    columns, :func:`takes_glu`) into ``out`` (F columns), the weight packed once, its gate and
    up panels alternating; a K of more than one block keeps the whole product in a per-thread
    scratch."""
    packed = _packed or packed_weight(call.args[1].value, routine, ("glu", gate_first))
    k, n = call.args[1].ty.shape
    cap = int(threads or 0)
    local = threading.local()

    def run(a, w, out):
        a = np.ascontiguousarray(a, np.float32)
        m = a.size // k if k else math.prod(a.shape[:-1])
        scratch = getattr(local, "buf", None)
        if k > KC and (scratch is None or scratch.size < m * n):
            scratch = local.buf = np.empty(m * n, np.float32)
        dims = (ctypes.c_int64 * 3)(m, k, n // 2)
        return _into(out, lambda target: routine.glu(address(a), address(packed.get(gate_first)), address(target),
                                                      dims, cap, None if scratch is None else address(scratch)))

    def prepare(operands, outputs):
        """The call as a record of a prepared call (dpl.runtime.prepared): the panels packed now,
        a scratch of its own where K takes more than one block."""
        a, shape = operands[0]
        m = math.prod(shape) // k if k else math.prod(shape[:-1])
        scratch = Address.of(np.empty(max(1, m * n), np.float32)) if k > KC else None
        return [CCall(entry_address(routine.glu), SCRATCH, (a, Address.of(packed.get(gate_first)), outputs[0][0], scratch),
                      (m, k, n // 2), cap)]

    run.prepare = prepare  # type: ignore[attr-defined]
    return openmp_kernel(run, f"cpu:packed-matmul {k}x{n} + silu-gated unit", SOURCE, threads,
                         lambda t: glu_runner(call, routine, gate_first, t, packed))


def takes_glu(call: Call, panel_width: int = VECTOR * 4) -> bool:
    """Whether :func:`glu_runner` computes the gated unit of product ``call``: a float32
    product this routine takes, of a constant 2-D weight whose halves are whole panels."""
    if not (takes(call) and isinstance(call.args[1], Constant)):
        return False
    n = call.args[1].ty.shape[-1]
    return n % 2 == 0 and (n // 2) % panel_width == 0


def runner(call: Call, routine: Routine, threads: int | None = None, _packed: _Packed | None = None,
           bias: np.ndarray | None = None, residual: bool = False, act: str | None = None):
    """``fn(a, b, out)`` computing ``call`` (:func:`takes`) into ``out`` by ``routine``. A
    constant ``b`` is packed once, at the first call (the segment runner passes it again at
    each call, and it is not read again), a variable one read in place. ``threads`` caps the
    team. With the epilogue of a constant ``b``'s product (``backends/cpu/segments.py``,
    ``fold_epilogues``): plus ``bias`` (N values) and then, with ``residual``, plus the array
    given before ``out`` (``fn(a, b, res, out)``), then the activation ``act`` (one of
    ``ACTS``), each applied as the last K-block stores its tiles."""
    if not isinstance(call.args[1], Constant):
        return _variable_runner(call, routine, threads)
    packed = _packed or packed_weight(call.args[1].value, routine)
    k, n = call.args[1].ty.shape
    cap = int(threads or 0)
    bias = None if bias is None else np.ascontiguousarray(bias, np.float32).reshape(n)
    bias_address = None if bias is None else bias.ctypes.data  # read once: ``bias`` is kept with the runner

    def run(a, w, *rest):
        *res, out = rest
        a = np.ascontiguousarray(a, np.float32)
        dims = (ctypes.c_int64 * 3)(a.size // k if k else math.prod(a.shape[:-1]), k, n)
        r = np.ascontiguousarray(res[0], np.float32) if residual else None
        return _into(out, lambda target: routine.kernel(address(a), address(packed.get()), address(target), dims, cap,
                                                        bias_address, None if r is None else address(r), code))

    def prepare(operands, outputs):
        """The call as a record of a prepared call (dpl.runtime.prepared): the panels packed now."""
        (a, shape), _, *res = operands
        m = math.prod(shape) // k if k else math.prod(shape[:-1])
        args = (a, Address.of(packed.get()), outputs[0][0], None if bias is None else Address.of(bias),
                res[0][0] if residual else None)
        return [CCall(entry_address(routine.kernel), PACKED, args, (m, k, n), cap, code)]

    run.prepare = prepare  # type: ignore[attr-defined]
    code = 0 if act is None else ACTS.index(act) + 1
    epilogue = (" + bias" if bias is not None else "") + (" + residual" if residual else "") + (f", {act}" if act else "")
    return openmp_kernel(run, f"cpu:packed-matmul {k}x{n}{epilogue}", SOURCE, threads,
                         lambda t: runner(call, routine, t, packed, bias, residual, act))


def _repeats(a_shape, b_shape) -> int:
    """How many of ``a``'s batches in a row each of ``b``'s matrices serves: 1 where their batch
    dims are the same, the product of ``a``'s where ``b``'s broadcast (are 1) after a shared
    prefix (grouped-query attention's k and v: [1, 2, 1, ...] for q's [1, 2, 2, ...])."""
    if len(b_shape) == 2:
        return 1
    return max(1, math.prod(a_shape[:-2]) // max(1, math.prod(b_shape[:-2])))  # >= 1: the C divides by it


def _variable_runner(call: Call, routine: Routine, threads: int | None):
    """:func:`runner` for a variable right operand, read in place (each batch's narrow last
    panel copied into a per-thread scratch kept from call to call), the batches shared by the
    team."""
    a_shape, b_shape = call.args[0].ty.shape, call.args[1].ty.shape
    k, n = b_shape[-2:]
    if len(b_shape) == 2:  # one matrix for every row of ``a``
        batch, m = 1, math.prod(a_shape[:-1])
    else:
        batch, m = math.prod(a_shape[:-2]), a_shape[-2]
    dims = (batch, m, k, n, m * k, _repeats(a_shape, b_shape))
    cap = int(threads or 0)

    def run(a, b, out):
        a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
        return _into(out, lambda target: routine.batched(a, b, target, dims, cap))

    def prepare(operands, outputs):
        """The call as a record of a prepared call (dpl.runtime.prepared), with a scratch of its
        own for the narrow last panels."""
        (a, _), (b, _) = operands
        scratch = Address.of(np.empty(max(1, batch * k * routine.panel_width), np.float32))
        entry = (routine._ready or routine._resolve())[1]
        return [CCall(entry_address(entry), SCRATCH, (a, b, outputs[0][0], scratch), dims, cap)]

    run.prepare = prepare  # type: ignore[attr-defined]
    return openmp_kernel(run, f"cpu:packed-matmul {batch}x {m}x{k}x{n}", SOURCE, threads,
                         lambda t: _variable_runner(call, routine, t))


def array_matmul(routine: Routine, fallback, threads: int | None = None):
    """``fn(a, b, out)``: ``a`` (M x K) times each of ``b``'s matrices (n x K x N) into ``out``
    (n x M x N) by ``routine``, ``b`` read in place: im2col's product, the convolution's
    weights times its columns (backends/cpu/im2col.py). Other operands (not float32, not
    contiguous: a grouped convolution's slices) go to ``fallback(a, b, out)``."""
    cap = int(threads or 0)

    def run(a, b, out):
        if not (a.dtype == b.dtype == out.dtype == np.float32 and a.ndim == 2 and b.ndim == 3 and out.ndim == 3
                and a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            return fallback(a, b, out)
        n, k, cols = b.shape
        routine.batched(a, b, out, (n, a.shape[0], k, cols, 0, 1), cap)
        return out

    return run
