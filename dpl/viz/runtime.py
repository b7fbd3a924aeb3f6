"""What the runtime would do with each fused group on this machine, without compiling:
the backend the target chooses (``dpl.backends.choose``) and, for automatic groups, the fusion
heuristics' answer (``FusionHeuristics.should_fuse``) at concrete shapes."""

from __future__ import annotations

from typing import Any, Mapping

from dpl.backends.registry import choose, classify, leaf_types, resolve_target
from dpl.ir.expr import Call, GlobalVar, Module
from dpl.runtime.config import FusionConfig
from dpl.runtime.heuristics import FusionHeuristics
from dpl.runtime.shapes import concrete
from dpl.transform.graph import is_view_group
from dpl.viz.coverage import RuntimeDecision, entry_functions

DEFAULT_DIM = 8  # a symbolic dim's size when none is given (as `dpl run` does)
VIEWS_ONLY = "views only: no kernel, no copy"  # a group of view ops (dpl.runtime.plan); no backend runs it


def decide(mod: Module, target: Any = "cpu", config: FusionConfig | None = None,
           dims: Mapping[str, int] | None = None) -> dict[str, RuntimeDecision]:
    """Per module function called from an entry: fused kernel or op by op, and why.
    Symbolic dims take their size from ``dims`` (default 8)."""
    backends = resolve_target(target)
    heuristics = FusionHeuristics(config or FusionConfig())
    sizes = dict(dims or {})
    out: dict[str, RuntimeDecision] = {}
    for entry in entry_functions(mod):
        for b in mod[entry].bindings:
            v = b.value
            if not (isinstance(v, Call) and isinstance(v.op, GlobalVar)) or v.op.name in out:
                continue
            if v.op.name not in mod.functions:
                continue
            fn = mod[v.op.name]
            if not fn.attrs:
                continue
            unit = classify(fn, mod)
            choice = choose(unit, backends)
            if choice.backend is None:
                out[fn.name] = RuntimeDecision(False, None, choice.explain())
                continue
            if unit.kind == "primitive" and is_view_group(fn):
                out[fn.name] = RuntimeDecision(True, None, VIEWS_ONLY)
                continue
            if unit.kind != "primitive":
                out[fn.name] = RuntimeDecision(True, choice.backend.name, f"{unit.kind} on {choice.explain()}")
                continue
            shapes, dtypes = _signature(fn, sizes)
            decision = heuristics.should_fuse(fn, shapes, dtypes, choice.backend.capabilities.ops)
            out[fn.name] = RuntimeDecision(decision.fuse, choice.backend.name, f"{decision.rule}: {decision.reason}")
    return out


def _signature(fn, sizes: dict[str, int]):
    shapes, dtypes = [], []
    for p in fn.params:
        for t in leaf_types(p.ty):
            for d in t.shape:
                if isinstance(d, str):
                    sizes.setdefault(d, DEFAULT_DIM)
            shapes.append(concrete(t, sizes, f"parameter '{p.name}'").shape)
            dtypes.append(t.dtype)
    return shapes, dtypes


def from_executable(exe) -> dict[str, RuntimeDecision]:
    """What a built Executable actually did in the plans it made (compile errors included):
    per Primitive group the scheduler's decision, per composite or codegen function the
    backend that compiled it."""
    out: dict[str, RuntimeDecision] = {}
    for name, choice in exe.choices.items():
        if name in exe.module.functions and choice.unit.kind in ("composite", "codegen"):
            out[name] = RuntimeDecision(choice.backend is not None, getattr(choice.backend, "name", None),
                                        f"{choice.unit.kind} on {choice.explain()}")
    for plan in exe.plans.values():
        for name in plan.view_groups:
            out[name] = RuntimeDecision(True, None, VIEWS_ONLY)
        for name, _shapes, group in plan.decisions:
            backend = exe.choices[name].backend if name in exe.choices else None
            out[name] = RuntimeDecision(group.fused, getattr(backend, "name", None), str(group))
    return out
