"""Flash-style attention on the CPU: softmax(q @ k * scale [+ mask]) @ v in one generated C
kernel, tiled over keys with an online softmax, so the scores never leave the cache.

Each OpenMP task takes ``ROWS`` query rows of one batch entry and walks the keys in tiles of
``KEYS``: the tile's scores (a register-blocked product over the head dimension), scale and
mask, the tile's maximum, the running output rescaled by ``exp(old max - new max)``, then
``exp(score - max)`` times the tile's values added in. The row is divided by its running sum
at the end. Values are accumulated in float (double for float64); 16-bit inputs are widened
as they are read, as the shared C prelude does. The per-row work between the two products is
written in vectors too (scale, mask and maximum; a float32 exp of the kernel's own, ``VEXP``):
with glibc's vector expf and scalar-indexed mask loads it had been as long as either product.
The values' product runs a vector of value columns for all the task's rows at a time. Both
halved the kernel (4 heads x 512 x 64, causal, one thread: 3.2-4.2 ms before, 1.9-2.3 after;
torch's SDPA 5.3-6.0, torch.compile of the written-out attention 4.0).

Both products are register blocks of the build's own vectors (``BLOCKS``: AVX-512 8 rows x 2
zmm, AVX2 4 x 3 ymm for the scores and 4 x 2 for the values, chosen by ``#if`` as
backends/cpu/packed_gemm.py chooses its tile), k's and v's rows streamed through them (copied
first where they straddle cache lines: ``PACK``). The score blocks scale, mask and take the
row's maximum as they store (``rowstat_t``), so the softmax reads the scores once, for exp.
The zoo's attentions (4 heads of 64, one thread, ``python bench/bench_attention.py --isa
native,haswell``, the 2-core Xeon): an AVX2 build had run at 3-4% of its FMA peak (its 64-byte
vectors split into spilled register pairs), then 52-85%; the AVX-512 build 36-47%, then 41-66%.
The kernel alone, medians of 31 interleaved samples of CPU time against the previous version,
GFLOP/s over every key: AVX-512 (peak 235 GFLOP/s) T5 1x128 48 -> 54%, BERT 1x128 (padding)
47 -> 54%, BERT 8x128 57 -> 65%, Llama 1x128 (causal) 70 -> 77%; AVX2 (-march=haswell, peak
130) 57 -> 63%, 56 -> 62%, 68 -> 76%, 89 -> 100%. Through ``exe()`` (bench_attention: 10-15
us of Python a call beside 0.13 ms) AVX-512's 1x128 rows read 47-48%.

What the interpreter's softmax does, this does too: a row whose scores are all -inf (a fully
masked row) is NaN, as exp(-inf - -inf) is; a NaN score makes its row NaN; +inf makes its row
NaN (inf - inf). A tile whose scores are all -inf adds nothing (its exponentials would be
exp(-inf - -inf) while the running maximum is still -inf). A tile's keys past the last one its
mask leaves to any of its rows are not computed, the whole tile where it leaves none (a causal
mask's upper triangle, -inf or Hugging Face's float minimum; padding: ``TILE_MASKED`` says
when an entry is hidden): their exponentials are exactly 0. The one difference this makes: a
NaN or inf in q or k under such keys does not reach the output, where the interpreter's would
be NaN.

Batch dimensions broadcast as NumPy's matmul does (GQA's k/v heads of size 1 over q's
heads, a mask of shape [Sq, Sk] over every head): the runner gives the kernel, per flattened
batch index, the element offset of each operand's matrix, and the mask's row and column
strides (0 where it broadcasts).

The kernel IR cannot express this kernel (see ``dpl/kernel/attention.py``); the template
below is the whole of it, written once with the prelude's widening loads.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import numpy as np

from dpl import dtypes
from dpl.backends.cpu.addresses import address
from dpl.backends.cpu.call_list import KERNEL, entry_address
from dpl.backends.cgen.emitter import PRELUDE, VECTOR_MATH
from dpl.kernel.attention import Attention, Const, Param
from dpl.kernel.ir import Const as KConst
from dpl.kernel.ir import to_c
from dpl.runtime.prepared import Address, CCall
from dpl.runtime.threads import openmp_kernel

ROWS = 8  # query rows per task: the key tile is read once for all of them (decode's at most; flash's on AVX-512)
# the flash kernel's rows per task where AVX-512 is not (AVX2 and older): two of its 6-row register
# blocks, not a 6-row block and a 2-row one whose 4 sums are too few to hide the FMA's latency (on
# a Zen 3 core, bench_attention's four rows 1-10% faster than 8 in one interleaved run, 1-32% in
# another)
ROWS_AVX2 = 12
KEYS = 128  # keys per tile: the tile's scores (ROWS x KEYS) stay in L1; 64 ran 9% slower at 1 x 128 (AVX-512 and AVX2)

_STORAGE = {"float32": ("float", "float", "(x)", "(float)(x)"),
            "float64": ("double", "double", "(x)", "(double)(x)"),
            "float16": ("half", "float", "((float)(x))", "((half)(x))"),
            "bfloat16": ("uint16_t", "float", "dpl_bf16_load(x)", "dpl_bf16_store(x)")}

# the two products' register blocks (micro-kernels), as backends/cpu/packed_gemm.py's: a block of
# the result in vector registers while one operand's rows stream through as vectors and the
# other's elements are broadcast against them. Their sizes are the instruction set's: AVX-512 8
# rows x 2 vectors (16 of 32 zmm accumulate; 8 x 3 measured no faster), AVX2 6 x 2 for the values
# (12 of 16 ymm; a task's last 2 rows a 2 x 2 block: on a Zen 3 core the whole kernel 5-12% faster
# than 4 x 2's 8 accumulators on bench_attention --isa's four rows, 3 x 4, 4 x 3, 8 x 1 and
# 2 x 4 in between) and 6 x 2 for the scores (12 ymm, 2 of k, 1 of q: 15 of 16, the scale
# keeping the last; 4 x 3's 16 had left no register for k, whose vectors GCC then read from
# memory in every FMA, 16 loads a 12 FMAs: 6 x 2 is 4-6% faster on a Zen 3 core, 4 x 2 and
# 3 x 3 no faster than 4 x 3); ``mr`` and ``nv`` are constants where they are called (always
# inlined)
BLOCKS = """\
#if defined(__AVX512F__)
enum {{ SR = 8, SN = 2, PR = 8, PN = 2 }};
#else
enum {{ SR = 6, SN = 2, PR = 6, PN = 2 }};
#endif
_Static_assert(SN <= 3, "score_rows' last block takes at most 3 vectors");
#define SR_ (ROWS < SR ? ROWS : SR)
#define PR_ (ROWS < PR ? ROWS : PR)

/* what a tile's score blocks leave per row besides its scores where they fold the row's first pass
   into their stores (scale, mask, maximum: the pass had read and written every score again): the
   running maximum of the row's scaled and masked scores, a vector of them, and which lanes saw a NaN */
typedef struct {{ vec_t max; ivec_t nan; }} rowstat_t;

/* scores s[r][j] = sum_d q[r][d] k[d][j] for mr rows (q's at qf, stride D; s's stride KEYS) and
   nv vectors of keys (k's rows at kt, stride kst), the last one's first `last` lanes only where
   `tail` (its other lanes 0: whole vectors stored, s's rows hold KEYS; `tail` a constant: a test of
   `last` in the loop had made GCC keep the block's sums in memory, BERT 1 x 128 13% slower). Where `fold`, the
   scores are stored scaled and masked (row r's mask entries at mk[r] + mj, contiguous) and
   st[r] takes in their maximum and NaNs */
static inline __attribute__((always_inline)) void score_block(const acc_t *restrict qf, const acc_t *restrict kt,
    int64_t kst, acc_t *restrict s, const int mr, const int nv, const int tail, int64_t last,
    const int fold, const acc_t scale, const elem_t *const *mk, int64_t mj, rowstat_t *restrict st) {{
  vec_t acc[SR][SN];
  for (int r = 0; r < mr; ++r)
    for (int c = 0; c < nv; ++c) acc[r][c] = vzero();
  for (int d = 0; d < D; ++d) {{
    const acc_t *kr = kt + (int64_t)d * kst;
    if (PREFETCH_K) {{ __builtin_prefetch(kr + KEYS); __builtin_prefetch(kr + KEYS + LANES); }}
    vec_t kv[SN];
    for (int c = 0; c < nv; ++c) kv[c] = tail && c == nv - 1 ? vload_part(kr + c * LANES, last) : vload(kr + c * LANES);
    for (int r = 0; r < mr; ++r) {{
      const acc_t x = qf[r * D + d];
      for (int c = 0; c < nv; ++c) acc[r][c] += x * kv[c];
    }}
  }}
  /* unrolled whole: a loop left over the sums (the tail block's, masked) keeps them in memory */
  #pragma GCC unroll 16
  for (int r = 0; r < mr; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < nv; ++c) {{
      const int part = tail && c == nv - 1;
      vec_t x = acc[r][c];
      if (fold) {{
        x = x SCALE_OP scale;
        if (MASKED) {{
          const acc_t *m = (const acc_t *)(mk[r] + mj) + c * LANES;  /* fold: elem_t is acc_t where masked */
          x += part ? vload_part(m, last) : vload(m);
        }}
      }}
      vstore(s + r * KEYS + c * LANES, x);
      if (!fold) continue;
      if (part) {{  /* the lanes past the keys: -inf, no maximum */
        const ivec_t past = IOTA >= ({lane_int})last;
        x = (vec_t)(((ivec_t)x & ~past) | ((ivec_t)(vzero() - INFINITY) & past));
      }}
      st[r].nan |= x != x;
      const ivec_t up = x > st[r].max;
      st[r].max = (vec_t)(((ivec_t)st[r].max & ~up) | ((ivec_t)x & up));
    }}
}}

/* the tile's scores for rows [r0, r0 + mr): its keys [0, jn) a block of SN vectors at a time, the
   rest one block of as many vectors as it needs, its last one partial (the rest had been blocks of
   one vector, then one of the last keys: fewer FMAs a load) */
static inline __attribute__((always_inline)) void score_rows(const acc_t *restrict qf, const acc_t *restrict kt,
    int64_t kst, acc_t *restrict s, const int mr, int64_t jn,
    const int fold, const acc_t scale, const elem_t *const *mk, rowstat_t *restrict st) {{
  int64_t jc = 0;
  for (; jc + SN * LANES <= jn; jc += SN * LANES) score_block(qf, kt + jc, kst, s + jc, mr, SN, 0, 0, fold, scale, mk, jc, st);
  const int64_t rest = jn - jc, last = rest - (rest - 1) / LANES * LANES;  /* the last vector's keys, 1 to LANES */
  if (SN >= 3 && rest > 2 * LANES) score_block(qf, kt + jc, kst, s + jc, mr, MIN_(3, SN), 1, last, fold, scale, mk, jc, st);
  else if (SN >= 2 && rest > LANES) score_block(qf, kt + jc, kst, s + jc, mr, MIN_(2, SN), 1, last, fold, scale, mk, jc, st);
  else if (rest > 0) score_block(qf, kt + jc, kst, s + jc, mr, 1, 1, last, fold, scale, mk, jc, st);
}}

/* o[r][c] += sum_j p[r][j] v[j][c] for mr rows (p's at s, stride KEYS; o's stride DV), keys
   [0, jn) (v's rows at vt, stride DV) and nv vectors of value columns */
static inline __attribute__((always_inline)) void value_block(const acc_t *restrict s, const acc_t *restrict vt,
    acc_t *restrict o, const int mr, const int nv, int64_t jn) {{
  vec_t acc[PR][PN];
  for (int r = 0; r < mr; ++r)
    for (int c = 0; c < nv; ++c) acc[r][c] = vload(o + r * DV + c * LANES);
  for (int64_t j = 0; j < jn; ++j) {{
    vec_t vv[PN];
    for (int c = 0; c < nv; ++c) vv[c] = vload(vt + j * DV + c * LANES);
    for (int r = 0; r < mr; ++r) {{
      const acc_t x = s[r * KEYS + j];
      for (int c = 0; c < nv; ++c) acc[r][c] += x * vv[c];
    }}
  }}
  for (int r = 0; r < mr; ++r)
    for (int c = 0; c < nv; ++c) vstore(o + r * DV + c * LANES, acc[r][c]);
}}

/* the tile's weighted values for rows [r0, r0 + mr): the value columns a block of PN vectors at a
   time (DV a multiple of LANES) */
static inline __attribute__((always_inline)) void value_rows(const acc_t *restrict s, const acc_t *restrict vt,
    acc_t *restrict o, const int mr, int64_t jn) {{
  int c0 = 0;
  for (; c0 + PN * LANES <= DV; c0 += PN * LANES) value_block(s, vt + c0, o + c0, mr, PN, jn);
  for (; c0 + LANES <= DV; c0 += LANES) value_block(s, vt + c0, o + c0, mr, 1, jn);
}}
"""

# what both attention kernels open with (this one's and decode_attention.py's): the sizes, the
# storage and accumulator types, the vector type and its helpers
HEAD = """
#include <string.h>
#define D {head}
#define DV {value}
#define ROWS {rows}
#define KEYS {keys}
typedef {elem} elem_t;
typedef {acc} acc_t;
#define LD(x) {load}
#define ST(x) {store}
#define MIN_(a, b) ((a) < (b) ? (a) : (b))
#define WIDEN {widen}
/* the vector: the widest the build's instruction set has (-march: AVX-512 64 bytes, AVX 32, else
   16), as a GCC/Clang vector type. A 64-byte vector on an AVX2 build is split in pairs of
   registers, its blocks spill and its comparisons go lane by lane: the kernel ran at 4 GFLOP/s */
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
typedef acc_t vec_t __attribute__((vector_size(VBYTES)));
typedef {lane_int} ivec_t __attribute__((vector_size(VBYTES)));  /* what comparing two vec_t gives: -1 or 0 a lane */
#define LANES (VBYTES / {acc_bytes})  /* a number the preprocessor can test */
int dpl_vector_lanes(void) {{ return LANES; }}  /* what the build's vectors hold (tests) */
static inline vec_t vload(const acc_t *p) {{ vec_t v; memcpy(&v, p, sizeof v); return v; }}
static inline void vstore(acc_t *p, vec_t v) {{ memcpy(p, &v, sizeof v); }}
static inline vec_t vzero(void) {{ vec_t v = {{0}}; return v; }}
static inline ivec_t iota(void) {{ ivec_t v; for (int i = 0; i < LANES; ++i) v[i] = i; return v; }}
#define IOTA iota()  /* lane numbers */
/* the first n <= LANES elements at p, the other lanes 0: one masked load where AVX-512 and AVX2
   have it (a memcpy call per vector had made ViT's 197 keys cost 1.4x of 192); a vector's maximum
   (no NaN lanes), its sum, whether any lane is set: AVX-512's reductions (loops over the lanes had
   been a fifth of the row work: the kernel 4-5% faster with these) */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline vec_t vload_part(const acc_t *p, int64_t n) {{ return (vec_t){masked_load}(({mask_type})((1u << n) - 1u), p); }}
static inline acc_t hmax(vec_t v) {{ return {reduce_max}(({m512})v); }}
static inline acc_t hsum(vec_t v) {{ return {reduce_add}(({m512})v); }}
static inline int vany(ivec_t v) {{ return {test_mask}((__m512i)v, (__m512i)v) != 0; }}
#else
#if defined(__AVX2__)
#include <immintrin.h>
static inline vec_t vload_part(const acc_t *p, int64_t n) {{ return (vec_t){avx2_masked_load}(p, (__m256i)(IOTA < ({lane_int})n)); }}
#else
static inline vec_t vload_part(const acc_t *p, int64_t n) {{ vec_t v = vzero(); memcpy(&v, p, n * sizeof(acc_t)); return v; }}
#endif
static inline acc_t hmax(vec_t v) {{ acc_t x = v[0]; for (int i = 1; i < LANES; ++i) x = v[i] > x ? v[i] : x; return x; }}
static inline acc_t hsum(vec_t v) {{ acc_t x = 0; for (int i = 0; i < LANES; ++i) x += v[i]; return x; }}
static inline int vany(ivec_t v) {{ {lane_int} x = 0; for (int i = 0; i < LANES; ++i) x |= v[i]; return x != 0; }}
#endif
#define FAST_EXP {fast_exp}
{vexp}#define FAST_PV (DV % LANES == 0)
#define PREFETCH_K {prefetch_k}
#define MASKED {masked}
#define SCALE_OP {scale_op}
/* the score blocks fold scale, mask and maximum into their stores, where the mask's entries are
   the scores' type (16-bit masks are widened in the row pass) and contiguous along the keys */
#define FOLD (!(WIDEN && MASKED))

{tile_masked}
""" + BLOCKS

# the buffers both kernels' entries take first: the operands, the output, the batch offsets
OPERANDS = """\
  const elem_t *restrict q = (const elem_t *)buffers[0];
  const elem_t *restrict k = (const elem_t *)buffers[1];
  const elem_t *restrict v = (const elem_t *)buffers[2];
  const elem_t *restrict mask = (const elem_t *)buffers[3];
  const elem_t *restrict scale_buf = (const elem_t *)buffers[4];
  elem_t *restrict out = (elem_t *)buffers[5];
  const int64_t *restrict qoff = (const int64_t *)buffers[6];
  const int64_t *restrict koff = (const int64_t *)buffers[7];
  const int64_t *restrict voff = (const int64_t *)buffers[8];
  const int64_t *restrict moff = (const int64_t *)buffers[9];
"""

# the flash kernel's entry: a task per ROWS query rows of one batch entry, over all the keys;
# k and v first copied where their vectors are not whole cache lines (see PACK)
FLASH_ENTRY = """\
{pack}
void dpl_kernel(void **buffers, const int64_t *dims) {{
{operands}  const int64_t nbatch = dims[0], sq = dims[1], sk = dims[2], mrow = dims[3], mcol = dims[4];
  const acc_t scale = {scale};
  (void)mask; (void)scale_buf; (void)moff; (void)mrow; (void)mcol;
  const int64_t blocks = (sq + ROWS - 1) / ROWS;
  const int64_t kstride = packed_stride(sk);
  #pragma omp parallel
  {{
  /* each thread's copy of the k and v matrices its tasks read, made as it comes to them (tasks
     of one batch entry, or of one GQA group, are dealt in turn), where PACK says it pays */
  const int pack = packing(k, v, sk, blocks, omp_get_num_threads());
  acc_t *kp = pack & 1 ? packed(D * kstride) : NULL, *vp = pack & 2 ? packed(sk * DV) : NULL;
  int64_t kheld = -1, vheld = -1;
  /* tasks dealt round-robin: under a causal mask a block's cost grows with its rows (one head
     of 512 rows on two threads: 0.34 ms in halves, 0.24 dealt) */
  #pragma omp for schedule(static, 1)
  for (int64_t task = 0; task < nbatch * blocks; ++task) {{
    const int64_t b = task / blocks, i0 = (task % blocks) * ROWS, rows = MIN_(ROWS, sq - i0);
    const elem_t *restrict qb = q + qoff[b] + i0 * D;
    if (kp && koff[b] != kheld) {{
      for (int d = 0; d < D; ++d) memcpy(kp + d * kstride, k + koff[b] + d * sk, sk * sizeof(acc_t));
      kheld = koff[b];
    }}
    if (vp && voff[b] != vheld) {{
      memcpy(vp, v + voff[b], sk * DV * sizeof(acc_t));
      vheld = voff[b];
    }}
    const elem_t *restrict kb = kp ? (const elem_t *)kp : k + koff[b];
    const elem_t *restrict vb = vp ? (const elem_t *)vp : v + voff[b];
    const int64_t krow = kp ? kstride : sk;  /* kb's rows */
    acc_t qf[ROWS][D], o[ROWS][DV], s[ROWS][KEYS], m[ROWS], l[ROWS];
    int nan[ROWS];
    for (int r = 0; r < ROWS; ++r) {{
      for (int d = 0; d < D; ++d) qf[r][d] = r < rows ? LD(qb[r * D + d]) : (acc_t)0;
      for (int c = 0; c < DV; ++c) o[r][c] = 0;
      m[r] = -INFINITY; l[r] = 0; nan[r] = 0;
    }}
    for (int64_t j0 = 0; j0 < sk; j0 += KEYS) {{
      const int64_t jt = MIN_(KEYS, sk - j0);  /* the tile's keys */
{tile}    }}
    elem_t *restrict ob = out + (b * sq + i0) * DV;
    for (int64_t r = 0; r < rows; ++r) {{
      const acc_t inv = (nan[r] || m[r] == -INFINITY) ? (acc_t)NAN : (acc_t)1 / l[r];
      for (int c = 0; c < DV; ++c) {{
        const acc_t y = (nan[r] || m[r] == -INFINITY) ? (acc_t)NAN : o[r][c] * inv;
        ob[r * DV + c] = ST(y);
      }}
    }}
  }}
  free(kp);
  free(vp);
  }}
}}
"""

# one tile of keys [j0, j0 + jn) for a task's rows: scores, the online softmax, the weighted values
# (qf, o, s, m, l, nan, rows, kb and its row stride krow, vb, sk are the entry's; {tile_mask_row}
# is row r's mask entries at the tile's first key, r < ROWS, rows past the task's own reading its last)
TILE = """\
{skip_masked}#if WIDEN
      /* 16-bit inputs: the tile of k and v widened once, read by the register blocks below */
      acc_t kt[D * KEYS], vt[KEYS * DV];
      for (int d = 0; d < D; ++d)
        for (int64_t j = 0; j < jn; ++j) kt[d * KEYS + j] = LD(kb[(int64_t)d * krow + j0 + j]);
      for (int64_t j = 0; j < jn; ++j)
        for (int c = 0; c < DV; ++c) vt[j * DV + c] = LD(vb[(j0 + j) * DV + c]);
      const acc_t *restrict kt0 = kt, *restrict vt0 = vt;
      const int64_t kst = KEYS;
#else
      const acc_t *restrict kt0 = kb + j0, *restrict vt0 = vb + j0 * DV;
      const int64_t kst = krow;
#endif
      /* the tile's scores: the task's rows SR_ at a time (the block's sizes are constants here);
         where the mask's entries are contiguous (or there is none), scaled, masked and their
         maxima taken as they are stored */
      const int fold = FOLD && (!MASKED || mcol == 1);
      rowstat_t st[ROWS];
      const elem_t *mk[ROWS];
      for (int r = 0; r < ROWS; ++r) {{
        st[r].max = vzero() - INFINITY;
        st[r].nan = (ivec_t){{0}};
        mk[r] = {tile_mask_row};
      }}
      if (fold) {{
        for (int r0 = 0; r0 + SR_ <= ROWS && r0 < rows; r0 += SR_) score_rows(qf[r0], kt0, kst, s[r0], SR_, jn, 1, scale, mk + r0, st + r0);
        if (ROWS % SR_ && ROWS - ROWS % SR_ < rows) score_rows(qf[ROWS - ROWS % SR_], kt0, kst, s[ROWS - ROWS % SR_], ROWS % SR_, jn, 1, scale,
                                   mk + ROWS - ROWS % SR_, st + ROWS - ROWS % SR_);
      }} else {{
        for (int r0 = 0; r0 + SR_ <= ROWS && r0 < rows; r0 += SR_) score_rows(qf[r0], kt0, kst, s[r0], SR_, jn, 0, scale, mk, st);
        if (ROWS % SR_ && ROWS - ROWS % SR_ < rows) score_rows(qf[ROWS - ROWS % SR_], kt0, kst, s[ROWS - ROWS % SR_], ROWS % SR_, jn, 0, scale, mk, st);
      }}
      /* scale, mask, the online softmax */
      for (int64_t r = 0; r < rows; ++r) {{
        acc_t *restrict sr = s[r];
        acc_t mx = -INFINITY;
        int bad = 0;
        if (fold) {{
          mx = hmax(st[r].max);
          bad = vany(st[r].nan);
        }} else {{  /* a mask of another stride, or 16-bit: the row's scores scaled and masked here */
{mask_row}
          #pragma omp simd reduction(max:mx) reduction(|:bad)
          for (int64_t j = 0; j < jn; ++j) {{
            acc_t x = (acc_t)(sr[j] {scale_op} scale);
{mask_add}
            sr[j] = x;
            bad |= x != x;
            mx = x > mx ? x : mx;
          }}
        }}
        nan[r] |= bad;
        const acc_t mnew = mx > m[r] ? mx : m[r];
        if (mnew == -INFINITY) {{  /* nothing seen yet but -inf: this tile adds nothing */
          for (int64_t j = 0; j < jn; ++j) sr[j] = 0;
          continue;
        }}
        /* the row's first scores: nothing to rescale (libm's exp a row had been 6% of 1 x 128's kernel) */
        const acc_t corr = m[r] == -INFINITY ? (acc_t)0 : exp(m[r] - mnew);
#if FAST_EXP
        vec_t sv = vzero();
        int64_t je = 0;
        for (; je + LANES <= jn; je += LANES) {{
          const vec_t e = vexp(vload(sr + je) - mnew);
          vstore(sr + je, e);
          sv += e;
        }}
        if (je < jn) {{  /* the last keys (whole vectors of the row); the lanes past them are exp(-inf) = 0 */
          const ivec_t past = IOTA >= ({lane_int})(jn - je);
          const vec_t x = (vec_t)(((ivec_t)vload(sr + je) & ~past) | ((ivec_t)(vzero() - INFINITY) & past));
          const vec_t e = vexp(x - mnew);
          vstore(sr + je, e);
          sv += e;
        }}
        acc_t sum = hsum(sv);
#else
        acc_t sum = 0;
        #pragma omp simd reduction(+:sum)
        for (int64_t j = 0; j < jn; ++j) {{
          const acc_t e = exp(sr[j] - mnew);
          sr[j] = e;
          sum += e;
        }}
#endif
        l[r] = l[r] * corr + sum;
        m[r] = mnew;
        if (corr != (acc_t)1) {{
          #pragma omp simd
          for (int c = 0; c < DV; ++c) o[r][c] *= corr;
        }}
      }}
      /* the tile's values, weighted */
#if FAST_PV
      /* the task's rows PR_ at a time, each block a PR_ x PN vectors of o in registers while the
         tile's rows of v stream through */
      for (int r0 = 0; r0 + PR_ <= ROWS && r0 < rows; r0 += PR_) value_rows(s[r0], vt0, o[r0], PR_, jn);
      if (ROWS % PR_ && ROWS - ROWS % PR_ < rows) value_rows(s[ROWS - ROWS % PR_], vt0, o[ROWS - ROWS % PR_], ROWS % PR_, jn);
#else
      for (int64_t j = 0; j < jn; ++j) {{
        const acc_t *restrict vr = vt0 + j * DV;
        for (int64_t r = 0; r < rows; ++r) {{
          const acc_t p = s[r][j];
          #pragma omp simd
          for (int c = 0; c < DV; ++c) o[r][c] += p * vr[c];
        }}
      }}
#endif
"""

# k and v copied, by each thread as its tasks come to a batch entry's, into 64-byte aligned memory,
# k's rows at a stride of an odd number of vectors: NumPy's and the runtime's buffers are 16-byte
# aligned (the zoo's k and v at 16 and 32 bytes past a cache line: every vector load split across
# two lines), and a row stride of a multiple of 1 KiB maps a tile's D rows of k onto a few L1
# sets. Where it pays: a thread's tasks read each matrix twice or more (a copy costs about one
# read), float32/64 (16-bit inputs are widened a tile at a time), at most PACK_MAX_BYTES each.
# Copied once a call for all threads before the tasks, BERT 8 x 128's 2 MiB of k and v gained
# nothing (1.016 ms either way: the copies had left the cache); copied as here, the zoo's 1 x 128
# and 8 x 128 rows 3% faster than in place (AVX-512, one thread)
PACK = """\
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_num_threads(void) { return 1; }
#endif
#define PACK_MAX_BYTES ((int64_t)16 << 20)
static int64_t packed_stride(int64_t sk) { return ((sk + LANES - 1) / LANES | 1) * LANES; }
static int unaligned(const void *p) { return ((uintptr_t)p & 63) != 0; }
static acc_t *packed(int64_t n) { return (acc_t *)aligned_alloc(64, (n * sizeof(acc_t) + 63) / 64 * 64); }
/* which of k (1) and v (2) a thread copies, a matrix's `blocks` tasks dealt over `threads` threads */
static int packing(const elem_t *k, const elem_t *v, int64_t sk, int64_t blocks, int threads) {
  if (WIDEN || sk == 0 || blocks < 2 * (int64_t)threads) return 0;
  int which = 0;
  if ((unaligned(k) || sk % LANES || (sk * sizeof(acc_t)) % 1024 == 0) && D * packed_stride(sk) * (int64_t)sizeof(acc_t) <= PACK_MAX_BYTES)
    which |= 1;
  if (unaligned(v) && DV % LANES == 0 && sk * DV * (int64_t)sizeof(acc_t) <= PACK_MAX_BYTES) which |= 2;
  return which;
}
"""

TEMPLATE = HEAD + FLASH_ENTRY.replace("{pack}", PACK.replace("{", "{{").replace("}", "}}")).replace("{operands}", OPERANDS).replace("{tile}", TILE)

# a tile's keys past the last one its mask leaves to any of the task's rows are not computed: a
# causal mask's tile on the diagonal computes the keys up to its last row's (KEYS 128 and no
# trimming: Llama's 1 x 128 skipped nothing; KEYS 64 and whole tiles skipped: a quarter)
# The live keys are rounded up to whole vectors (the keys past them are hidden too: their exponentials
# are 0): a partial last vector cost more than the keys it saved (BERT 1 x 128's padding leaves
# 123 of 128 keys: 9% slower than computing all 128)
SKIP_MASKED = """\
      const int64_t live = tile_live(mask + moff[b] + i0 * mrow + j0 * mcol, rows, jt, mrow, mcol, m);
      if (live == 0) continue;
      const int64_t jn = MIN_(jt, (live + LANES - 1) / LANES * LANES);
"""
TILE_KEYS = "      const int64_t jn = jt;\n"
TILE_MASKED = """
/* whether a row of mask entries holds one above -1e29 among its first n (a NaN is not) */
static int anchored(const elem_t *row, int64_t n, int64_t mcol) {
  int64_t j = 0;
#if !WIDEN
  if (mcol == 1)
    for (; j + LANES <= n; j += LANES)
      if (vany(vload(row + j) > (acc_t)-1e29)) return 1;
#endif
  for (; j < n; ++j)
    if (LD(row[j * mcol]) > (acc_t)-1e29) return 1;
  return 0;
}

/* the keys [0, n) of a tile that its rows need: past n every mask entry of every row is hidden,
   so that those keys' scores need not be computed. Hidden, for a row: -inf (a causal mask's
   upper triangle); at most -1e30 (Hugging Face's float minimum) once the row has seen a score
   above -1e29; at most -1e37 where the row has a mask entry above -1e29 in this tile (its first
   tile: that key is computed, so the row's maximum ends above -1e30). Either way each
   exp(score + mask - max) there is exactly 0 for any score below 9e29 in magnitude. 0: the tile
   adds nothing to any row */
static int64_t tile_live(const elem_t *mk, int64_t rows, int64_t keys, int64_t mrow, int64_t mcol, const acc_t *m) {
  int64_t live = 0;
  for (int64_t r = 0; r < rows && live < keys; ++r) {  /* each row from its end down to the live keys found */
    const elem_t *row = mk + r * mrow;
    acc_t floor_ = m[r] > (acc_t)-1e29 ? (acc_t)-1e30 : (acc_t)-INFINITY;
    if (floor_ == -INFINITY && anchored(row, keys, mcol)) floor_ = (acc_t)-1e37;
    int64_t j = keys;
#if !WIDEN
    if (mcol == 1)  /* a vector of entries at a time; a NaN entry is not <= floor_ */
      while (j - LANES >= live && !vany(~(vload(row + j - LANES) <= floor_))) j -= LANES;
#endif
    while (j > live && LD(row[(j - 1) * mcol]) <= floor_) --j;
    live = j;
  }
  return live;
}
"""

MASK_ROW = "          const elem_t *restrict mr = mask + moff[b] + (i0 + r) * mrow + j0 * mcol;"
MASK_ADD = "            x = (acc_t)(x + LD(mr[j * mcol]));"
# row r's mask entries at the tile's first key, for the score blocks (rows past the task's: its last row's)
TILE_MASK_ROW = "mask + moff[b] + (i0 + MIN_(r, rows - 1)) * mrow + j0 * mcol"

# exp of a vector of float lanes, x <= 0 (a score less the row's maximum): Cody and Waite's
# reduction by ln 2 (its two-part constant), a degree-6 polynomial on [-ln2/2, ln2/2] (Cephes'
# expf coefficients; within 1.01 ulp of exp on [-87.3, 0]: tests/test_flash_attention.py), 2^n put in
# the exponent bits. Below -87.3 (and at -inf) the lane is 0: expf there is under 1.3e-38, far
# below what a float sum that holds the row's 1 resolves; a NaN lane stays NaN.
VEXP = """\
static inline vec_t vexp(vec_t x) {
  const vec_t magic = vzero() + 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
  const ivec_t dead = x < -87.3f;
  const vec_t xc = (vec_t)((ivec_t)x & ~dead);  /* dead lanes computed at 0, then cleared */
  const vec_t t = xc * 1.44269504088896341f + magic;
  const vec_t n = t - magic;
  const vec_t r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  vec_t p = vzero() + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vec_t y = p * r * r + r + 1.0f;
  const ivec_t two_n = (((ivec_t)t - (ivec_t)magic) + 127) << 23;
  return (vec_t)((ivec_t)(y * (vec_t)two_n) & ~dead);
}
"""


def emit_flash(spec: Attention, vector_math: bool = False) -> str:
    """The C source of the flash kernel for ``spec`` (``dpl_kernel(buffers, dims)``)."""
    rows = f"#if defined(__AVX512F__)\n#define FLASH_ROWS {ROWS}\n#else\n#define FLASH_ROWS {ROWS_AVX2}\n#endif\n"
    return PRELUDE + (VECTOR_MATH if vector_math else "") + rows + TEMPLATE.format(**template_fields(spec, "FLASH_ROWS"))


def template_fields(spec: Attention, rows: int | str) -> dict:
    """What :data:`HEAD`, :data:`TILE` and the flash entry are formatted with for ``spec``, a task
    holding ``rows`` query rows (a number, or a macro the source defines)."""
    elem, acc, load, store = _STORAGE[spec.dtype]
    if isinstance(spec.scale, float):
        scale = to_c(KConst(spec.scale, "float64" if acc == "double" else "float32"))
    else:
        scale = "LD(scale_buf[0])"
    widen = elem != acc  # 16-bit inputs: each tile widened into float before the register blocks
    masked = spec.mask is not None
    scale_op = "*" if spec.scale_op == "multiply" else "/"
    fast_exp = acc == "float"
    return dict(head=spec.head_dim, value=spec.value_dim, rows=rows, keys=KEYS, elem=elem, acc=acc,
                widen=int(widen), acc_bytes=8 if acc == "double" else 4,
                lane_int="int64_t" if acc == "double" else "int32_t", fast_exp=int(fast_exp),
                masked_load="_mm512_maskz_loadu_pd" if acc == "double" else "_mm512_maskz_loadu_ps",
                avx2_masked_load="_mm256_maskload_pd" if acc == "double" else "_mm256_maskload_ps",
                mask_type="__mmask8" if acc == "double" else "__mmask16",
                m512="__m512d" if acc == "double" else "__m512",
                reduce_max="_mm512_reduce_max_pd" if acc == "double" else "_mm512_reduce_max_ps",
                reduce_add="_mm512_reduce_add_pd" if acc == "double" else "_mm512_reduce_add_ps",
                test_mask="_mm512_test_epi64_mask" if acc == "double" else "_mm512_test_epi32_mask",
                vexp=VEXP if fast_exp else "", prefetch_k=0, masked=int(masked), tile_mask_row=TILE_MASK_ROW,
                skip_masked=SKIP_MASKED if masked else TILE_KEYS, tile_masked=TILE_MASKED if masked else "",
                load=load, store=store, scale=scale, scale_op=scale_op,
                mask_row=MASK_ROW if spec.mask is not None else "",
                mask_add=MASK_ADD if spec.mask is not None else "")


def _batch_offsets(shape, batch, stride) -> np.ndarray:
    """Per flattened index of ``batch``, the element offset of the matrix of a C-contiguous
    operand of ``shape`` (its batch dims broadcast to ``batch``), ``stride`` elements each."""
    own = tuple(shape[:-2])
    index = np.arange(int(np.prod(own, dtype=np.int64)), dtype=np.int64).reshape(own)
    full = np.broadcast_to(index.reshape((1,) * (len(batch) - len(own)) + own), batch)
    return np.ascontiguousarray(full.reshape(-1) * stride)


def batch_layout(spec: Attention, q, k, v, mask, out) -> tuple[list[np.ndarray], tuple[int, ...]]:
    """What the flash kernels take besides the arrays, from the shapes of C-contiguous q, k, v,
    mask (None without) and the output: per flattened batch index the element offsets of q's,
    k's, v's and the mask's matrices, and the dims (batch entries, query rows, keys, the mask's
    row and column strides, 0 where it broadcasts)."""
    sq, sk = q[-2], k[-1]
    batch = tuple(out[:-2])
    nbatch = int(np.prod(batch, dtype=np.int64))
    offs = [_batch_offsets(q, batch, sq * spec.head_dim), _batch_offsets(k, batch, spec.head_dim * sk),
            _batch_offsets(v, batch, sk * spec.value_dim)]
    if mask is None:
        offs.append(np.zeros(max(1, nbatch), np.int64))
        return offs, (nbatch, sq, sk, 0, 0)
    m = (1,) * (2 - min(2, len(mask))) + tuple(mask)
    index = np.arange(int(np.prod(m, dtype=np.int64)), dtype=np.int64).reshape(m)
    full = np.broadcast_to(index.reshape((1,) * (len(batch) + 2 - len(m)) + m), batch + (sq, sk))
    mrow, mcol = (st // index.itemsize for st in full.strides[-2:])
    offs.append(np.ascontiguousarray(full[..., 0, 0].reshape(-1)))
    return offs, (nbatch, sq, sk, mrow, mcol)


LAYOUTS_KEPT = 64  # shapes a runner keeps the layout of (a decode step meets a new one every token)


def layout_cache(spec: Attention, prepare):
    """``layout(q, k, v, mask, out_shape)``: :func:`batch_layout` of these shapes as
    ``prepare(offsets, dims)`` readies it for a launch (ctypes arrays on the CPU, device arrays
    and a grid on CUDA), made once per shape (the latest ``LAYOUTS_KEPT`` kept); safe to call
    from several threads. ``layout.of_shapes(q, k, v, mask, out)`` takes the shapes (mask: None)."""
    layouts: OrderedDict = OrderedDict()
    lock = threading.Lock()

    def of_shapes(*shapes):
        got = layouts.get(shapes)
        if got is None:
            got = prepare(*batch_layout(spec, *shapes))
            with lock:
                layouts[shapes] = got
                while len(layouts) > LAYOUTS_KEPT:
                    layouts.popitem(last=False)
        return got

    def layout(q, k, v, mask, out_shape):
        return of_shapes(q.shape, k.shape, v.shape, None if mask is None else mask.shape, tuple(out_shape))

    layout.of_shapes = of_shapes  # type: ignore[attr-defined]
    return layout


def flash_runner(name: str, spec: Attention, source: str, lib, threads: int | None = None, note: str = "",
                 kind: str = "flash", prepare=None, calls=None):
    """``run(inputs, outputs)`` calling the compiled flash kernel on the composite's inputs; or
    another kernel of the same buffers (``kind``, its label): ``prepare(offsets, dims)`` gives
    the arrays it takes after the offsets' and its dims (ctypes int64s), once per shape.
    ``run.prepare`` says the same call as one record of ``calls`` (dpl.runtime.prepared)."""
    entry = lib.dpl_kernel
    entry.restype = None
    entry.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
    set_threads = getattr(lib, "omp_set_num_threads", None) if threads else None
    get_threads = getattr(lib, "omp_get_max_threads", None)
    np_dtype = dtypes.to_numpy(spec.dtype)
    ready = prepare or (lambda offs, dims: (offs, (ctypes.c_int64 * len(dims))(*dims)))

    def with_addresses(offs, dims):
        """The shape's arrays, their addresses read once (a call then reads six: at 1 x 128 the
        runner's Python had been a tenth of the kernel's 0.17 ms), and its dims."""
        arrays, ints = ready(offs, dims)
        return arrays, tuple(address(a) for a in arrays), ints, ctypes.c_void_p * (6 + len(arrays))

    layout = layout_cache(spec, with_addresses)
    dummy = np.zeros(1, np_dtype)
    dummy_at = address(dummy)  # the absent mask's and the constant scale's, read once (0.45 us each a call)

    def operand(src, inputs):
        if isinstance(src, Param):
            return np.ascontiguousarray(inputs[src.index])
        return np.ascontiguousarray(src.value.astype(np_dtype, copy=False))

    def run(inputs, outputs):
        q, k, v = (operand(s, inputs) for s in (spec.q, spec.k, spec.v))
        mask = None if spec.mask is None else operand(spec.mask, inputs)
        scale = None if isinstance(spec.scale, float) else operand(spec.scale, inputs).reshape(-1)  # kept alive for the call
        scale_at = dummy_at if scale is None else address(scale)
        out = outputs[0]
        target = out if out.flags.c_contiguous else np.empty_like(out, order="C")
        _, offsets, dims, slots = layout(q, k, v, mask, out.shape)
        ptrs = slots(address(q), address(k), address(v), dummy_at if mask is None else address(mask), scale_at,
                     address(target), *offsets)
        before = threads if set_threads is None or get_threads is None else get_threads()
        if before == threads:  # the team already has the cap (or none asked): no call to set it
            entry(ptrs, dims)
        else:
            set_threads(threads)
            try:
                entry(ptrs, dims)
            finally:
                set_threads(before)
        if target is not out:
            np.copyto(out, target)

    def operand_ref(src, inputs):
        """(ref, shape) of an operand: the caller's for a parameter, a constant's own memory."""
        if isinstance(src, Param):
            return inputs[src.index]
        value = np.ascontiguousarray(src.value.astype(np_dtype, copy=False))
        return Address.of(value), value.shape

    def prepare_call(inputs, outputs):
        """The kernel's call at these ``(ref, shape)`` of the composite's inputs and its output,
        as one record of the call list (its arguments as ``run`` passes them)."""
        (q, qs), (k, ks), (v, vs) = (operand_ref(s, inputs) for s in (spec.q, spec.k, spec.v))
        mask, ms = (Address(dummy, dummy_at), None) if spec.mask is None else operand_ref(spec.mask, inputs)
        scale = Address(dummy, dummy_at) if isinstance(spec.scale, float) else operand_ref(spec.scale, inputs)[0]
        out, out_shape = outputs[0]
        arrays, offsets, dims, _ = layout.of_shapes(tuple(qs), tuple(ks), tuple(vs), None if ms is None else tuple(ms),
                                                    tuple(out_shape))
        held = [Address(a, at) for a, at in zip(arrays, offsets)]
        cap = int(threads) if threads and set_threads is not None else 0
        return [CCall(entry_address(entry), KERNEL, (q, k, v, mask, scale, out, *held), tuple(dims), cap)]

    run.note = note  # type: ignore[attr-defined]  # the path and why, for exe.summary()
    if calls is not None:
        run.prepare, run.call_list = prepare_call, calls  # type: ignore[attr-defined]
    return openmp_kernel(run, f"cpu-{kind}:{name}", source, threads,
                         lambda n: flash_runner(name, spec, source, lib, n, note, kind, prepare, calls))


# "auto" builds the flash kernel, raced against the segments, from this many keys on (see
# choose). Measured with the vector row work (bench/bench_attention.py, H heads x S x 64, one
# thread, medians of 21 interleaved rounds, ms flash / segments): causal 16x8 0.09 / 0.10,
# 16x16 0.10 / 0.13, 16x64 0.35 / 0.34, 32x128 2.07 / 2.25, 16x256 3.04 / 4.39; a dense random
# mask, where no tile is skipped, 32x128 2.20 / 2.13 and 16x512 15.6 / 16.4. Before it (glibc's
# expf) segments won below 256 keys: 16x128 1.19 / 1.06.
MIN_KEYS = 8
MODES = ("auto", "flash", "segments")
# what one task may keep on its thread's stack: its rows of q and of the output, its scores, and
# for 16-bit inputs a widened tile of k and v. An OpenMP worker's stack is the thread default
# (often 8 MiB, less where OMP_STACKSIZE says so); a head of 262,144 float32s overflowed it
# (SIGSEGV). Heads past this run as the segments (two products around the softmax).
MAX_STACK_BYTES = 512 << 10


def stack_bytes(spec: Attention) -> int:
    """The bytes a task of the flash kernel keeps on the stack for ``spec`` (see the template)."""
    elem, acc = _STORAGE[spec.dtype][:2]
    size = 8 if acc == "double" else 4
    rows = max(ROWS, ROWS_AVX2) * (spec.head_dim + spec.value_dim + KEYS) * size
    widened = KEYS * (spec.head_dim + spec.value_dim) * size if elem != acc else 0  # emit_flash's WIDEN
    return rows + widened


def choose(spec: Attention, shapes, mode: str = "auto") -> tuple[bool, str]:
    """Whether the flash kernel runs this attention, and why: never for heads whose rows would
    not fit ``MAX_STACK_BYTES``, nor for no keys (its rows would be NaN where softmax's empty
    sum gives zeros); else ``mode`` "flash" / "segments" decide alone, and "auto"
    takes flash from ``MIN_KEYS`` keys on (the build's shapes say how many; without them,
    always)."""
    if mode not in MODES:
        raise ValueError(f"attention mode must be one of {', '.join(MODES)}, got {mode!r}")
    need = stack_bytes(spec)
    if need > MAX_STACK_BYTES and mode != "segments":
        return False, (f"heads of {spec.head_dim} x {spec.value_dim} need {need >> 10} KiB of stack a thread, over the "
                       f"{MAX_STACK_BYTES >> 10} KiB the flash kernel keeps there: two products")
    keys = None
    if isinstance(spec.k, Const):
        keys = spec.k.value.shape[-1]
    elif spec.k.index < len(shapes) and len(shapes[spec.k.index]) >= 2:
        keys = shapes[spec.k.index][-1]
    if keys == 0 and mode != "segments":  # its rows would be NaN (no maximum); the products give zeros
        return False, "no keys: two products"
    if mode != "auto":
        return mode == "flash", f"attention={mode!r} asked for"
    if keys is None:
        return True, "key count unknown at build time"
    if keys >= MIN_KEYS:
        return True, f"{keys} keys >= {MIN_KEYS}"
    return False, f"{keys} keys < {MIN_KEYS}: two products win"
