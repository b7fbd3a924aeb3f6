"""A plan's call prepared once: every step a list of C calls whose arguments sit in one table of
addresses, so that a call writes its inputs' and outputs' addresses there and runs the whole
list in one call into C (issue 31: at most 20 us of dpl's Python per compiled partition).

The general path (:meth:`~dpl.runtime.plan.Plan.run`) binds a list of arrays per call and calls
each step's kernel in Python, which reads every array's address, builds its ctypes arguments and
calls its C entry; a small model's call spent most of its time there. Here a step's kernel is
asked once, per arena and per list of steps (the plan's, or its one-thread list), for the C
calls it would make (``kernel.prepare(inputs, outputs)``, each argument given as ``(ref,
shape)``; it answers a list of :class:`CCall` or None). ``ref`` is a buffer number of the plan,
which the kernel passes on untouched (a segment runner hands it to its product and its parts),
or an :class:`Address`: memory fixed for the prepared call (a temporary of the arena, a constant,
a packed weight, a segment's scratch), which the address keeps alive.

Every buffer then has one entry in a table of addresses: temporaries and constants fixed for
the arena, inputs and outputs (and their views, which share their base's memory) written per
call. The kernels' backend runs the list (``kernel.call_list``, the same object for every step:
``backends/cpu/call_list.py``): each call's pointers gathered from the table, its entry called.

A step whose kernel cannot say its C calls (a NumPy take or product, a view copy, a timed race
between two kernels, a kernel of another runner) runs in Python between the prepared runs of
the steps around it (:class:`MixedCall`): the arena's arrays with the call's inputs and outputs
bound, as on the general path. A decode step of a 4-layer Llama has 55 steps, of which the
embedding's take and the 4 attentions (raced against two products) are such steps: 5 Python
steps a call instead of 55. The general path runs the whole call where an output is an input
or a constant or returned twice (a copy after the steps), a buffer a step reads or writes is empty, no step is
prepared, or a call has ``out=`` or a timer. An input that is not C-contiguous is copied to one
for the call, as every C kernel does with it on the general path; what each C call computes is
the same function on the same bytes, so both paths give the same bits.
"""

from __future__ import annotations

import itertools
import math
import weakref
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from dpl import dtypes as dt

JOIN_AFTER = 2  # the call of a mixed call at which its consecutive prepared runs become one (MixedCall._join_runs)


class Address:
    """Memory fixed for a prepared call: its address, and the object that owns it (kept alive
    as long as the prepared call that reads it)."""

    __slots__ = ("at", "owner")

    def __init__(self, owner: Any, at: int):
        self.owner, self.at = owner, at

    @classmethod
    def of(cls, array: np.ndarray) -> "Address":
        """The address of a C-contiguous array (which it keeps alive)."""
        if not array.flags.c_contiguous:
            raise ValueError("internal: a prepared call reads only C-contiguous arrays")
        return cls(array, array.ctypes.data)


@attrs.frozen(eq=False)
class CCall:
    """One call into C: ``entry`` (a function's address) called the way ``kind`` says (the
    runner's numbering), on pointer arguments ``args`` (each a caller's ``ref``, an
    :class:`Address` or None: NULL), the dims array ``dims``, and two integers: ``threads``
    (an OpenMP cap or argument; 0: none) and ``code`` (a kind's own flag: an activation).
    ``check``: called after the program has run, to raise what the call reported in memory of
    its own (a C routine cannot raise: an index out of range, ``backends/cpu/index_put.py``)."""

    entry: int
    kind: int
    args: tuple
    dims: tuple[int, ...] = ()
    threads: int = 0
    code: int = 0
    check: Callable[[], None] | None = None


class PreparedCall:
    """One arena's prepared call of one list of steps: ``run(inputs, outputs)`` writes the
    arrays' addresses into the table and runs the C calls. Made by :func:`prepare`."""

    def __init__(self, views: list, calls: Sequence[CCall], table, inputs: list[tuple[int, int]], outputs: list[tuple[int, int]],
                 program: Callable[[], None], address: Callable[[np.ndarray], int]):
        self.views = views  # the arena whose temporaries the table addresses (kept alive)
        self.calls = tuple(calls)  # what it runs, in order
        self._table = table
        self._inputs = inputs  # (input position, table entry)
        self._outputs = outputs  # (output position, table entry)
        self._program = program
        self._address = address
        self._checks = tuple(c.check for c in self.calls if c.check is not None)

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        table, address = self._table, self._address
        held = []  # contiguous copies of strided inputs, alive until the C calls return
        for pos, entry in self._inputs:
            a = inputs[pos]
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
                held.append(a)
            table[entry] = address(a)
        for pos, entry in self._outputs:
            table[entry] = address(outputs[pos])
        self._program()
        for check in self._checks:
            check()


class MixedCall:
    """Prepared runs of steps with the steps that cannot be prepared between them, run in
    Python on the arena's arrays with the call's inputs and outputs bound (see the module text)."""

    def __init__(self, plan, views: list, parts: Sequence, runner=None):
        # the plan weakly: it holds this call, and a cycle would outlive the plan's eviction
        # from the rebound plans (dpl.runtime.executable) until a full garbage collection, which
        # over a torch process's heap took 250 ms of a 32-token generate at fresh lengths
        self._plan, self.views = weakref.ref(plan), views
        self.parts = tuple(parts)  # PreparedCall, or a Step run in Python
        # steps in Python whose kernel may have C calls later (a race once it has chosen)
        self.later = tuple(p for p in self.parts if type(p) is not PreparedCall and hasattr(p.kernel, "preparable"))
        self._runner, self._calls = runner, 0

    def _join_runs(self) -> None:
        """Consecutive prepared runs as one (a table and a program of their own): runs are cut
        where the entry's symbols move a step's shapes, so that the plans of one bucket share
        the others (:func:`prepare`), and a 4-layer decode step ran 17 of them, 17 calls into C
        with their Python between. A plan called again is worth its own: it joins them at its
        :data:`JOIN_AFTER`-th call (a length met once, as a server's fresh prompts are, never
        pays for it)."""
        plan, joined = self._plan(), []
        if plan is None or self._runner is None:
            return
        for is_run, parts in itertools.groupby(self.parts, lambda p: type(p) is PreparedCall):
            parts = list(parts)
            if is_run and len(parts) > 1:
                run = _prepared_run(plan, self.views, [c for p in parts for c in p.calls], self._runner)
                parts = parts if run is None else [run]
            joined.extend(parts)
        self.parts = tuple(joined)

    def stale(self) -> bool:
        """Whether a step run in Python could now be prepared (then the call is made again)."""
        return any(p.kernel.preparable() for p in self.later)

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self._calls += 1
        if self._calls == JOIN_AFTER:
            self._join_runs()
        bufs = None
        for part in self.parts:
            if type(part) is PreparedCall:
                part.run(inputs, outputs)
                continue
            if bufs is None:  # bound at the first Python step: the arrays every later one reads
                bufs = list(self.views)
                self._plan().bind(bufs, inputs, outputs)
            part.kernel([bufs[b] for b in part.inputs], [bufs[b] for b in part.outputs])


def prepare(plan, views: list, steps: Sequence, runs: dict | None = None) -> PreparedCall | MixedCall | None:
    """The prepared call of ``steps`` (the plan's list, or its one-thread list) over arena
    ``views``: one :class:`PreparedCall` where every step is prepared, a :class:`MixedCall`
    where some run in Python between, or None where the general path must run them (see the
    module text).

    ``runs``: the prepared runs made on this arena before, by the plans of one bucket
    (``dpl.runtime.rebinding``), which share its addresses. Then a run holds only steps whose
    shapes the entry's symbols change, or only steps whose shapes they do not: a decode step at
    a new cache length prepares its cache's concatenations again and takes every other run as
    the last length made it."""
    touched = {c for s in steps for b in (*s.inputs, *s.outputs) for c in (b, plan.base_of(b))}
    if plan.copies or any(math.prod(plan.buffers[b].shape) == 0 for b in touched):
        return None  # (an empty input no step reads does not count: dynamo's placeholders for a cache not yet made)
    runner = next((s.kernel.call_list for s in steps if getattr(s.kernel, "call_list", None) is not None), None)
    if runner is None:
        return None
    symbolic = plan.rebinding.shapes if runs is not None and plan.rebinding is not None else None
    parts: list = []  # runs of consecutive prepared steps (their keys and C calls), and steps run in Python
    for k, step in enumerate(steps):
        if getattr(step.kernel, "call_list", None) is not runner or not callable(getattr(step.kernel, "prepare", None)):
            parts.append(step)
            continue
        moves = symbolic is not None and any(symbolic[b] is not None for b in (*step.inputs, *step.outputs))
        key = (k, tuple(plan.buffers[b].shape for b in (*step.inputs, *step.outputs)))
        if not (parts and isinstance(parts[-1], _Run) and parts[-1].moves == moves):
            parts.append(_Run(moves))
        parts[-1].keys.append(key)
        parts[-1].steps.append(step)
    made_parts = []
    for part in parts:
        if not isinstance(part, _Run):
            made_parts.append(part)
            continue
        key = (id(steps), tuple(part.keys))
        found = runs.get(key) if runs is not None and not part.moves else None
        if found is None:
            calls = part.calls(plan)
            if calls is None:  # a step has no C call at these shapes: it runs in Python, the others prepared around it
                for made in part.by_step(plan):
                    run = _prepared_run(plan, views, made, runner) if isinstance(made, list) else made
                    if run is None:
                        return None
                    made_parts.append(run)
                continue
            found = _prepared_run(plan, views, calls, runner)
            if found is None:
                return None
            if runs is not None and not part.moves:  # a moving run is the plan's own (its prepared call holds it)
                runs[key] = found
        made_parts.append(found)
    if not any(type(p) is PreparedCall or hasattr(p.kernel, "preparable") for p in made_parts):
        return None  # nothing in C, now or later (a race still timing may be, once it has chosen)
    if len(made_parts) == 1 and type(made_parts[0]) is PreparedCall:
        return made_parts[0]
    return MixedCall(plan, views, made_parts, runner)


class _Run:
    """Consecutive steps with C calls, whose shapes the entry's symbols change (``moves``) or not."""

    __slots__ = ("moves", "keys", "steps")

    def __init__(self, moves: bool):
        self.moves, self.keys, self.steps = moves, [], []

    def calls(self, plan) -> list[CCall] | None:
        """The steps' C calls at ``plan``'s shapes, or None where one says it has none."""
        out: list[CCall] = []
        for step in self.steps:
            made = _calls_of(plan, step)
            if made is None:
                return None
            out.extend(made)
        return out

    def by_step(self, plan) -> list:
        """The steps as lists of C calls of consecutive steps that have them, and the steps that
        have none (run in Python)."""
        out: list = []
        for step in self.steps:
            made = _calls_of(plan, step)
            if made is None:
                out.append(step)
            elif out and isinstance(out[-1], list):
                out[-1].extend(made)
            else:
                out.append(list(made))
        return out


def _calls_of(plan, step) -> list[CCall] | None:
    spec = [(plan.base_of(b), plan.buffers[b].shape) for b in step.inputs]
    return step.kernel.prepare(spec, [(plan.base_of(b), plan.buffers[b].shape) for b in step.outputs])


def _prepared_run(plan, views: list, calls: list[CCall], runner) -> PreparedCall | None:
    """One table and program for ``calls`` over arena ``views`` (None: the runner is not there)."""
    entries: dict[Any, int] = {}  # a buffer number or an Address's id -> its table entry
    fixed: list[int] = []  # the table's initial values
    keep = []

    def entry_of(ref) -> int | None:
        key = id(ref) if isinstance(ref, Address) else ref
        if ref is None:
            return None
        if key not in entries:
            entries[key] = len(fixed)
            fixed.append(ref.at if isinstance(ref, Address) else _buffer_address(plan, views, ref, keep))
            if isinstance(ref, Address):
                keep.append(ref)
        return entries[key]

    resolved = [(c, tuple(entry_of(a) for a in c.args)) for c in calls]
    inputs = [(pos, entries[b]) for pos, b in enumerate(plan.input_ids) if b in entries]
    outputs = [(pos, entries[b]) for pos, b in enumerate(plan.output_ids) if b is not None and b in entries]
    made = runner.program(resolved, fixed, keep)
    if made is None:  # the runner is not there (a package without it)
        return None
    table, program = made
    return PreparedCall(views, calls, table, inputs, outputs, program, runner.address)


def _buffer_address(plan, views: list, b: int, keep: list) -> int:
    """The fixed address of buffer ``b`` of the arena (a temporary or a constant, made
    C-contiguous once where it is not), or 0 for an input or an output (written per call)."""
    kind = plan.buffers[b].kind
    if kind in ("input", "output"):
        return 0
    if kind not in ("temp", "const"):
        raise ValueError(f"internal: a prepared call met a {kind} buffer")
    array = views[b]
    if not array.flags.c_contiguous:  # a constant's strided array: what its kernel made of it each call
        array = np.ascontiguousarray(array)
    if array.dtype != dt.to_numpy(plan.buffers[b].dtype):
        raise ValueError(f"internal: buffer {b} holds {array.dtype}, the plan says {plan.buffers[b].dtype}")
    keep.append(array)
    return array.ctypes.data
