"""Run a kernel on NumPy arrays by interpreting its IR directly.

Every loop becomes an axis of an index grid: a statement at loop depth ``d`` is evaluated once
for all ``d`` enclosing iterations at the same time, with NumPy broadcasting. That is exact,
not an approximation, because kernel statements read only parameters and locals and write only
outputs (no loop-carried dependences). Reductions evaluate their value over the grid extended
by their own axes and fold those axes with the combiner.

Scalar ops run through the registry's NumPy references, the very functions ``dpl.interpret``
uses, so a mismatch points at the lowering and not at arithmetic. The evaluator is strict:
an out-of-bounds load (outside a guarded branch), a load of an output or an output element
left unwritten is an error.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.kernel.ir import Bin, Const, Kernel, Let, Load, Loop, Op, Reduce, Select, Store, Var, dim_value
from dpl.ops.registry import get_op


class KernelEvalError(DplError):
    """A kernel misbehaved when run, or was given inputs that do not fit its parameters."""


_REDUCERS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}
_BIN = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.floor_divide, "%": np.mod,
    "floordiv": np.floor_divide, "floormod": np.mod,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
    "&&": np.logical_and,
}


def evaluate(kernel: Kernel, *arrays: Any, dims: dict[str, int] | None = None) -> Any:
    """The kernel's outputs for these inputs: one array, or a tuple for several outputs.
    ``dims`` gives symbolic dims that only the outputs carry (``arange(end=n)``)."""
    outs = _Run(kernel, arrays, dims or {}).outputs()
    return outs[0] if len(outs) == 1 else tuple(outs)


def _lift(a: np.ndarray, ndim: int) -> np.ndarray:
    """Give an array computed at an outer loop depth the axes of the deeper ones."""
    if a.ndim == 0 or a.ndim == ndim:
        return a
    return a.reshape(a.shape + (1,) * (ndim - a.ndim))


class _Run:
    def __init__(self, kernel: Kernel, arrays, given_dims: dict[str, int]):
        self.k = kernel
        if len(arrays) != len(kernel.params):
            raise KernelEvalError(f"kernel '{kernel.name}' takes {len(kernel.params)} inputs, got {len(arrays)}")
        self.dims: dict[str, int] = {}
        self.buffers: dict[str, np.ndarray] = {}
        for buf, a in zip(kernel.params, arrays):
            a = np.asarray(a)
            if a.dtype != dtypes.to_numpy(buf.dtype) or a.ndim != len(buf.shape):
                raise KernelEvalError(f"kernel '{kernel.name}': input '{buf.name}' expects {buf}, got {a.dtype}{list(a.shape)}")
            self.buffers[buf.name] = a
        for d, n in given_dims.items():
            self.dims[d] = n
        try:  # lone symbols, then dims linear in one unknown (n * 2), then every dim checked
            kernel.bind_dims([self.buffers[b.name].shape for b in kernel.params], self.dims)
        except DplError as err:
            raise KernelEvalError(err.message) from None
        unbound = [d for d in kernel.dims if d not in self.dims]
        if unbound:
            raise KernelEvalError(f"kernel '{kernel.name}': no input binds dimension '{unbound[0]}'; pass it in dims=")
        try:
            kernel.check_requires(self.dims)
        except DplError as err:
            raise KernelEvalError(err.message) from None
        self.buffers.update(kernel.constants)
        self.out: dict[str, np.ndarray] = {}
        self.written: dict[str, np.ndarray] = {}
        for buf in kernel.outputs:
            shape = tuple(dim_value(d, self.dims) for d in buf.shape)
            self.out[buf.name] = np.zeros(shape, dtypes.to_numpy(buf.dtype))
            self.written[buf.name] = np.zeros(shape, bool)

    def outputs(self) -> list[np.ndarray]:
        env = {d: np.asarray(n, np.int64) for d, n in self.dims.items()}
        with np.errstate(all="ignore"):
            self.block(self.k.body, env, [])
        for buf in self.k.outputs:
            if not self.written[buf.name].all():
                raise KernelEvalError(f"kernel '{self.k.name}' leaves part of output '{buf.name}' unwritten")
        return [self.out[b.name] for b in self.k.outputs]

    # -- statements

    def block(self, stmts, env: dict, shape: list[int]) -> dict:
        env = dict(env)
        depth = len(shape)
        for s in stmts:
            if isinstance(s, Loop):
                n = int(self.expr(s.extent, env, 0))
                var = np.arange(n, dtype=np.int64).reshape((1,) * depth + (n,))
                self.block(s.body, {**env, s.var.name: var}, shape + [n])
            elif isinstance(s, Let):
                env[s.name] = self.expr(s.value, env, depth)
            elif isinstance(s, Reduce):
                env[s.name] = self.reduce(s, env, shape)
            elif isinstance(s, Store):
                self.store(s, env, shape)
            else:
                raise KernelEvalError(f"unknown statement {s!r}")
        return env

    def reduce(self, s: Reduce, env: dict, shape: list[int]) -> np.ndarray:
        inner, grid = dict(env), list(shape)
        for ax in s.axes:
            n = int(self.expr(ax.extent, env, 0))
            inner[ax.var.name] = np.arange(n, dtype=np.int64).reshape((1,) * len(grid) + (n,))
            grid.append(n)
        inner = self.block(s.body, inner, grid)
        value = _lift(self.expr(s.value, inner, len(grid)), len(grid))
        value = np.broadcast_to(value, tuple(grid)).astype(dtypes.to_numpy(s.dtype), copy=False)
        ufunc = _REDUCERS[s.combiner]
        axes = tuple(range(len(shape), len(grid)))
        return np.asarray(ufunc.reduce(value, axis=axes, initial=s.init.value), dtypes.to_numpy(s.dtype))

    def store(self, s: Store, env: dict, shape: list[int]) -> None:
        if s.buffer not in self.out:
            raise KernelEvalError(f"kernel '{self.k.name}' stores to '{s.buffer}', which is not an output")
        depth = len(shape)
        grid = tuple(shape)
        idx = [np.broadcast_to(_lift(self.expr(i, env, depth), depth), grid) for i in s.indices]
        value = np.broadcast_to(_lift(self.expr(s.value, env, depth), depth), grid)
        out = self.out[s.buffer]
        self.check_bounds(s.buffer, out.shape, idx)
        out[tuple(idx)] = value
        self.written[s.buffer][tuple(idx)] = True

    def check_bounds(self, name: str, shape, idx) -> None:
        for axis, (i, n) in enumerate(zip(idx, shape)):
            if i.size and (i.min() < 0 or i.max() >= n):
                raise KernelEvalError(
                    f"kernel '{self.k.name}' indexes '{name}' out of bounds in dimension {axis} "
                    f"(index {int(i.min())}..{int(i.max())}, size {n})"
                )

    # -- expressions

    def expr(self, e, env: dict, depth: int, mask: np.ndarray | None = None) -> np.ndarray:
        if isinstance(e, Const):
            return np.asarray(e.value, dtypes.to_numpy(e.dtype))
        if isinstance(e, Var):
            return _lift(env[e.name], depth)
        if isinstance(e, Load):
            return self.load(e, env, depth, mask)
        if isinstance(e, Op):
            args = [self.expr(a, env, depth, mask) for a in e.args]
            result = get_op(e.op).ref(*args, **dict(e.attrs))
            return np.asarray(result).astype(dtypes.to_numpy(e.dtype), copy=False)
        if isinstance(e, Bin):
            return _BIN[e.op](self.expr(e.a, env, depth, mask), self.expr(e.b, env, depth, mask))
        if isinstance(e, Select):
            cond = self.expr(e.cond, env, depth, mask)
            take_a = cond if mask is None else mask & cond
            take_b = ~cond if mask is None else mask & ~cond
            return np.where(cond, self.expr(e.a, env, depth, take_a), self.expr(e.b, env, depth, take_b))
        raise KernelEvalError(f"unknown expression {e!r}")

    def load(self, e: Load, env: dict, depth: int, mask) -> np.ndarray:
        if e.buffer not in self.buffers:
            raise KernelEvalError(f"kernel '{self.k.name}' loads '{e.buffer}', which is not a parameter or constant")
        buf = self.buffers[e.buffer]
        if len(e.indices) != buf.ndim:
            raise KernelEvalError(f"kernel '{self.k.name}' indexes '{e.buffer}' (rank {buf.ndim}) with {len(e.indices)} indices")
        idx = [self.expr(i, env, depth, mask) for i in e.indices]
        if mask is not None:  # lanes that the guarding select discards read element 0
            idx = [np.where(mask, i, 0) for i in idx]
        idx = np.broadcast_arrays(*idx) if idx else []
        self.check_bounds(e.buffer, buf.shape, idx)
        return buf[tuple(idx)] if idx else buf[()]
