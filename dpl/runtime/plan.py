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

Views cost nothing: a reshape, squeeze or expand_dims (:data:`~dpl.transform.graph.VIEW_OPS`)
of one tensor, alone or as a Primitive group of nothing but views, becomes a *view buffer*: no
step, no memory of its own, the array of its *base* (the buffer it views, itself never a view:
a chain of views views the first one's base) with its own shape, ``ndarray.reshape`` of a
C-contiguous array, so no copy. Shapes are concrete in a plan, so symbolic shapes are resolved
before any call. Views of temporaries and constants are made once per arena; views of inputs
and outputs once per call (:meth:`Plan.bind`). A base lives as long as any view of it is read
(liveness is counted on bases), and no step ever writes a view, an input or a constant. A view
that is returned makes its base the output when the base is a temporary not returned already
(the kernel writing it writes the caller's array, reshaped); a view of an input, a constant or
of a value already returned is copied at the end like the values themselves: what a call
returns never shares memory with its inputs, the module's constants or its other results
(unlike NumPy's ``reshape``; a caller writing a result never changes a weight).

Calls from several threads at once are safe: each call borrows an arena of its own from the
plan's pool (a lock guards only the borrowing), so one thread calling keeps reusing one warm
arena, and N threads calling at once hold N arenas (kept for later calls).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Protocol, Sequence

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.backends.registry import flatten, leaf_types
from dpl.errors import DplError, count
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ir.extent_symbols import with_caller_dims
from dpl.ir.types import TupleType
from dpl.limits import MAX_CALL_DEPTH, LimitError
from dpl.runtime.output_pool import OutputPool
from dpl.runtime.prepared import MixedCall, PreparedCall, prepare
from dpl.runtime.rebinding import Lifter, Rebinding
from dpl.runtime.shapes import ShapeError, bind_dims, concrete
from dpl.runtime.timed_choice import thread_choice
from dpl.runtime.threads import available_cores, budget_binds, budget_threads, one_pool_kernels
from dpl.transform.graph import is_view, is_view_group


@attrs.frozen
class Buffer:
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input" | "const" | "temp" | "output" | "view"
    value: Any = None  # the array of a constant
    base: int | None = None  # what a view views: a buffer that is not a view

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


class _Arena:
    """One call's memory: a raw array per slot of a memory plan, and the prepared runs of steps
    made on it, which every plan using it shares (see :meth:`Plan.for_bucket`)."""

    __slots__ = ("slots", "runs")

    def __init__(self, sizes: Sequence[int]):
        self.slots = [_aligned(n) for n in sizes]
        self.runs: dict = {}  # (list of steps, the run's steps and shapes) -> PreparedCall


ALIGN = 64  # bytes: a cache line, and an AVX-512 vector (the flash kernel copied k and v it found 16 bytes past one)


def _aligned(n: int) -> np.ndarray:
    """``n`` bytes starting on an ``ALIGN``-byte boundary."""
    raw = np.empty(n + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip:skip + n]


class Plan:
    """A plan for one input signature. Every call borrows an arena from the plan's pool and gives
    it back after, so calls from several threads at once never share a temporary."""

    def __init__(self, signature, buffers: list[Buffer], steps: list[Step], inputs: list[int], result,
                 output_ids: list[int | None], out_specs: list, copies: list[tuple[int, int]], decisions,
                 threads_note: str | None = None, threads: int | None = None, view_groups: Sequence[str] = (),
                 single_steps: list[Step] | None = None, *, rebinding: Rebinding | None = None, shared_choice=None,
                 home: "Plan | None" = None):
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
        # the same steps on one thread, and which of the two a call takes (dpl.runtime.timed_choice)
        self.single_steps = single_steps
        self.thread_choice = shared_choice or (thread_choice(threads) if single_steps is not None else None)
        self.rebinding = rebinding  # how to make this plan at another binding of its symbols, or None
        self.origin: Plan | None = None  # the plan this one was rebound from
        self.unbound_why: str | None = None  # why a plan of symbolic inputs cannot be rebound
        # the pools a call's budget must cap: every step declares its own (threads.pools_of), or
        # None, when one does not, and every pool is capped (a NumPy reference may use the BLAS)
        declared = [getattr(s.kernel, "thread_pools", None) for s in steps]
        self.pools = None if any(d is None for d in declared) else frozenset().union(*declared)
        # outputs: a pool of the plan's own, or its home's (sized for the bucket's largest binding)
        self.output_pool = home.output_pool if home is not None else OutputPool(out_specs)
        self._out_specs = None if home is None else out_specs  # the shapes this plan takes from a shared pool
        self.view_groups = tuple(view_groups)  # Primitive groups of views only, run as views
        # the plan whose memory plan and arenas this one uses: itself, or the plan of its bucket
        # that it was rebound from (sized for the bucket's largest binding, :meth:`for_bucket`)
        self._home = home or self
        self._in_place: dict[tuple, tuple] = {}  # pairs asked for -> those this plan can write in place (in_place)
        self._plan_views()
        self._plan_memory()

    def rebound(self, dims: dict[str, int]) -> "Plan | None":
        """This plan at another binding ``dims`` of the entry's symbols: the same steps and
        kernels, the buffers' shapes evaluated at ``dims`` and memory planned for them; None
        where it cannot be rebound or ``dims`` breaks a constraint (then a planner's walk says
        why). See :mod:`dpl.runtime.rebinding`; the caller decides which kernels may be shared."""
        r = self.rebinding
        shapes = None if r is None else r.shapes_at(dims, [b.shape for b in self.buffers])
        if shapes is None:
            return None
        buffers = [b if b.shape == shape else attrs.evolve(b, shape=shape) for b, shape in zip(self.buffers, shapes)]
        specs = [(buffers[b].shape, dt.to_numpy(buffers[b].dtype)) for b in r.outputs]
        signature = tuple((tuple(shape), str(np.dtype(dtype))) for shape, dtype in specs)
        sizes = self.slot_sizes
        fits = self.sized_for_bucket and all(buffers[b].nbytes <= sizes[slot] for b, slot in self.slot_of.items())
        plan = Plan(signature, buffers, self.steps, self.input_ids, self.result, self.output_ids, specs, self.copies, self.decisions,
                    self.threads_note, self.threads, self.view_groups, self.single_steps, rebinding=r, shared_choice=self.thread_choice,
                    home=self if fits else None)
        plan.origin = self
        return plan

    def for_bucket(self, dims: dict[str, int]) -> None:
        """Size this plan's arenas for binding ``dims`` (its bucket's largest), so that the plans
        rebound from it borrow them: same addresses at every size, so the prepared runs of steps
        whose shapes do not change are shared (:func:`dpl.runtime.prepared.prepare`). Made before
        the plan's first call; a binding whose buffers do not fit gets arenas of its own."""
        shapes = None if self.rebinding is None else self.rebinding.shapes_at(dims, [b.shape for b in self.buffers])
        if shapes is None or self._prepared:
            return
        largest = [math.prod(shape) * dt.to_numpy(buf.dtype).itemsize for buf, shape in zip(self.buffers, shapes)]
        self._plan_memory(largest)
        self.output_pool = OutputPool([(shapes[b], dt.to_numpy(self.buffers[b].dtype)) for b in self.rebinding.outputs])
        self._out_specs = self.out_specs  # its own shapes, from a pool sized for the largest
        self.sized_for_bucket = True

    # -- views ----------------------------------------------------------------------------------
    def _plan_views(self) -> None:
        """Which views are made with each arena (of temporaries and constants) and which with
        each call (of inputs and outputs); no step may write a view, an input or a constant."""
        views = [(b, buf.base) for b, buf in enumerate(self.buffers) if buf.kind == "view"]
        self.view_count = len(views)  # bindings that run as views: no kernel, no copy
        self.arena_views = [(b, base) for b, base in views if self.buffers[base].kind in ("temp", "const")]
        self.call_views = [(b, base) for b, base in views if self.buffers[base].kind in ("input", "output")]
        self._viewed = {base for _, base in self.call_views}
        for step in self.steps:
            for b in step.outputs:
                if self.buffers[b].kind not in ("temp", "output"):
                    raise DplError(f"internal: step {step.label} in '{step.function}' writes a {self.buffers[b].kind} buffer")

    def base_of(self, b: int) -> int:
        """The buffer whose memory ``b`` is: its base for a view, else itself."""
        base = self.buffers[b].base
        return b if base is None else base

    def fill_views(self, views: list) -> list:
        """Fill ``views`` (an arena's arrays by buffer number, NumPy or CuPy) with the views of
        its temporaries and constants."""
        for b, base in self.arena_views:
            views[b] = views[base].reshape(self.buffers[b].shape)
        return views

    def in_place(self, pairs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
        """Those of ``pairs`` (output position, input position) whose output a call may write in
        its input's memory: the output's buffer written by one step, whose kernel lets its first
        output be its first input (``kernel.in_place``, a lone index_put), that input the plan's
        input itself, which no other step of either list of steps reads, no view shows and no
        output returns (views of the output are fine: they see it updated). A static cache updated so is written once, not copied whole and then
        copied back (issue 31)."""
        key = tuple(pairs)
        found = self._in_place.get(key)
        if found is None:
            found = self._in_place[key] = tuple(p for p in key if self._writes_in_place(*p))
        return found

    def _writes_in_place(self, k: int, j: int) -> bool:
        if not (0 <= k < len(self.output_ids) and 0 <= j < len(self.input_ids)):
            return False
        out, given = self.output_ids[k], self.input_ids[j]
        # views of the output see it updated, as they would see a fresh output; a view of the
        # input would be a reader of its old values
        views = {b for b, _ in self.call_views}
        if (out is None or out in views or given in views or given in self._viewed or self.output_ids.count(out) != 1 or given in self.output_ids
                or any(b in (out, given) for _, b in self.copies) or self.input_ids.count(given) != 1):
            return False
        for steps in (self.steps, self.single_steps or ()):
            readers = [s for s in steps if given in s.inputs]
            if len(readers) != 1:
                return False
            (step,) = readers
            if (not getattr(step.kernel, "in_place", False) or step.inputs[0] != given or step.inputs.count(given) != 1
                    or not step.outputs or step.outputs[0] != out):
                return False
        return True

    def bind(self, bufs: list, inputs: Sequence, outs: Sequence) -> list[tuple[int, int]]:
        """Put one call's ``inputs`` and ``outs`` (NumPy or CuPy arrays) into ``bufs``, an
        arena's arrays, then the views of them. Returns the (output position, buffer) copies
        to make after the steps besides :attr:`copies`: an ``out=`` array that is not
        C-contiguous (no reshape of it is a view) whose base has another shape or views read by
        later steps is computed aside and copied."""
        for b, a in zip(self.input_ids, inputs):
            bufs[b] = a
        late = []
        for pos, b in enumerate(self.output_ids):
            if b is None:
                continue
            o, shape = outs[pos], self.buffers[b].shape
            if tuple(o.shape) == shape and (b not in self._viewed or o.flags.c_contiguous):
                bufs[b] = o
            elif o.flags.c_contiguous:
                bufs[b] = o.reshape(shape)  # a view: the kernel writes the caller's array
            else:  # no view of it would see what the kernel writes
                bufs[b] = np.empty_like(o, order="C").reshape(shape)
                late.append((pos, b))
        for b, base in self.call_views:
            bufs[b] = bufs[base].reshape(self.buffers[b].shape)
        return late

    # -- memory ---------------------------------------------------------------------------------
    def _plan_memory(self, sizes: list[int] | None = None) -> None:
        """Slots of the arena by liveness, each temporary's of ``sizes[b]`` bytes (default: its
        own); a plan with another home uses its home's slots and arenas."""
        self.sized_for_bucket = False
        self.unplanned_bytes = sum(buf.nbytes for buf in self.buffers if buf.kind == "temp")
        self.output_bytes = sum(self.buffers[b].nbytes for b in self._output_buffers())
        self._pool_lock = threading.Lock()
        self._views: dict[int, list[Any]] = {}  # views by arena: this plan's buffers on each arena it met
        self._arena_of: dict[int, _Arena] = {}  # id of a views list -> its arena
        self._prepared: dict[tuple[int, int], Any] = {}  # by (arena, list of steps): see _prepared_call
        self._unprepared: set[int] = set()  # lists of steps that cannot be prepared
        self._called_once: set[tuple[int, int]] = set()  # (arena, list of steps) a rebound plan ran once
        if self._home is not self:
            home = self._home
            self.slot_of, self.slot_sizes, self.peak_bytes = home.slot_of, home.slot_sizes, 0  # no arena of its own
            return
        nbytes = sizes or [buf.nbytes for buf in self.buffers]
        last_use: dict[int, int] = {}  # by base: a buffer lives while any view of it is read
        for i, step in enumerate(self.steps):
            for b in (*step.inputs, *step.outputs):
                last_use[self.base_of(b)] = i
        for _, b in self.copies:
            last_use[self.base_of(b)] = len(self.steps)
        self.slot_of: dict[int, int] = {}
        self.slot_sizes: list[int] = []
        free: list[int] = []
        for i, step in enumerate(self.steps):
            for b in step.outputs:
                if self.buffers[b].kind != "temp":
                    continue
                need = nbytes[b]
                fits = [s for s in free if self.slot_sizes[s] >= need]
                if fits:
                    slot = min(fits, key=lambda s: (self.slot_sizes[s], s))
                    free.remove(slot)
                else:
                    slot = len(self.slot_sizes)
                    self.slot_sizes.append(need)
                self.slot_of[b] = slot
            for b in {self.base_of(b) for b in step.inputs} | set(step.outputs):
                if b in self.slot_of and last_use[b] == i:
                    free.append(self.slot_of[b])
        self.peak_bytes = sum(self.slot_sizes)
        self._arenas: list[_Arena] = [_Arena(self.slot_sizes)]  # free arenas

    def _views_on(self, arena: "_Arena") -> list[Any]:
        """This plan's buffers on ``arena``: a view into its slot for every temporary, each
        constant's array, the views of those, and None for inputs, outputs and their views (the
        call's own arrays, bound by :meth:`bind`). Made once per arena."""
        views = self._views.get(id(arena))
        if views is not None:
            return views
        views = [None] * len(self.buffers)
        for b, buf in enumerate(self.buffers):
            if buf.kind == "const":
                views[b] = buf.value
            elif b in self.slot_of:
                raw = arena.slots[self.slot_of[b]][: buf.nbytes]
                views[b] = raw.view(dt.to_numpy(buf.dtype)).reshape(buf.shape)
        views = self.fill_views(views)
        self._views[id(arena)], self._arena_of[id(views)] = views, arena
        return views

    def _borrow(self) -> list[Any]:
        home = self._home
        with home._pool_lock:
            arena = home._arenas.pop() if home._arenas else None
        return self._views_on(arena or _Arena(home.slot_sizes))  # none free: another thread holds each; a new one

    def _give_back(self, views: list[Any]) -> None:
        home = self._home
        with home._pool_lock:
            home._arenas.append(self._arena_of[id(views)])

    def _prepared_call(self, views: list[Any], steps: list[Step]) -> PreparedCall | None:
        """The prepared call of ``steps`` on arena ``views``, made at its first call; but a
        rebound plan with arenas of its own runs its first call on the general path (a decode
        step at a new cache length is called once: preparing its 55 steps took 5.6 ms, the
        general path runs them in 5), where one sharing its bucket's arenas prepares at once,
        taking the unchanged runs from the arena. Made again once a race it ran in Python has
        chosen a kernel with C calls. None where the steps cannot be prepared (then never
        asked again)."""
        key = (id(views), id(steps))
        found = self._prepared.get(key)
        if found is not None:
            if type(found) is not MixedCall or not found.later or not found.stale():
                return found
            # a race run in Python has chosen since: prepared again, its choice among the C calls
        elif id(steps) in self._unprepared:
            return None
        elif self.origin is not None and self._home is not self.origin and key not in self._called_once:
            self._called_once.add(key)  # arenas of its own: nothing prepared on them yet
            return None
        found = prepare(self, views, steps, self._arena_of[id(views)].runs)
        if found is None:
            self._unprepared.add(id(steps))  # the plan's own lists of steps: their ids stay theirs
        else:
            self._prepared[(id(views), id(steps))] = found  # it holds the arena: the id is not reused
        return found

    def _output_buffers(self) -> list[int]:
        return [b for b, buf in enumerate(self.buffers) if buf.kind == "output"]

    # -- running --------------------------------------------------------------------------------
    def steps_now(self) -> tuple[int | None, list[Step]]:
        """The thread budget a call runs on now and its steps: the thread choice's current option
        (the many-thread steps until it has chosen), or the plan's own where it has no choice."""
        if self.thread_choice is None:
            return self.threads, self.steps
        threads = self.thread_choice.current()
        return threads, self.single_steps if threads == 1 else self.steps

    def run(self, arrays: Sequence[np.ndarray], out: Sequence[np.ndarray] | None = None, timer=None,
            in_place: Sequence[tuple[int, int]] = ()) -> Any:
        """One call; ``in_place``: (output, input) positions of :meth:`in_place`'s answer, each
        output written in its input's array (C-contiguous, writable), which is returned for it."""
        views = self._borrow()
        try:
            choice = self.thread_choice
            if choice is None or timer is not None:  # a profile times what calls run now, and chooses nothing
                return self._on(*self.steps_now(), views, arrays, out, timer, in_place)
            threads = choice.pick()
            steps = self.single_steps if threads == 1 else self.steps
            start = time.perf_counter()
            result = self._on(threads, steps, views, arrays, out, timer, in_place)
            choice.record(threads, time.perf_counter() - start)
            return result
        finally:
            self._give_back(views)

    def _on(self, threads, steps, views, arrays, out, timer, in_place=()) -> Any:
        if not budget_binds(threads, self.pools):  # no budget, or none it would change: not even the context managers
            return self._run(steps, views, arrays, out, timer, in_place)
        with budget_threads(threads, self.pools):
            return self._run(steps, views, arrays, out, timer, in_place)

    def _run(self, steps, views: list[Any], arrays, out, timer, in_place=()) -> Any:
        if out is None and timer is None:
            prepared = self._prepared_call(views, steps)
            if prepared is not None:  # the steps' C calls in one call into C (dpl.runtime.prepared)
                outs = self.output_pool.take(self._out_specs)
                for k, j in in_place:
                    outs[k] = arrays[j]
                prepared.run(arrays, outs)
                return _nest(self.result, outs)
        bufs = list(views)
        outs = list(out) if out is not None else self.output_pool.take(self._out_specs)
        for k, j in in_place:
            outs[k] = arrays[j]
        late = self.bind(bufs, arrays, outs)
        for step in steps:
            ins = [bufs[b] for b in step.inputs]
            dst = [bufs[b] for b in step.outputs]
            if timer is None:
                step.kernel(ins, dst)
            else:
                timer(step, lambda: step.kernel(ins, dst))
        for pos, b in self.copies:
            np.copyto(outs[pos], bufs[b])
        for pos, b in late:
            np.copyto(outs[pos], bufs[b].reshape(outs[pos].shape))
        return _nest(self.result, outs)


def _nest(shape, outs):
    if isinstance(shape, tuple):
        return tuple(_nest(s, outs) for s in shape)
    return outs[shape]


class Planner:
    """Walks the entry function at concrete input shapes and produces a :class:`Plan`."""

    def __init__(self, module: Module, entry: Function, compiler: Compiler, threads: int | None = None,
                 adapt_threads: bool = True):
        self.module, self.entry, self.compiler = module, entry, compiler
        self.threads = threads  # the thread budget of the plan's kernels (None: each pool's own)
        self.adapt_threads = adapt_threads  # let each call take one thread where that is faster
        self.buffers: list[Buffer] = []
        self.steps: list[Step] = []
        self.decisions: list = []
        self.view_groups: list[str] = []
        self._consts: dict[int, int] = {}
        self._depth = 0
        # each buffer's shape over the entry's symbols, and the current function's symbols over
        # them (dpl.runtime.rebinding): what lets the plan serve another binding
        self.symbolic: list = []
        self.lifter = Lifter()
        self._symbols: dict = {}

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
        self._symbols = {s: s for s in dims}
        inputs = [self._new(shape, ty.dtype, "input", symbolic=ty.shape) for ty, (shape, _) in zip(types, specs)]
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
            base = b if buf.base is None else buf.base  # a view returned: its base is the output
            if self.buffers[base].kind == "temp" and base not in claimed:
                claimed.add(base)
                self.buffers[base] = attrs.evolve(self.buffers[base], kind="output")
                output_ids.append(base)
            else:
                copies.append((pos, b))
                output_ids.append(None)
        signature = tuple((tuple(shape), str(np.dtype(dtype))) for shape, dtype in specs)
        positions = _positions(result, iter(range(len(flat))))
        capped = one_pool_kernels((s.kernel for s in self.steps), self.threads)
        steps = [attrs.evolve(s, kernel=capped.get(id(s.kernel), s.kernel)) for s in self.steps]
        single_steps = None
        if self.adapt_threads and self.threads != 1 and available_cores() > 1:
            single = one_pool_kernels((s.kernel for s in self.steps), 1)
            single_steps = [attrs.evolve(s, kernel=single.get(id(s.kernel), s.kernel)) for s in self.steps]
        mixed = any(getattr(k, "threads", None) == 1 for k in capped.values()) and self.threads != 1
        note = "OpenMP kernels on one thread: the plan also calls BLAS" if mixed else None
        if self.threads is not None:
            note = f"{note}; " if note else ""
            note += f"thread budget {self.threads}: BLAS, torch and OpenMP kernels on at most {count(self.threads, 'thread')}"
        rebinding = None
        if self.lifter.why_not is None and dims:
            rebinding = Rebinding(tuple(self.symbolic), tuple(self.lifter.constraints), tuple(flat))
        plan = Plan(signature, self.buffers, steps, inputs, positions, output_ids, specs, copies, self.decisions, note, self.threads,
                    self.view_groups, single_steps, rebinding=rebinding)
        plan.unbound_why = self.lifter.why_not
        return plan

    # -- the walk -------------------------------------------------------------------------------
    def _new(self, shape, dtype, kind, value=None, symbolic=None) -> int:
        """A buffer of this concrete ``shape``; ``symbolic``: its declared shape in the current
        function's symbols (None: static)."""
        self.buffers.append(Buffer(tuple(int(d) for d in shape), dtype, kind, value))
        self.symbolic.append(self._lift(symbolic))
        return len(self.buffers) - 1

    def _lift(self, shape):
        """``shape`` over the entry's symbols, or None where it is static."""
        if shape is None or self.lifter.why_not is not None or all(type(d) is int for d in shape):
            return None
        return self.lifter.lift(shape, self._symbols)

    def _specialized(self, fn: Function, dims) -> Function:
        """``fn`` with the caller's values of the symbols it cannot bind itself written in (a
        plan holding such a kernel is for this binding only)."""
        given = with_caller_dims(fn, dims)
        if given is not fn:
            self.lifter.refuse(f"'{fn.name}' has a caller's value written in")
        return given

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

        def alloc(t, declared):
            if isinstance(t, TupleType):
                return tuple(alloc(f, d) for f, d in zip(t.fields, declared.fields))
            made.append(self._new(t.shape, t.dtype, "temp", symbolic=declared.shape))
            return made[-1]

        return alloc(concrete(ty, dims, what), ty), made

    def _shapes(self, ids: list[int]):
        return [self.buffers[b].shape for b in ids], [self.buffers[b].dtype for b in ids]

    def _view(self, call: Call, env, dims, fn: Function) -> int | None:
        """The view buffer of a view op of one tensor, or None (then a kernel runs it)."""
        src = self._eval(call.args[0], env, dims, fn)
        if not isinstance(src, int):
            return None
        ty = concrete(call.ty, dims, f"op {call.op} in '{fn.name}'")
        buf = self.buffers[src]
        if ty.dtype != buf.dtype or math.prod(ty.shape) != math.prod(buf.shape):
            return None
        base = src if buf.base is None else buf.base
        self.buffers.append(Buffer(tuple(int(d) for d in ty.shape), ty.dtype, "view", base=base))
        self.symbolic.append(self._lift(call.ty.shape))
        return len(self.buffers) - 1

    def _call_op(self, call: Call, env, dims, fn: Function):
        if is_view(call) and len(call.args) == 1 and isinstance(call.args[0], (Var, Constant)):
            view = self._view(call, env, dims, fn)
            if view is not None:
                return view
        single, operands = single_op_function(call)
        ins = [b for a in operands for b in flatten(self._eval(a, env, dims, fn))]
        tree, outs = self._outputs(call.ty, dims, f"op {call.op} in '{fn.name}'")
        kernel, backend = self.compiler.op_kernel(self._specialized(single, dims), *self._shapes(ins))
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
        # a dim no parameter binds (arange(end=seq) in a group, n of (n + 1) // 2 - 1) is the caller's
        callee_dims = bind_dims(types, shapes, names, fallback=dims)
        for d, n in dims.items():
            callee_dims.setdefault(d, n)
        caller = self._symbols
        if self.lifter.why_not is None:
            declared = [self.symbolic[b] or self.buffers[b].shape for b in ins]
            self._symbols = self.lifter.callee([t.shape for t in types], declared, caller, callee_dims)
        try:
            return self._callee(name, callee, args, ins, shapes, dtypes, callee_dims)
        finally:
            self._symbols = caller

    def _callee(self, name: str, callee: Function, args, ins, shapes, dtypes, callee_dims):
        """Plan the call of module function ``callee``, in its own symbols (``callee_dims``)."""
        if callee.attrs.get("Primitive") and "Composite" not in callee.attrs:
            if is_view_group(callee):  # no kernel: views
                self.view_groups.append(name)
                return self._inline(callee, args, callee_dims)
            group, backend = self.compiler.group(self._specialized(callee, callee_dims), shapes, dtypes)
            self.decisions.append((name, shapes, group))
            if not group.fused:
                return self._inline(callee, args, callee_dims)
            tree, outs = self._outputs(callee.ret.ty, callee_dims, f"function '{name}'")
            self.steps.append(Step(f"fused {name}", name, backend, group.kernel, tuple(ins), tuple(outs)))
            return tree
        if not callee.attrs:  # a plain subroutine: its calls join the plan
            return self._inline(callee, args, callee_dims)
        kernel, backend = self.compiler.function_kernel(self._specialized(callee, callee_dims), shapes, dtypes)
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
