"""Kernel IR -> C. One statement emitter, :class:`StatementEmitter`, writes the scalar code
every target shares: loads (flattened, 16-bit floats widened), lets, reductions, stores and
plain serial loops, with expressions through ``dpl.kernel.to_c``. Each target wraps it: the
CPU wrapper here (:class:`CpuEmitter`) puts OpenMP over the outermost loop of each nest and
``omp simd`` on innermost loops; the CUDA wrapper (``backends/cuda/emitter.py``) maps the outer loops
onto the thread grid. So the arithmetic a GPU runs is the arithmetic the CPU tests check.

Large outputs are written with non-temporal (streaming) stores: an innermost loop that stores
contiguously into an output of at least ``stream_bytes`` computes blocks of one vector into a
register-sized buffer and streams each block out, which skips the read-for-ownership a plain
store costs (a third of the traffic of a one-read one-write kernel). Each thread fences its
streams before the parallel region ends. Without SSE2/AVX the plain loop is all there is.

A nest of two loops that transposes (its stores contiguous in the inner variable, more of its
loads contiguous in the outer one: a permute_dims of the last two axes, such as the k that
attention reads as [D, S]) runs in 16 x 16 tiles: computed into a stack buffer with the loads
in vectors, then stored row by row. Run as written each load was a gather from another cache
line (Llama 8x128's RoPE group that also transposes k: 0.50 -> 0.22-0.29 ms).

Every C identifier the kernel's own names need (buffers, dims, loop variables, locals) is
spelled by one allocator, ``cgen.names.CNames``; the emitter's scaffolding lives in ``dpl_*``.
NaN, the infinities and -0.0 mean what they mean to NumPy (see ``_NAN_FOLD`` for max/min).

The generated function is ``void <name>(void **buffers, const int64_t *dims)``: buffers are
the kernel's parameters, then its constants, then its outputs, all C-contiguous; ``dims`` are
the symbolic dimensions in ``Kernel.dims`` order.
"""

from __future__ import annotations

import math
import re

import attrs
import numpy as np

from dpl import dtypes
from dpl.backends.cgen.names import CNames, EmitError
from dpl.ir import dims as dimexpr
from dpl.kernel.ir import (C_TYPES, Bin, Const, Kernel, Let, Load, Loop, Op, Reduce, Select, Store, Var, free_vars, substitute,
                          op_c, to_c, walk, walk_exprs)
from dpl.kernel.loop_split import split_index_loops
from dpl.kernel.collapse import collapse_transposes
from dpl.kernel.short_axis import unroll_short_axes
from dpl.ops.registry import get_op

PRELUDE = """\
#include <stdint.h>
#include <stdbool.h>
#include <tgmath.h>
typedef _Float16 half;
/* bfloat16: stored as its 16 bits, computed in float (rounded to nearest even when stored) */
typedef float bfloat16;
static inline float dpl_bf16_load(uint16_t h) {
  union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
  return v.f;
}
static inline uint16_t dpl_bf16_store(float f) {
  union { float f; uint32_t u; } v = { f };
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);  /* NaN stays a quiet NaN */
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
"""

# streaming stores (see the module docstring), included in kernels that use them
STREAMING = """\
#if defined(__AVX__)
#include <immintrin.h>
#define DPL_NT_BYTES 32
static inline void dpl_put_f32(float *p, const float *v) {
  if ((uintptr_t)p % 32) _mm256_storeu_ps(p, _mm256_loadu_ps(v)); else _mm256_stream_ps(p, _mm256_loadu_ps(v));
}
static inline void dpl_put_f64(double *p, const double *v) {
  if ((uintptr_t)p % 32) _mm256_storeu_pd(p, _mm256_loadu_pd(v)); else _mm256_stream_pd(p, _mm256_loadu_pd(v));
}
#elif defined(__SSE2__)
#include <emmintrin.h>
#define DPL_NT_BYTES 16
static inline void dpl_put_f32(float *p, const float *v) {
  if ((uintptr_t)p % 16) _mm_storeu_ps(p, _mm_loadu_ps(v)); else _mm_stream_ps(p, _mm_loadu_ps(v));
}
static inline void dpl_put_f64(double *p, const double *v) {
  if ((uintptr_t)p % 16) _mm_storeu_pd(p, _mm_loadu_pd(v)); else _mm_stream_pd(p, _mm_loadu_pd(v));
}
#endif
#ifdef DPL_NT_BYTES
#define dpl_sfence() _mm_sfence()
/* elements to store one by one before p + head is aligned for streaming (all n if it never is) */
static inline int64_t dpl_nt_head(const void *p, int64_t size, int64_t n) {
  const uintptr_t a = (uintptr_t)p;
  const int64_t head = a % size ? n : (int64_t)((DPL_NT_BYTES - a % DPL_NT_BYTES) % DPL_NT_BYTES) / size;
  return head < n ? head : n;
}
#else
#define dpl_sfence() ((void)0)
#endif
"""

# integer division as the interpreter defines it (dpl/ops/elementwise.py): truncated toward zero,
# 0 for a zero divisor, the most negative value over -1 wrapping to itself. C leaves both to
# chance and x86 traps on them: a zero divisor in the data had killed the process (SIGFPE).
# The remainders ``mod`` (truncated, C's %) and ``floor_mod`` (the sign of the divisor) are 0
# for a zero divisor, as ``divide``'s quotient is, and 0 for the most negative value over -1 (its
# true remainder), which C's % traps on too.
# Written once for C and CUDA C++ (``inline`` is the qualifier each puts in front).
INT_DIVIDE = """\
#define DPL_DIV_SIGNED(N, T, U) static {inline} T dpl_div_##N(T a, T b) {{ \\
  return b == 0 ? (T)0 : b == (T)-1 ? (T)(0 - (U)a) : (T)(a / b); }} \\
static {inline} T dpl_mod_##N(T a, T b) {{ return b == 0 || b == (T)-1 ? (T)0 : (T)(a % b); }} \\
static {inline} T dpl_floor_mod_##N(T a, T b) {{ \\
  const T m = dpl_mod_##N(a, b); return m != 0 && (m < 0) != (b < 0) ? (T)(m + b) : m; }}
#define DPL_DIV_UNSIGNED(N, T) static {inline} T dpl_div_##N(T a, T b) {{ return b == 0 ? (T)0 : (T)(a / b); }} \\
static {inline} T dpl_mod_##N(T a, T b) {{ return b == 0 ? (T)0 : (T)(a % b); }} \\
static {inline} T dpl_floor_mod_##N(T a, T b) {{ return dpl_mod_##N(a, b); }}
DPL_DIV_SIGNED(int64, int64_t, uint64_t) DPL_DIV_SIGNED(int32, int32_t, uint32_t)
DPL_DIV_SIGNED(int16, int16_t, uint16_t) DPL_DIV_SIGNED(int8, int8_t, uint8_t)
DPL_DIV_UNSIGNED(uint8, uint8_t) DPL_DIV_UNSIGNED(bool, bool)
"""
# a call of the dims.C_HELPERS (a dimension expression's floor division, modulo, min or max)
DIM_HELPER_CALL = re.compile(r"\bdpl_(floordiv|mod|min|max)\(")
INT_DIVIDE_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
INT_DIVIDING_OPS = ("divide", "mod", "floor_mod")  # integer ops spelled by the helpers above

# The rest of the IR's arithmetic, which C's is not of itself. Every op's result is a value of its
# IR type, as the interpreter computes it (NumPy, op by op):
# - signed overflow wraps (C leaves it undefined: GCC folds ``x + 1 > x`` to true at INT_MAX), so
#   int32 and int64 add, subtract, multiply, square, negative and abs compute in the unsigned type
#   of their width, which wraps, and convert back (GCC and NVCC keep the bits): the same
#   instructions, and no compiler flag (NVRTC has no -fwrapv);
# - C computes int8, uint8, int16 and bool in int: a result is converted back to its type at
#   each op that can leave it (int8 ``x + x`` at 100 is -56 for a later compare or cast, not 200);
# - float16 and bfloat16 compute in float: a result is rounded to its type at each op that can
#   leave it (``x * x / x`` at 300 is inf, not 300); see ``StatementEmitter.rounded``.
WRAPPING = {
    "add": "(({T})(({U})({0}) + ({U})({1})))",
    "subtract": "(({T})(({U})({0}) - ({U})({1})))",
    "multiply": "(({T})(({U})({0}) * ({U})({1})))",
    "square": "(({T})(({U})({0}) * ({U})({0})))",
    "negative": "(({T})(0 - ({U})({0})))",
    "abs": "({0} < 0 ? ({T})(0 - ({U})({0})) : {0})",
}
WRAP_UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t"}
NARROW_INTS = ("int16", "int8", "uint8", "bool")
SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")
# ops whose C value is one of their operands (or a comparison's 0 or 1): a value of the type already
SELECTING = frozenset({"maximum", "minimum", "where", "nn.relu", "equal", "not_equal", "less", "less_equal",
                       "greater", "greater_equal"})
# ... and for floats a sign flipped too (for integers ``-x`` overflows at MIN)
SELECTING_FLOAT = SELECTING | {"negative", "abs"}
# float16 ops the C computes in half itself, correctly rounded (as float then rounded would be):
# the others' templates (literals, libm calls: tgmath has no half exp) compute in float
HALF_NATIVE = frozenset({"add", "subtract", "multiply", "divide", "square"})
# bfloat16 rounded to nearest even, as a float (the CPU kernels compute bfloat16 in float): the
# rounding of dpl_bf16_store kept in 32-bit lanes (through the 16 bits and back, GCC packs and
# unpacks every vector: a bfloat16 multiply-add-silu-subtract chain took 2.4x its unrounded time,
# this way 1.9x); a NaN stays a NaN
BF16_ROUND = """\
static inline float dpl_bf16_round(float f) {
  union { float f; uint32_t u; } v = { f };
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return f;
  v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
  return v.f;
}
"""


# Vector variants of the float math functions exist in glibc's libmvec; glibc only declares
# them under -ffast-math, which would also drop NaN/inf semantics. Declaring them here lets
# "omp simd" loops call the vector versions while every other IEEE rule stays in force.
VECTOR_MATH = """\
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
float powf(float, float);
"""

SUPPORTED_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"})


# outputs of at least this many bytes are streamed past the caches (see the module docstring):
# well above a core's L2, so an output the next kernel reads while it is still cached stays plain
STREAM_BYTES = 16 << 20
STREAM_PUT = {"float32": "dpl_put_f32", "float64": "dpl_put_f64"}

# a row reduction's folded value that a later loop over the row computes again is kept in a
# per-thread row buffer when it is this costly (a libm call) and the row this small
COSTLY_C = ("exp(", "log(", "tanh(", "erf(", "sin(", "cos(", "pow(", "sqrt(", "log1p(", "expm1(", "fmod(")
KEEP_ROW_BYTES = 64 << 10

# a loop nest that transposes (see CpuEmitter.transposes) runs in tiles of this many elements
# square: a tile of float32 is 1 KiB, and each of its loads and stores a whole 64-byte line
TRANSPOSE_TILE = 16
FOUR_BYTE_C = ("float", "int32_t", "uint32_t")  # tiles dpl_transpose16 turns (TRANSPOSE_TILE must be 16)


def _transpose_round(h: int, lanes: int = 16) -> str:
    """Round ``h`` of ``dpl_transpose16``: rows r and r + h (bit h of r clear) trade their
    h-element blocks, so element (r, j) with bit h of j set moves to (r + h, j - h) and back.
    ``lanes``: 16, a row one vector; 8, a row two (rounds 4, 2, 1 alike in each half)."""
    first = [lanes + j - h if j & h else j for j in range(lanes)]
    second = [lanes + j if j & h else j + h for j in range(lanes)]
    at = "" if lanes == 16 else "[c]"
    pad = "      " if lanes == 16 else "        "
    body = (f"{pad}const dpl_u32x{lanes} a = v[r]{at}, b = v[r + {h}]{at};\n"
            f"{pad}v[r]{at} = DPL_SHUFFLE{lanes}(a, b, {', '.join(map(str, first))});\n"
            f"{pad}v[r + {h}]{at} = DPL_SHUFFLE{lanes}(a, b, {', '.join(map(str, second))});\n")
    if lanes != 16:
        body = f'      _Pragma("GCC unroll 2") for (int c = 0; c < 2; ++c) {{\n{body}      }}\n'
    return f'  _Pragma("GCC unroll 16") for (int r = 0; r < 16; ++r)\n    if (!(r & {h})) {{\n{body}    }}\n'


# included in kernels whose transposing nests hold 4-byte elements (see CpuEmitter.transpose_loop):
# a full 16 x 16 tile transposed in vector registers, four rounds of two-vector shuffles (round h
# swaps bit h of the row number with bit h of the column), instead of 256 loads and stores with a
# 64-byte stride. Without AVX-512 the rows are pairs of 8-lane vectors: round 8 trades the
# off-diagonal blocks' halves (moves, no shuffle), the others shuffle within each half (64-byte
# vectors there had been split by the compiler into spilled register pairs: a BERT 8 x 128 k
# transposed 266-324 -> 135-141 us on a Zen 3 core)
TRANSPOSE16 = ("""\
typedef uint32_t dpl_u32x16 __attribute__((vector_size(64)));
typedef uint32_t dpl_u32x8 __attribute__((vector_size(32)));
#if defined(__clang__)
#define DPL_SHUFFLE16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#define DPL_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define DPL_SHUFFLE16(a, b, ...) __builtin_shuffle(a, b, (dpl_u32x16){__VA_ARGS__})
#define DPL_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (dpl_u32x8){__VA_ARGS__})
#endif
static inline void dpl_transpose16(void *tile) {
#if defined(__AVX512F__)
  dpl_u32x16 v[16];
  __builtin_memcpy(v, tile, sizeof v);
""" + "".join(_transpose_round(h) for h in (8, 4, 2, 1)) + """\
#else
  dpl_u32x8 v[16][2];
  __builtin_memcpy(v, tile, sizeof v);
  _Pragma("GCC unroll 8") for (int r = 0; r < 8; ++r) {
    const dpl_u32x8 t = v[r][1];
    v[r][1] = v[r + 8][0];
    v[r + 8][0] = t;
  }
""" + "".join(_transpose_round(h, 8) for h in (4, 2, 1)) + """\
#endif
  __builtin_memcpy(tile, v, sizeof v);
}
""")


# OpenMP reduction operators for the registry combiners
_SIMD_REDUCTION = {"add": "+", "multiply": "*", "maximum": "max", "minimum": "min"}
# A float max/min reduction folds the non-NaN values (one maxss/minss: the NaN-propagating
# select would put a compare, an or and a blend on the accumulator's chain, and branches) and
# ORs a NaN flag beside them, which also survives OpenMP's SIMD max/min (it combines the lanes'
# partial results with no rule for NaN); the local becomes NaN after the loop if the flag is set
_NAN_FOLD = {"maximum": ">", "minimum": "<"}
SIMD_MIN_TRIPS = 8  # a max/min reduction's innermost loop shorter than this stays scalar
# a loop nest of fewer iterations than this runs on the calling thread alone: waking an OpenMP
# team and meeting it at the closing barrier costs more than such a nest computes, and on a
# busy machine a descheduled worker holds the barrier for a scheduler slice (an 8 x 8 add-relu
# kernel took 41 us a call on a loaded 2-core host with a team of two). Symbolic extents: an
# ``if`` clause decides at run time.
PARALLEL_MIN_WORK = 32768
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _LoopDependent(Exception):
    """A loop extent that reads a loop variable: no iteration count before the nest."""


class StatementEmitter:
    """Kernel IR statements as C-like scalar code, shared by every target. Loops come out as
    plain serial ``for`` loops; a target subclass overrides :meth:`loop` (and may add hooks
    around reductions) to parallelise them. Buffers of the dtypes in ``bits`` hold their raw
    16 bits: loads widen them to float through the named function, stores round through the
    other."""

    bits = {"bfloat16": ("dpl_bf16_load", "dpl_bf16_store")}

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.names = CNames(kernel)  # every C identifier of the kernel's own names
        self.buffers = {}
        for b in (*kernel.params, *kernel.outputs):
            self.buffers[b.name] = b
        self.const_buffers = {}
        for name, value in kernel.constants.items():
            self.const_buffers[name] = value
        for b in self.buffers.values():
            if b.dtype not in SUPPORTED_DTYPES:
                raise EmitError(f"kernel '{kernel.name}': dtype {b.dtype} of buffer {b.name} has no C type here")

    # -- expressions ------------------------------------------------------------------------

    def dim(self, d) -> str:
        """A buffer's dimension as C: a symbol by its name, an expression through
        ``dims.to_c`` (its floor division and min/max by the ``dims.C_HELPERS``)."""
        if isinstance(d, str):
            return self.names[d]
        if isinstance(d, int):
            return f"{int(d)}LL"
        return dimexpr.to_c(d, self.names.__getitem__)

    def dtype_of(self, buffer: str) -> str:
        return self.buffers[buffer].dtype if buffer in self.buffers else _dtype_of(self.const_buffers[buffer])

    def load(self, buffer: str, index: list[str]) -> str:
        widen = self.bits.get(self.dtype_of(buffer))
        return f"{widen[0]}({self.flat(buffer, index)})" if widen else self.flat(buffer, index)

    def flat(self, buffer: str, index: list[str]) -> str:
        if buffer in self.buffers:
            shape = self.buffers[buffer].shape
        else:
            shape = self.const_buffers[buffer].shape
        if not index:
            return f"{self.names.buffer(buffer)}[0]"
        offset = index[0]
        for d, i in zip(shape[1:], index[1:]):
            offset = f"({offset}) * {self.dim(d)} + {i}"
        return f"{self.names.buffer(buffer)}[{offset}]"

    def var(self, name: str) -> str:
        return self.names[name]

    def op(self, e: Op, args: list[str]) -> str | None:
        """The C for a registry op where the template alone does not compute the IR's value
        (None: the template): an integer ``divide``, ``mod`` or ``floor_mod`` by the ``INT_DIVIDE`` helpers, int32/int64
        arithmetic wrapping, narrow integers converted back and 16-bit floats rounded to their
        type (see ``WRAPPING``). float32, float64 and the other int32/int64 ops are templates."""
        if e.op == "astype":
            to = dict(e.attrs)["dtype"]
            return self.rounded(to, args[0]) if to in SIXTEEN_BIT_FLOATS else None
        if e.op in INT_DIVIDING_OPS and e.dtype in INT_DIVIDE_DTYPES:
            helper = "div" if e.op == "divide" else e.op
            return f"dpl_{helper}_{e.dtype}({args[0]}, {args[1]})"  # a value of its type
        if e.dtype in WRAP_UNSIGNED:
            if e.op in WRAPPING:
                return WRAPPING[e.op].format(*args, T=self.ctype(e.dtype), U=WRAP_UNSIGNED[e.dtype])
            if e.op in ("power", "clip"):  # computed in double (pow, a float bound)
                return f"(({self.ctype(e.dtype)})({op_c(e, args)}))"
            return None
        if e.dtype in NARROW_INTS and e.op not in SELECTING:
            return f"(({self.ctype(e.dtype)})({op_c(e, args)}))"
        if e.dtype in SIXTEEN_BIT_FLOATS and e.op not in SELECTING_FLOAT:
            if e.dtype == "float16" and e.op not in HALF_NATIVE:
                args = [f"(float)({a})" for a in args]
            return self.rounded(e.dtype, op_c(e, args))
        return None

    def rounded(self, dtype: str, c: str) -> str:
        """``c`` rounded to nearest even in the 16-bit float ``dtype``: a conversion to ``half``
        (``_Float16``, which GCC rounds at a conversion), ``dpl_bf16_round`` for bfloat16 (a
        float here)."""
        return f"((half)({c}))" if dtype == "float16" else f"dpl_bf16_round({c})"

    def combine(self, dtype: str, combiner: str, a: str, b: str) -> str:
        """``combiner(a, b)`` in ``dtype`` as the IR computes it: a reduction's fold (float32 and
        float64 as ``(T)(template)``)."""
        t = self.ctype(dtype)
        if dtype in WRAP_UNSIGNED and combiner in WRAPPING:
            return WRAPPING[combiner].format(a, b, T=t, U=WRAP_UNSIGNED[dtype])
        template = get_op(combiner).c_expr.format(a, b)
        if dtype in SIXTEEN_BIT_FLOATS and combiner not in SELECTING_FLOAT:
            return self.rounded(dtype, template)
        return f"({t})({template})"

    def expr(self, e) -> str:
        return to_c(e, load=lambda load, index: self.load(load.buffer, index), var=self.var, op=self.op)

    def ctype(self, dtype: str) -> str:
        if dtype not in SUPPORTED_DTYPES:
            raise EmitError(f"kernel '{self.kernel.name}': dtype {dtype} has no C type here")
        return C_TYPES[dtype]

    def buffer_order(self) -> list[tuple[str, str]]:
        """(name, dtype) of every buffer as the kernel takes them: parameters, constants, outputs."""
        k = self.kernel
        order = [(b.name, b.dtype) for b in k.params]
        order += [(name, _dtype_of(value)) for name, value in k.constants.items()]
        order += [(b.name, b.dtype) for b in k.outputs]
        return order

    def buffer_ctype(self, dtype: str) -> str:
        """The C element type of a buffer: the bits for a dtype held as bits; a bool buffer's
        bytes (NumPy's 0 and 1) as uint8_t, as GCC does not vectorise a loop over _Bool loads
        (a bool -> float max over 512 x 512 ran a scalar loop: 0.20 ms a call, 0.03 as bytes). Stores
        still convert to bool first, so each byte written is 0 or 1."""
        if dtype == "bool":
            return "uint8_t"
        return "uint16_t" if dtype in self.bits else self.ctype(dtype)

    # -- statements -------------------------------------------------------------------------

    def stmts(self, stmts, indent: int, out: list[str], outer: bool = False) -> None:
        pad = "  " * indent
        for s in stmts:
            if isinstance(s, Loop):
                self.loop(s, indent, out, outer)
            elif isinstance(s, Let):
                out.append(f"{pad}{self.let(s)}")
            elif isinstance(s, Reduce):
                self.reduce(s, indent, out)
            elif isinstance(s, Store):
                out.append(f"{pad}{self.store(s)}")
            else:
                raise EmitError(f"cannot emit {type(s).__name__}")

    def loop(self, s: Loop, indent: int, out: list[str], outer: bool) -> None:
        pad, v = "  " * indent, self.names[s.var.name]
        out.append(f"{pad}for (int64_t {v} = 0; {v} < {self.expr(s.extent)}; ++{v}) {{")
        self.stmts(s.body, indent + 1, out, False)
        out.append(f"{pad}}}")

    def let(self, s: Let) -> str:
        return f"const {self.ctype(s.value.dtype)} {self.names[s.name]} = {self.expr(s.value)};"

    def store(self, s: Store, target: str | None = None) -> str:
        """``buffer[index] = value``, into ``target`` (another lvalue) when given."""
        dtype = self.buffers[s.buffer].dtype
        target = target or self.flat(s.buffer, [self.expr(i) for i in s.indices])
        narrow = self.bits.get(dtype)
        if narrow:
            return f"{target} = {narrow[1]}({self.expr(s.value)});"
        return f"{target} = ({self.ctype(dtype)})({self.expr(s.value)});"

    def reduce_start(self, s: Reduce) -> str:
        t = self.ctype(s.dtype)
        return f"{t} {self.names[s.name]} = ({t}){self.expr(s.init)};"

    def fold(self, s: Reduce, value: str) -> str:
        """The statement folding ``value`` (C) into the reduction's local; a value the
        combiner reads twice (maximum's NaN test) is computed once, into a local."""
        acc, t = self.names[s.name], self.ctype(s.dtype)
        template = get_op(s.combiner).c_expr
        if template.count("{1}") == 1 or _C_IDENTIFIER.fullmatch(value):
            return f"{acc} = {self.combine(s.dtype, s.combiner, acc, f'({value})')};"
        return f"{{ const {t} dpl_fold = ({value}); {acc} = {self.combine(s.dtype, s.combiner, acc, 'dpl_fold')}; }}"

    def reduce(self, s: Reduce, indent: int, out: list[str]) -> None:
        """The local, one serial loop per reduction axis, the body, the fold."""
        pad = "  " * indent
        self.before_reduce(s, indent, out)
        out.append(f"{pad}{self.reduce_start(s)}")
        depth = indent
        for k, a in enumerate(s.axes):
            v = self.names[a.var.name]
            self.before_axis(s, k, depth, out)
            out.append(f"{'  ' * depth}for (int64_t {v} = 0; {v} < {self.expr(a.extent)}; ++{v}) {{")
            depth += 1
        self.stmts(s.body, depth, out, False)
        out.append(f"{'  ' * depth}{self.fold(s, self.folded(s, depth, out))}")
        for _ in s.axes:
            depth -= 1
            out.append(f"{'  ' * depth}}}")
        self.after_reduce(s, indent, out)

    # hooks around a reduction, for a target's additions (pragmas, kept rows)
    def before_reduce(self, s: Reduce, indent: int, out: list[str]) -> None:
        pass

    def before_axis(self, s: Reduce, k: int, indent: int, out: list[str]) -> None:
        pass

    def after_reduce(self, s: Reduce, indent: int, out: list[str]) -> None:
        pass

    def folded(self, s: Reduce, indent: int, out: list[str]) -> str:
        """The C of the value folded in (a target may compute it into a buffer first)."""
        return self.expr(s.value)


class CpuEmitter(StatementEmitter):
    """The CPU wrapper: OpenMP over the outermost loop of each nest, ``omp simd`` on innermost
    loops and loop-free reductions, streaming stores for large outputs, kept rows."""

    def __init__(self, kernel: Kernel, stream_bytes: int | None = STREAM_BYTES):
        super().__init__(kernel)
        self.stream_bytes = stream_bytes
        self.redirect: dict[int, str] = {}  # id(Store) -> the C lvalue it writes instead (a block buffer)
        self.kept: dict[int, str] = {}  # id(Reduce) -> the row buffer its folded values are kept in
        self.aliases: dict[str, str] = {}  # kernel IR variable -> the C it reads instead (a kept row)
        self.nan_flags: dict[int, str] = {}  # id(Reduce) -> the NaN flag of a float max/min reduction

    def var(self, name: str) -> str:
        return self.aliases.get(name) or self.names[name]

    def stmts(self, stmts, indent: int, out: list[str], outer: bool = False) -> None:
        super().stmts(self.keep_rows(stmts), indent, out, outer)

    def store(self, s: Store, target: str | None = None) -> str:
        return super().store(s, target or self.redirect.get(id(s)))

    def loop(self, s: Loop, indent: int, out: list[str], outer: bool) -> None:
        pad = "  " * indent
        v = self.names[s.var.name]
        innermost = not any(isinstance(x, (Loop, Reduce)) for x in walk(s.body))
        if self.streamed(s):
            self.stream_loop(s, indent, out, outer)
            return
        if self.transposes(s):
            self.transpose_loop(s, indent, out, outer)
            return
        if outer and any(isinstance(x, Loop) and self.streamed(x) for x in walk(s.body)):
            # a parallel region of its own, so that each thread fences its streams
            out.append(f"{pad}#pragma omp parallel{self.parallel_if(s)}")
            out.append(f"{pad}{{")
            out.append(f"{pad}#pragma omp for schedule(static)")
            out.append(f"{pad}for (int64_t {v} = 0; {v} < {self.expr(s.extent)}; ++{v}) {{")
            self.stmts(s.body, indent + 1, out, False)
            out.append(f"{pad}}}")
            out.append(f"{pad}dpl_sfence();")
            out.append(f"{pad}}}")
            return
        if outer:
            cond = self.parallel_if(s)
            if cond != " if(0)":
                out.append(f"{pad}#pragma omp parallel for schedule(static){cond}")
            elif innermost:  # the calling thread alone (no team to wake), in vectors
                out.append(f"{pad}#pragma omp simd")
        elif innermost:
            out.append(f"{pad}#pragma omp simd")
        super().loop(s, indent, out, outer)

    def redirected(self, stmts, targets: dict, indent: int, out: list[str]) -> None:
        """``stmts``, each store in ``targets`` (by id) writing the C lvalue given there instead."""
        self.redirect = targets
        try:
            self.stmts(stmts, indent, out, False)
        finally:
            self.redirect = {}

    def transposes(self, s: Loop) -> bool:
        """Whether ``s`` and its one inner loop are a transpose: the inner loop's stores are
        contiguous in the inner variable while more of its loads are contiguous in the outer
        one (a permute_dims that swaps the last axes, the k of attention written as [D, S]).
        Run as written, every load is a gather from a different cache line."""
        if len(s.body) != 1 or not isinstance(s.body[0], Loop) or not all(
                isinstance(e, Const) and int(e.value) >= TRANSPOSE_TILE for e in (s.extent, s.body[0].extent)):
            return False
        inner = s.body[0]
        if any(not isinstance(x, (Let, Store)) for x in inner.body) or self.streamed(inner):
            return False
        a, b = s.var.name, inner.var.name
        stores = [x for x in inner.body if isinstance(x, Store)]
        lets = [x for x in inner.body if isinstance(x, Let)]
        local = {let.name for let in lets}  # out of scope where the tile is stored
        if not stores or not all(isinstance(st.indices[-1], Var) and st.indices[-1].name == b and st.buffer in self.buffers
                                 and not any(b in free_vars(i) or free_vars(i) & local for i in st.indices[:-1])
                                 for st in stores):
            return False
        by_a = by_b = 0
        for x in inner.body:
            for e in walk_exprs(_inline_lets(x.value, lets)):
                if isinstance(e, Load) and e.indices:
                    last = free_vars(e.indices[-1])
                    by_b += b in last
                    by_a += a in last and b not in last
        return by_a > by_b

    def transpose_loop(self, s: Loop, indent: int, out: list[str], outer: bool) -> None:
        """The nest in tiles of ``TRANSPOSE_TILE`` squared: each tile computed with the outer
        variable innermost (its loads contiguous, in vectors) into a buffer on the stack, then
        stored with the inner variable innermost (the stores contiguous). A full tile runs
        loops of constant length (GCC made each variable-length row of a plain copy a call to
        memcpy: 16 calls a tile), and a full tile of 4-byte elements is turned in registers
        (``dpl_transpose16``) and stored a row of vectors at a time; the ragged edge tiles
        take the general loops."""
        inner, t = s.body[0], TRANSPOSE_TILE
        pad = ["  " * (indent + k) for k in range(3)]
        a, b = self.names[s.var.name], self.names[inner.var.name]
        a_n, b_n = self.expr(s.extent), self.expr(inner.extent)
        stores = [x for x in inner.body if isinstance(x, Store)]
        if outer:
            cond = self.parallel_if(s)
            if cond != " if(0)":
                out.append(f"{pad[0]}#pragma omp parallel for schedule(static){cond}")
        out.append(f"{pad[0]}for (int64_t dpl_a0 = 0; dpl_a0 < {a_n}; dpl_a0 += {t}) {{")
        out.append(f"{pad[1]}for (int64_t dpl_b0 = 0; dpl_b0 < {b_n}; dpl_b0 += {t}) {{")
        out.append(f"{pad[2]}const int64_t dpl_a1 = dpl_a0 + {t} < {a_n} ? dpl_a0 + {t} : {a_n};")
        out.append(f"{pad[2]}const int64_t dpl_b1 = dpl_b0 + {t} < {b_n} ? dpl_b0 + {t} : {b_n};")
        for k, st in enumerate(stores):
            out.append(f"{pad[2]}{self.buffer_ctype(self.buffers[st.buffer].dtype)} dpl_tile{k}[{t}][{t}];")
        turned = {k for k, st in enumerate(stores) if self.buffer_ctype(self.buffers[st.buffer].dtype) in FOUR_BYTE_C}
        out.append(f"{pad[2]}if (dpl_a1 - dpl_a0 == {t} && dpl_b1 - dpl_b0 == {t}) {{")
        self.tile_pass(inner.body, stores, a, b, f"dpl_a0 + {t}", f"dpl_b0 + {t}", turned, indent + 3, out)
        out.append(f"{pad[2]}}} else {{")
        self.tile_pass(inner.body, stores, a, b, "dpl_a1", "dpl_b1", set(), indent + 3, out)
        out.append(f"{pad[2]}}}")
        out.append(f"{pad[1]}}}")
        out.append(f"{pad[0]}}}")

    def tile_pass(self, body, stores, a: str, b: str, a_end: str, b_end: str, turned: set, indent: int,
                  out: list[str]) -> None:
        """One tile of a transposing nest, rows ``[dpl_a0, a_end)`` by ``[dpl_b0, b_end)``: the
        values into the tiles (``a`` innermost), the tiles in ``turned`` transposed in place,
        then the stores (``b`` innermost), tile ``k`` read ``[a][b]`` where it was turned,
        else ``[b][a]``."""
        pad = ["  " * (indent + k) for k in range(3)]
        out.append(f"{pad[0]}for (int64_t {b} = dpl_b0; {b} < {b_end}; ++{b}) {{")
        out.append(f"{pad[1]}#pragma omp simd")
        out.append(f"{pad[1]}for (int64_t {a} = dpl_a0; {a} < {a_end}; ++{a}) {{")
        self.redirected(body, {id(st): f"dpl_tile{k}[{b} - dpl_b0][{a} - dpl_a0]" for k, st in enumerate(stores)},
                        indent + 2, out)
        out.append(f"{pad[1]}}}")
        out.append(f"{pad[0]}}}")
        out.extend(f"{pad[0]}dpl_transpose16(dpl_tile{k});" for k in sorted(turned))
        out.append(f"{pad[0]}for (int64_t {a} = dpl_a0; {a} < {a_end}; ++{a}) {{")
        out.append(f"{pad[1]}#pragma omp simd")
        out.append(f"{pad[1]}for (int64_t {b} = dpl_b0; {b} < {b_end}; ++{b}) {{")
        for k, st in enumerate(stores):
            target = self.flat(st.buffer, [self.expr(i) for i in st.indices])
            at = f"[{a} - dpl_a0][{b} - dpl_b0]" if k in turned else f"[{b} - dpl_b0][{a} - dpl_a0]"
            out.append(f"{pad[2]}{target} = dpl_tile{k}{at};")
        out.append(f"{pad[1]}}}")
        out.append(f"{pad[0]}}}")

    def parallel_if(self, s: Loop) -> str:
        """The ``if`` clause of the parallel region around the outer loop ``s``: none for a nest
        of at least ``PARALLEL_MIN_WORK`` iterations, `` if(0)`` below, a run-time test where
        an extent is symbolic."""
        try:
            work = self.work([s])
        except _LoopDependent:
            return ""  # an extent that depends on a loop variable: parallel, as it always was
        if isinstance(work, int):
            return "" if work >= PARALLEL_MIN_WORK else " if(0)"
        return f" if(({work}) >= {PARALLEL_MIN_WORK})"

    def work(self, stmts) -> int | str:
        """About how many innermost iterations ``stmts`` run: an int where every extent is known,
        else a C expression (the sum over statements of the product of their loops' extents)."""
        const, terms = 0, []
        for st in stmts:
            if isinstance(st, Loop):
                extents, body = [st.extent], st.body
            elif isinstance(st, Reduce):
                extents, body = [a.extent for a in st.axes], st.body
            else:
                const += 1
                continue
            inner = self.work(body) if body else 1
            factor, names = 1, []
            for e in extents:
                if isinstance(e, Const):
                    factor *= int(e.value)
                elif free_vars(e) - set(self.kernel.dims):
                    raise _LoopDependent
                else:
                    names.append(f"({self.expr(e)})")
            if isinstance(inner, int):
                factor *= max(inner, 1)
            else:
                names.append(f"({inner})")
            if names:
                terms.append(" * ".join([str(factor), *names]))
            else:
                const += factor
        if not terms:
            return const
        return " + ".join([str(const), *terms]) if const else " + ".join(terms)

    def simd_reduction(self, s: Reduce) -> str | None:
        """The OpenMP reduction operator of a reduction whose innermost loop is a SIMD
        reduction: one whose body has no loops (reassociating the sum is the one freedom
        taken; it stays within tolerance)."""
        if any(isinstance(x, (Loop, Reduce)) for x in walk(s.body)):
            return None
        return _SIMD_REDUCTION.get(s.combiner)

    def before_reduce(self, s: Reduce, indent: int, out: list[str]) -> None:
        keep = self.kept.get(id(s))
        if keep is not None:
            out.append(f"{'  ' * indent}{self.ctype(s.value.dtype)} {keep}[{self.expr(s.axes[0].extent)}];")
        if s.combiner in _NAN_FOLD and dtypes.is_float(s.dtype):
            flag = self.nan_flags[id(s)] = self.names.internal("nan")
            out.append(f"{'  ' * indent}int {flag} = 0;")

    def before_axis(self, s: Reduce, k: int, indent: int, out: list[str]) -> None:
        clause = self.simd_reduction(s)
        extent = s.axes[-1].extent
        if s.combiner in _NAN_FOLD and isinstance(extent, Const) and int(extent.value) < SIMD_MIN_TRIPS:
            return  # a pooling window's row: the vector loop with its NaN flag costs more than it gains
        if clause and k == len(s.axes) - 1:
            flag = self.nan_flags.get(id(s))
            also = f" reduction(|:{flag})" if flag else ""
            out.append(f"{'  ' * indent}#pragma omp simd reduction({clause}:{self.names[s.name]}){also}")

    def fold(self, s: Reduce, value: str) -> str:
        flag = self.nan_flags.get(id(s))
        if flag is None:
            return super().fold(s, value)
        acc, t, cmp = self.names[s.name], self.ctype(s.dtype), _NAN_FOLD[s.combiner]
        return (f"{{ const {t} dpl_fold = ({value}); {acc} = dpl_fold {cmp} {acc} ? dpl_fold : {acc}; "
                f"{flag} |= dpl_fold != dpl_fold; }}")

    def after_reduce(self, s: Reduce, indent: int, out: list[str]) -> None:
        flag = self.nan_flags.get(id(s))
        if flag is not None:
            out.append(f"{'  ' * indent}if ({flag}) {self.names[s.name]} = NAN;")

    def folded(self, s: Reduce, indent: int, out: list[str]) -> str:
        value = self.expr(s.value)
        keep = self.kept.get(id(s))
        if keep is None:
            return value
        # computed once, kept for the loop over the row that needs it again
        out.append(f"{'  ' * indent}{keep}[{self.names[s.axes[0].var.name]}] = {value};")
        return f"{keep}[{self.names[s.axes[0].var.name]}]"

    # -- kept rows ------------------------------------------------------------------------

    def keep_rows(self, stmts):
        """``stmts`` with each costly value a row reduction folds, and a later loop over the same
        row computes again (softmax's ``exp(x - max)``), read from a row buffer the reduction
        fills instead. Only whole folded values are kept, and only for small static rows."""
        stmts = list(stmts)
        for k, red in enumerate(stmts):
            if not (isinstance(red, Reduce) and len(red.axes) == 1 and isinstance(red.axes[0].extent, Const)
                    and all(isinstance(x, Let) for x in red.body)):
                continue
            axis = red.axes[0]
            value = _inline_lets(red.value, red.body)
            size = int(axis.extent.value) * np.dtype(dtypes.to_numpy(value.dtype)).itemsize
            if size > KEEP_ROW_BYTES or not any(t in self.expr(value) for t in COSTLY_C) or value.dtype not in SUPPORTED_DTYPES:
                continue
            if free_vars(value) & {x.name for x in red.body}:
                continue  # reads the reduction's own locals: no longer the same value outside it
            buf = self.names.internal("row")
            for j in range(k + 1, len(stmts)):
                loop = stmts[j]
                if not (isinstance(loop, Loop) and loop.extent == axis.extent
                        and not any(isinstance(x, (Loop, Reduce)) for x in loop.body)):
                    continue
                again = _rename(value, axis.var.name, loop.var)
                alias_name = f"{buf}[{loop.var.name}]"
                while alias_name in self.names.of:  # a kernel name, however unlikely, is never read as the alias
                    alias_name += "'"
                alias = Var(alias_name, value.dtype)
                body = tuple(_replace_in(x, again, alias) for x in loop.body)
                if body != loop.body:
                    stmts[j] = Loop(loop.var, loop.extent, body)
                    self.kept[id(red)] = buf
                    self.aliases[alias.name] = f"{buf}[{self.names[loop.var.name]}]"
        return stmts

    # -- streaming stores ------------------------------------------------------------------

    def streamed(self, loop: Loop) -> list[Store]:
        """The stores of an innermost loop that go out with streaming stores: contiguous in the
        loop variable, into a float output of at least ``stream_bytes``. The first one decides
        the alignment peel; the others stream where their blocks happen to be aligned."""
        if self.stream_bytes is None or any(isinstance(x, (Loop, Reduce)) for x in loop.body):
            return []
        var = loop.var.name
        found = []
        for s in loop.body:
            if not isinstance(s, Store) or not s.indices or s.buffer not in self.buffers:
                continue
            buf = self.buffers[s.buffer]
            last = s.indices[-1]
            if (buf.dtype != self.buffers[(found or [s])[0].buffer].dtype or buf.dtype not in STREAM_PUT
                    or buf not in self.kernel.outputs or not (isinstance(last, Var) and last.name == var)
                    or any(var in free_vars(i) for i in s.indices[:-1])):
                continue
            if self.big_enough(buf) is not False:
                found.append(s)
        return found

    def big_enough(self, buf):
        """True / False for a static shape, else the C condition to test at run time."""
        size = np.dtype(dtypes.to_numpy(buf.dtype)).itemsize
        if all(isinstance(d, int) for d in buf.shape):
            return math.prod(buf.shape) * size >= self.stream_bytes
        return " * ".join([*(self.dim(d) for d in buf.shape), str(size)]) + f" >= {self.stream_bytes}LL"

    def stream_loop(self, loop: Loop, indent: int, out: list[str], outer: bool) -> None:
        """An alignment head stored plainly, whole vector blocks computed into register-sized
        buffers and streamed out, then the plain loop for the tail (or for all of it, when a
        run-time size test says the output is small)."""
        pad, inner = "  " * indent, "  " * (indent + 1)
        stores = self.streamed(loop)
        v = self.names[loop.var.name]
        t = self.ctype(self.buffers[stores[0].buffer].dtype)
        lanes = "dpl_lanes"
        conditions = [c for c in (self.big_enough(self.buffers[st.buffer]) for st in stores[:1]) if c is not True]
        at = lambda st, i: self.flat(st.buffer, [*(self.expr(x) for x in st.indices[:-1]), i])  # noqa: E731
        out.append(f"{pad}{{")
        out.append(f"{inner}const int64_t dpl_n = {self.expr(loop.extent)};")
        out.append(f"{inner}int64_t dpl_done = 0;")
        out.append("#ifdef DPL_NT_BYTES")
        out.append(f"{inner}if ({conditions[0]}) {{" if conditions else f"{inner}{{")
        deep = "  " * (indent + 2)
        out.append(f"{deep}enum {{ dpl_lanes = DPL_NT_BYTES / sizeof({t}) }};")
        out.append(f"{deep}const int64_t dpl_head = dpl_nt_head(&{at(stores[0], '0')}, sizeof({t}), dpl_n);")
        out.append(f"{deep}for (int64_t {v} = 0; {v} < dpl_head; ++{v}) {{")
        self.stmts(loop.body, indent + 3, out, False)
        out.append(f"{deep}}}")
        out.append(f"{deep}const int64_t dpl_blocks = (dpl_n - dpl_head) / {lanes};")
        block_indent = indent + 2
        if outer:
            out.append(f"{deep}#pragma omp parallel")
            out.append(f"{deep}{{")
            out.append(f"{deep}#pragma omp for schedule(static)")
        bpad, lpad = "  " * block_indent, "  " * (block_indent + 1)
        out.append(f"{bpad}for (int64_t dpl_b = 0; dpl_b < dpl_blocks; ++dpl_b) {{")
        for k in range(len(stores)):
            out.append(f"{lpad}{t} dpl_buf{k}[dpl_lanes];")
        out.append(f"{lpad}#pragma omp simd")
        out.append(f"{lpad}for (int64_t dpl_l = 0; dpl_l < {lanes}; ++dpl_l) {{")
        out.append(f"{lpad}  const int64_t {v} = dpl_head + dpl_b * {lanes} + dpl_l;")
        self.redirected(loop.body, {id(st): f"dpl_buf{k}[dpl_l]" for k, st in enumerate(stores)}, block_indent + 2, out)
        out.append(f"{lpad}}}")
        for k, st in enumerate(stores):
            out.append(f"{lpad}{STREAM_PUT[self.buffers[st.buffer].dtype]}(&{at(st, f'dpl_head + dpl_b * {lanes}')}, dpl_buf{k});")
        out.append(f"{bpad}}}")
        if outer:
            out.append(f"{deep}dpl_sfence();")
            out.append(f"{deep}}}")
        out.append(f"{deep}dpl_done = dpl_head + dpl_blocks * {lanes};")
        out.append(f"{inner}}}")
        out.append("#endif")
        out.append(f"{inner}#pragma omp {'parallel for schedule(static) if(dpl_n - dpl_done > 4096)' if outer else 'simd'}")
        out.append(f"{inner}for (int64_t {v} = dpl_done; {v} < dpl_n; ++{v}) {{")
        self.stmts(loop.body, indent + 2, out, False)
        out.append(f"{inner}}}")
        out.append(f"{pad}}}")

    def function(self, symbol: str) -> str:
        k = self.kernel
        lines = [f"void {symbol}(void **buffers, const int64_t *dims) {{"]
        for i, d in enumerate(k.dims):
            lines.append(f"  const int64_t {self.names[d]} = dims[{i}];")
        order = self.buffer_order()
        for i, (name, dtype) in enumerate(order):
            const = "const " if i < len(order) - len(k.outputs) else ""
            t = self.buffer_ctype(dtype)  # bfloat16 buffers hold the bits
            lines.append(f"  {const}{t} *restrict {self.names.buffer(name)} = ({const}{t} *)buffers[{i}];")
        self.stmts(k.body, 1, lines, True)
        lines.append("}")
        return "\n".join(lines)


def _inline_lets(e, lets):
    """``e`` with the scalar locals ``lets`` define written out."""
    env = {}
    for let in lets:
        env[let.name] = substitute(let.value, env)
    return substitute(e, env)


def _rename(e, old: str, new: Var):
    return substitute(e, {old: new})


def _replace(e, old, new):
    """``e`` with every occurrence of the subexpression ``old`` replaced by ``new``."""
    if e == old:
        return new
    if isinstance(e, Load):
        return attrs.evolve(e, indices=tuple(_replace(i, old, new) for i in e.indices))
    if isinstance(e, Op):
        return attrs.evolve(e, args=tuple(_replace(a, old, new) for a in e.args))
    if isinstance(e, Bin):
        return attrs.evolve(e, a=_replace(e.a, old, new), b=_replace(e.b, old, new))
    if isinstance(e, Select):
        return attrs.evolve(e, cond=_replace(e.cond, old, new), a=_replace(e.a, old, new), b=_replace(e.b, old, new))
    return e


def _replace_in(stmt, old, new):
    if isinstance(stmt, Let):
        return Let(stmt.name, _replace(stmt.value, old, new))
    if isinstance(stmt, Store):
        return Store(stmt.buffer, stmt.indices, _replace(stmt.value, old, new))
    return stmt


def _dtype_of(value) -> str:
    from dpl import dtypes

    return dtypes.from_numpy(value.dtype)


def emit_kernel(kernel: Kernel, symbol: str = "dpl_kernel", vector_math: bool = False,
                stream_bytes: int | None = STREAM_BYTES) -> str:
    """The C source of a kernel: the prelude and one function named ``symbol``. Outputs of at
    least ``stream_bytes`` are written with streaming stores (``None``: never)."""
    body = CpuEmitter(unroll_short_axes(collapse_transposes(split_index_loops(kernel))), stream_bytes).function(symbol)
    streams = STREAMING if "dpl_sfence();" in body else ""
    turns = TRANSPOSE16 if "dpl_transpose16(" in body else ""
    divides = INT_DIVIDE.format(inline="inline") if re.search(r"\bdpl_(div|mod|floor_mod)_", body) else ""
    rounds = BF16_ROUND if "dpl_bf16_round(" in body else ""
    floors = dimexpr.C_HELPERS if DIM_HELPER_CALL.search(body) else ""
    return PRELUDE + floors + streams + turns + divides + rounds + (VECTOR_MATH if vector_math else "") + "\n" + body + "\n"
