"""Which bindings of a function each fusion pattern matches, with its check run as
FuseOpsByPattern will run it (TVM's PatternCheckContext contents). For tests and tools."""

from __future__ import annotations

from typing import Iterable

import attrs

from dpl.ir.expr import Call, Function, TupleGetItem, Var
from dpl.pattern import nodes as P
from dpl.pattern.fusion import CheckContext, FusionPattern
from dpl.pattern.match import Match, match_bindings


@attrs.frozen
class Found:
    pattern: str
    binding: str  # the root binding's name
    match: Match
    accepted: bool
    reason: str | None
    bindings: tuple[str, ...]  # names of the matched call / tuple-item bindings, root included


def _vars_in(e):
    if isinstance(e, Var):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from _vars_in(a)
    elif hasattr(e, "fields"):
        for f in e.fields:
            yield from _vars_in(f)
    elif isinstance(e, TupleGetItem):
        yield from _vars_in(e.tuple_value)


def var_usages(func: Function) -> dict[Var, tuple[Var, ...]]:
    """{var: binding vars that use it}, params included; the return is not a use (as in TVM)."""
    users: dict[Var, list[Var]] = {p: [] for p in func.params}
    for b in func.bindings:
        users.setdefault(b.var, [])
        for v in _vars_in(b.value):
            lst = users.setdefault(v, [])
            if b.var not in lst:
                lst.append(b.var)
    return {k: tuple(v) for k, v in users.items()}


def find_matches(patterns: Iterable[FusionPattern], func: Function) -> list[Found]:
    """Every match of every pattern on ``func``'s bindings, in binding order then priority."""
    patterns = list(patterns)
    by_root = {id(fp.pattern): fp for fp in patterns}
    order = {id(fp.pattern): i for i, fp in enumerate(patterns)}
    usages = var_usages(func)
    value_to_var = {b.value: b.var for b in func.bindings}
    position = {id(b.value): i for i, b in enumerate(func.bindings)}
    found = []
    hits = match_bindings([fp.pattern for fp in patterns], func)
    hits.sort(key=lambda h: (position[id(h[0].value)], order[id(h[1])]))
    for binding, pattern, m in hits:
        fp = by_root[id(pattern)]
        matched = {}
        for p, e in m.items():
            if isinstance(p, (P.CallPattern, P.TupleGetItemPattern)) and id(e) in position:
                matched[value_to_var[e]] = e
        upto = position[id(binding.value)]
        seen = {b.value: b.var for b in func.bindings[: upto + 1]}
        ctx = CheckContext(binding.value, fp.annotated(m), matched, usages, seen, m)
        verdict = fp.run_check(ctx)
        reason = None if verdict else verdict.reason
        names = tuple(b.var.name for b in func.bindings if b.var in matched)
        found.append(Found(fp.name, binding.var.name, m, bool(verdict), reason, names))
    return found
