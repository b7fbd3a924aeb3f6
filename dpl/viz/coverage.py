"""How much of a module fusion covered, and why the rest was not: ``coverage(fused, ...)``.

Walks each entry function of a module after ``dpl.apply`` (a function that is not a Primitive,
Composite or Codegen function) call by call:

- a call of a Codegen wrapper or a Composite function is a **composite** group (by composite
  name; the pattern's file:line when the pattern set is known);
- a call of a Primitive function is an **automatic** group (FuseOps, or row fusion);
- a call of an op is an op **alone**, with its reason: a rule matched it but was refused (the
  rule and its reason, from the trace), it is opaque by nature (FuseOps never fuses kind
  kOpaque), it is a view the runtime aliases (a reshape, squeeze or expand_dims: no kernel, no
  copy), or no pattern matched and FuseOps found nothing to fuse it with.

``FunctionCoverage.fused_share`` is the figure the issue tracker and the zoo tests quote: the
share of the ops that run (opaque ones and views left out) that run inside a composite or a
fused group.

``runtime=`` (from :func:`dpl.viz.runtime.decide`) adds what the runtime heuristics decide for
each group on this machine: fused kernel or op by op, and which rule said so.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

import attrs

from dpl.backends.registry import function_ops
from dpl.ir.expr import Call, Function, GlobalVar, Module, Tuple, TupleGetItem, Var
from dpl.ops.registry import OpPatternKind
from dpl.transform.graph import binding_kind, is_view

ALONE_REASONS = ("refused", "opaque", "view", "unmatched")


@attrs.frozen
class RuntimeDecision:
    """What the runtime does with one group at the planned shapes."""

    fused: bool  # one kernel (True) or op by op (False)
    backend: str | None
    why: str  # the heuristics' rule or the backend choice, in words

    def to_json(self) -> dict:
        return {"fused": self.fused, "backend": self.backend, "why": self.why}


@attrs.frozen
class GroupCoverage:
    """One call of a fused function in an entry function."""

    function: str  # the module function called
    bindings: tuple[str, ...]  # the entry's bindings the call defines (its tuple items included)
    claim: str  # "composite" or "automatic"
    composite: str | None  # the composite name ("kernel.attention")
    ops: tuple[str, ...]  # every op inside, in order
    origin: str | None = None  # the pattern's file:line that claimed it
    runtime: RuntimeDecision | None = None

    @property
    def label(self) -> str:
        return self.composite if self.claim == "composite" else "automatic fusion"

    def to_json(self) -> dict:
        out = {"function": self.function, "bindings": list(self.bindings), "claim": self.claim,
               "composite": self.composite, "ops": list(self.ops), "origin": self.origin}
        out["runtime"] = self.runtime.to_json() if self.runtime else None
        return out


@attrs.frozen
class LoneOp:
    """An op no group claimed, and why."""

    binding: str
    op: str
    reason: str  # one of ALONE_REASONS
    detail: str
    rule: str | None = None  # the rule whose check (or safety rule) refused it

    def to_json(self) -> dict:
        return {"binding": self.binding, "op": self.op, "reason": self.reason, "detail": self.detail, "rule": self.rule}


@attrs.frozen
class FunctionCoverage:
    function: str
    groups: tuple[GroupCoverage, ...]
    alone: tuple[LoneOp, ...]

    @property
    def total(self) -> int:
        return sum(len(g.ops) for g in self.groups) + len(self.alone)

    def by_composite(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            if g.claim == "composite":
                out[g.composite] = out.get(g.composite, 0) + len(g.ops)
        return out

    @property
    def in_composites(self) -> int:
        return sum(len(g.ops) for g in self.groups if g.claim == "composite")

    @property
    def in_automatic(self) -> int:
        return sum(len(g.ops) for g in self.groups if g.claim == "automatic")

    @property
    def fused_share(self) -> float:
        """Percent of the ops that run as kernels, opaque-by-nature ones left out, that run inside
        a composite or a fused group (a lone view runs as nothing: it is left out too)."""
        runs = self.total - sum(a.reason in ("opaque", "view") for a in self.alone)
        return 100.0 * (self.in_composites + self.in_automatic) / runs if runs else 100.0

    @property
    def fused_at_runtime(self) -> int | None:
        """Ops that run inside one kernel at run time (None without runtime decisions)."""
        if any(g.runtime is None for g in self.groups):
            return None
        return sum(len(g.ops) for g in self.groups if g.runtime.fused and (g.claim == "composite" or len(g.ops) > 1))

    def to_json(self) -> dict:
        total = self.total
        return {
            "function": self.function, "ops": total,
            "composite": {"ops": self.in_composites, "share": _share(self.in_composites, total),
                          "by_name": self.by_composite()},
            "automatic": {"ops": self.in_automatic, "share": _share(self.in_automatic, total)},
            "alone": {"ops": len(self.alone), "share": _share(len(self.alone), total)},
            "fused_share": round(self.fused_share, 1),
            "fused_at_runtime": self.fused_at_runtime,
            "groups": [g.to_json() for g in self.groups],
            "alone_ops": [a.to_json() for a in self.alone],
        }


@attrs.frozen
class Coverage:
    """Per entry function: ops in composites, in automatic groups, alone (with reasons)."""

    functions: tuple[FunctionCoverage, ...]

    def __getitem__(self, name: str) -> FunctionCoverage:
        for f in self.functions:
            if f.function == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict:
        return {"functions": [f.to_json() for f in self.functions]}

    def json(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def table(self) -> str:
        return "\n\n".join(_table(f) for f in self.functions)

    __str__ = table


def _share(part: int, total: int) -> float:
    return round(100.0 * part / total, 1) if total else 0.0


def _table(f: FunctionCoverage) -> str:
    total = f.total
    lines = [f"coverage of '{f.function}': {total} op{'s' if total != 1 else ''}"]

    def row(what: str, count: int) -> None:
        lines.append(f"  {what:<40} {count:>5}  {_share(count, total):5.1f}%")

    row("in composites", f.in_composites)
    for name, count in f.by_composite().items():
        row(f"  {name}", count)
    row(f"in automatic groups ({sum(g.claim == 'automatic' for g in f.groups)})", f.in_automatic)
    row("alone", len(f.alone))
    for reason in ALONE_REASONS:
        count = sum(a.reason == reason for a in f.alone)
        if count:
            row(f"  {_REASON_WORDS[reason]}", count)
    lines.append(f"  {'fused share of the ops that run':<40} {'':>5}  {f.fused_share:5.1f}%  (opaque ops and views left out)")
    fused = f.fused_at_runtime
    if fused is not None:
        row("in one kernel at run time", fused)
    if f.groups:
        lines.append("groups:")
        # alike groups (same claim, ops and runtime decision: a model's layers) on one line
        alike: dict[tuple, list[GroupCoverage]] = {}
        for g in f.groups:
            why = (g.runtime.fused, g.runtime.backend, g.runtime.why.split("; fused kernel")[0]) if g.runtime else None
            alike.setdefault((g.label, g.origin, g.ops, why), []).append(g)
        for same in alike.values():
            g = same[0]
            where = f" [{g.origin}]" if g.origin else ""
            times = f" x{len(same)}" if len(same) > 1 else ""
            lines.append(f"  {g.function}{times} ({g.label}{where}): {' + '.join(g.ops)}")
            if g.runtime is not None and g.runtime.fused and g.runtime.backend is None:  # views: no kernel at all
                lines.append(f"      at run time: {g.runtime.why}")
            elif g.runtime is not None:
                how = "one kernel" if g.runtime.fused else "op by op"
                lines.append(f"      at run time: {how} on {g.runtime.backend or 'nothing'} ({g.runtime.why})")
    if f.alone:
        lines.append("alone:")
        for a in f.alone:
            lines.append(f"  {a.binding} = {a.op}: {a.detail}")
    return "\n".join(lines)


_REASON_WORDS = {"refused": "a rule matched, then refused", "opaque": "opaque by nature",
                 "view": "a view: no kernel, no copy",
                 "unmatched": "no pattern, nothing to fuse with"}


def entry_functions(mod: Module) -> list[str]:
    """The functions a user calls: not Primitive, Composite or Codegen, nor called by another."""
    called = set()
    for fn in mod.functions.values():
        called |= set(_called_names(fn))
    return [name for name, fn in mod.functions.items()
            if not any(k in fn.attrs for k in ("Primitive", "Composite", "Codegen")) and name not in called]


def _called_names(fn: Function) -> list[str]:
    names = []

    def visit(e):
        if isinstance(e, Call):
            if isinstance(e.op, GlobalVar):
                names.append(e.op.name)
            for a in e.args:
                visit(a)
        elif isinstance(e, Tuple):
            for x in e.fields:
                visit(x)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)

    for b in fn.bindings:
        visit(b.value)
    return names


def coverage(mod: Module, trace=None, patterns=None, runtime: Mapping[str, RuntimeDecision] | None = None,
             entries: Sequence[str] | None = None) -> Coverage:
    """The coverage of ``mod`` (a module after ``dpl.apply``). ``trace`` (the apply's Trace)
    gives the reasons of refused matches, ``patterns`` (its PatternSet) the file:line of each
    composite's pattern, ``runtime`` the per-group decisions of :func:`dpl.viz.runtime.decide`."""
    origins = {p.name: p.origin for p in getattr(patterns, "patterns", ())}
    refusals = _refusals(trace)
    out = []
    for name in entries or entry_functions(mod):
        out.append(_function_coverage(mod, mod[name], origins, refusals.get(name, {}), runtime or {}))
    return Coverage(tuple(out))


def _refusals(trace) -> dict[str, dict[str, tuple[str, str]]]:
    """function -> binding -> (rule, reason) of the first refused match that held the binding
    and that no accepted match of any rule covered."""
    if trace is None:
        return {}
    accepted: dict[str, set[str]] = {}
    for e in trace.events:
        if e.accepted:
            accepted.setdefault(e.function, set()).update(e.members)
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for e in trace.events:
        if e.accepted:
            continue
        for m in e.members:
            if m not in accepted.get(e.function, ()):
                out.setdefault(e.function, {}).setdefault(m, (e.pattern, e.reason or "refused"))
    return out


def _function_coverage(mod: Module, fn: Function, origins, refusals, runtime) -> FunctionCoverage:
    groups: list[GroupCoverage] = []
    alone: list[LoneOp] = []
    users = _users_in(mod, fn)
    by_binding: dict[str, int] = {}
    for b in fn.bindings:
        v = b.value
        if isinstance(v, TupleGetItem) and getattr(v.tuple_value, "name", None) in by_binding:
            gi = by_binding[v.tuple_value.name]
            groups[gi] = attrs.evolve(groups[gi], bindings=groups[gi].bindings + (b.var.name,))
            continue
        if not isinstance(v, Call):
            continue
        if isinstance(v.op, GlobalVar):
            group = _group(mod, v.op.name, b.var.name, origins, runtime)
            if group is not None:
                by_binding[b.var.name] = len(groups)
                groups.append(group)
            continue
        for call in _op_calls(v):
            alone.append(_lone(b.var.name, call, refusals, users.get(b.var.name, [])))
    return FunctionCoverage(fn.name, tuple(groups), tuple(alone))


def _users_in(mod: Module, fn: Function) -> dict[str, list[str]]:
    """binding name -> what reads it, in words ("probs (kernel.attention)")."""
    out: dict[str, list[str]] = {}
    for b in fn.bindings:
        v = b.value
        what = b.var.name
        if isinstance(v, Call) and isinstance(v.op, GlobalVar) and v.op.name in mod.functions:
            what = f"{b.var.name} ({_composite_name(mod, mod[v.op.name]) or 'automatic group'})"
        elif isinstance(v, Call):
            what = f"{b.var.name} ({v.op})"
        for name in {getattr(x, "name", None) for x in _leaf_vars(v)}:
            if name is not None and what not in out.setdefault(name, []):
                out[name].append(what)
    return out


def _leaf_vars(e) -> list:
    if isinstance(e, Call):
        return [x for a in e.args for x in _leaf_vars(a)]
    if isinstance(e, Tuple):
        return [x for f in e.fields for x in _leaf_vars(f)]
    if isinstance(e, TupleGetItem):
        return _leaf_vars(e.tuple_value)
    return [e] if isinstance(e, Var) else []


def _op_calls(e) -> list[Call]:
    """The op calls of a binding's value, nested ones first (without A-normal form)."""
    out = []
    if isinstance(e, Call):
        for a in e.args:
            out += _op_calls(a)
        if isinstance(e.op, str):
            out.append(e)
    elif isinstance(e, Tuple):
        for x in e.fields:
            out += _op_calls(x)
    elif isinstance(e, TupleGetItem):
        out += _op_calls(e.tuple_value)
    return out


def _group(mod: Module, name: str, binding: str, origins, runtime) -> GroupCoverage | None:
    if name not in mod.functions:
        return None
    callee = mod[name]
    ops = function_ops(callee, mod)
    composite = _composite_name(mod, callee)
    if composite is not None:
        return GroupCoverage(name, (binding,), "composite", composite, ops, origins.get(composite), runtime.get(name))
    if callee.attrs.get("Primitive"):
        return GroupCoverage(name, (binding,), "automatic", None, ops, None, runtime.get(name))
    return None  # a plain subroutine: not a fusion decision


def _composite_name(mod: Module, fn: Function) -> str | None:
    if "Composite" in fn.attrs:
        return str(fn.attrs["Composite"])
    if "Codegen" in fn.attrs:
        for b in fn.bindings:
            v = b.value
            if isinstance(v, Call) and isinstance(v.op, GlobalVar) and v.op.name in mod.functions:
                inner = mod[v.op.name].attrs.get("Composite")
                if inner:
                    return str(inner)
        return str(fn.attrs["Codegen"])
    return None


def _lone(binding: str, call: Call, refusals, users: list[str] = ()) -> LoneOp:
    if binding in refusals:
        rule, why = refusals[binding]
        return LoneOp(binding, call.op, "refused", f"rule '{rule}' matched it but refused: {why}", rule)
    # a view is never opaque by nature: dpl.apply's FuseOps (views=True) fuses it like an
    # elementwise op, symbolic shapes included (TVM makes a symbolic reshape Opaque)
    kind = binding_kind(call, views=True)
    if kind == OpPatternKind.OPAQUE:
        return LoneOp(binding, call.op, "opaque", "opaque by nature (kind kOpaque): automatic fusion never fuses it")
    if is_view(call):
        return LoneOp(binding, call.op, "view", "a view the runtime aliases: its input's buffer with another shape, "
                                               "no kernel and no copy")
    near = f"; its users: {', '.join(users)}" if users else ""
    return LoneOp(binding, call.op, "unmatched",
                  f"no pattern matched it, and automatic fusion left it alone: {_KIND_RULES.get(kind, kind.name)}{near}")


# what TVM's FuseOps fuses an op of each kind with (dpl.transform.partition), for the reasons
_KIND_RULES = {
    OpPatternKind.OUT_EWISE_FUSABLE: "a kOutEWiseFusable op (matmul, conv, norms) takes only elementwise or broadcast ops after it",
    OpPatternKind.COMM_REDUCE: "a reduction takes injective ops before it and elementwise ops after it",
    OpPatternKind.ELEMWISE: "its producers and users are in composites, opaque, or of kinds it cannot join",
    OpPatternKind.BROADCAST: "its producers and users are in composites, opaque, or of kinds it cannot join",
    OpPatternKind.INJECTIVE: "its producers and users are in composites, opaque, or of kinds it cannot join",
}
