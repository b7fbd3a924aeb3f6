"""C for one mylib composite: an optional matrix product, then an elementwise epilogue.

The composite is read through dpl's public API (``dpl.backends.read_composite``): its
parameters, its bindings in order and its constants, as plain Python values. A leading
``matmul(x, w)`` with a 2-D ``w`` becomes a row-at-a-time product into a local accumulator;
every later binding is one C expression per element of the ``[rows, M]`` result. Operands of
the epilogue are the result's own shape, a row vector ``[M]`` (a bias) or a scalar. Anything
else is a :class:`CompileError`, and dpl runs the composite on the next backend of the target
instead.

The generated function has the signature every kernel of dpl's C toolchain has:
``void dpl_kernel(void **buffers, const int64_t *dims)``: the buffers are the composite's
parameters, then its constants, then its output; ``dims[0]`` is the number of rows, read off
the output at each call, so one compiled library serves every value of a symbolic dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpl.backends import CompileError

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


def emit(composite) -> Emitted:
    """C for ``composite`` (a ``dpl.backends.Composite``), or CompileError saying what it cannot hold."""
    where = f"'{composite.function}' ({composite.name})"
    if len(composite.outputs) != 1 or not composite.bindings:
        raise CompileError(f"mylib: {where} must compute one tensor")
    shapes = {p.name: p.shape for p in composite.params}
    shapes.update({name: value.shape for name, value in composite.constants.items()})
    shapes.update({b.name: b.shape for b in composite.bindings})
    out_shape = shapes[composite.outputs[0]]
    if not out_shape:
        raise CompileError(f"mylib: {where} must return one tensor of rank >= 1")
    if not isinstance(out_shape[-1], int):
        raise CompileError(f"mylib: the last dim of {where} must be static, got '{out_shape[-1]}'")
    m = out_shape[-1]
    names: dict[str, str] = {}  # dpl's name of a value -> its C name
    decls: list[str] = []
    constants: list[np.ndarray] = []
    for i, p in enumerate(composite.params):
        _check_dtype(p.dtype, p.name)
        names[p.name] = f"p{i}"
        decls.append(f"  const float *restrict p{i} = (const float *)buffers[{i}];")

    def buffer(name) -> str:
        """The C name of a parameter or a constant (a constant becomes one more buffer)."""
        if name in composite.constants and name not in names:
            value = composite.constants[name]
            _check_dtype(str(value.dtype), f"constant {name}")
            k = len(composite.params) + len(constants)
            constants.append(np.ascontiguousarray(value))
            names[name] = f"c{len(constants) - 1}"
            decls.append(f"  const float *restrict {names[name]} = (const float *)buffers[{k}];")
        return names[name]

    def operand(name) -> str:
        """The C expression of value ``name`` at element (r, j)."""
        if not isinstance(name, str):  # a tuple literal or an item of a tuple (dpl.backends.Item)
            raise CompileError(f"mylib: {where} reads a tuple value")
        if composite.kind(name) == "binding":
            return names[name]  # an earlier binding: a local of the element loop
        c, shape = buffer(name), tuple(shapes[name])
        if shape == tuple(out_shape):
            return f"{c}[r * {m} + j]"
        if shape == (m,):
            return f"{c}[j]"
        if shape in ((), (1,)):
            return f"{c}[0]"
        raise CompileError(f"mylib: operand of shape {list(shape)} does not broadcast as a row or a scalar over {list(out_shape)}")

    bindings = list(composite.bindings)
    product = ""
    if bindings[0].op == "matmul":
        x, w = bindings[0].args
        product = _product(composite, where, shapes, x, w, out_shape, buffer)
        names[bindings[0].name] = "acc[j]"
        bindings = bindings[1:]
    body = []
    for n, b in enumerate(bindings):
        _check_dtype(b.dtype, b.name)
        args = [operand(a) for a in b.args]
        if b.op in UNARY and len(args) == 1:
            expr = UNARY[b.op].format(*args)
        elif b.op in BINARY and len(args) == 2:
            expr = BINARY[b.op].format(*args)
        else:
            raise CompileError(f"mylib: no C for op '{b.op}' in '{composite.function}'")
        if b.attrs:
            raise CompileError(f"mylib: op '{b.op}' with attributes is not supported")
        names[b.name] = f"v{n}"
        body.append(f"      const float v{n} = {expr};")
    result = operand(composite.outputs[0])
    n_in = len(composite.params) + len(constants)
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


def _product(composite, where, shapes, x, w, out_shape, buffer) -> str:
    """A row of ``x @ w`` into ``acc``: ``x`` is [..., K] (its leading dims are the rows), ``w`` [K, M]."""
    m = out_shape[-1]
    if composite.kind(x) == "binding" or composite.kind(w) == "binding":
        raise CompileError(f"mylib: the product in {where} must read parameters or constants")
    w_shape = shapes[w]
    if len(w_shape) != 2 or any(not isinstance(d, int) for d in w_shape) or w_shape[1] != m:
        raise CompileError(f"mylib: the product in {where} needs a static 2-D right operand [K, {m}]")
    k = w_shape[0]
    if tuple(shapes[x]) != (*out_shape[:-1], k):
        raise CompileError(f"mylib: the product in {where} needs a left operand of shape {[*out_shape[:-1], k]}")
    xs, ws = buffer(x), buffer(w)
    return "\n".join([
        f"    float acc[{m}];",
        f"    for (int64_t j = 0; j < {m}; ++j) acc[j] = 0.0f;",
        f"    for (int64_t k = 0; k < {k}; ++k) {{",
        f"      const float a = {xs}[r * {k} + k];",
        f"      for (int64_t j = 0; j < {m}; ++j) acc[j] += a * {ws}[k * {m} + j];",
        "    }",
    ])


def _check_dtype(dtype, what):
    if dtype != "float32":
        raise CompileError(f"mylib: {what} is not float32 ({dtype})")
