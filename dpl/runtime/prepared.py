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

What is not prepared runs the general path: a step whose kernel cannot say its C calls (a NumPy
or torch product, a view copy, a timed race between two kernels), kernels of different runners,
an output that is an input or a constant or returned twice (a copy after the steps), an empty
buffer, a call with ``out=`` or a timer. An input that is not C-contiguous is copied to one for
the call, as every C kernel does with it on the general path; what each C call computes is the
same function on the same bytes, so both paths give the same bits.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from dpl import dtypes as dt


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
    (an OpenMP cap or argument; 0: none) and ``code`` (a kind's own flag: an activation)."""

    entry: int
    kind: int
    args: tuple
    dims: tuple[int, ...] = ()
    threads: int = 0
    code: int = 0


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


def prepare(plan, views: list, steps: Sequence) -> PreparedCall | None:
    """The prepared call of ``steps`` (the plan's list, or its one-thread list) over arena
    ``views``, or None where the general path must run them (see the module text)."""
    if plan.copies or any(math.prod(buf.shape) == 0 for buf in plan.buffers):
        return None
    runners = {id(getattr(s.kernel, "call_list", None)) for s in steps}
    runner = getattr(steps[0].kernel, "call_list", None) if steps else None
    if runner is None or len(runners) != 1 or not all(callable(getattr(s.kernel, "prepare", None)) for s in steps):
        return None
    calls: list[CCall] = []
    for step in steps:
        spec = [(plan.base_of(b), plan.buffers[b].shape) for b in step.inputs]
        made = step.kernel.prepare(spec, [(plan.base_of(b), plan.buffers[b].shape) for b in step.outputs])
        if made is None:
            return None
        calls.extend(made)
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
