"""The fusion scheduler: heuristics -> kernel cache -> compile -> run, with fall-back.

For a Primitive group at concrete input shapes: ask the heuristics; if they say fuse, take the
kernel from the cache or compile it with the chosen backend. A compile error runs the group op
by op instead (``fallback_on_error=True``) or raises :class:`FusionError`. The Executable calls
:meth:`FusionScheduler.prepare` once per group and shape when it plans; :meth:`dispatch` is
the seed's whole path for a direct call.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import numpy as np

from dpl import dtypes as dt
from dpl.backends.registry import Backend, leaf_types, unflatten
from dpl.errors import DplError
from dpl.interpret import run_function
from dpl.ir.expr import Function, Module
from dpl.runtime.cache import KernelCache
from dpl.runtime.config import FusionConfig
from dpl.runtime.heuristics import FusionDecision, FusionHeuristics
from dpl.runtime.keys import exact_key
from dpl.runtime.shapes import bind_dims, concrete


class FusionError(DplError):
    """A fused kernel failed to compile and ``fallback_on_error`` is off."""


@attrs.frozen
class ScheduledGroup:
    """How a group runs at one shape: ``kernel`` is the fused kernel, or None to run op by op."""

    kernel: Any
    decision: FusionDecision
    note: str
    error: str | None = None  # the compile error that sent a group the heuristics fused op by op

    @property
    def fused(self) -> bool:
        return self.kernel is not None

    def __str__(self) -> str:
        return f"{self.decision}; {self.note}"


class FusionScheduler:
    def __init__(self, config: FusionConfig | None = None, heuristics: FusionHeuristics | None = None, cache: KernelCache | None = None):
        self.config = config or FusionConfig()
        self.heuristics = heuristics or FusionHeuristics(self.config)
        self.cache = cache if cache is not None else KernelCache()

    def prepare(self, graph: Function, backend: Backend, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str], module: Module | None = None) -> ScheduledGroup:
        decision = self.heuristics.should_fuse(graph, shapes, dtypes, backend.capabilities.ops)
        if not decision:
            return ScheduledGroup(None, decision, "runs op by op")
        key = exact_key(graph, shapes, dtypes)
        kernel = self.cache.get(backend.name, key)
        if kernel is not None:
            return ScheduledGroup(kernel, decision, f"fused kernel from the cache ({backend.name}, key {key[:16]})")
        try:
            kernel = backend.compile(graph, module=module, shapes=tuple(shapes))
        except Exception as err:  # any failure of a backend's compiler is a compile error here
            why = err.message if isinstance(err, DplError) else f"{type(err).__name__}: {err}"
            if not self.config.fallback_on_error:
                raise FusionError(f"backend '{backend.name}' failed to compile group '{graph.name}': {why}",
                                  hint="FusionConfig(fallback_on_error=True) runs the group op by op instead") from err
            return ScheduledGroup(None, decision, f"compile error on {backend.name} ({why}); runs op by op", why)
        self.cache.put(backend.name, key, kernel)
        return ScheduledGroup(kernel, decision, f"fused kernel compiled by {backend.name}")

    def dispatch(self, graph: Function, inputs: Sequence[np.ndarray], backend: Backend, module: Module | None = None) -> Any:
        """Run ``graph`` on ``inputs`` as the seed's scheduler does; returns its result."""
        inputs = [np.asarray(a) for a in inputs]
        shapes = [a.shape for a in inputs]
        dts = [dt.from_numpy(a.dtype) for a in inputs]
        group = self.prepare(graph, backend, shapes, dts, module)
        if not group.fused:
            return run_function(module, graph, inputs)
        dims = bind_dims([p.ty for p in graph.params], shapes, [f"parameter '{p.name}'" for p in graph.params])
        outs = [np.empty(t.shape, dt.to_numpy(t.dtype)) for t in leaf_types(concrete(graph.ret.ty, dims, graph.name))]
        group.kernel(inputs, outs)
        return unflatten([graph.ret.ty], outs)[0]
