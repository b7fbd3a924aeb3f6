"""Flash-style attention as CUDA C++: the arithmetic of the CPU kernel (``flash_attention.py``)
for a GPU, in the CUDA emitter's prelude and 16-bit helpers (``cuda.emitter.CUDA_PRELUDE``,
``HELPERS``), so NVRTC compiles it and the host twin (``cuda.host.HostTwin``) runs it on the
CPU in the tests.

One block per query row (grid-stride over batch x rows); keys in tiles of ``DPL_BLOCK``: each
thread scores one key of the tile (scale, mask), the block folds the tile's maximum (and a NaN
flag) and, after the online update, the sum of ``exp(score - max)`` in shared-memory trees;
the output row lives in shared memory, each thread owning the columns ``c = t, t + block,
...``, rescaled by ``exp(old max - new max)`` and accumulated over the tile's weighted values.
Every thread holds the same running maximum and sum, so a tile whose maximum is -inf is
skipped by the whole block at once (no thread leaves a barrier behind). The same rules as the
CPU kernel and the interpreter: a row all -inf is NaN, a NaN score makes its row NaN.

The CuPy backend runs ``kernel.attention`` composites through :func:`device_runner` when
:func:`choose` says so (``CupyBackend(attention=...)``); the kernel's arguments are those of
the CPU kernel's runner, its per-shape batch offsets uploaded to the device once.
"""

from __future__ import annotations


import numpy as np

from dpl import dtypes
from dpl.backends.cuda.emitter import CUDA_PRELUDE, HELPERS, MAX_GRID
from dpl.backends.cpu.flash_attention import layout_cache
from dpl.kernel.attention import Attention, Param
from dpl.kernel.ir import Const as KConst
from dpl.kernel.ir import to_c

_STORAGE = {"float32": ("float", "float", "(x)", "(x)"),
            "float64": ("double", "double", "(x)", "(x)"),
            "float16": ("uint16_t", "float", "dpl_f16_load(x)", "dpl_f16_store(x)"),
            "bfloat16": ("uint16_t", "float", "dpl_bf16_load(x)", "dpl_bf16_store(x)")}

TEMPLATE = """
#define FA_D {head}
#define FA_DV {value}
typedef {elem} fa_elem_t;
typedef {acc} fa_acc_t;
#define FA_LD(x) {load}
#define FA_ST(x) {store}

extern "C" __global__ void __launch_bounds__(DPL_BLOCK) {symbol}(const fa_elem_t *__restrict__ q, const fa_elem_t *__restrict__ k, const fa_elem_t *__restrict__ v, const fa_elem_t *__restrict__ mask, const fa_elem_t *__restrict__ scale_buf, fa_elem_t *__restrict__ out, const int64_t *__restrict__ qoff, const int64_t *__restrict__ koff, const int64_t *__restrict__ voff, const int64_t *__restrict__ moff, const int64_t nbatch, const int64_t sq, const int64_t sk, const int64_t mrow, const int64_t mcol) {{
  __shared__ fa_acc_t fa_p[DPL_BLOCK];
  __shared__ fa_acc_t fa_red[DPL_BLOCK];
  __shared__ int fa_bad[DPL_BLOCK];
  __shared__ fa_acc_t fa_o[FA_DV];
  const int64_t t = threadIdx.x;
  const fa_acc_t scale = {scale};
  (void)mask; (void)scale_buf; (void)moff; (void)mrow; (void)mcol;
  for (int64_t row = blockIdx.x; row < nbatch * sq; row += gridDim.x) {{
    const int64_t b = row / sq, i = row % sq;
    const fa_elem_t *__restrict__ qr = q + qoff[b] + i * FA_D;
    const fa_elem_t *__restrict__ kb = k + koff[b];
    const fa_elem_t *__restrict__ vb = v + voff[b];
    for (int64_t c = t; c < FA_DV; c += DPL_BLOCK) fa_o[c] = 0;
    fa_acc_t m = -INFINITY, l = 0;
    int bad = 0;
    for (int64_t j0 = 0; j0 < sk; j0 += DPL_BLOCK) {{
      const int64_t jn = sk - j0 < DPL_BLOCK ? sk - j0 : DPL_BLOCK;
      fa_acc_t x = -INFINITY;
      int nan_x = 0;
      if (t < jn) {{
        fa_acc_t dot = 0;
        for (int64_t d = 0; d < FA_D; ++d) dot += FA_LD(qr[d]) * FA_LD(kb[d * sk + j0 + t]);
        x = (fa_acc_t)(dot {scale_op} scale);
{mask_add}
        nan_x = x != x;
      }}
      fa_red[t] = nan_x ? (fa_acc_t)-INFINITY : x;
      fa_bad[t] = nan_x;
      __syncthreads();
      for (int64_t s = DPL_BLOCK / 2; s > 0; s >>= 1) {{
        if (t < s) {{
          fa_red[t] = fa_red[t + s] > fa_red[t] ? fa_red[t + s] : fa_red[t];
          fa_bad[t] |= fa_bad[t + s];
        }}
        __syncthreads();
      }}
      const fa_acc_t mx = fa_red[0];
      bad |= fa_bad[0];
      __syncthreads();  /* every thread has read the tree's root before it is reused */
      const fa_acc_t mnew = mx > m ? mx : m;
      if (mnew == -INFINITY) continue;  /* the same on every thread: nothing but -inf so far */
      const fa_acc_t corr = exp(m - mnew);
      const fa_acc_t e = t < jn ? (fa_acc_t)exp(x - mnew) : (fa_acc_t)0;
      fa_p[t] = e;
      fa_red[t] = e;
      __syncthreads();
      for (int64_t s = DPL_BLOCK / 2; s > 0; s >>= 1) {{
        if (t < s) fa_red[t] += fa_red[t + s];
        __syncthreads();
      }}
      l = l * corr + fa_red[0];
      m = mnew;
      for (int64_t c = t; c < FA_DV; c += DPL_BLOCK) {{
        fa_acc_t acc = fa_o[c] * corr;
        for (int64_t j = 0; j < jn; ++j) acc += fa_p[j] * FA_LD(vb[(j0 + j) * FA_DV + c]);
        fa_o[c] = acc;
      }}
      __syncthreads();  /* the tile's weights and sums are read before the next tile writes them */
    }}
    for (int64_t c = t; c < FA_DV; c += DPL_BLOCK) {{
      const fa_acc_t y = (bad || m == -INFINITY) ? (fa_acc_t)NAN : fa_o[c] / l;
      out[(b * sq + i) * FA_DV + c] = FA_ST(y);
    }}
    __syncthreads();  /* the row is written before the next row clears it */
  }}
}}
"""

MASK_ADD = "        x = (fa_acc_t)(x + FA_LD(mask[moff[b] + i * mrow + (j0 + t) * mcol]));"


def emit_flash_cuda(spec: Attention, symbol: str = "dpl_flash_attention") -> str:
    """The whole CUDA source (prelude, helpers, kernel ``symbol``) of the flash kernel for ``spec``."""
    elem, acc, load, store = _STORAGE[spec.dtype]
    if isinstance(spec.scale, float):
        scale = to_c(KConst(spec.scale, "float64" if acc == "double" else "float32"))
    else:
        scale = "FA_LD(scale_buf[0])"
    body = TEMPLATE.format(head=spec.head_dim, value=spec.value_dim, elem=elem, acc=acc, load=load, store=store,
                           symbol=symbol, scale=scale, scale_op="*" if spec.scale_op == "multiply" else "/",
                           mask_add=MASK_ADD if spec.mask is not None else "")
    return CUDA_PRELUDE + HELPERS + body


# "auto" takes the flash kernel when the score tensor the segments would write (batch x Sq x Sk
# elements) is at least this large. Not measured on a GPU: this kernel reads every key and value
# row once per query row (from L2), where cuBLAS's two products and the softmax kernel between
# them are fast until the scores themselves are the traffic (and the memory) that matters.
SCORES_BYTES = 256 << 20


def scores_bytes(spec: Attention, shapes) -> int | None:
    """Bytes of the scores the segments would materialise, from the build's shapes (None when
    q's or k's shape is not known)."""
    def shape(src):
        if not isinstance(src, Param):
            return tuple(src.value.shape)
        if src.index < len(shapes) and all(isinstance(d, (int, np.integer)) for d in shapes[src.index]):
            return tuple(int(d) for d in shapes[src.index])
        return None

    q, k = shape(spec.q), shape(spec.k)
    if q is None or k is None or len(q) < 2 or len(k) < 2:
        return None
    batch = np.broadcast_shapes(q[:-2], k[:-2])
    return int(np.prod(batch, dtype=np.int64)) * q[-2] * k[-1] * np.dtype(dtypes.to_numpy(spec.dtype)).itemsize


def choose(spec: Attention, shapes, mode: str = "auto", threshold: int | None = None) -> tuple[bool, str]:
    """Whether the CUDA flash kernel runs this attention, and why: "flash" / "segments" decide
    alone (``flash_attention.choose``); "auto" takes flash from ``SCORES_BYTES`` of scores on
    (unknown shapes: the segments)."""
    from dpl.backends.cpu import flash_attention as fa

    if mode != "auto":
        return fa.choose(spec, shapes, mode)
    threshold = SCORES_BYTES if threshold is None else threshold
    size = scores_bytes(spec, shapes)
    if size is None:
        return False, "scores' size unknown at build time: cuBLAS products"
    if size >= threshold:
        return True, f"{_size(size)} of scores >= {_size(threshold)}"
    return False, f"{_size(size)} of scores < {_size(threshold)}: cuBLAS products"


def _size(n: int) -> str:
    return f"{n / (1 << 20):.3g} MiB" if n >= 1 << 20 else f"{n / (1 << 10):.3g} KiB"


def launch_grid(nbatch: int, sq: int, max_grid: int = MAX_GRID) -> int:
    """Blocks for one launch: a block per query row, at most ``max_grid`` (the rest by grid stride)."""
    return max(1, min(nbatch * sq, max_grid))


def bits(a: np.ndarray) -> np.ndarray:
    """A 16-bit float array as the bits the kernel reads (float32/float64 as they are)."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def device_runner(name: str, spec: Attention, function, cp, block: int, note: str = ""):
    """``run(inputs, outputs)`` on device arrays: the compiled flash kernel ``function`` (a
    CuPy ``RawModule`` function of :func:`emit_flash_cuda`'s source at ``-DDPL_BLOCK=block``)
    launched on the composite's operands. Constant operands go to the device once, each shape's
    batch offsets once (the first call of a shape, before a CUDA graph captures it)."""
    np_dtype = dtypes.to_numpy(spec.dtype)

    def device(a):
        return cp.asarray(bits(np.require(np.asarray(a, np_dtype), requirements="C")))

    constants = {id(s): device(s.value) for s in (spec.q, spec.k, spec.v, spec.mask, spec.scale)
                 if s is not None and not isinstance(s, (Param, float))}
    dummy = device(np.zeros(1, np_dtype))
    layout = layout_cache(spec, lambda offs, dims: ([cp.asarray(o) for o in offs], tuple(np.int64(d) for d in dims),
                                                    launch_grid(dims[0], dims[1])))

    def operand(src, inputs):
        if not isinstance(src, Param):
            return constants[id(src)]
        a = inputs[src.index]
        return a if a.flags.c_contiguous else cp.ascontiguousarray(a)

    def run(inputs, outputs):
        q, k, v = (operand(s, inputs) for s in (spec.q, spec.k, spec.v))
        mask = None if spec.mask is None else operand(spec.mask, inputs)
        scale = dummy if isinstance(spec.scale, float) else operand(spec.scale, inputs).reshape(-1)
        out = outputs[0]
        offs, dims, grid = layout(q, k, v, mask, out.shape)
        function((grid,), (block,), (q, k, v, dummy if mask is None else mask, scale, out, *offs, *dims))

    run.__qualname__ = f"cuda-flash:{name}"
    run.note = note  # type: ignore[attr-defined]  # the path and why, for exe.summary()
    return run
