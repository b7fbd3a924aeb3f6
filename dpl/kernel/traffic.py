"""The traffic model: bytes a kernel must move and the arithmetic it does.

A kernel *must* read each buffer it loads once and write each output once; a row kept in cache
while several reductions pass over it is not read again. So a loop nest's reads are the full
size of every distinct buffer it loads, its writes the size of what it stores. (A kernel with
several nests, for outputs whose axes do not fit one nest, reads its inputs once per nest.)
Arithmetic counts one operation per registry op applied to a scalar (a cast counts none) and
one per combine of a reduction, times the iterations of the loops around it; index arithmetic
and selects are addressing, not arithmetic.

Functions and modules add their kernels up. :func:`unfused_traffic` prices a function as if
every op were its own kernel (each intermediate written and read back), and
:func:`minimum_traffic` as if the whole function were one kernel, so a report can show bytes
before fusion, after it, and the floor.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from dpl import dtypes
from dpl.errors import DplError
from dpl.ir.expr import Binding, Call, Function, GlobalVar, Module, Tuple, Var
from dpl.ir.types import TensorType
from dpl.kernel import ir
from dpl.kernel.ir import Kernel, Load, Loop, Op, Reduce, Store
from dpl.kernel.lower import LoweringError, is_kernel_function, lower_function


@attrs.frozen
class Traffic:
    read: int = 0  # bytes
    written: int = 0  # bytes
    flops: int = 0

    @property
    def bytes(self) -> int:
        return self.read + self.written

    @property
    def intensity(self) -> float:
        """Operations per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.read + other.read, self.written + other.written, self.flops + other.flops)

    def __str__(self) -> str:
        return f"read {self.read} B, write {self.written} B, {self.flops} ops"


def _size(shape, dtype: str, dims: Mapping[str, int], what: str) -> int:
    n = 1
    for d in shape:
        if not isinstance(d, int):
            missing = sorted(set(ir.dim_symbols(d)) - dims.keys())
            if missing:
                raise DplError(f"traffic of {what} needs a value for the symbolic dimension '{missing[0]}'")
            d = ir.dim_value(d, dims)
        n *= d
    return n * dtypes.to_numpy(dtype).itemsize


def _extent(e: ir.Expr, dims: Mapping[str, int], kernel: str) -> int:
    if isinstance(e, ir.Const):
        return int(e.value)
    if isinstance(e, ir.Var):
        if e.name not in dims:
            raise DplError(f"traffic of kernel '{kernel}' needs a value for the symbolic dimension '{e.name}'")
        return dims[e.name]
    missing = sorted(ir.free_vars(e) - dims.keys())
    if missing:
        raise DplError(f"traffic of kernel '{kernel}' needs a value for the symbolic dimension '{missing[0]}'")
    try:  # a dimension expression (n * 2, (n + 1) // 2)
        return ir.index_value(e, dims)
    except ValueError:
        raise DplError(f"kernel '{kernel}' has a loop extent that is not a dimension: {ir.to_c(e)}") from None


def _ops(e: ir.Expr) -> int:
    return sum(1 for x in ir.walk_exprs(e) if isinstance(x, Op) and x.op != "astype")


def _loads(e: ir.Expr) -> set[str]:
    return {x.buffer for x in ir.walk_exprs(e) if isinstance(x, Load)}


def kernel_traffic(k: Kernel, dims: Mapping[str, int] | None = None) -> Traffic:
    """Bytes read and written and operations of one kernel (symbolic dims bound by ``dims``)."""
    dims = dict(dims or {})
    total = Traffic()
    for nest in k.body:
        loads: set[str] = set()
        stores: set[str] = set()
        flops = 0
        todo = [(nest, 1)]
        while todo:
            s, trips = todo.pop()
            if isinstance(s, Loop):
                inner = trips * _extent(s.extent, dims, k.name)
                todo.extend((t, inner) for t in s.body)
                loads |= _loads(s.extent)
                continue
            if isinstance(s, Reduce):
                inner = trips
                for a in s.axes:
                    inner *= _extent(a.extent, dims, k.name)
                todo.extend((t, inner) for t in s.body)
                flops += inner * (1 + _ops(s.value))
                loads |= _loads(s.value)
                continue
            exprs = (s.value,) if isinstance(s, ir.Let) else (s.value, *s.indices)
            flops += trips * sum(_ops(e) for e in exprs)
            loads |= set().union(*(_loads(e) for e in exprs))
            if isinstance(s, Store):
                stores.add(s.buffer)
        read = 0
        for name in sorted(loads):
            if name in k.constants:
                c = k.constants[name]
                read += c.size * c.dtype.itemsize
            else:
                b = k.buffer(name)
                read += _size(b.shape, b.dtype, dims, f"kernel '{k.name}'")
        written = sum(_size(k.buffer(n).shape, k.buffer(n).dtype, dims, f"kernel '{k.name}'") for n in sorted(stores))
        total = total + Traffic(read, written, flops)
    return total


def function_traffic(fn: Function, dims: Mapping[str, int] | None = None) -> Traffic:
    """``fn`` as one kernel."""
    return kernel_traffic(lower_function(fn), dims)


def _single_op_function(b: Binding) -> Function | None:
    """A function computing only binding ``b``, its operands as parameters (None if ``b``
    moves no data: tuples and tuple items are free)."""
    c = b.value
    if not isinstance(c, Call):
        return None
    params: list[Var] = []
    env: dict[int, Var] = {}

    def param(v):
        if isinstance(v, Var):
            if id(v) not in env:
                env[id(v)] = Var(v.name, v.ty)
                params.append(env[id(v)])
            return env[id(v)]
        if isinstance(v, Tuple):
            return Tuple(tuple(param(f) for f in v.fields))
        return v

    call = attrs.evolve(c, args=tuple(param(a) for a in c.args))
    out = Var(b.var.name, b.var.ty)
    return Function(f"op_{b.var.name}", params, [Binding(out, call)], out, {"Primitive": True})


def _io(fn: Function, dims) -> Traffic:
    read = sum(_size(p.ty.shape, p.ty.dtype, dims, f"'{fn.name}'") for p in fn.params if isinstance(p.ty, TensorType))
    rets = fn.ret.fields if isinstance(fn.ret, Tuple) else (fn.ret,)
    written = sum(_size(r.ty.shape, r.ty.dtype, dims, f"'{fn.name}'") for r in rets if isinstance(r.ty, TensorType))
    return Traffic(read, written, 0)


def _binding_traffic(b: Binding, mod: Module | None, dims, cache: dict) -> Traffic:
    c = b.value
    if isinstance(c, Call) and isinstance(c.op, GlobalVar):
        if mod is None or c.op.name not in mod.functions:
            raise DplError(f"traffic: call of unknown function '{c.op.name}'")
        callee = mod[c.op.name]
        if c.op.name not in cache:
            try:
                cache[c.op.name] = lower_function(callee)
            except LoweringError:
                cache[c.op.name] = None  # an external kernel (another backend): priced by its I/O
        kernel = cache[c.op.name]
        return kernel_traffic(kernel, dims) if kernel is not None else _io(callee, dims)
    single = _single_op_function(b)
    if single is None:
        return Traffic()
    try:
        return function_traffic(single, dims)
    except LoweringError:
        return _io(single, dims)


def unfused_traffic(fn: Function, dims: Mapping[str, int] | None = None, mod: Module | None = None) -> Traffic:
    """``fn`` with every binding its own kernel (calls of module functions priced as their kernel)."""
    dims, cache = dict(dims or {}), {}
    total = Traffic()
    for b in fn.bindings:
        total = total + _binding_traffic(b, mod, dims, cache)
    return total


def minimum_traffic(fn: Function, dims: Mapping[str, int] | None = None) -> Traffic:
    """The floor: read every parameter once, write every result once (operations not counted)."""
    return _io(fn, dict(dims or {}))


def module_traffic(mod: Module, dims: Mapping[str, int] | None = None, entry: str = "main") -> Traffic:
    """The entry function as it will run: each call of a fused function is its kernel, each op
    left in the entry function its own kernel."""
    if entry not in mod.functions:
        raise DplError(f"module has no function '{entry}'")
    return unfused_traffic(mod[entry], dims, mod)


def kernel_table(mod: Module, dims: Mapping[str, int] | None = None) -> dict[str, Traffic]:
    """Traffic of every kernel function of the module, by name."""
    return {name: function_traffic(fn, dims) for name, fn in mod.functions.items() if is_kernel_function(fn)}

