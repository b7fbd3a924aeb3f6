"""C for one mylib composite: an optional matrix product, then an elementwise epilogue.

The composite's bindings are walked in order. A leading ``matmul(x, w)`` with a 2-D ``w``
becomes a row-at-a-time product into a local accumulator; every later binding is one C
expression per element of the ``[rows, M]`` result. Operands of the epilogue are the result's
own shape, a row vector ``[M]`` (a bias) or a scalar. Anything else is a :class:`CompileError`,
and dpl runs the composite on the next backend of the target instead.

The generated function has the signature every kernel of dpl's C toolchain has:
``void dpl_kernel(void **buffers, const int64_t *dims)``: the buffers are the composite's
parameters, then its constants, then its output; ``dims[0]`` is the number of rows, read off
the output at each call, so one compiled library serves every value of a symbolic dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpl.backends import CompileError
from dpl.ir.expr import Call, Constant, Var

UNARY = {
    "nn.relu": "fmaxf({0}, 0.0f)",
    "tanh": "tanhf({0})",
    "sigmoid": "(1.0f / (1.0f + expf(-{0})))",
    "exp": "expf({0})",
    "negative": "(-{0})",
}
BINARY = {"add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "({0} / {1})"}


@dataclass
class Emitted:
    """The C source, the constants to pass after the parameters, and the row length ``M``."""

    source: str
    constants: list[np.ndarray] = field(default_factory=list)
    row: int = 0


def emit(function) -> Emitted:
    """C for ``function`` (a composite), or CompileError saying what it cannot hold."""
    out_ty = function.ret.ty
    if not hasattr(out_ty, "shape") or not out_ty.shape:
        raise CompileError(f"mylib: '{function.name}' must return one tensor of rank >= 1")
    if not isinstance(out_ty.shape[-1], int):
        raise CompileError(f"mylib: the last dim of '{function.name}' must be static, got '{out_ty.shape[-1]}'")
    m = out_ty.shape[-1]
    names: dict[int, str] = {}  # id(IR value) -> its C name
    decls: list[str] = []
    constants: list[np.ndarray] = []
    for i, p in enumerate(function.params):
        _check_dtype(p.ty, p.name)
        names[id(p)] = f"p{i}"
        decls.append(f"  const float *restrict p{i} = (const float *)buffers[{i}];")

    def buffer(e) -> str:
        """The C name of a parameter or a constant (a constant becomes one more buffer)."""
        if isinstance(e, Constant) and id(e) not in names:
            _check_dtype(e.ty, "a constant")
            k = len(function.params) + len(constants)
            constants.append(np.ascontiguousarray(e.value, dtype=np.float32))
            names[id(e)] = f"c{len(constants) - 1}"
            decls.append(f"  const float *restrict {names[id(e)]} = (const float *)buffers[{k}];")
        if id(e) not in names:
            raise CompileError(f"mylib: '{function.name}' uses a value it cannot hold ({type(e).__name__})")
        return names[id(e)]

    def operand(e) -> str:
        """The C expression of ``e`` at element (r, j)."""
        if isinstance(e, Var) and any(e is b.var for b in function.bindings):
            return names[id(e)]  # an earlier binding: a local of the element loop
        name = buffer(e)
        shape = tuple(e.ty.shape)
        if shape == tuple(out_ty.shape):
            return f"{name}[r * {m} + j]"
        if shape == (m,):
            return f"{name}[j]"
        if shape in ((), (1,)):
            return f"{name}[0]"
        raise CompileError(f"mylib: operand of shape {list(shape)} does not broadcast as a row or a scalar over {list(out_ty.shape)}")

    bindings = list(function.bindings)
    product = ""
    if bindings and _is_product(bindings[0].value):
        x, w = bindings[0].value.args
        product = _product(function, x, w, out_ty.shape, buffer)
        names[id(bindings[0].var)] = "acc[j]"
        bindings = bindings[1:]
    body = []
    for n, b in enumerate(bindings):
        v = b.value
        if not isinstance(v, Call) or not isinstance(v.op, str):
            raise CompileError(f"mylib: '{function.name}' binds something other than an op call")
        _check_dtype(b.var.ty, b.var.name)
        args = [operand(a) for a in v.args]
        if v.op in UNARY and len(args) == 1:
            expr = UNARY[v.op].format(*args)
        elif v.op in BINARY and len(args) == 2:
            expr = BINARY[v.op].format(*args)
        else:
            raise CompileError(f"mylib: no C for op '{v.op}' in '{function.name}'")
        if v.attrs:
            raise CompileError(f"mylib: op '{v.op}' with attributes is not supported")
        names[id(b.var)] = f"v{n}"
        body.append(f"      const float v{n} = {expr};")
    result = operand(function.ret) if function.bindings else None
    if result is None:
        raise CompileError(f"mylib: '{function.name}' computes nothing")
    n_in = len(function.params) + len(constants)
    lines = [
        "#include <math.h>",
        "#include <stdint.h>",
        "",
        "void dpl_kernel(void **buffers, const int64_t *dims) {",
        "  const int64_t rows = dims[0];",
        *decls,
        f"  float *restrict out = (float *)buffers[{n_in}];",
        "  for (int64_t r = 0; r < rows; ++r) {",
        product,
        f"    for (int64_t j = 0; j < {m}; ++j) {{",
        *body,
        f"      out[r * {m} + j] = {result};",
        "    }",
        "  }",
        "}",
        "",
    ]
    return Emitted("\n".join(line for line in lines if line), constants, m)


def _is_product(v) -> bool:
    return isinstance(v, Call) and v.op == "matmul"


def _product(function, x, w, out_shape, buffer) -> str:
    """A row of ``x @ w`` into ``acc``: ``x`` is [..., K] (its leading dims are the rows), ``w`` [K, M]."""
    m = out_shape[-1]
    if len(w.ty.shape) != 2 or any(not isinstance(d, int) for d in w.ty.shape) or w.ty.shape[1] != m:
        raise CompileError(f"mylib: the product in '{function.name}' needs a static 2-D right operand [K, {m}]")
    k = w.ty.shape[0]
    if tuple(x.ty.shape) != (*out_shape[:-1], k):
        raise CompileError(f"mylib: the product in '{function.name}' needs a left operand of shape {[*out_shape[:-1], k]}")
    if any(x is b.var or w is b.var for b in function.bindings):
        raise CompileError(f"mylib: the product in '{function.name}' must read parameters or constants")
    xs, ws = buffer(x), buffer(w)
    return "\n".join([
        f"    float acc[{m}];",
        f"    for (int64_t j = 0; j < {m}; ++j) acc[j] = 0.0f;",
        f"    for (int64_t k = 0; k < {k}; ++k) {{",
        f"      const float a = {xs}[r * {k} + k];",
        f"      for (int64_t j = 0; j < {m}; ++j) acc[j] += a * {ws}[k * {m} + j];",
        "    }",
    ])


def _check_dtype(ty, what):
    if getattr(ty, "dtype", None) != "float32":
        raise CompileError(f"mylib: {what} is not float32 ({ty})")
