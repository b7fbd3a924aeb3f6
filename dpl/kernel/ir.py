"""The kernel IR: one fused group as one loop nest over scalar expressions.

A :class:`Kernel` reads its parameter buffers and writes its output buffers; nothing else
survives between its statements except scalar locals. Its body is a few statements:

- :class:`Loop` ``for var in [0, extent): body`` over the output space;
- :class:`Let` a scalar local (a register);
- :class:`Reduce` a scalar local folded over reduction loops with a registry combiner
  (``add``, ``maximum``, ...) from an initial value; its ``body`` holds the locals that
  depend on the reduction variables (the prologue), its ``value`` is what is folded;
- :class:`Store` ``buffer[indices] = value``.

Scalar expressions are C-shaped: :class:`Const`, :class:`Var` (loop index, symbolic dim or
local), :class:`Load`, :class:`Op` (a registry op, emitted through its ``c_expr`` template and
evaluated through its NumPy reference), :class:`Bin` (integer index arithmetic and logic with
C operators) and :class:`Select`. :func:`to_c` prints an expression as C, which is also how
kernels print.

Every statement of a kernel reads only parameters and writes only outputs, so the loops
carry no dependences and a kernel can be run vectorised (see :mod:`dpl.kernel.evaluate`).
Nodes are frozen and compare structurally, so lowering can memoise on them.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping, Union

import attrs
import numpy as np

from dpl import dtypes
from dpl.ir import dims as dimexpr
from dpl.ir.types import Dim
from dpl.ops.registry import get_op

INDEX = "int64"  # the dtype of loop variables, dims and index arithmetic

# -- scalar expressions ------------------------------------------------------------------------


@attrs.frozen
class Const:
    value: Any  # a Python int, float or bool
    dtype: str


@attrs.frozen
class Var:
    """A loop variable, a symbolic dimension or a scalar local."""

    name: str
    dtype: str = INDEX


@attrs.frozen
class Load:
    buffer: str
    indices: tuple["Expr", ...] = attrs.field(converter=tuple)
    dtype: str = "float32"


@attrs.frozen
class Op:
    """A registry op on scalars; ``attrs`` is a tuple of (key, value) pairs, all of the op's."""

    op: str
    args: tuple["Expr", ...] = attrs.field(converter=tuple)
    attrs: tuple[tuple[str, Any], ...] = ()
    dtype: str = "float32"


BIN_OPS = ("+", "-", "*", "/", "%", "floordiv", "floormod", "<", "<=", ">", ">=", "==", "&&")
# floor division and modulo for operands of any sign (a dimension expression's intermediates,
# ``(n - 3) // 2`` at n = 0), printed as calls of the dims.C_HELPERS; ``/`` and ``%`` are C's
FLOOR_OPS = {"floordiv": "dpl_floordiv", "floormod": "dpl_mod"}
INDEX_OPS = ("+", "-", "*", "/", "%", "floordiv", "floormod")


@attrs.frozen
class Bin:
    """Index arithmetic and logic: C operators on int64 or bool. ``/`` and ``%`` are C's, on
    non-negative operands only (where they floor); ``floordiv`` and ``floormod`` floor for any
    sign (Python's ``//`` and ``%``)."""

    op: str
    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> str:
        return INDEX if self.op in INDEX_OPS else "bool"


@attrs.frozen
class Select:
    """``cond ? a : b``; only the chosen side is evaluated (so it may guard a load)."""

    cond: "Expr"
    a: "Expr"
    b: "Expr"

    @property
    def dtype(self) -> str:
        return self.a.dtype


Expr = Union[Const, Var, Load, Op, Bin, Select]

# -- statements --------------------------------------------------------------------------------


@attrs.frozen
class Let:
    name: str
    value: Expr


@attrs.frozen
class Axis:
    var: Var
    extent: Expr


@attrs.frozen
class Reduce:
    name: str
    dtype: str
    combiner: str  # a registry binary op: add, multiply, maximum, minimum
    init: Const
    axes: tuple[Axis, ...] = attrs.field(converter=tuple)
    body: tuple["Stmt", ...] = attrs.field(converter=tuple)
    value: Expr = None


@attrs.frozen
class Store:
    buffer: str
    indices: tuple[Expr, ...] = attrs.field(converter=tuple)
    value: Expr = None


@attrs.frozen
class Loop:
    var: Var
    extent: Expr
    body: tuple["Stmt", ...] = attrs.field(converter=tuple)


Stmt = Union[Let, Reduce, Store, Loop]

# -- kernels -----------------------------------------------------------------------------------


@attrs.frozen
class Buffer:
    name: str
    shape: tuple[Dim, ...] = attrs.field(converter=tuple)
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.name}: {dtypes.short(self.dtype)}[{', '.join(map(str, self.shape))}]"


KINDS = ("elementwise", "reduce", "row", "matmul", "conv2d", "pool")


def _frozen(value) -> Mapping[str, np.ndarray]:
    return MappingProxyType({k: np.asarray(v) for k, v in dict(value or {}).items()})


@attrs.frozen(eq=False)
class Kernel:
    """One fused group. ``body`` is a tuple of independent loop nests (usually one).

    ``kind`` says what shape of kernel this is, for code generators that specialise:
    ``elementwise`` (injective too), ``reduce``, ``row`` (reductions over a row whose results
    are used across the same row), ``matmul`` / ``conv2d`` / ``pool`` (an anchor with its
    epilogue). ``constants`` holds the data of non-scalar constants, read like parameters.
    """

    name: str
    params: tuple[Buffer, ...] = attrs.field(converter=tuple)
    outputs: tuple[Buffer, ...] = attrs.field(converter=tuple)
    body: tuple[Stmt, ...] = attrs.field(converter=tuple)
    kind: str = "elementwise"
    constants: Mapping[str, np.ndarray] = attrs.field(converter=_frozen, factory=dict)
    # (small, large) pairs of dims the sizes must satisfy, small <= large: what a slice to a
    # symbolic end assumes (``[0:T]`` of 128 rows reads in bounds only for T <= 128). Backends
    # check them before running the kernel, so a violation is an error and never a stray read
    requires: tuple[tuple[Dim, Dim], ...] = attrs.field(converter=tuple, default=())

    def check_requires(self, dims: Mapping[str, int]) -> None:
        """A DplError naming the first requirement the bound ``dims`` break."""
        from dpl.errors import DplError

        for small, large in self.requires:
            a, b = (dim_value(d, dims) for d in (small, large))
            if a > b:
                got = ", ".join(f"{dimexpr.text(d)}={v}" for d, v in ((small, a), (large, b)) if not isinstance(d, int))
                raise DplError(f"kernel '{self.name}' needs {small} <= {large} (a slice must lie within its "
                               f"dimension), got {got}")

    @property
    def dims(self) -> tuple[str, ...]:
        """The symbols of the parameters' and outputs' dims, in order of first appearance (the
        symbols of one expression dim by name): a symbol that appears only inside an expression
        (``n * 2``) is a dim of the kernel too."""
        seen: dict[str, None] = {}
        for b in self.params + self.outputs:
            for d in b.shape:
                for s in dim_symbols(d):
                    seen.setdefault(s)
        return tuple(seen)

    def bind_dims(self, shapes, dims: dict[str, int] | None = None) -> dict[str, int]:
        """The value of every symbol in :attr:`dims` from the concrete ``shapes`` of the
        parameters, then of the outputs where given (lone symbols, then dims linear in one
        unknown, then every dim checked: :func:`dpl.ir.dim_binding.bind_shapes`). A DplError
        names the buffer, the dim and the bindings that disagree."""
        from dpl.errors import DplError
        from dpl.ir.dim_binding import bind_shapes

        entries = []
        for k, (buf, shape) in enumerate(zip(self.params + self.outputs, shapes)):
            what = f"kernel '{self.name}': {'input' if k < len(self.params) else 'output'} '{buf.name}'"
            if len(shape) != len(buf.shape):
                raise DplError(f"{what} expects {buf}, got shape {tuple(shape)}")
            entries.append((buf.shape, tuple(shape), what))
        return bind_shapes(entries, dims)

    def buffer(self, name: str) -> Buffer:
        for b in self.params + self.outputs:
            if b.name == name:
                return b
        raise KeyError(name)

    def __str__(self) -> str:
        return print_kernel(self)


def dim_symbols(d: Dim) -> tuple[str, ...]:
    """The symbols of a dim, sorted: a lone symbol is itself whatever its spelling (a model's
    ``a.b`` is a dim; only expressions require identifiers)."""
    if isinstance(d, str):
        return (d,)
    return () if isinstance(d, int) else tuple(sorted(dimexpr.free_symbols(d)))


def dim_value(d: Dim, dims: Mapping[str, int]) -> int:
    """The value of a dim at bound symbols (a KeyError names a lone symbol ``dims`` lacks)."""
    if isinstance(d, int):
        return d
    if isinstance(d, str):
        return int(dims[d])
    return dimexpr.evaluate(d, dict(dims))


def dim_expr(d: Dim) -> "Expr":
    """A dimension as index arithmetic: symbols are variables (the kernel's dims), ``//`` and
    ``%`` floor (``floordiv`` / ``floormod``, or C's ``/`` and ``%`` where the dividend is
    provably >= 0 and the divisor a positive constant), min and max selects."""
    if isinstance(d, int):
        return Const(int(d), INDEX)
    if isinstance(d, str):
        return Var(d, INDEX)
    if isinstance(d, dimexpr.Poly):
        out = None
        for mono, coef in sorted(d.terms, key=lambda t: t[1] < 0):  # stable: the sums first
            term = None
            for atom in mono:
                term = dim_expr(atom) if term is None else Bin("*", term, dim_expr(atom))
            if term is None:
                term = Const(abs(coef), INDEX)
            elif abs(coef) != 1:
                term = Bin("*", term, Const(abs(coef), INDEX))
            if out is None:
                out = term if coef > 0 else Bin("-", Const(0, INDEX), term)
            else:
                out = Bin("+" if coef > 0 else "-", out, term)
        return out
    if isinstance(d, dimexpr.MinMax):
        pick = "<" if isinstance(d, dimexpr.Min) else ">"
        out = dim_expr(d.args[-1])
        for a in reversed(d.args[:-1]):
            x = dim_expr(a)
            out = Select(Bin(pick, x, out), x, out)
        return out
    a, b = dim_expr(d.a), dim_expr(d.b)
    plain = isinstance(d.b, int) and d.b > 0 and dimexpr.provably_nonnegative(d.a)
    if isinstance(d, dimexpr.FloorDiv):
        return Bin("/" if plain else "floordiv", a, b)
    return Bin("%" if plain else "floormod", a, b)


_INDEX_VALUE = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a // b, "%": lambda a, b: a % b, "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "&&": lambda a, b: bool(a and b),
}


def index_value(e: "Expr", dims: Mapping[str, int]) -> int:
    """The value of index arithmetic (constants, the variables in ``dims``, :class:`Bin` and
    :class:`Select`: a loop extent) as a Python int; a KeyError names a variable ``dims`` lacks,
    a ValueError an expression that is not index arithmetic."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return int(dims[e.name])
    if isinstance(e, Bin):
        a, b = index_value(e.a, dims), index_value(e.b, dims)
        if e.op in ("/", "%", "floordiv", "floormod") and b == 0:
            raise ValueError(f"division by zero in {to_c(e)}")
        return _INDEX_VALUE[e.op](a, b)
    if isinstance(e, Select):
        return index_value(e.a if index_value(e.cond, dims) else e.b, dims)
    raise ValueError(f"{to_c(e)} is not index arithmetic")


# -- printing (as C) ---------------------------------------------------------------------------

C_TYPES = {
    "float64": "double", "float32": "float", "float16": "half", "bfloat16": "bfloat16",
    "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
    "bool": "bool",
}


def _c_const(c: Const) -> str:
    """A C literal of the constant's value. NaN and the infinities are the macros ``NAN`` and
    ``INFINITY`` (of ``<math.h>``, and of the CUDA prelude), which have no literal of their own."""
    v = c.value
    if isinstance(v, bool) or c.dtype == "bool":
        return "1" if v else "0"
    if dtypes.is_float(c.dtype):
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = repr(float(v))
        return text + "f" if c.dtype == "float32" else text
    return str(int(v))


SINGLE_PRECISION = ("float32", "float16", "bfloat16")  # computed in float, never promoted to double
_DOUBLE_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])")


@lru_cache(maxsize=None)
def _float_literals(template: str) -> str:
    """A ``c_expr`` template with its decimal literals as float literals (``0.5`` -> ``0.5f``):
    in C a double literal promotes the whole expression to double, and a double ``tanh`` does
    not vectorise (nn.gelu_tanh at 128x3072: 6.3 ms in double, see bench/bench_models.py)."""
    return _DOUBLE_LITERAL.sub(r"\1f", template)


def _c_attr(value, dtype: str):
    """An attribute as its template needs it: a float as a C literal, in single precision
    beside single-precision operands (as NumPy casts a Python float to the array's dtype)."""
    if isinstance(value, float):
        return _c_const(Const(value, dtype if dtype in SINGLE_PRECISION or dtype == "float64" else "float64"))
    return value


def op_c(e: Op, args: list[str]) -> str:
    """An op's registry ``c_expr`` template over the C of its operands, attributes filled in."""
    template = get_op(e.op).c_expr
    if e.dtype in SINGLE_PRECISION:
        template = _float_literals(template)
    named = {k: C_TYPES[v] if k == "dtype" else _c_attr(v, e.dtype) for k, v in e.attrs}
    return template.format(*args, **named)


def to_c(e: Expr, load=None, var=None, op=None) -> str:
    """The expression as C: registry ops through their ``c_expr`` templates. A code generator
    passes ``load(e, index)`` to print a :class:`Load` (flattening its indices) and ``var(name)``
    to spell variables; by default both print as the kernel IR names them. ``op(e, args)`` may
    spell an :class:`Op` its own way for a target (returning None keeps the template)."""
    if isinstance(e, Const):
        return _c_const(e)
    if isinstance(e, Var):
        return var(e.name) if var is not None else e.name
    if isinstance(e, Load):
        index = [to_c(i, load, var, op) for i in e.indices]
        return load(e, index) if load is not None else f"{e.buffer}[{', '.join(index)}]"
    if isinstance(e, Op):
        args = [to_c(a, load, var, op) for a in e.args]
        spelled = op(e, args) if op is not None else None
        return spelled if spelled is not None else op_c(e, args)
    if isinstance(e, Bin) and e.op in FLOOR_OPS:
        return f"{FLOOR_OPS[e.op]}({to_c(e.a, load, var, op)}, {to_c(e.b, load, var, op)})"
    if isinstance(e, Bin):
        return f"({to_c(e.a, load, var, op)} {e.op} {to_c(e.b, load, var, op)})"
    if isinstance(e, Select):
        return f"({to_c(e.cond, load, var, op)} ? {to_c(e.a, load, var, op)} : {to_c(e.b, load, var, op)})"
    raise TypeError(f"not a kernel expression: {e!r}")


def _print_stmts(stmts, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for s in stmts:
        if isinstance(s, Loop):
            out.append(f"{pad}for {s.var.name} in [0, {to_c(s.extent)}):")
            _print_stmts(s.body, indent + 1, out)
        elif isinstance(s, Let):
            out.append(f"{pad}{dtypes.short(s.value.dtype)} {s.name} = {to_c(s.value)}")
        elif isinstance(s, Reduce):
            over = ", ".join(f"{a.var.name} in [0, {to_c(a.extent)})" for a in s.axes)
            out.append(f"{pad}{dtypes.short(s.dtype)} {s.name} = {s.combiner}-reduce from {_c_const(s.init)} over {over}:")
            _print_stmts(s.body, indent + 1, out)
            out.append(f"{pad}  {to_c(s.value)}")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buffer}[{', '.join(to_c(i) for i in s.indices)}] = {to_c(s.value)}")
        else:
            raise TypeError(f"not a kernel statement: {s!r}")


def print_kernel(k: Kernel) -> str:
    params = ", ".join(map(str, k.params))
    outputs = ", ".join(map(str, k.outputs))
    lines = [f"kernel {k.name} [{k.kind}] ({params}) -> ({outputs}):"]
    for name, value in k.constants.items():
        lines.append(f"  const {name}: {dtypes.short(dtypes.from_numpy(value.dtype))}{list(value.shape)}")
    for small, large in k.requires:
        lines.append(f"  requires {small} <= {large}")
    _print_stmts(k.body, 1, lines)
    return "\n".join(lines)


# -- traversal ---------------------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Bin):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def free_vars(node) -> frozenset[str]:
    """Names a statement or expression reads and does not define itself."""
    if isinstance(node, Var):
        return frozenset((node.name,))
    if isinstance(node, (Const, Load, Op, Bin, Select)):
        return frozenset().union(*(free_vars(c) for c in children(node)))
    if isinstance(node, Let):
        return free_vars(node.value)
    if isinstance(node, Store):
        return frozenset().union(free_vars(node.value), *(free_vars(i) for i in node.indices))
    if isinstance(node, Reduce):
        inner = _block_free(node.body, free_vars(node.value))
        bound = {a.var.name for a in node.axes}
        return frozenset().union(inner - bound, *(free_vars(a.extent) for a in node.axes))
    if isinstance(node, Loop):
        return (_block_free(node.body, frozenset()) - {node.var.name}) | free_vars(node.extent)
    raise TypeError(f"not a kernel node: {node!r}")


def block_free_vars(stmts) -> frozenset[str]:
    """Names a statement sequence reads and does not define: a kernel body's symbolic dims."""
    return _block_free(stmts, frozenset())


def _block_free(stmts, tail: frozenset[str]) -> frozenset[str]:
    """Free names of a statement sequence followed by an expression with free names ``tail``."""
    free = set(tail)
    for s in reversed(stmts):
        if isinstance(s, (Let, Reduce)):
            free.discard(s.name)
        free |= free_vars(s)
    return frozenset(free)


def walk(stmts):
    """Every statement, depth first, with the loops and reductions enclosing it."""
    for s in stmts:
        yield s
        if isinstance(s, (Loop, Reduce)):
            yield from walk(s.body)


def walk_exprs(e: Expr):
    yield e
    for c in children(e):
        yield from walk_exprs(c)


def substitute(e: Expr, env: Mapping[str, Expr]) -> Expr:
    """``e`` with each variable named in ``env`` replaced by its expression."""
    if isinstance(e, Var):
        return env.get(e.name, e)
    if isinstance(e, Load):
        return attrs.evolve(e, indices=tuple(substitute(i, env) for i in e.indices))
    if isinstance(e, Op):
        return attrs.evolve(e, args=tuple(substitute(a, env) for a in e.args))
    if isinstance(e, Bin):
        return attrs.evolve(e, a=substitute(e.a, env), b=substitute(e.b, env))
    if isinstance(e, Select):
        return attrs.evolve(e, cond=substitute(e.cond, env), a=substitute(e.a, env), b=substitute(e.b, env))
    return e
