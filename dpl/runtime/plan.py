"""The flat plan: kernel calls over numbered buffers, with buffers reused by liveness.

A plan is made for one signature of concrete input shapes. Walking the entry function, every
tensor value becomes a *buffer*: an input, a constant, a temporary or an output; tuples and
tuple items are bookkeeping over buffers and cost nothing. Every kernel call becomes a
:class:`Step` reading and writing buffer numbers.

Memory planning gives each temporary a slot of an arena: a slot is free again after the last
step that reads its value, and a new temporary takes the smallest free slot big enough for it
(else a new slot). Inputs are only read. Outputs never live in the arena: they come from the
plan's :class:`~dpl.runtime.output_pool.OutputPool` (memory already mapped, which no caller
still holds) or are the caller's ``out=``, so what a call returns never aliases a buffer in use.
An output that is an input, a constant or an output already given is copied at the end.

Calls from several threads at once are safe: each call borrows an arena of its own from the
plan's pool (a lock guards only the borrowing), so one thread calling keeps reusing one warm
arena, and N threads calling at once hold N arenas (kept for later calls).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Protocol, Sequence

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.backends.registry import flatten, leaf_types
from dpl.errors import DplError
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.types import TupleType
from dpl.limits import MAX_CALL_DEPTH, LimitError
from dpl.runtime.output_pool import OutputPool
from dpl.runtime.shapes import ShapeError, bind_dims, concrete
from dpl.runtime.threads import budget_threads, one_pool_kernels


@attrs.frozen
class Buffer:
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "const" | "temp" | "output"
    value: Any = None  # the array of a constant

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dt.to_numpy(self.dtype).itemsize


@attrs.frozen
class Step:
    label: str  # what runs: "op nn.relu", "fused fused_silu_mul", "composite cublas.matmul_bias"
    function: str  # the module function the step comes from
    backend: str
    kernel: Callable
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


class Compiler(Protocol):
    """What the planner asks of the executable: (kernel, backend name) for a single op or a
    composite/codegen function, and (ScheduledGroup, backend name) for a Primitive group."""

    def op_kernel(self, fn: Function, shapes, dtypes) -> tuple[Callable, str]: ...

    def function_kernel(self, fn: Function, shapes, dtypes) -> tuple[Callable, str]: ...

    def group(self, fn: Function, shapes, dtypes) -> tuple[Any, str | None]: ...


def single_op_function(call: Call) -> tuple[Function, list[Expr]]:
    """``call`` as a one-binding function; its non-constant operands become parameters."""
    params, operands, args = [], [], []
    for a in call.args:
        if isinstance(a, Constant):
            args.append(a)
            continue
        p = Var(f"p{len(params)}", a.ty)
        params.append(p)
        operands.append(a)
        args.append(p)
    out = Var("out", call.ty)
    body = attrs.evolve(call, args=tuple(args))
    return Function(call.op, params, [Binding(out, body)], out), operands


class Plan:
    """A plan for one input signature. Every call borrows an arena from the plan's pool and gives
    it back after, so calls from several threads at once never share a temporary."""

    def __init__(self, signature, buffers: list[Buffer], steps: list[Step], inputs: list[int], result,
                 output_ids: list[int | None], out_specs: list, copies: list[tuple[int, int]], decisions,
                 threads_note: str | None = None, threads: int | None = None):
        self.signature = signature
        self.buffers = buffers
        self.steps = steps
        self.input_ids = inputs
        self.result = result  # nested tuple of output positions, or one position
        self.output_ids = output_ids  # the buffer each output position is written as, or None: copied
        self.out_specs = out_specs  # (shape, numpy dtype) of each output position
        self.copies = copies  # (output position, buffer read)
        self.decisions = decisions  # (function name, ScheduledGroup)
        self.threads_note = threads_note  # why the plan caps its kernels' threads (dpl.runtime.threads)
        self.threads = threads  # the thread budget of its BLAS calls (None: the BLAS's own setting)
        self.output_pool = OutputPool(out_specs)
        self._plan_memory()

    # -- memory ---------------------------------------------------------------------------------
    def _plan_memory(self) -> None:
        last_use: dict[int, int] = {}
        for i, step in enumerate(self.steps):
            for b in (*step.inputs, *step.outputs):
                last_use[b] = i
        for _, b in self.copies:
            last_use[b] = len(self.steps)
        self.slot_of: dict[int, int] = {}
        self.slot_sizes: list[int] = []
        free: list[int] = []
        for i, step in enumerate(self.steps):
            for b in step.outputs:
                if self.buffers[b].kind != "temp":
                    continue
                need = self.buffers[b].nbytes
                fits = [s for s in free if self.slot_sizes[s] >= need]
                if fits:
                    slot = min(fits, key=lambda s: (self.slot_sizes[s], s))
                    free.remove(slot)
                else:
                    slot = len(self.slot_sizes)
                    self.slot_sizes.append(need)
                self.slot_of[b] = slot
            for b in set(step.inputs) | set(step.outputs):
                if b in self.slot_of and last_use[b] == i:
                    free.append(self.slot_of[b])
        self.peak_bytes = sum(self.slot_sizes)
        self.unplanned_bytes = sum(buf.nbytes for buf in self.buffers if buf.kind == "temp")
        self.output_bytes = sum(self.buffers[b].nbytes for b in self._output_buffers())
        self._pool_lock = threading.Lock()
        self._arenas: list[list[Any]] = [self._new_arena()]  # free arenas, as views by buffer number

    def _new_arena(self) -> list[Any]:
        """The buffers of one call: a view into a fresh arena for every temporary, each constant's
        array, and None for inputs and outputs (the call's own arrays)."""
        arena = [np.empty(n, np.uint8) for n in self.slot_sizes]
        views: list[Any] = [None] * len(self.buffers)
        for b, buf in enumerate(self.buffers):
            if buf.kind == "const":
                views[b] = buf.value
            elif b in self.slot_of:
                raw = arena[self.slot_of[b]][: buf.nbytes]
                views[b] = raw.view(dt.to_numpy(buf.dtype)).reshape(buf.shape)
        return views

    def _borrow(self) -> list[Any]:
        with self._pool_lock:
            if self._arenas:
                return self._arenas.pop()
        return self._new_arena()  # another thread holds every arena: this call gets its own

    def _give_back(self, views: list[Any]) -> None:
        with self._pool_lock:
            self._arenas.append(views)

    def _output_buffers(self) -> list[int]:
        return [b for b, buf in enumerate(self.buffers) if buf.kind == "output"]

    # -- running --------------------------------------------------------------------------------
    def run(self, arrays: Sequence[np.ndarray], out: Sequence[np.ndarray] | None = None, timer=None) -> Any:
        views = self._borrow()
        try:
            if self.threads is None:  # no budget: not even the context manager's microsecond
                return self._run(views, arrays, out, timer)
            with budget_threads(self.threads):
                return self._run(views, arrays, out, timer)
        finally:
            self._give_back(views)

    def _run(self, views: list[Any], arrays, out, timer) -> Any:
        bufs = list(views)
        for b, a in zip(self.input_ids, arrays):
            bufs[b] = a
        outs = list(out) if out is not None else self.output_pool.take()
        for pos, b in enumerate(self.output_ids):
            if b is not None:
                bufs[b] = outs[pos]
        for step in self.steps:
            ins = [bufs[b] for b in step.inputs]
            dst = [bufs[b] for b in step.outputs]
            if timer is None:
                step.kernel(ins, dst)
            else:
                timer(step, lambda: step.kernel(ins, dst))
        for pos, b in self.copies:
            np.copyto(outs[pos], bufs[b])
        return _nest(self.result, outs)


def _nest(shape, outs):
    if isinstance(shape, tuple):
        return tuple(_nest(s, outs) for s in shape)
    return outs[shape]


class Planner:
    """Walks the entry function at concrete input shapes and produces a :class:`Plan`."""

    def __init__(self, module: Module, entry: Function, compiler: Compiler, threads: int | None = None):
        self.module, self.entry, self.compiler = module, entry, compiler
        self.threads = threads  # the thread budget of the plan's kernels (None: each pool's own)
        self.buffers: list[Buffer] = []
        self.steps: list[Step] = []
        self.decisions: list = []
        self._consts: dict[int, int] = {}
        self._depth = 0

    def plan(self, specs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> Plan:
        """Plan for inputs of these (shape, dtype), one per tensor leaf of the parameters."""
        fn = self.entry
        types = [t for p in fn.params for t in leaf_types(p.ty)]
        names = [f"input '{p.name}'" for p in fn.params for _ in leaf_types(p.ty)]
        if len(specs) != len(types):
            raise ShapeError(f"function '{fn.name}' takes {len(types)} input arrays, got {len(specs)}")
        dims = bind_dims(types, [s for s, _ in specs], names)
        for ty, (_, dtype), name in zip(types, specs, names):
            if np.dtype(dtype) != dt.to_numpy(ty.dtype):
                raise ShapeError(f"{name} expects dtype {dt.short(ty.dtype)}, got {np.dtype(dtype)}")
        inputs = [self._new(shape, ty.dtype, "input") for ty, (shape, _) in zip(types, specs)]
        env: dict[int, Any] = {}
        it = iter(inputs)
        for p in fn.params:
            env[id(p)] = _tree(p.ty, it)
        result = self._function_body(fn, env, dims)
        flat = flatten(result)
        copies, output_ids, specs, claimed = [], [], [], set()
        for pos, b in enumerate(flat):
            buf = self.buffers[b]
            specs.append((buf.shape, dt.to_numpy(buf.dtype)))
            if buf.kind == "temp" and b not in claimed:
                claimed.add(b)
                self.buffers[b] = attrs.evolve(buf, kind="output")
                output_ids.append(b)
            else:
                copies.append((pos, b))
                output_ids.append(None)
        signature = tuple((tuple(shape), str(np.dtype(dtype))) for shape, dtype in specs)
        positions = _positions(result, iter(range(len(flat))))
        capped = one_pool_kernels((s.kernel for s in self.steps), self.threads)
        steps = [attrs.evolve(s, kernel=capped.get(id(s.kernel), s.kernel)) for s in self.steps]
        mixed = any(getattr(k, "threads", None) == 1 for k in capped.values()) and self.threads != 1
        note = "OpenMP kernels on one thread: the plan also calls BLAS" if mixed else None
        if self.threads is not None:
            note = f"{note}; " if note else ""
            note += f"thread budget {self.threads}: BLAS, torch and OpenMP kernels on at most {self.threads} thread(s)"
        return Plan(signature, self.buffers, steps, inputs, positions, output_ids, specs, copies, self.decisions, note, self.threads)

    # -- the walk -------------------------------------------------------------------------------
    def _new(self, shape, dtype, kind, value=None) -> int:
        self.buffers.append(Buffer(tuple(int(d) for d in shape), dtype, kind, value))
        return len(self.buffers) - 1

    def _function_body(self, fn: Function, env: dict[int, Any], dims: dict[str, int]):
        for b in fn.bindings:
            env[id(b.var)] = self._eval(b.value, env, dims, fn)
        return self._eval(fn.ret, env, dims, fn)

    def _eval(self, e: Expr, env, dims, fn: Function):
        if isinstance(e, Var):
            return env[id(e)]
        if isinstance(e, Constant):
            if id(e) not in self._consts:
                self._consts[id(e)] = self._new(e.value.shape, e.ty.dtype, "const", e.value)
            return self._consts[id(e)]
        if isinstance(e, Tuple):
            return tuple(self._eval(f, env, dims, fn) for f in e.fields)
        if isinstance(e, TupleGetItem):
            return self._eval(e.tuple_value, env, dims, fn)[e.index]
        if isinstance(e, Call) and isinstance(e.op, GlobalVar):
            return self._call_function(e, env, dims, fn)
        if isinstance(e, Call):
            return self._call_op(e, env, dims, fn)
        raise DplError(f"cannot plan a {type(e).__name__} in function '{fn.name}'")

    def _outputs(self, ty, dims, what) -> tuple[Any, list[int]]:
        made = []

        def alloc(t):
            if isinstance(t, TupleType):
                return tuple(alloc(f) for f in t.fields)
            made.append(self._new(t.shape, t.dtype, "temp"))
            return made[-1]

        return alloc(concrete(ty, dims, what)), made

    def _shapes(self, ids: list[int]):
        return [self.buffers[b].shape for b in ids], [self.buffers[b].dtype for b in ids]

    def _call_op(self, call: Call, env, dims, fn: Function):
        single, operands = single_op_function(call)
        ins = [b for a in operands for b in flatten(self._eval(a, env, dims, fn))]
        tree, outs = self._outputs(call.ty, dims, f"op {call.op} in '{fn.name}'")
        kernel, backend = self.compiler.op_kernel(single, *self._shapes(ins))
        self.steps.append(Step(f"op {call.op}", fn.name, backend, kernel, tuple(ins), tuple(outs)))
        return tree

    def _call_function(self, call: Call, env, dims, fn: Function):
        name = call.op.name
        if name not in self.module.functions:
            raise DplError(f"function '{fn.name}' calls unknown function '{name}'")
        callee = self.module[name]
        args = [self._eval(a, env, dims, fn) for a in call.args]
        ins = [b for a in args for b in flatten(a)]
        shapes, dtypes = self._shapes(ins)
        types = [t for p in callee.params for t in leaf_types(p.ty)]
        names = [f"parameter '{p.name}' of '{name}'" for p in callee.params for _ in leaf_types(p.ty)]
        callee_dims = bind_dims(types, shapes, names)
        for d, n in dims.items():  # a dim no parameter binds (arange(end=seq) in a group) is the caller's
            callee_dims.setdefault(d, n)
        if callee.attrs.get("Primitive") and "Composite" not in callee.attrs:
            group, backend = self.compiler.group(callee, shapes, dtypes)
            self.decisions.append((name, shapes, group))
            if not group.fused:
                return self._inline(callee, args, callee_dims)
            tree, outs = self._outputs(callee.ret.ty, callee_dims, f"function '{name}'")
            self.steps.append(Step(f"fused {name}", name, backend, group.kernel, tuple(ins), tuple(outs)))
            return tree
        if not callee.attrs:  # a plain subroutine: its calls join the plan
            return self._inline(callee, args, callee_dims)
        kernel, backend = self.compiler.function_kernel(callee, shapes, dtypes)
        tree, outs = self._outputs(callee.ret.ty, callee_dims, f"function '{name}'")
        kind = "codegen" if "Codegen" in callee.attrs else "composite" if "Composite" in callee.attrs else "function"
        label = callee.attrs.get("Codegen") or callee.attrs.get("Composite") or name
        self.steps.append(Step(f"{kind} {label}", name, backend, kernel, tuple(ins), tuple(outs)))
        return tree

    def _inline(self, callee: Function, args, dims):
        if self._depth > MAX_CALL_DEPTH:
            raise LimitError(f"calls nest deeper than MAX_CALL_DEPTH = {MAX_CALL_DEPTH} levels at '{callee.name}' (recursion?)")
        self._depth += 1
        try:
            env = {id(p): a for p, a in zip(callee.params, args)}
            return self._function_body(callee, env, dims)
        finally:
            self._depth -= 1


def _tree(ty, it):
    if isinstance(ty, TupleType):
        return tuple(_tree(t, it) for t in ty.fields)
    return next(it)


def _positions(result, counter):
    if isinstance(result, tuple):
        return tuple(_positions(r, counter) for r in result)
    return next(counter)
