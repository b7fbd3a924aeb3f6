"""Which bindings of a function each fusion pattern matches, with its check run as
FuseOpsByPattern runs it (TVM's PatternCheckContext contents). For tests and tools."""

from __future__ import annotations

from typing import Iterable

import attrs

from dpl.ir.expr import Function
from dpl.pattern.fusion import FusionPattern
from dpl.pattern.match import Match
from dpl.transform.fuse_by_pattern import matches


@attrs.frozen
class Found:
    pattern: str
    binding: str  # the (last) root binding's name
    match: Match
    accepted: bool
    reason: str | None
    bindings: tuple[str, ...]  # names of the matched call / tuple-item bindings, roots included


def find_matches(patterns: Iterable[FusionPattern], func: Function) -> list[Found]:
    """Every match of every pattern on ``func``'s bindings, in binding order then priority;
    unlike FuseOpsByPattern, matches are not resolved against each other."""
    found = []
    for order, fp in enumerate(patterns):
        for cand in matches(fp, func):
            verdict = fp.run_check(cand.context)
            names = tuple(func.bindings[i].var.name for i in sorted(cand.members))
            found.append((cand.root, order, Found(fp.name, func.bindings[cand.root].var.name, cand.context.match,
                                                   bool(verdict), None if verdict else verdict.reason, names)))
    return [f for _, _, f in sorted(found, key=lambda t: (t[0], t[1]))]
