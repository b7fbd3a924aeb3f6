"""Apply ``.dpl`` rewrite rules to a module, to a fixed point.

Each binding whose value a rule matches (and whose ``where`` holds) gets the rule's
replacement; the replaced producers become dead and are removed. A replacement that cannot be
built (its op rejects the operands) or whose type differs from the value it replaces is
skipped, and the reason is recorded in the trace: a library rule never breaks a module.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from dpl.errors import DplError
from dpl.ir.expr import Binding, Call, Constant, Expr, Function, Module, Tuple, TupleGetItem, Var
from dpl.lang._uses import vars_in
from dpl.lang.compiler import Rule
from dpl.pattern.match import Matcher
from dpl.pattern.nodes import root_ops


class RewriteLimitError(DplError):
    """Rewriting did not reach a fixed point."""


@attrs.define
class RewriteEvent:
    rule: str
    function: str
    binding: str
    applied: bool
    reason: str | None = None


def _index(rules: Sequence[Rule]) -> tuple[dict[str, list[Rule]], list[Rule]]:
    by_op: dict[str, list[Rule]] = {}
    anywhere: list[Rule] = []
    for r in rules:
        ops = root_ops(r.pattern)
        if ops is None:
            anywhere.append(r)
        else:
            for op in ops:
                by_op.setdefault(op, []).append(r)
    return by_op, anywhere


def _candidates(value: Expr, by_op, anywhere, order) -> list[Rule]:
    found = list(anywhere)
    if isinstance(value, Call) and isinstance(value.op, str):
        found += by_op.get(value.op, [])
    return sorted(found, key=order.__getitem__) if len(found) > 1 else found


def _flatten(value: Expr, name: str, taken: set[str], out: list[Binding]) -> Expr:
    """Bind nested calls of a replacement to fresh variables, so the body stays flat."""
    if isinstance(value, Call):
        args = tuple(_flatten_arg(a, name, taken, out) for a in value.args)
        return attrs.evolve(value, args=args)
    if isinstance(value, TupleGetItem):
        return attrs.evolve(value, tuple_value=_flatten_arg(value.tuple_value, name, taken, out))
    return value


def _flatten_arg(arg: Expr, name: str, taken: set[str], out: list[Binding]) -> Expr:
    if isinstance(arg, Tuple):
        return Tuple(tuple(_flatten_arg(f, name, taken, out) for f in arg.fields))
    if not isinstance(arg, (Call, TupleGetItem)):
        return arg
    inner = _flatten(arg, name, taken, out)
    k = 0
    while f"{name}_{k}" in taken:
        k += 1
    var = Var(f"{name}_{k}", inner.ty)
    taken.add(var.name)
    out.append(Binding(var, inner))
    return var


def remove_dead(func: Function) -> Function:
    live: set[int] = {id(v) for v in vars_in(func.ret)}
    kept = []
    for b in reversed(func.bindings):
        if id(b.var) in live:
            kept.append(b)
            live.update(id(v) for v in vars_in(b.value))
    if len(kept) == len(func.bindings):
        return func
    return attrs.evolve(func, bindings=tuple(reversed(kept)))


def _sweep(func: Function, rules: Sequence[Rule], index, order, trace: list | None) -> tuple[Function, int]:
    """One pass over the bindings; returns the new function and how many rewrites it made."""
    by_op, anywhere = index
    bindings = list(func.bindings)
    taken = {p.name for p in func.params} | {b.var.name for b in bindings}
    count = 0
    i = 0
    current = func
    matcher = Matcher(current)
    while i < len(bindings):
        b = bindings[i]
        new_value = None
        for rule in _candidates(b.value, by_op, anywhere, order):
            m = matcher.match(rule.pattern, b.value)
            if not m:
                continue
            view = rule.view(m, current)
            ok, why = rule.check(view)
            if not ok:
                _record(trace, rule, func, b, False, why)
                continue
            to_var = {id(x.value): x.var for x in bindings}
            try:
                candidate = rule.replacement(view, lambda e: e if isinstance(e, (Var, Constant)) else to_var.get(id(e), e))
            except DplError as err:
                _record(trace, rule, func, b, False, f"replacement rejected: {err.message}")
                continue
            if candidate.ty != b.value.ty:
                _record(trace, rule, func, b, False, f"replacement has type {candidate.ty}, the value it replaces {b.value.ty}")
                continue
            new_value = candidate
            _record(trace, rule, func, b, True)
            break
        if new_value is None:
            i += 1
            continue
        extra: list[Binding] = []
        flat = _flatten(new_value, b.var.name, taken, extra)
        bindings[i : i + 1] = [*extra, Binding(b.var, flat)]
        i += len(extra) + 1
        count += 1
        current = attrs.evolve(func, bindings=tuple(bindings))
        matcher = Matcher(current)
    return (remove_dead(current) if count else func), count


def _record(trace, rule: Rule, func: Function, b: Binding, applied: bool, reason: str | None = None) -> None:
    if trace is not None:
        trace.append(RewriteEvent(rule.name, func.name, b.var.name, applied, reason))


def apply_rewrites(mod: Module, rules: Sequence[Rule], *, max_sweeps: int = 32, trace: list | None = None) -> Module:
    """Rewrite every function that is not a fused kernel, until no rule applies."""
    rules = [r for r in rules if r.kind == "rewrite"]
    if not rules:
        return mod
    index = _index(rules)
    order = {id(r): i for i, r in enumerate(rules)}
    order = _Order(order)
    functions = {}
    for name, func in mod.functions.items():
        if any(k in func.attrs for k in ("Primitive", "Composite", "Codegen")):
            functions[name] = func
            continue
        for _ in range(max_sweeps):
            func, count = _sweep(func, rules, index, order, trace)
            if count == 0:
                break
        else:
            names = sorted({e.rule for e in (trace or []) if e.applied}) or [r.name for r in rules]
            raise RewriteLimitError(f"rewrites did not converge in '{name}' after {max_sweeps} sweeps (rules: {', '.join(names)})")
        functions[name] = func
    return Module(functions)


class _Order:
    """Rule priority by identity (rules are attrs classes compared by value)."""

    def __init__(self, by_id: dict[int, int]):
        self.by_id = by_id

    def __getitem__(self, rule: Rule) -> int:
        return self.by_id[id(rule)]
