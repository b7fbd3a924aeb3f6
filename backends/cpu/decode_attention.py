"""Attention for a decode step on the CPU: one query row (per batch entry and head) against n
cached keys, flash-decoding style: the keys split into chunks that run in parallel, each a
partial softmax, merged at the end.

Why not the flash kernel (``flash_attention.py``): its tasks are ``ROWS`` query rows of one
batch entry over all the keys. With one query row a task computes scores for eight rows of
which one is real, grouped-query heads read their shared keys and values once per query head,
and a decoder with fewer heads than threads (or one head per batch, past the cache) leaves
threads idle however long the cache grows.

Here a task is a block of up to ``rows`` query rows that read one key/value stream (the query
heads of a GQA group, whose k and v batch entries are the same matrix: the frontend's
``[B, Hkv, G, 1, D]`` query against ``[B, Hkv, 1, D, n]`` keys), over one chunk of the keys. So
each key and value is read once per group, and where the row blocks are fewer than ``SPLIT``
times the threads, the keys split into chunks of at least ``MIN_CHUNK`` keys, tasks of their
own. A chunk's tiles run the flash kernel's tile code unchanged (:data:`flash_attention.TILE`:
scores, scale, mask, online softmax, weighted values), so the two kernels compute a tile alike.
A split row's chunks leave (maximum, sum, weighted values); a second loop merges them: the
largest maximum M, each chunk weighted by exp(m - M).

What the interpreter's softmax gives, this gives: a row whose scores are all -inf (fully
masked) is NaN, a NaN score makes its row NaN (a chunk passes it on as a NaN sum), +inf makes
its row NaN (exp(inf - inf)); a mask of the dtype's lowest value (torch's boolean masks, Hugging
Face's padding) gives exp(...) = 0 for the masked keys and a uniform average for a row masked
everywhere. Tiles a mask hides are skipped as in the flash kernel, row by row.

Chosen (``backends/cpu/backend.py``) where the build's shapes have one query row: a plan is
made per input signature, so a decode step's query length is known even where the IR's is
symbolic. The kernel is correct for any number of rows; it is chosen only for one.

Measured (bench/bench_attention.py --decode: 32 query heads over 8 key/value heads of 128, one
thread, a loaded 2-core host): 8192 keys 13.2 ms against the flash kernel's 67.4 on the one row
and the segments' 195; 512 keys 0.33 against 0.66 and 3.1. At 8192 keys k and v are read at 5.1
GB/s, where a plain sum of 256 MiB streams 6.5: the step is bound by memory.

Against the segments that ``attention="auto"`` races it with (backend.py's ``RacedKernel``), at
bench_zoo's generated Llama (8 query / 4 key-value heads of 64; ``bench_attention.py --decode
--heads 8,4,64 --keys ...``, one thread, medians of 31 interleaved rounds, load average 1.5):
130 keys 0.014 ms against 0.058 (4.3x), 195 0.019 / 0.080, 260 0.023 / 0.103, 1024 0.111 /
0.463, 2048 0.191 / 0.976, 4096 0.359 / 2.18 (6.1x); two threads, where the loaded host let a
team run, 130 keys 4.4x, 195 4.0x, 4096 10.8x. Of a call at 260 keys (CPU time) 5.4 us are
the runner's Python, 10.9 us the kernel; at 2048-4096 keys k and v stream at 24 GB/s, where one
thread copies 26 GB/s (read + write) and NumPy sums 16.5: the memory's pace. Splitting the
one- and two-row blocks' sums over d and keys (FMA latency) changed nothing measurable.
"""

from __future__ import annotations

import ctypes

import numpy as np

from dpl.backends.cgen.emitter import PRELUDE, VECTOR_MATH
from dpl.backends.cpu import flash_attention as fa
from dpl.kernel.attention import Attention, Const

MIN_CHUNK = 256  # keys a task takes at least: each split costs a partial row written and merged
SPLIT = 2  # tasks wanted per thread where the row blocks alone are fewer (load balance on a shared host)

ENTRY = """
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) {{ return 1; }}
#endif
#define MIN_CHUNK {min_chunk}
#define SPLIT {split}

/* keys per task (whole tiles): one chunk, or as many as give SPLIT tasks a thread, each of at
   least MIN_CHUNK keys; ``asked`` > 0 sets it (tests) */
static int64_t chunk_keys(int64_t sk, int64_t nblocks, int64_t asked) {{
  if (asked > 0) return asked;
  int64_t chunks = (SPLIT * (int64_t)omp_get_max_threads() + nblocks - 1) / nblocks;
  const int64_t most = (sk + MIN_CHUNK - 1) / MIN_CHUNK;
  chunks = chunks > most ? most : chunks;
  chunks = chunks < 1 ? 1 : chunks;
  return ((sk + KEYS - 1) / KEYS + chunks - 1) / chunks * KEYS;
}}

void dpl_kernel(void **buffers, const int64_t *dims) {{
{operands}  const int64_t *restrict gbatch = (const int64_t *)buffers[10];  /* batch entries, those of one k/v stream together */
  const int64_t *restrict blk = (const int64_t *)buffers[11];  /* per row block: its first row (over gbatch x sq), its rows */
  const int64_t sq = dims[1], sk = dims[2], mrow = dims[3], mcol = dims[4], nblocks = dims[5];
  const int64_t krow = sk;  /* k's rows, in place */
  const acc_t scale = {scale};
  (void)mask; (void)scale_buf; (void)moff; (void)mrow; (void)mcol;
  if (nblocks == 0) return;  /* no query rows */
  const int64_t chunk = chunk_keys(sk, nblocks, dims[6]);
  /* a split row's partials, per task and row: maximum, sum (NaN after a NaN score), values */
  const int64_t pstride = DV + 2;
  acc_t *part = sk > chunk ? (acc_t *)malloc(sizeof(acc_t) * nblocks * ((sk + chunk - 1) / chunk) * ROWS * pstride) : NULL;
  const int64_t nchunks = part ? (sk + chunk - 1) / chunk : 1;
  const int64_t span = part ? chunk : sk;  /* no memory for the partials: one chunk a row */
  #pragma omp parallel for schedule(static, 1)
  for (int64_t task = 0; task < nblocks * nchunks; ++task) {{
    const int64_t bi = task / nchunks, c0 = (task % nchunks) * span, c1 = MIN_(sk, c0 + span);
    const int64_t t0 = blk[2 * bi], rows = blk[2 * bi + 1];
    const elem_t *restrict kb = k + koff[gbatch[t0 / sq]];
    const elem_t *restrict vb = v + voff[gbatch[t0 / sq]];
    acc_t qf[ROWS][D], o[ROWS][DV], s[ROWS][KEYS], m[ROWS], l[ROWS];
    int nan[ROWS];
    int64_t orow[ROWS];
    const elem_t *mrows[ROWS];
    for (int r = 0; r < ROWS; ++r) {{
      const int64_t t = t0 + MIN_(r, rows - 1), b = gbatch[t / sq], i = t % sq;
      const elem_t *restrict qr = q + qoff[b] + i * D;
      for (int d = 0; d < D; ++d) qf[r][d] = r < rows ? LD(qr[d]) : (acc_t)0;
      for (int c = 0; c < DV; ++c) o[r][c] = 0;
      m[r] = -INFINITY; l[r] = 0; nan[r] = 0;
      orow[r] = (b * sq + i) * DV;
      mrows[r] = mask + moff[b] + i * mrow;
    }}
    (void)mrows;
    for (int64_t j0 = c0; j0 < c1; j0 += KEYS) {{
      const int64_t jt = MIN_(KEYS, c1 - j0);  /* the tile's keys */
{tile}    }}
    if (!part) {{
      for (int64_t r = 0; r < rows; ++r) {{
        const int dead = nan[r] || m[r] == -INFINITY;
        const acc_t inv = dead ? (acc_t)NAN : (acc_t)1 / l[r];
        for (int c = 0; c < DV; ++c) out[orow[r] + c] = ST(dead ? (acc_t)NAN : o[r][c] * inv);
      }}
      continue;
    }}
    acc_t *restrict pr = part + task * ROWS * pstride;
    for (int64_t r = 0; r < rows; ++r) {{
      pr[r * pstride] = m[r];
      pr[r * pstride + 1] = nan[r] ? (acc_t)NAN : l[r];
      for (int c = 0; c < DV; ++c) pr[r * pstride + 2 + c] = o[r][c];
    }}
  }}
  if (!part) return;
  /* the merge: each chunk's sum and values weighted by exp(its maximum - the row's) */
  #pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < nblocks * ROWS; ++row) {{
    const int64_t bi = row / ROWS, r = row % ROWS, t0 = blk[2 * bi];
    if (r >= blk[2 * bi + 1]) continue;
    const acc_t *restrict pr = part + (bi * nchunks * ROWS + r) * pstride;
    const int64_t cs = ROWS * pstride;  /* from one chunk's partial of the row to the next's */
    acc_t mx = -INFINITY;
    int bad = 0;
    for (int64_t c = 0; c < nchunks; ++c) {{
      mx = pr[c * cs] > mx ? pr[c * cs] : mx;
      bad |= pr[c * cs + 1] != pr[c * cs + 1];
    }}
    const int dead = bad || mx == -INFINITY;
    acc_t y[DV], sum = 0;
    for (int c = 0; c < DV; ++c) y[c] = 0;
    for (int64_t c = 0; c < nchunks && !dead; ++c) {{
      const acc_t *restrict pc = pr + c * cs;
      const acc_t w = exp(pc[0] - mx);
      sum += w * pc[1];
      for (int j = 0; j < DV; ++j) y[j] += w * pc[2 + j];
    }}
    const int64_t t = t0 + r, b = gbatch[t / sq], i = t % sq;
    const acc_t inv = dead ? (acc_t)NAN : (acc_t)1 / sum;
    for (int c = 0; c < DV; ++c) out[(b * sq + i) * DV + c] = ST(dead ? (acc_t)NAN : y[c] * inv);
  }}
  free(part);
}}
"""

# the next tile's keys, fetched while this tile's are read: each tile reads D rows of k at once
# (k is [D, n]), more streams than the hardware's prefetcher follows (8192 keys, 8 heads of 128,
# one thread: 23.1 ms without, 17.1 with; at 2048 keys, in cache, no change)
PREFETCH_K = 1  # flash_attention.BLOCKS' score_block: its k rows' next tile fetched
# the mask's entries of a task row come from that row's batch entry (mrows, set per task)
MASK_ROW = "          const elem_t *restrict mr = mrows[r] + j0 * mcol;"
# a tile's keys past the last one any row needs are not computed (flash_attention.TILE_MASKED, row by row)
SKIP_MASKED = """\
      int64_t jn = 0;
      for (int64_t r = 0; r < rows && jn < jt; ++r) {
        const int64_t live = tile_live(mrows[r] + j0 * mcol, 1, jt, 0, mcol, m + r);
        jn = live > jn ? live : jn;
      }
      if (jn == 0) continue;
"""


def emit_decode(spec: Attention, rows: int, vector_math: bool = False) -> str:
    """The C source of the decode kernel for ``spec``, a task holding ``rows`` query rows."""
    fields = {**fa.template_fields(spec, rows), "prefetch_k": PREFETCH_K}
    if spec.mask is not None:
        fields.update(mask_row=MASK_ROW, skip_masked=SKIP_MASKED)
    fields.update(tile_mask_row="mrows[r] + j0 * mcol")  # mrows: each task row's, set for all ROWS
    template = fa.HEAD + ENTRY.replace("{operands}", fa.OPERANDS).replace("{tile}", fa.TILE)
    return PRELUDE + (VECTOR_MATH if vector_math else "") + template.format(**fields, min_chunk=MIN_CHUNK, split=SPLIT)


def _shape(source, shapes):
    """The shape of operand ``source`` at the build's ``shapes``, or None where they do not say."""
    if isinstance(source, Const):
        return tuple(source.value.shape)
    if source.index < len(shapes) and all(isinstance(d, (int, np.integer)) for d in shapes[source.index]):
        return tuple(int(d) for d in shapes[source.index])
    return None


def query_rows(spec: Attention, shapes) -> int | None:
    """The query length at the build's ``shapes`` (or the IR's, where static), None if unknown."""
    q = _shape(spec.q, shapes)
    if q is not None and len(q) >= 2:
        return q[-2]
    rows = spec.out_shape[-2]
    return rows if isinstance(rows, int) else None


def takes(spec: Attention, shapes) -> tuple[bool, str]:
    """Whether this kernel runs the attention at the build's ``shapes``, and why: one query row."""
    rows = query_rows(spec, shapes)
    if rows is None:
        return False, "query length unknown at build time"
    return rows == 1, f"{rows} query row{'s' * (rows != 1)}"


def row_blocks(offsets, dims, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch entries grouped by the k/v matrices they read (groups in the order of their
    keys' offsets), and the row blocks over them: per block, its first row (an index over those
    entries x the query rows) and its row count, at most ``rows``, never across two groups."""
    _, koff, voff, _ = offsets
    nbatch, sq = dims[:2]
    if nbatch == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _, group = np.unique(np.stack([koff, voff], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    blocks, start = [], 0
    for count in np.bincount(group):
        n = int(count) * sq
        blocks += [(start + t, min(rows, n - t)) for t in range(0, n, rows)]
        start += n
    return np.argsort(group, kind="stable").astype(np.int64), np.asarray(blocks, np.int64).reshape(-1)


def task_rows(spec: Attention, shapes) -> int:
    """The rows a task holds: the query rows that share one k/v stream at the build's ``shapes``,
    at most the flash kernel's ``ROWS`` (``ROWS`` where the shapes do not say)."""
    given = [_shape(s, shapes) for s in (spec.q, spec.k, spec.v)]
    if any(s is None or len(s) < 2 for s in given):
        return fa.ROWS
    q, k, v = given
    out = np.broadcast_shapes(q[:-2], k[:-2], v[:-2]) + (q[-2], v[-1])
    offsets, dims = fa.batch_layout(spec, q, k, v, None, out)
    _, blocks = row_blocks(offsets, dims, fa.ROWS)
    return int(max(blocks[1::2], default=1))


def decode_runner(name: str, spec: Attention, source: str, lib, rows: int, threads: int | None = None,
                  note: str = "", chunk: int = 0, calls=None):
    """``run(inputs, outputs)`` calling the compiled decode kernel (``rows`` query rows a task;
    ``chunk`` > 0 fixes the keys a task takes, 0 leaves it to the kernel); ``calls``: the call
    list its prepared calls run on (:func:`~dpl.backends.cpu.flash_attention.flash_runner`)."""

    def prepare(offsets, dims):
        gbatch, blocks = row_blocks(offsets, dims, rows)
        ints = (*dims, len(blocks) // 2, chunk)
        return [*offsets, gbatch, blocks if blocks.size else np.zeros(2, np.int64)], (ctypes.c_int64 * len(ints))(*ints)

    return fa.flash_runner(name, spec, source, lib, threads, note, kind="decode", prepare=prepare, calls=calls)
