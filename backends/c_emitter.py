"""Kernel IR -> C. One scalar-expression emitter (``dpl.kernel.to_c``, with loads flattened
here) and a CPU loop wrapper: OpenMP over the outermost loop of each nest, ``omp simd`` on
innermost loops that carry no reduction. A CUDA wrapper would reuse :func:`emit_stmts` with
the outer loop variables taken from the thread index instead.

The generated function is ``void <name>(void **buffers, const int64_t *dims)``: buffers are
the kernel's parameters, then its constants, then its outputs, all C-contiguous; ``dims`` are
the symbolic dimensions in ``Kernel.dims`` order.
"""

from __future__ import annotations

import re

from dpl.errors import DplError
from dpl.kernel.ir import C_TYPES, Const, Kernel, Let, Load, Loop, Reduce, Store, to_c, walk
from dpl.ops.registry import get_op

PRELUDE = """\
#include <stdint.h>
#include <stdbool.h>
#include <tgmath.h>
typedef _Float16 half;
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

SUPPORTED_DTYPES = frozenset({"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"})


# OpenMP reduction operators for the registry combiners
_SIMD_REDUCTION = {"add": "+", "multiply": "*", "maximum": "max", "minimum": "min"}


class EmitError(DplError):
    """A kernel the C emitter cannot express (e.g. bfloat16)."""


def c_name(name: str) -> str:
    """A C identifier for a buffer, local or dimension name (dpl names may hold dots)."""
    return "v_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


class _Emitter:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.buffers = {}
        for b in (*kernel.params, *kernel.outputs):
            self.buffers[b.name] = b
        self.const_buffers = {}
        for name, value in kernel.constants.items():
            self.const_buffers[name] = value
        for b in self.buffers.values():
            if b.dtype not in SUPPORTED_DTYPES:
                raise EmitError(f"kernel '{kernel.name}': dtype {b.dtype} of buffer {b.name} has no C type here")

    def dim(self, d) -> str:
        return c_name(d) if isinstance(d, str) else f"{int(d)}LL"

    def flat(self, buffer: str, index: list[str]) -> str:
        if buffer in self.buffers:
            shape = self.buffers[buffer].shape
        else:
            shape = self.const_buffers[buffer].shape
        if not index:
            return f"{c_name(buffer)}[0]"
        offset = index[0]
        for d, i in zip(shape[1:], index[1:]):
            offset = f"({offset}) * {self.dim(d)} + {i}"
        return f"{c_name(buffer)}[{offset}]"

    def expr(self, e) -> str:
        return to_c(e, load=lambda load, index: self.flat(load.buffer, index), var=c_name)

    def ctype(self, dtype: str) -> str:
        if dtype not in SUPPORTED_DTYPES:
            raise EmitError(f"kernel '{self.kernel.name}': dtype {dtype} has no C type here")
        return C_TYPES[dtype]

    def stmts(self, stmts, indent: int, out: list[str], outer: bool) -> None:
        pad = "  " * indent
        for s in stmts:
            if isinstance(s, Loop):
                v = c_name(s.var.name)
                innermost = not any(isinstance(x, (Loop, Reduce)) for x in walk(s.body))
                if outer:
                    out.append(f"{pad}#pragma omp parallel for schedule(static)")
                elif innermost:
                    out.append(f"{pad}#pragma omp simd")
                out.append(f"{pad}for (int64_t {v} = 0; {v} < {self.expr(s.extent)}; ++{v}) {{")
                self.stmts(s.body, indent + 1, out, False)
                out.append(f"{pad}}}")
            elif isinstance(s, Let):
                out.append(f"{pad}const {self.ctype(s.value.dtype)} {c_name(s.name)} = {self.expr(s.value)};")
            elif isinstance(s, Reduce):
                acc = c_name(s.name)
                t = self.ctype(s.dtype)
                out.append(f"{pad}{t} {acc} = ({t}){self.expr(s.init)};")
                depth = indent
                # the innermost reduction loop is a SIMD reduction when the body has no loops
                # (reassociating the sum is the one freedom taken; it stays within tolerance)
                simple = not any(isinstance(x, (Loop, Reduce)) for x in walk(s.body))
                clause = _SIMD_REDUCTION.get(s.combiner)
                for k, a in enumerate(s.axes):
                    v = c_name(a.var.name)
                    if simple and clause and k == len(s.axes) - 1:
                        out.append(f"{'  ' * depth}#pragma omp simd reduction({clause}:{acc})")
                    out.append(f"{'  ' * depth}for (int64_t {v} = 0; {v} < {self.expr(a.extent)}; ++{v}) {{")
                    depth += 1
                self.stmts(s.body, depth, out, False)
                combine = get_op(s.combiner).c_expr.format(acc, f"({self.expr(s.value)})")
                out.append(f"{'  ' * depth}{acc} = ({t})({combine});")
                for _ in s.axes:
                    depth -= 1
                    out.append(f"{'  ' * depth}}}")
            elif isinstance(s, Store):
                t = self.ctype(self.buffers[s.buffer].dtype)
                index = [self.expr(i) for i in s.indices]
                out.append(f"{pad}{self.flat(s.buffer, index)} = ({t})({self.expr(s.value)});")
            else:
                raise EmitError(f"cannot emit {type(s).__name__}")

    def function(self, symbol: str) -> str:
        k = self.kernel
        lines = [f"void {symbol}(void **buffers, const int64_t *dims) {{"]
        for i, d in enumerate(k.dims):
            lines.append(f"  const int64_t {c_name(d)} = dims[{i}];")
        order = [(b.name, b.dtype) for b in k.params]
        order += [(name, _dtype_of(value)) for name, value in k.constants.items()]
        order += [(b.name, b.dtype) for b in k.outputs]
        for i, (name, dtype) in enumerate(order):
            const = "const " if i < len(order) - len(k.outputs) else ""
            lines.append(f"  {const}{self.ctype(dtype)} *restrict {c_name(name)} = ({const}{self.ctype(dtype)} *)buffers[{i}];")
        self.stmts(k.body, 1, lines, True)
        lines.append("}")
        return "\n".join(lines)


def _dtype_of(value) -> str:
    from dpl import dtypes

    return dtypes.from_numpy(value.dtype)


def emit_kernel(kernel: Kernel, symbol: str = "dpl_kernel", vector_math: bool = False) -> str:
    """The C source of a kernel: the prelude and one function named ``symbol``."""
    return PRELUDE + (VECTOR_MATH if vector_math else "") + "\n" + _Emitter(kernel).function(symbol) + "\n"
