"""float32 ``nn.conv2d`` (NCHW data, OIHW weights, one group) as dpl's own C: a direct
convolution over the input as it lies, the weights blocked once, no im2col.

A convolution is a product whose right operand is never written out: output pixel ``q`` of
output channel ``o`` sums ``w[o, k] * x[base(q) + off[k]]`` over the window's taps
``k = (c, kh, kw)``, where ``off`` is a table of one address offset per tap. That holds
exactly once the input is *prepared*: padded, and for a stride ``S`` split into its ``S x S``
phases (``x[c, S i + ph, S j + pw]`` at ``[c, ph, pw, i, j]``, space-to-depth), so that
consecutive output pixels of a row read consecutive input elements at every tap. The flat
walk takes the output grid as rows of the prepared plane's width ``L`` (``L - OW`` columns of each row are
computed and never stored), so a tile of ``NR`` consecutive pixels is one vector load per tap
wherever it lies: a 3x3 conv at 56x56 (padded 58 wide) wastes 2 of 58 columns, the 7x7
stride-2 stem 3 of 115, and a patch embedding (stride = kernel, no padding: its phases are its
patches) or a 1x1 stride-1 conv (no preparation where it has a tile of pixels: the input itself)
none. Phases no tap reads are not prepared (a 1x1 at stride 2 reads one of four).

The micro-kernel is the packed product's (:mod:`dpl.backends.cpu.packed_gemm`) with the roles
as the output's layout wants them: ``MR`` output channels times ``NR`` pixels in vector
registers (AVX-512 6 x 64, AVX2 6 x 16), a weight broadcast against ``NV`` vectors of input per
tap, the weights packed at the first call as ``ceil(O / MR)`` blocks of ``K x MR`` (zero rows
pad the last), so a tile reads its broadcasts from one contiguous stream. The prepared image has
``NR`` zeroed floats of slack, so every tap loads whole vectors. Two walks of the output, the
kernel taking whichever computes fewer lanes: by output rows, each tile up to ``NR`` pixels of
one row stored straight from its registers (the stem's 112-wide rows: 64 + 48), or flat, as
above, through a buffer (a 3x3 at 56: 58 of every 64 lanes kept). Tiles go pixel-block major
over the team (OpenMP, the generated kernels' pool), so a block's input stays in cache while
every channel block reads it. The last tap block of a tile applies the epilogue the segments
folded into the convolution in its registers: per-channel steps (an inference BatchNorm's
subtract, multiply, multiply, add: :data:`STEPS`), plus a residual of the output's shape, then a
ReLU; another activation (``packed_gemm.ACTS``, the generated C's own expressions), and the
flat walk's residual, on the stored rows. Each step is rounded as its separate op rounds it.

The arithmetic is the interpreter's sum in another order; padding is real zeros, so an
infinite or NaN weight meets them as the reference's ``0 * inf`` does.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from dpl.backends.cpu import packed_gemm
from dpl.backends.cpu.addresses import address
from dpl.backends.cpu.call_list import KERNEL, entry_address
from dpl.backends.cpu.im2col import _pads, _pair
from dpl.ir.expr import Call, Constant
from dpl.runtime.prepared import Address, CCall
from dpl.runtime.threads import openmp_kernel

SOURCE_HEAD = r"""
#include <tgmath.h>
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
/* KB: the taps a tile takes at a time (its KB x NR input, 40 KB on AVX-512, stays in L1 while
   every channel block of its group reads it: ResNet's stem, 147 taps, in one pass); GB: the most
   channel blocks a task takes */
enum { NR = VL * NV, KB = 10240 / NR, GB = 16 };
typedef float vf __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(float)), aligned(sizeof(float)), may_alias));

int64_t dpl_conv_rows(void) { return MR; }
int64_t dpl_conv_slack(void) { return NR; }  /* floats a tile may read past a prepared image */

/* what a tile's last pass applies in registers: the per-channel steps (code[s]: 1 + c, 2 - c,
   3 c -, 4 * c, 5 / c, 6 c /, with c = vals[s O + o] for output channel o = o0 + row), then plus the
   residual at res (laid out as the tile's destination; NULL: none), then a ReLU (relu) */
typedef struct {
  const int64_t *code;
  const float *vals, *res;
  int64_t steps, O, o0;
  int relu;
} fin_t;

/* the MR x (nv VL) tile of channel block W (K x MR, packed) by pixels [0, nv VL) of the prepared
   source S (tap k at S + off[k], whole vectors: the scratch has NR floats of slack), started from
   zero (first) or from t, finished by fin (NULL: not the last pass), stored into t: `rows` rows
   `ld` apart, `cols` columns (the last vector in part). Each step is rounded as its op rounds it. */
static inline __attribute__((always_inline)) void tile(const float *restrict W, const float *restrict S,
    const int64_t *restrict off, int64_t K, float *restrict t, int64_t ld, int rows, int cols, int first,
    const fin_t *fin, int nv) {
  vf c[MR][NV];
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < NV; v++) c[r][v] = (vf){0};
  if (!first)
    for (int r = 0; r < rows; r++)
      for (int v = 0; v < nv; v++) {
        const int n = cols - v * VL;
        if (n >= VL) c[r][v] = *(const vf *)(t + r * ld + v * VL);
        else memcpy(&c[r][v], t + r * ld + v * VL, (size_t)n * sizeof(float));
      }
  for (int64_t k = 0; k < K; k++) {
    const float *s = S + off[k];
    vf b[NV];
    for (int v = 0; v < NV && v < nv; v++) b[v] = *(const vf *)(s + v * VL);
    for (int r = 0; r < MR; r++) {
      const float a = W[k * MR + r];
      for (int v = 0; v < NV && v < nv; v++) c[r][v] += a * b[v];
    }
  }
  if (fin)
    for (int r = 0; r < rows; r++) {
      for (int64_t q = 0; q < fin->steps; q++) {
        const float x = fin->vals[q * fin->O + fin->o0 + r];
        switch (fin->code[q]) {
          case 1: for (int v = 0; v < nv; v++) c[r][v] = c[r][v] + x; break;
          case 2: for (int v = 0; v < nv; v++) c[r][v] = c[r][v] - x; break;
          case 3: for (int v = 0; v < nv; v++) c[r][v] = x - c[r][v]; break;
          case 4: for (int v = 0; v < nv; v++) c[r][v] = c[r][v] * x; break;
          case 5: for (int v = 0; v < nv; v++) c[r][v] = c[r][v] / x; break;
          default: for (int v = 0; v < nv; v++) c[r][v] = x / c[r][v]; break;
        }
      }
      if (fin->res)
        for (int v = 0; v < nv; v++) {
          const int n = cols - v * VL;
          vf e = (vf){0};
          if (n >= VL) e = *(const vf *)(fin->res + r * ld + v * VL);
          else memcpy(&e, fin->res + r * ld + v * VL, (size_t)n * sizeof(float));
          c[r][v] = c[r][v] + e;
        }
      if (fin->relu)  /* the kernels' (x <= 0 ? 0 : x): +0 for -0, NaN kept */
        for (int v = 0; v < nv; v++) c[r][v] = (vf)((vi)c[r][v] & ~(vi)(c[r][v] <= (vf){0}));
    }
  for (int r = 0; r < rows; r++)
    for (int v = 0; v < nv; v++) {
      const int n = cols - v * VL;
      if (n >= VL) *(vf *)(t + r * ld + v * VL) = c[r][v];
      else memcpy(t + r * ld + v * VL, &c[r][v], (size_t)n * sizeof(float));
    }
}

typedef void (*tile_fn)(const float *, const float *, const int64_t *, int64_t, float *, int64_t, int, int, int,
                        const fin_t *);
#define TILE(v) static void tile##v(const float *W, const float *S, const int64_t *off, int64_t K, float *t, \
  int64_t ld, int rows, int cols, int first, const fin_t *fin) { tile(W, S, off, K, t, ld, rows, cols, first, fin, v); }
TILE(1) TILE(2) TILE(3) TILE(4)

/* the tile of nv vectors (1 <= nv <= NV) */
static tile_fn tile_of(int64_t nv) {
  switch (nv < NV ? nv : NV) {
    case 1: return tile1;
    case 2: return tile2;
    case 3: return tile3;
    default: return tile4;
  }
}

/* what a tile's registers did not apply, on ncols elements of a stored row: plus the residual
   (res: at the same place, NULL: none), then the activation */
static void epilogue(float *restrict row, const float *restrict res, int64_t ncols, int act) {
  if (res) {
    #pragma omp simd
    for (int64_t j = 0; j < ncols; j++) row[j] += res[j];
  }
  switch (act) {
ACT_CASES
  }
}

/* x[C, H, W] (one image) padded by (pt, pl) and split into its Sh x Sw phases: P[c, ph, pw, i, j] =
   x[c, Sh i + ph - pt, Sw j + pw - pl], zero outside x; each phase Hq x Wq, those used[ph Sw + pw] only */
static void prepare(const float *restrict x, float *restrict P, int64_t C, int64_t H, int64_t Wd, int64_t Sh, int64_t Sw,
                    int64_t pt, int64_t pl, int64_t Hq, int64_t Wq, const int8_t *used, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && C * Sh * Sw > 1)
  for (int64_t plane = 0; plane < C * Sh * Sw; plane++) {
    const int64_t c = plane / (Sh * Sw), ph = plane / Sw % Sh, pw = plane % Sw;
    if (!used[ph * Sw + pw]) continue;  /* a phase no tap reads (a 1x1 at stride 2 reads one of four) */
    float *to = P + plane * Hq * Wq;
    for (int64_t i = 0; i < Hq; i++) {
      const int64_t y = Sh * i + ph - pt;
      float *row = to + i * Wq;
      if (y < 0 || y >= H) { memset(row, 0, (size_t)Wq * sizeof(float)); continue; }
      const float *from = x + (c * H + y) * Wd;
      if (Sw == 1 && pw == 0) {  /* a plain padded row */
        const int64_t lo = pl < Wq ? pl : Wq, n = Wd < Wq - lo ? Wd : Wq - lo;
        memset(row, 0, (size_t)lo * sizeof(float));
        memcpy(row + lo, from, (size_t)n * sizeof(float));
        memset(row + lo + n, 0, (size_t)(Wq - lo - n) * sizeof(float));
        continue;
      }
      for (int64_t j = 0; j < Wq; j++) {
        const int64_t xw = Sw * j + pw - pl;
        row[j] = xw >= 0 && xw < Wd ? from[xw] : 0.0f;
      }
    }
  }
}

/* how many tasks of `blocks` pixel blocks and channel groups: as many groups as give the team four
   tasks a thread where the pixel blocks alone do not, each of at most GB channel blocks */
static int64_t groups_of(int64_t blocks, int64_t oblocks, int threads) {
  int64_t groups = (4 * threads + blocks - 1) / blocks;
  if (groups < (oblocks + GB - 1) / GB) groups = (oblocks + GB - 1) / GB;
  return groups > oblocks ? oblocks : groups;
}

/* p: x [N, C, H, W], the packed weights (ceil(O / MR) blocks of K x MR), out [N, O, OH, OW], the
   steps' values [steps, O], residual [N, O, OH, OW] (NULL: none), off [K] (the taps' offsets in the
   prepared source), scratch (one prepared image, C Sh Sw Hq Wq and NR floats of zeroed slack),
   the steps' codes [steps], which phases the taps read [Sh Sw] (int8)
   d: N, C, H, W, O, OH, OW, K, Sh, Sw, pt, pl, Hq, Wq, steps, act, threads, pointwise (1x1, stride 1, no padding)

   Two walks of the output, whichever computes fewer lanes: by rows (a task's tile is up to NR
   pixels of one output row, stored straight into the output) or flat (the output grid as rows of
   the prepared plane's width Wq: Wq - OW columns of each row computed and never stored, tiles of NR
   whole pixels anywhere, copied out of a buffer): 56-wide rows of 3x3s take 4 vectors a row one
   way, 58 / 64 of them the other. */
void dpl_kernel(void **p, const int64_t *d) {
KERNEL_ARGS
  if (OH <= 0 || OW <= 0) return;
  const int64_t plane = OH * OW, oblocks = (O + MR - 1) / MR;
  const int64_t cblocks = (OW + NR - 1) / NR, Q = (OH - 1) * Wq + OW, qblocks = (Q + NR - 1) / NR;
  const int64_t row_lanes = OH * ((OW / NR) * NR + ((OW % NR) + VL - 1) / VL * VL);
  /* a 1x1 stride-1 convolution without padding reads its input as it lies, flat (its whole
     vectors stay inside while there are NR pixels) */
  const int in_place = d[17] && Q >= NR;
  const int by_rows = !in_place && row_lanes <= qblocks * NR;
  for (int64_t n = 0; n < N; n++) {
    const float *S0 = in_place ? x + n * C * H * Wd : scratch;
    if (!in_place) prepare(x + n * C * H * Wd, scratch, C, H, Wd, Sh, Sw, pt, pl, Hq, Wq, (const int8_t *)p[8], threads);
    float *on = out + n * O * plane;
    const float *rn = res ? res + n * O * plane : 0;
    if (by_rows) {  /* the whole epilogue in the tiles' registers but an activation other than ReLU */
      const int64_t blocks = OH * cblocks, groups = groups_of(blocks, oblocks, threads), per = (oblocks + groups - 1) / groups;
      #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks * groups > 1)
      for (int64_t task = 0; task < blocks * groups; task++) {
        const int64_t pb = task / groups, oh = pb / cblocks, j0 = pb % cblocks * NR;
        const int64_t ob0 = task % groups * per, ob1 = ob0 + per < oblocks ? ob0 + per : oblocks;
        const int cols = (int)(OW - j0 < NR ? OW - j0 : NR);
        const tile_fn fn = tile_of((cols + VL - 1) / VL);
        const float *S = S0 + oh * Wq + j0;
        for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += KB) {
          const int64_t kc = K - k0 < KB ? K - k0 : KB;
          for (int64_t ob = ob0; ob < ob1; ob++) {
            const int rows = (int)(O - ob * MR < MR ? O - ob * MR : MR);
            const int64_t at = ob * MR * plane + oh * OW + j0;
            const fin_t fin = {code, vals, rn ? rn + at : 0, steps, O, ob * MR, act == 1};
            fn(W + (ob * K + k0) * MR, S, off + k0, kc, on + at, plane, rows, cols, k0 == 0, k0 + KB >= K ? &fin : 0);
          }
        }
        if (act > 1)
          for (int64_t o = ob0 * MR; o < ob1 * MR && o < O; o++) epilogue(on + o * plane + oh * OW + j0, 0, cols, act);
      }
      continue;
    }
    /* flat: the steps in the tiles' registers, the residual and the activation after it on the
       stored rows (a ReLU in registers where there is no residual) */
    const int post = res || act > 1, relu = act == 1 && !res;
    const int64_t groups = groups_of(qblocks, oblocks, threads), per = (oblocks + groups - 1) / groups;
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && qblocks * groups > 1)
    for (int64_t task = 0; task < qblocks * groups; task++) {
      /* the last pixel block ends at Q, overlapping the one before it (its pixels from `skip` on
         stored): whole vectors, where a narrow block paid a partial copy at every tap */
      const int64_t qb = task / groups, ob0 = task % groups * per, first = qb * NR;
      const int64_t q0 = first < Q - NR ? first : (Q > NR ? Q - NR : 0), skip = first - q0;
      const int64_t ob1 = ob0 + per < oblocks ? ob0 + per : oblocks;
      const int64_t ncols = Q - q0 < NR ? Q - q0 : NR;
      float acc[GB * MR * NR] __attribute__((aligned(64)));
      for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += KB) {
        const int64_t kc = K - k0 < KB ? K - k0 : KB;
        for (int64_t ob = ob0; ob < ob1; ob++) {
          const fin_t fin = {code, vals, 0, steps, O, ob * MR, relu};
          const int rows = (int)(O - ob * MR < MR ? O - ob * MR : MR);
          tile_of(NV)(W + (ob * K + k0) * MR, S0 + q0, off + k0, kc, acc + (ob - ob0) * MR * NR, NR, rows, NR, k0 == 0,
                      k0 + KB >= K ? &fin : 0);
        }
      }
      for (int64_t ob = ob0; ob < ob1; ob++) {
        const float *t = acc + (ob - ob0) * MR * NR;
        for (int r = 0; r < MR && ob * MR + r < O; r++) {
          const int64_t o = ob * MR + r;
          for (int64_t j = skip, q = first; j < ncols;) {
            const int64_t oh = q / Wq, ow = q % Wq, run = Wq - ow < ncols - j ? Wq - ow : ncols - j;
            if (ow < OW) {
              const int64_t keep = OW - ow < run ? OW - ow : run, at = (o * OH + oh) * OW + ow;
              memcpy(on + at, t + r * NR + j, (size_t)keep * sizeof(float));
              if (post) epilogue(on + at, rn ? rn + at : 0, keep, act);
            }
            j += run;
            q += run;
          }
        }
      }
    }
  }
}
"""

# dpl_kernel's arguments as this routine and conv_lanes.py's read them (the calls kernel_calls makes)
KERNEL_ARGS = r"""  const float *x = p[0], *W = p[1], *vals = p[3], *res = p[4];
  float *out = p[2], *scratch = p[6];
  const int64_t *off = p[5], *code = p[7];
  const int64_t N = d[0], C = d[1], H = d[2], Wd = d[3], O = d[4], OH = d[5], OW = d[6], K = d[7], Sh = d[8], Sw = d[9];
  const int64_t pt = d[10], pl = d[11], Hq = d[12], Wq = d[13], steps = d[14];
  const int act = (int)d[15];
#ifdef _OPENMP
  const int threads = d[16] > 0 ? (int)d[16] : omp_get_max_threads();
#else
  const int threads = 1;
#endif"""
SOURCE = SOURCE_HEAD.replace("KERNEL_ARGS", KERNEL_ARGS).replace("ACT_CASES", packed_gemm._act_cases())


def takes(call: Call) -> bool:
    """Whether ``call`` is a convolution this routine computes: float32 throughout, NCHW data,
    OIHW weights, one group, a static channel count and window."""
    if not isinstance(call, Call) or call.op != "nn.conv2d" or len(call.args) != 2:
        return False
    a = call.attrs
    if a.get("data_layout", "NCHW") != "NCHW" or a.get("kernel_layout", "OIHW") != "OIHW" or int(a.get("groups", 1)) != 1:
        return False
    x, w = call.args
    if not all(getattr(t, "dtype", None) == "float32" for t in (x.ty, w.ty, call.ty)):
        return False
    return len(w.ty.shape) == 4 and all(isinstance(v, int) for v in w.ty.shape) and isinstance(x.ty.shape[1], int)


def wins(call: Call) -> bool:
    """Whether the direct routine is the faster for convolution ``call`` (:func:`takes`): a
    window wider than 1x1 at stride 1, or over few input channels (ResNet's stem: 7x7, stride 2,
    3 channels, 1.65 ms against oneDNN's 3.1 in NCHW, one thread, AVX-512); not a 1x1 (a product
    of the input as it lies: 59-88 GFLOP/s here against 100-177) nor a strided window over many
    channels (3x3, stride 2, 32 channels: 85 against 111), nor a patch embedding (its im2col is
    a view)."""
    _, c, kh, kw = call.args[1].ty.shape
    sh, sw = _pair(call.attrs.get("strides", 1))
    if kh * kw == 1 or (sh, sw) == (kh, kw):
        return False
    return sh == sw == 1 or c <= 4


class Geometry:
    """Where a convolution's taps read the prepared input, at one input shape: the phase
    planes' size and the offset of each tap ``(c, kh, kw)``."""

    def __init__(self, attrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...]):
        n, c, h, wd = (int(v) for v in x_shape)
        o, ci, kh, kw = w_shape
        (sh, sw), (dh, dw) = _pair(attrs.get("strides", 1)), _pair(attrs.get("dilation", 1))
        pt, pl, pb, pr = _pads(attrs.get("padding", 0))
        self.oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        self.ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
        self.n, self.c, self.h, self.w, self.o, self.k = n, c, h, wd, o, ci * kh * kw
        self.pt, self.pl = pt, pl
        self.sh, self.sw = sh, sw
        self.hq, self.wq = -(-max(h + pt + pb, 1) // sh), -(-max(wd + pl + pr, 1) // sw)
        plane = self.hq * self.wq
        rows, cols = np.arange(kh)[:, None] * dh, np.arange(kw)[None, :] * dw
        # each tap's pixel in the prepared image, (kh, kw): its phase's plane, then its row and column there
        self.window = ((rows % sh) * sw + cols % sw) * plane + (rows // sh) * self.wq + cols // sw
        offsets = np.arange(c)[:, None, None] * (sh * sw * plane) + self.window[None]
        self.offsets = np.ascontiguousarray(offsets.reshape(-1), np.int64)
        self.phases = np.zeros((sh, sw), np.int8)  # the phases some tap reads
        self.phases[np.ix_(np.unique(rows % sh), np.unique(cols % sw))] = 1
        self.scratch = c * sh * sw * plane  # one prepared image (the routine adds its slack)
        self.pointwise = kh == kw == 1 and sh == sw == 1 and not any((pt, pl, pb, pr))  # may be read as it lies

    @property
    def valid(self) -> bool:
        """Whether the output has any pixels (a window larger than the padded input has none)."""
        return self.oh > 0 and self.ow > 0

    def dims(self, steps: int, act: int, threads: int) -> tuple[int, ...]:
        """``dpl_kernel``'s dims."""
        return (self.n, self.c, self.h, self.w, self.o, max(self.oh, 0), max(self.ow, 0), self.k, self.sh, self.sw,
                self.pt, self.pl, self.hq, self.wq, steps, act, threads, int(self.pointwise))


class Routine(packed_gemm.LibraryRoutine):
    """The compiled convolution (``dpl_kernel``), resolved at the first call."""

    def _resolve(self):
        with self._lock:
            if self._ready is None:
                lib = self._lib.result() if hasattr(self._lib, "result") else self._lib
                entry, rows, slack = lib.dpl_kernel, lib.dpl_conv_rows, lib.dpl_conv_slack
                entry.restype, entry.argtypes = None, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
                rows.restype, rows.argtypes = ctypes.c_int64, []
                slack.restype, slack.argtypes = ctypes.c_int64, []
                self._ready = (entry, int(rows()), int(slack()))
        return self._ready

    @property
    def entry(self):
        return (self._ready or self._resolve())[0]

    def scratch_size(self, g: Geometry) -> int:
        """Floats of a buffer for a prepared image of geometry ``g`` and the slack the tiles'
        whole vectors may read past it."""
        return g.scratch + (self._ready or self._resolve())[2]

    def scratch(self, g: Geometry) -> np.ndarray:
        """:meth:`scratch_size` floats, the slack zeroed (zeros: no NaN, no subnormal slowing a
        lane no one stores)."""
        buf = packed_gemm.aligned_empty((self.scratch_size(g),))
        buf[g.scratch:] = 0
        return buf

    def pack(self, w: np.ndarray) -> np.ndarray:
        """OIHW weights as ``dpl_kernel`` reads them: ``ceil(O / MR)`` blocks of ``K x MR`` (the
        taps ``(c, kh, kw)`` in order), zero rows padding the last block."""
        rows = (self._ready or self._resolve())[1]
        o = w.shape[0]
        flat = np.zeros((-(-o // rows) * rows, int(np.prod(w.shape[1:]))), np.float32)
        flat[:o] = np.asarray(w, np.float32).reshape(o, -1)
        packed = packed_gemm.aligned_empty((flat.shape[0] // rows, flat.shape[1], rows))
        packed[...] = flat.reshape(-1, rows, flat.shape[1]).transpose(0, 2, 1)
        return packed


class _Weights:
    """A convolution's packed weights, made at the first call and shared by every thread cap."""

    def __init__(self, w: np.ndarray, routine: Routine):
        self.w, self.routine = w, routine
        self.packed: np.ndarray | None = None
        self.lock = threading.Lock()

    def get(self) -> np.ndarray:
        if self.packed is None:
            with self.lock:
                if self.packed is None:
                    self.packed = self.routine.pack(self.w)
                    self.w = None
        return self.packed


SHAPES_KEPT = 16  # input shapes a runner keeps the geometry of

# the per-channel steps an epilogue takes (``dpl_kernel``'s codes 1-6): the op, and whether the
# channel's value is its left operand (``c - x``, ``c / x``)
STEPS = (("add", False), ("subtract", False), ("subtract", True), ("multiply", False), ("divide", False), ("divide", True))


def step_code(op: str, value_first: bool) -> int | None:
    """The routine's code of an elementwise ``op`` of the output and a per-channel value (the
    value its left operand where ``value_first``), None where it has none (``x + c`` and
    ``c + x`` are one, as are the two products)."""
    if op in ("add", "multiply"):
        value_first = False
    return STEPS.index((op, value_first)) + 1 if (op, value_first) in STEPS else None


def kernel_calls(routine, weights: _Weights | None, residual: bool, geometry_of, values, dims, codes: np.ndarray, cap: int):
    """``run(x, w, *res, out)`` calling a convolution routine's ``dpl_kernel`` (this module's or
    ``conv_lanes``'s: the same nine pointers), with ``run.prepare`` its record as a prepared call;
    ``geometry_of(shape)`` a geometry (kept for up to ``SHAPES_KEPT`` shapes), ``values()`` the
    steps' values, ``dims(g)`` the dims, ``weights`` a constant weight's packing (None: packed at
    each call), ``routine.scratch_size(g)`` / ``routine.scratch(g)`` the prepared input's buffer."""
    geometries: dict[tuple, object] = {}
    local = threading.local()

    def geometry(shape):
        found = geometries.get(shape)
        if found is None:
            found = geometry_of(shape)
            if len(geometries) < SHAPES_KEPT:
                geometries[shape] = found
        return found

    def run(x, w, *rest):
        *res, out = rest
        x = np.ascontiguousarray(x, np.float32)
        g = geometry(x.shape)
        scratch = getattr(local, "buf", None)
        if scratch is None or scratch.size < routine.scratch_size(g):
            scratch = local.buf = routine.scratch(g)
        r = np.ascontiguousarray(res[0], np.float32) if residual else None
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        packed = weights.get() if weights is not None else routine.pack(w)  # a variable weight: packed at each call
        ptrs = (ctypes.c_void_p * 9)(address(x), address(packed), address(target), address(values()),
                                     None if r is None else address(r), g.offsets.ctypes.data, address(scratch),
                                     codes.ctypes.data, g.phases.ctypes.data)
        d = dims(g)
        routine.entry(ptrs, (ctypes.c_int64 * len(d))(*d))
        if target is not out:
            np.copyto(out, target)
        return out

    def prepare(operands, outputs):
        """The call as a record of a prepared call (dpl.runtime.prepared): the weights packed
        now, a scratch of its own for the prepared input."""
        if weights is None:
            return None  # packed at each call: the general path
        (x, shape), _, *res = operands
        g = geometry(tuple(shape))
        args = (x, Address.of(weights.get()), outputs[0][0], Address.of(values()), res[0][0] if residual else None,
                Address.of(g.offsets), Address.of(routine.scratch(g)), Address.of(codes), Address.of(g.phases))
        return [CCall(entry_address(routine.entry), KERNEL, args, dims(g), cap)]

    run.prepare = prepare  # type: ignore[attr-defined]
    return run


def runner(call: Call, routine: Routine, threads: int | None = None, bias: np.ndarray | None = None,
           residual: bool = False, act: str | None = None, _weights: _Weights | None = None, steps: tuple = ()):
    """``fn(x, w, out)`` computing convolution ``call`` (:func:`takes`) into ``out`` by
    ``routine``, a constant weight packed once (a variable one at each call); with the epilogue
    the segments folded into it, each step rounded as its op rounds it: the per-channel
    ``steps`` (``(code, values)``, :func:`step_code`, one value per output channel; ``bias`` is
    the one step ``x + bias``), then with ``residual`` plus the array given before ``out``
    (``fn(x, w, res, out)``), then activation ``act`` (one of ``packed_gemm.ACTS``). ``threads``
    caps the team."""
    constant = isinstance(call.args[1], Constant)
    weights = _weights or (_Weights(call.args[1].value, routine) if constant else None)
    w_shape = tuple(call.args[1].ty.shape)
    cap = int(threads or 0)
    code = 0 if act is None else packed_gemm.ACTS.index(act) + 1
    if bias is not None:
        steps = ((1, bias), *steps)
    codes = np.array([c for c, _ in steps], np.int64)
    values = np.ascontiguousarray(np.stack([np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (w_shape[0],))
                                            for _, v in steps]) if steps else np.zeros((0, w_shape[0]), np.float32))
    run = kernel_calls(routine, weights, residual, lambda shape: Geometry(call.attrs, shape, w_shape), lambda: values,
                       lambda g: g.dims(len(codes), code, cap), codes, cap)
    epilogue = "".join(f" {STEPS[c - 1][0]}" for c in codes) + (" + residual" if residual else "") + (f", {act}" if act else "")
    o, c, kh, kw = w_shape
    return openmp_kernel(run, f"cpu:direct-conv {o}x{c}x{kh}x{kw}{epilogue}", SOURCE, threads,
                         lambda t: runner(call, routine, t, None, residual, act, weights, steps))
