"""float32 channels-last ``nn.conv2d`` (NHWC data, OHWI weights, one group: what the
convert-layout pass makes) as dpl's own C, with the output's channels in the vector lanes.

Why channels in lanes: the output is written pixel by pixel with its channels contiguous, so a
tile of ``mc`` channel vectors times ``np`` pixels is stored as whole vectors whatever the image
width (no lanes lost to a row's end, as :mod:`conv_direct`'s pixel vectors lose 16 of 128 on
ResNet's 112-wide stem rows), and an epilogue's per-channel values (an inference BatchNorm's four
steps) are vectors too. Each tap (input channel, kh, kw) loads ``mc`` weight vectors and
broadcasts one input value per pixel: ``mc + np`` loads for ``mc * np`` FMAs (AVX-512: 4 x 6,
3 x 8, 2 x 12, 1 x 12 tiles; AVX2: 2 x 6, 1 x 12).

A 1x1 convolution at stride 1 without padding reads its input as it lies. Any other is first
*prepared*: padded and split into its stride's phases (``x[S i + ph, S j + pw]`` at
``[ph, pw, i, j]``), the channels still innermost, whole pixels copied and nothing transposed;
consecutive output pixels of a row then read consecutive pixels of the source at every tap, so
a tap is one offset (``conv_direct.Geometry``'s window, in pixels, times C, plus the channel) and
a tile's pixels lie C floats apart. The walk is flat: the output grid as rows of the source's
width ``Wq``, ``Wq - OW`` columns of each row computed and never stored (ResNet's stem: 3 of
115), the tiles' pixels anywhere in it, the last tile overlapping the one before so that none
reads past the source. Measured against pixel vectors over transposed channel planes (one
thread, AVX-512): the same on the stem, 0.17 -> 0.13 ms on a 3x3 at stride 2 over 32 channels,
where the transposition cost a quarter of the time.

The weights are packed at the first call as blocks of ``K x (mc VL)`` (``mc`` the largest tile
width dividing the output's channel vectors, zero channels padding the last vector), and each
tile's last step applies the epilogue the segments folded into the convolution in its registers:
the per-channel steps (``conv_direct.STEPS``), plus a residual of the output's layout, then a
ReLU; another activation (``packed_gemm.ACTS``) on the stored pixel. Each step is rounded as its
separate op rounds it; padding is real zeros, as the reference's.
"""

from __future__ import annotations

import ctypes

import numpy as np

from dpl.backends.cpu import conv_direct, max_pool, packed_gemm
from dpl.ir.expr import Call, Constant, Var
from dpl.ir.types import TensorType
from dpl.ops.registry import make_call
from dpl.runtime.threads import available_cores, openmp_kernel

SOURCE_HEAD = r"""
#include <tgmath.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* VL floats a vector; a tile of mc channel vectors holds NP<mc> pixels */
#if defined(__AVX512F__)
enum { VL = 16, MCMAX = 4, NP1 = 12, NP2 = 12, NP3 = 8, NP4 = 6 };
#elif defined(__AVX__)
enum { VL = 8, MCMAX = 2, NP1 = 12, NP2 = 6, NP3 = 1, NP4 = 1 };
#else
enum { VL = 4, MCMAX = 2, NP1 = 6, NP2 = 3, NP3 = 1, NP4 = 1 };
#endif
enum { NPMAX = NP1 > NP2 ? NP1 : NP2 };
#define UNROLL _Pragma("GCC unroll 32")
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));

int64_t dpl_conv_lanes(void) { return VL; }
int64_t dpl_conv_widest(void) { return MCMAX; }
int64_t dpl_conv_slack(void) { return NPMAX; }  /* pixels a tile may read past a prepared image */

/* a tile's epilogue: the per-channel steps (code[s]: 1 + c, 2 - c, 3 c -, 4 * c, 5 / c, 6 c /, with
   c = vals[s Op + o], Op the channels padded to whole vectors), a residual laid out as the output
   (NULL: none), a ReLU (relu) */
typedef struct {
  const int64_t *code;
  const float *vals, *res;
  int64_t steps, Op;
  int relu;
} fin_t;

typedef void (*tile_fn)(const float *, const float *, const int64_t *, int64_t, int64_t, int64_t, int64_t, int64_t,
                        float *, int64_t, int64_t, int64_t, const fin_t *, int64_t, int64_t, int64_t);
TILES

/* what a tile's registers did not apply, on one stored pixel's n channels: the activation */
static void epilogue(float *restrict row, int64_t ncols, int act) {
  switch (act) {
ACT_CASES
  }
}

/* x[H, W, C] (one NHWC image) padded by (pt, pl) and split into its Sh x Sw phases, channels
   innermost: P[ph, pw, i, j, c] = x[Sh i + ph - pt, Sw j + pw - pl, c], zero outside x; each phase
   Hq x Wq pixels, those used[ph Sw + pw] only. Whole pixels are copied (a row at stride 1),
   nothing transposed. */
static void prepare(const float *restrict x, float *restrict P, int64_t C, int64_t H, int64_t Wd, int64_t Sh,
                    int64_t Sw, int64_t pt, int64_t pl, int64_t Hq, int64_t Wq, const int8_t *used, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && Sh * Hq * C * Wd > 32768)
  for (int64_t r = 0; r < Sh * Hq; r++) {  /* one phase row ph, plane row i */
    const int64_t ph = r / Hq, i = r % Hq, y = Sh * i + ph - pt;
    for (int64_t pw = 0; pw < Sw; pw++) {
      if (!used[ph * Sw + pw]) continue;
      float *to = P + (((ph * Sw + pw) * Hq + i) * Wq) * C;
      if (y < 0 || y >= H) { memset(to, 0, (size_t)(Wq * C) * sizeof(float)); continue; }
      const float *from = x + y * Wd * C;
      /* the columns whose pixel lies inside x: [lo, hi) */
      int64_t lo = pl - pw > 0 ? (pl - pw + Sw - 1) / Sw : 0, hi = Wd + pl - pw > 0 ? (Wd + pl - pw + Sw - 1) / Sw : 0;
      lo = lo < Wq ? lo : Wq;
      hi = hi < Wq ? hi : Wq;
      hi = hi > lo ? hi : lo;
      memset(to, 0, (size_t)(lo * C) * sizeof(float));
      memset(to + hi * C, 0, (size_t)((Wq - hi) * C) * sizeof(float));
      if (Sw == 1) memcpy(to + lo * C, from + (lo + pw - pl) * C, (size_t)((hi - lo) * C) * sizeof(float));
      else if (C < 16)  /* a few channels (an image's three): no call a pixel */
        for (int64_t j = lo; j < hi; j++)
          for (int64_t c = 0; c < C; c++) to[j * C + c] = from[(Sw * j + pw - pl) * C + c];
      else
        for (int64_t j = lo; j < hi; j++) memcpy(to + j * C, from + (Sw * j + pw - pl) * C, (size_t)C * sizeof(float));
    }
  }
}

typedef float T;  /* the pooled row (max_pool.py) in this routine's float */
NHWC_ROW
/* rows [r0, r1) of the output (the flat walk's pixels from r0 Wq to (r1 - 1) Wq + OW) into out, which
   holds rows from row0 on: each tile by every channel block, the last tile overlapping the one
   before it (none reads before the walk's first pixel: `skip`), then another activation */
static void conv_rows(tile_fn fn, int np, const float *W, const float *S, const int64_t *off, int64_t K, int64_t Wq,
                      int64_t OW, float *out, int64_t O, int64_t width, int64_t blocks, const fin_t *fin, int64_t C,
                      int act, int64_t r0, int64_t r1, int64_t row0) {
  const int64_t qs = r0 * Wq, Qe = (r1 - 1) * Wq + OW, last = Qe - np > 0 ? Qe - np : 0;
  for (int64_t q = qs; q < Qe; q += np) {
    const int64_t q0 = q < last ? q : last;
    for (int64_t b = 0; b < blocks; b++) {
      const int64_t o0 = b * width, nl = O - o0 < width ? O - o0 : width;
      fn(W + b * K * width, S, off, K, q0, Qe, Wq, OW, out, O, o0, nl, fin, C, q - q0, row0);
    }
  }
  if (act > 1) epilogue(out + (r0 - row0) * OW * O, (r1 - r0) * OW * O, act);
}

/* p: x [N, H, W, C], the packed weights (blocks of K x mc VL), out [N, OH, OW, O] (pooled: [N, POH,
   POW, O]), the steps' values [steps, Op], residual [N, OH, OW, O] (NULL: none), off [K] (the
   taps' offsets in floats from a pixel's first input), scratch (one prepared image, Sh Sw Hq Wq
   C floats and NPMAX C of zeroed slack; a pool's rows after), the steps' codes [steps], which
   phases the taps read [Sh Sw] (int8)
   d: N, C, H, W, O, OH, OW, K, Sh, Sw, pt, pl, Hq, Wq, steps, act, threads, mc, pointwise (1x1,
   stride 1, no padding: the input read as it lies where it has a whole tile of pixels); then a
   max pool the segments folded in: KH (0: none), KW, SH, SW, PT, PL, DH, DW, POH, POW, the
   buffers of rows in scratch (one a thread, at most) and where they start (floats)

   The walk is flat over the source's pixels, rows Wq wide; where it has a whole tile of pixels
   the last tile ends at Q, overlapping the one before it (its pixels from `skip` on stored), so
   no tile reads past the source; else the one tile reads into the prepared image's slack.
   Pooled, each thread takes a run of pooled rows, computing the convolution's rows each needs
   into its buffer (those the last one read moved to the front, not computed again) and pooling
   them there while they are in cache: ResNet's stem had written 3.2 MB, then read it back. */
void dpl_kernel(void **p, const int64_t *d) {
KERNEL_ARGS
  const int mc = (int)d[17];
  if (OH <= 0 || OW <= 0) return;
  const int np = mc == 1 ? NP1 : mc == 2 ? NP2 : mc == 3 ? NP3 : NP4;
  const tile_fn fn = mc == 1 ? tile1 : mc == 2 ? tile2 : mc == 3 ? tile3 : tile4;
  const int64_t width = (int64_t)mc * VL, Op = (O + VL - 1) / VL * VL, blocks = Op / width;
  const int64_t Q = (OH - 1) * Wq + OW, tiles = (Q + np - 1) / np;
  const int in_place = d[18] && Q >= np;
  const int64_t PKH = d[19], PKW = d[20], PSH = d[21], PSW = d[22], PPT = d[23], PPL = d[24], PDH = d[25], PDW = d[26];
  const int64_t POH = d[27], POW = d[28], nbuf = d[29], pool_at = d[30];
  /* tasks: a tile's pixels by a group of channel blocks, as many groups as give the team four
     tasks a thread where the tiles alone do not, tile by tile; where the weights outgrow half
     the L2 (3x3 over 256 channels: 2.4 MB), a block at a time over every tile, so that its
     weights stay in cache while the tiles read them (each tile had read every block's) */
  const int by_block = blocks > 1 && K * width * blocks * (int64_t)sizeof(float) > (1 << 20);
  int64_t groups = by_block ? blocks : (4 * threads + tiles - 1) / tiles;
  groups = groups > blocks ? blocks : groups;
  const int64_t per = (blocks + groups - 1) / groups;
  for (int64_t n = 0; n < N; n++) {
    const float *S = in_place ? x + n * H * Wd * C : scratch;
    if (!in_place) prepare(x + n * H * Wd * C, scratch, C, H, Wd, Sh, Sw, pt, pl, Hq, Wq, (const int8_t *)p[8], threads);
    const fin_t fin = {code, vals, res ? res + n * OH * OW * O : 0, steps, Op, act == 1};
    if (PKH > 0) {
      const int64_t span = (PKH - 1) * PDH + 1, row = OW * O, team = threads < nbuf ? threads : nbuf;
      float *pooled = out + n * POH * POW * O;
      #pragma omp parallel num_threads(team) if (team > 1 && POH > 1)
      {
#ifdef _OPENMP
        float *rows = scratch + pool_at + (int64_t)omp_get_thread_num() * (span + 1) * row;
#else
        float *rows = scratch + pool_at;
#endif
        float *across = rows + span * row;  /* the pool's column maxima of one row */
        int64_t ha = 0, hb = 0;  /* the convolution's rows held: [ha, hb) at rows */
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < POH; i++) {
          int64_t a = i * PSH - PPT, b = a + span;
          a = a < 0 ? 0 : a > OH ? OH : a;
          b = b > OH ? OH : b < a ? a : b;
          int64_t from = a;
          if (a >= ha && a < hb) {  /* rows [a, hb) held already: to the front */
            from = hb < b ? hb : b;
            memmove(rows, rows + (a - ha) * row, (size_t)((from - a) * row) * sizeof(float));
          }
          if (from < b) conv_rows(fn, np, W, S, off, K, Wq, OW, rows, O, width, blocks, &fin, C, act, from, b, a);
          ha = a;
          hb = b;
          dpl_pool_row_nhwc(rows, a, pooled + i * POW * O, across, i, OH, OW, O, POW, PKH, PKW, PSH, PSW, PPT, PPL, PDH, PDW);
        }
      }
      continue;
    }
    float *on = out + n * OH * OW * O;
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && tiles * groups > 1)
    for (int64_t task = 0; task < tiles * groups; task++) {
      const int64_t t = by_block ? task % tiles : task / groups, g = by_block ? task / tiles : task % groups;
      const int64_t b0 = g * per, b1 = b0 + per < blocks ? b0 + per : blocks;
      const int64_t q0 = Q >= np && t * np > Q - np ? Q - np : t * np;
      for (int64_t b = b0; b < b1; b++) {
        const int64_t o0 = b * width, nl = O - o0 < width ? O - o0 : width;
        fn(W + b * K * width, S, off, K, q0, Q, Wq, OW, on, O, o0, nl, &fin, C, t * np - q0, 0);
      }
      if (act > 1)
        for (int64_t q = t * np; q < (t + 1) * np && q < Q; q++)
          if (q % Wq < OW) {
            const int64_t lo = b0 * width, hi = b1 * width < O ? b1 * width : O;
            epilogue(on + (q / Wq * OW + q % Wq) * O + lo, hi - lo, act);
          }
    }
  }
}
"""

# one tile function a width (tile1 .. tile4, each its accumulators' exact count: in registers)
TILE = r"""
/* pixels [q0, q0 + np) of the flat walk (q = oh Wq + ow; ow >= OW computed, not stored; q >= Q
   and the first `skip` neither) by the mc channel vectors of block W (K x mc VL, packed), from
   the source S (tap k of pixel q at S + off[k] + q ps, ps = C: the input, or its prepared
   phases), into out (NHWC, O channels a pixel, its rows from row0 on; the block's channels from
   o0, nl of them valid) */
static void TILE(const float *restrict W, const float *restrict S, const int64_t *restrict off, int64_t K, int64_t q0,
                 int64_t Q, int64_t Wq, int64_t OW, float *restrict out, int64_t O, int64_t o0, int64_t nl, const fin_t *fin,
                 int64_t ps, int64_t skip, int64_t row0) {
  enum { mc = MC < MCMAX ? MC : MCMAX, np = NP };  /* an array of their exact size: all in registers */
  vf c[np][mc];
  UNROLL for (int p = 0; p < np; p++)
    UNROLL for (int m = 0; m < mc; m++) c[p][m] = (vf){0};
  const float *src = S + q0 * ps;
  int64_t at[np];  /* each pixel's offset, in registers: an address mode a broadcast, no chain of adds */
  UNROLL for (int p = 0; p < np; p++) {
    at[p] = p * ps;
    __asm__("" : "+r"(at[p]));  /* opaque: the compiler keeps it, not a chain of adds from one */
  }
  for (int64_t k = 0; k < K; k++) {
    const float *s = src + off[k];
    __asm__("" : "+r"(s));  /* a base register: each broadcast one address mode off it */
    vf w[MCMAX];
    UNROLL for (int m = 0; m < mc; m++) w[m] = *(const vf *)(W + (k * mc + m) * VL);
    UNROLL for (int p = 0; p < np; p++) {
      const float a = s[at[p]];
      UNROLL for (int m = 0; m < mc; m++) c[p][m] += a * w[m];
    }
  }
  /* the steps on every pixel's registers (a switch a step, not a vector or pixel), then each
     stored pixel's residual and ReLU */
  for (int64_t s = 0; s < fin->steps; s++) {
    vf x[mc];
    UNROLL for (int m = 0; m < mc; m++) x[m] = *(const vf *)(fin->vals + s * fin->Op + o0 + m * VL);
#define DPL_STEP(e) UNROLL for (int m = 0; m < mc; m++) UNROLL for (int p = 0; p < np; p++) c[p][m] = (e); break;
    switch (fin->code[s]) {
      case 1: DPL_STEP(c[p][m] + x[m])
      case 2: DPL_STEP(c[p][m] - x[m])
      case 3: DPL_STEP(x[m] - c[p][m])
      case 4: DPL_STEP(c[p][m] * x[m])
      case 5: DPL_STEP(c[p][m] / x[m])
      default: DPL_STEP(x[m] / c[p][m])
    }
#undef DPL_STEP
  }
  int64_t oh = q0 / Wq, ow = q0 - oh * Wq;
  const float *res = fin->res;
  if (skip == 0 && q0 + np <= Q && nl == mc * VL && (Wq == OW || ow + np <= OW)) {  /* every pixel stored, whole vectors: one stride */
    const int64_t at = ((oh - row0) * OW + ow) * O + o0;
    if (res) UNROLL for (int p = 0; p < np; p++) UNROLL for (int m = 0; m < mc; m++) c[p][m] = c[p][m] + *(const vf *)(res + at + p * O + m * VL);
    if (fin->relu) UNROLL for (int p = 0; p < np; p++) UNROLL for (int m = 0; m < mc; m++) c[p][m] = (vf)((vi)c[p][m] & ~(vi)(c[p][m] <= (vf){0}));
    UNROLL for (int p = 0; p < np; p++) UNROLL for (int m = 0; m < mc; m++) *(vf *)(out + at + p * O + m * VL) = c[p][m];
    return;
  }
  UNROLL for (int p = 0; p < np; p++, ow++) {
    if (ow == Wq) { ow = 0; oh++; }
    if (q0 + p >= Q) break;
    if (ow >= OW || p < skip) continue;
    const int64_t at = ((oh - row0) * OW + ow) * O + o0;
    UNROLL for (int m = 0; m < mc; m++) {
      const int64_t n = nl - m * VL;
      vf v = c[p][m];
      if (res) {
        vf e = (vf){0};
        if (n >= VL) e = *(const vf *)(res + at + m * VL);
        else if (n > 0) memcpy(&e, res + at + m * VL, (size_t)n * sizeof(float));
        v = v + e;
      }
      if (fin->relu)  /* the kernels' (x <= 0 ? 0 : x): +0 for -0, NaN kept */
        v = (vf)((vi)v & ~(vi)(v <= (vf){0}));
      if (n >= VL) *(vf *)(out + at + m * VL) = v;
      else if (n > 0) memcpy(out + at + m * VL, &v, (size_t)n * sizeof(float));
    }
  }
}
"""
TILES = "".join(f"#define MC {m}\n#define NP NP{m}\n#define TILE tile{m}\n{TILE}#undef MC\n#undef NP\n#undef TILE\n" for m in (1, 2, 3, 4))
SOURCE = SOURCE_HEAD.replace("NHWC_ROW", max_pool.NHWC_ROW).replace("KERNEL_ARGS", conv_direct.KERNEL_ARGS).replace("TILES", TILES).replace("ACT_CASES", packed_gemm._act_cases())


def takes(call: Call) -> bool:
    """Whether ``call`` is a convolution this routine computes: float32 throughout, NHWC data,
    OHWI weights, one group, a static channel count and window."""
    if not isinstance(call, Call) or call.op != "nn.conv2d" or len(call.args) != 2:
        return False
    a = call.attrs
    if a.get("data_layout") != "NHWC" or a.get("kernel_layout") != "OHWI" or int(a.get("groups", 1)) != 1:
        return False
    x, w = call.args
    if not all(getattr(t, "dtype", None) == "float32" for t in (x.ty, w.ty, call.ty)):
        return False
    return len(w.ty.shape) == 4 and all(isinstance(v, int) for v in w.ty.shape) and isinstance(x.ty.shape[3], int)


def pools(call: Call) -> bool:
    """Whether this routine pools its rows by max pool ``call`` (:func:`runner`'s ``pool``): a
    float32 channels-last one the max pool routine takes."""
    return max_pool.takes(call, layouts=("NHWC",), dtypes=("float32",))


class Geometry:
    """Where a convolution's taps read its NHWC source, at one input shape: the shape facts of
    :class:`conv_direct.Geometry` (the phases' planes, the output's size), and each tap
    ``(c, kh, kw)``'s offset in floats from a pixel's first input (the order
    :meth:`Routine.pack` packs the weights in). With the max pool ``pool`` folded in (its call),
    its window and output size, and the floats of the ``buffers`` buffers of rows it pools from
    (one a thread)."""

    def __init__(self, attrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...], pool: Call | None = None,
                 buffers: int = 1):
        n, h, w, c = (int(v) for v in x_shape)
        o, kh, kw, ci = w_shape
        g = conv_direct.Geometry(attrs, (n, c, h, w), (o, ci, kh, kw))
        self.offsets = np.ascontiguousarray((g.window[None] * c + np.arange(c)[:, None, None]).reshape(-1), np.int64)
        self.phases, self.channels = g.phases, c
        self.scratch = g.scratch  # one prepared image, in floats (the routine adds its slack)
        self.dims = (g.n, c, g.h, g.w, g.o, max(g.oh, 0), max(g.ow, 0), g.k, g.sh, g.sw, g.pt, g.pl, g.hq, g.wq)
        self.pointwise, self.pixels = g.pointwise, max(g.oh, 0) * max(g.ow, 0)
        self.pool, self.pool_floats = (0,) * 10, 0
        if pool is not None:
            window = max_pool.window(pool)
            oh, ow = _pooled_size(pool, g.n, max(g.oh, 0), max(g.ow, 0), g.o)
            self.pool = (*window, oh, ow)
            span = (window[0] - 1) * window[6] + 1  # the convolution's rows a pooled row reads
            self.pool_floats = buffers * (span + 1) * max(g.ow, 0) * g.o


def _pooled_size(pool: Call, n: int, h: int, w: int, c: int) -> tuple[int, int]:
    """The output size of max pool ``pool`` over an ``n x h x w x c`` image: its op's own type
    rule (ceil mode, uneven padding)."""
    x = Var("x", TensorType((n, h, w, c), pool.ty.dtype))
    shape = make_call("nn.max_pool2d", [x], dict(pool.attrs)).ty.shape
    return int(shape[1]), int(shape[2])


def tile_width(channels: int, lanes: int, widest: int) -> int:
    """The channel vectors of a tile: the most (up to ``widest``) that divide the output's."""
    vectors = -(-channels // lanes)
    return next(m for m in range(min(widest, vectors), 0, -1) if vectors % m == 0)


class Routine(packed_gemm.LibraryRoutine):
    """The compiled convolution (``dpl_kernel``), resolved at the first call."""

    def _resolve(self):
        with self._lock:
            if self._ready is None:
                lib = self._lib.result() if hasattr(self._lib, "result") else self._lib
                entry = lib.dpl_kernel
                entry.restype, entry.argtypes = None, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
                facts = []
                for name in ("dpl_conv_lanes", "dpl_conv_widest", "dpl_conv_slack"):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = ctypes.c_int64, []
                    facts.append(int(fn()))
                self._ready = (entry, *facts)
        return self._ready

    @property
    def entry(self):
        return (self._ready or self._resolve())[0]

    @property
    def lanes(self) -> int:
        return (self._ready or self._resolve())[1]

    def width(self, channels: int) -> int:
        """The channel vectors of a tile for ``channels`` output channels."""
        ready = self._ready or self._resolve()
        return tile_width(channels, ready[1], ready[2])

    def image_size(self, g: Geometry) -> int:
        """Floats of a buffer for a prepared image of geometry ``g``, and of the slack a tile of
        an image of fewer pixels than a tile reads past it; none for a 1x1 that ``dpl_kernel``
        reads in place (a tile's pixels, at most the slack's, inside its input)."""
        slack = (self._ready or self._resolve())[3]
        return 0 if g.pointwise and g.pixels >= slack else g.scratch + slack * g.channels

    def scratch_size(self, g: Geometry) -> int:
        """Floats of ``dpl_kernel``'s scratch: the prepared image (:meth:`image_size`), then a
        folded pool's buffers of rows."""
        return self.image_size(g) + g.pool_floats

    def scratch(self, g: Geometry) -> np.ndarray:
        """:meth:`scratch_size` floats, the slack zeroed (no NaN, no subnormal slowing a lane no
        one stores)."""
        size = self.scratch_size(g)
        buf = packed_gemm.aligned_empty((max(size, 1),))
        buf[min(g.scratch, size):] = 0
        return buf

    def pack(self, w: np.ndarray) -> np.ndarray:
        """OHWI weights as ``dpl_kernel`` reads them: blocks of ``K x (mc VL)`` channels, the taps
        ``(c, kh, kw)`` in order, zero channels padding the last vector."""
        o = w.shape[0]
        vl = self.lanes
        width = self.width(o) * vl
        padded = -(-o // vl) * vl
        flat = np.zeros((int(np.prod(w.shape[1:])), padded), np.float32)  # K x O
        flat[:, :o] = np.asarray(w, np.float32).transpose(3, 1, 2, 0).reshape(-1, o)
        packed = packed_gemm.aligned_empty((padded // width, flat.shape[0], width))
        packed[...] = flat.reshape(flat.shape[0], -1, width).transpose(1, 0, 2)
        return packed

    def values(self, steps: tuple, channels: int) -> np.ndarray:
        """The steps' per-channel values as ``dpl_kernel`` reads them: ``[steps, Op]``, each row
        padded to whole vectors (values no stored lane reads)."""
        vl = self.lanes
        out = packed_gemm.aligned_empty((max(len(steps), 1), -(-channels // vl) * vl))
        out[...] = 1
        for i, (_, v) in enumerate(steps):
            out[i, :channels] = np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (channels,))
        return out


def runner(call: Call, routine: Routine, threads: int | None = None, residual: bool = False, act: str | None = None,
           steps: tuple = (), pool: Call | None = None, _weights=None):
    """``fn(x, w, out)`` computing convolution ``call`` (:func:`takes`) into ``out`` by
    ``routine``, a constant weight packed once (a variable one at each call); with the epilogue
    the segments folded into it, each step rounded as its op rounds it: the per-channel
    ``steps`` (``(code, values)``, ``conv_direct.step_code``), then with ``residual`` plus the
    array given before ``out`` (``fn(x, w, res, out)``), then activation ``act`` (one of
    ``packed_gemm.ACTS``), then the max pool ``pool`` (its call; ``out`` is then the pool's, and
    there is no residual). ``threads`` caps the team."""
    if pool is not None and residual:
        raise ValueError("conv_lanes.runner: a pooled convolution takes no residual (the pool reads its rows before "
                         "any other array could be added)")
    constant = isinstance(call.args[1], Constant)
    weights = _weights or (conv_direct._Weights(call.args[1].value, routine) if constant else None)
    w_shape = tuple(call.args[1].ty.shape)
    o = w_shape[0]
    cap = int(threads or 0)
    buffers = cap or available_cores()  # the pool's buffers of rows: one a thread (the C takes no more threads)
    code = 0 if act is None else packed_gemm.ACTS.index(act) + 1
    codes = np.array([c for c, _ in steps] or [0], np.int64)
    values_of = []  # made at the first call (the routine's vector width)

    def values():
        if not values_of:
            values_of.append(routine.values(steps, o))
        return values_of[0]

    def dims(g: Geometry) -> tuple:
        return (*g.dims, len(steps), code, cap, routine.width(o), int(g.pointwise), *g.pool, buffers, routine.image_size(g))

    run = conv_direct.kernel_calls(routine, weights, residual, lambda shape: Geometry(call.attrs, shape, w_shape, pool, buffers),
                                   values, dims, codes, cap)
    epilogue = "".join(f" {conv_direct.STEPS[c - 1][0]}" for c, _ in steps) + (" + residual" if residual else "") + (f", {act}" if act else "")
    if pool is not None:
        kh, kw = max_pool.window(pool)[:2]
        epilogue += f", max pool {kh}x{kw}"
    _, kh, kw, c = w_shape
    return openmp_kernel(run, f"cpu:lanes-conv {o}x{kh}x{kw}x{c}{epilogue}", SOURCE, threads,
                         lambda t: runner(call, routine, t, residual, act, steps, pool, weights))
