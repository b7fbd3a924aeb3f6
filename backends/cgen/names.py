"""The C identifiers of one generated kernel, from one allocator.

A kernel IR names its buffers, symbolic dims, loop variables and scalar locals with dpl names,
which may be anything a user or a model file wrote: ``i0`` (also a name the lowering would
give a loop), ``n``, ``exp``, ``int``, ``a.b`` and ``a_b`` (equal once made C identifiers).
The emitted C has two namespaces that cannot meet:

- ``v_...``: every kernel IR name, allocated once per kernel in a fixed order (dims, buffers,
  then each loop variable, local and reduction in the order the body defines them). The name
  is the dpl name with every character C does not allow as ``_``; a name whose C spelling is
  already taken gets the first free ``_<k>`` suffix. So the map is one-to-one, and no kernel
  name can be a C keyword, a C library name or one of the emitter's own names.
- ``dpl_...``: the emitter's scaffolding (the flat thread index, streaming-store counters, row
  buffers, NaN flags): fixed names in scopes the emitter opens itself, or numbered ones from
  :meth:`CNames.internal`.

Buffers and variables are two namespaces in the kernel IR (a parameter may be named like a
dim), and one here. A kernel IR that defines a variable twice where both are visible (a local
named like a symbolic dim, a loop variable shadowing another) is refused with an :class:`EmitError`:
the lowering never writes one, and C would silently read the wrong value.
"""

from __future__ import annotations

import re
from itertools import count

from dpl.errors import DplError
from dpl.kernel.ir import Kernel, Let, Loop, Reduce

_NOT_C = re.compile(r"[^A-Za-z0-9_]")


class EmitError(DplError):
    """A kernel the C emitter cannot express (a dtype with no C type, a statement it does not know)."""


class CNames:
    """The one allocator of a kernel's C identifiers (see the module docstring)."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.used: set[str] = set()
        self.of: dict[str, str] = {}  # variables: symbolic dims, loop variables, locals
        self.buffers: dict[str, str] = {}  # buffers (a namespace of their own in the kernel IR)
        self.counters: dict[str, count] = {}
        for name in kernel.dims:
            self.of[name] = self._allocate(name)
        for name in [*(b.name for b in kernel.params), *kernel.constants, *(b.name for b in kernel.outputs)]:
            if name in self.buffers:
                raise EmitError(f"kernel '{kernel.name}': two of its buffers are named '{name}'")
            self.buffers[name] = self._allocate(name)
        self._definitions(kernel.body, frozenset(kernel.dims))

    def __getitem__(self, name: str) -> str:
        """The C identifier of a kernel IR variable (a dim, loop variable or local)."""
        found = self.of.get(name)
        if found is None:
            raise EmitError(f"kernel '{self.kernel.name}' reads '{name}', which it does not define")
        return found

    def buffer(self, name: str) -> str:
        """The C identifier of a kernel IR buffer."""
        found = self.buffers.get(name)
        if found is None:
            raise EmitError(f"kernel '{self.kernel.name}' reads buffer '{name}', which it does not have")
        return found

    def internal(self, hint: str) -> str:
        """A fresh name for the emitter's own use, ``dpl_<hint><k>``."""
        k = next(self.counters.setdefault(hint, count()))
        return f"dpl_{hint}{k}"

    def _allocate(self, name: str) -> str:
        base = "v_" + _NOT_C.sub("_", name)
        spelled, k = base, 1
        while spelled in self.used:
            spelled, k = f"{base}_{k}", k + 1
        self.used.add(spelled)
        return spelled

    def _define(self, name: str, visible: frozenset[str]) -> frozenset[str]:
        if name in visible:
            raise EmitError(f"kernel '{self.kernel.name}' defines '{name}' where a dim or an outer "
                            "definition of that name is visible")
        if name not in self.of:  # sibling scopes may reuse a name: it keeps its one spelling
            self.of[name] = self._allocate(name)
        return visible | {name}

    def _definitions(self, stmts, visible: frozenset[str]) -> None:
        for s in stmts:
            if isinstance(s, Loop):
                self._definitions(s.body, self._define(s.var.name, visible))
            elif isinstance(s, Reduce):  # its accumulator is declared before its loops
                visible = inner = self._define(s.name, visible)
                for a in s.axes:
                    inner = self._define(a.var.name, inner)
                self._definitions(s.body, inner)
            elif isinstance(s, Let):
                visible = self._define(s.name, visible)
