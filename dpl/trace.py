"""What a pattern-driven pass decided, and why: pass ``trace=dpl.Trace()`` to ``dpl.apply``
or ``fuse_ops_by_pattern`` and read ``trace.report()``."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class TraceEvent:
    pattern: str
    function: str
    root: str  # the binding the match is rooted at
    members: tuple[str, ...]  # the bindings the match would fuse
    accepted: bool
    reason: str | None = None
    composite: str | None = None  # accepted: the composite function the match became


@attrs.frozen
class RewriteEvent:
    """One rewrite rule that changed a function, in the order the rules ran."""

    rule: str
    origin: str  # the rule's file:line:col
    function: str
    changed: tuple[str, ...]  # bindings whose value the rule replaced ("h = nn.rms_norm(...)")
    removed: tuple[str, ...]  # bindings that went away with them
    added: tuple[str, ...] = ()  # bindings the replacement introduced

    @property
    def names(self) -> tuple[str, ...]:
        """The bindings whose value the rule replaced or removed."""
        return tuple(c.partition(" = ")[0] for c in self.changed) + self.removed

    def __str__(self) -> str:
        parts = [f"rewrite {self.rule} ({self.origin}) in {self.function}: {', '.join(self.changed) or 'no binding kept its name'}"]
        if self.removed:
            parts.append(f"replacing {', '.join(self.removed)}")
        if self.added:
            parts.append(f"adding {', '.join(self.added)}")
        return "; ".join(parts)


def rewrite_events(rule: str, origin: str, before, after) -> list[RewriteEvent]:
    """What rule ``rule`` changed from module ``before`` to module ``after``, per function."""
    out = []
    for name, fn in after.functions.items():
        old = before.functions.get(name)
        if old is None or old is fn:
            continue
        was = {b.var.name: b.value for b in old.bindings}
        now = {b.var.name: b.value for b in fn.bindings}
        changed = tuple(f"{k} = {_op(v)}" for k, v in now.items() if k in was and _op(was[k]) != _op(v))
        removed = tuple(k for k in was if k not in now)
        added = tuple(f"{k} = {_op(v)}" for k, v in now.items() if k not in was)
        if changed or removed or added:
            out.append(RewriteEvent(rule, origin, name, changed, removed, added))
    return out


def _op(value) -> str:
    op = getattr(value, "op", None)
    if op is None:
        return type(value).__name__
    return op if isinstance(op, str) else f"@{op.name}"


@attrs.define
class Trace:
    events: list[TraceEvent] = attrs.field(factory=list)
    rewrites: list[RewriteEvent] = attrs.field(factory=list)  # the rewrites applied, in order
    # set by dpl.apply: the module it was given, the module after the rewrites, the result and
    # the PatternSet, so that coverage() and the pictures can say what happened to every op
    source: Any = attrs.field(default=None, eq=False)
    rewritten: Any = attrs.field(default=None, eq=False)
    result: Any = attrs.field(default=None, eq=False)
    patterns: Any = attrs.field(default=None, eq=False)

    def record(self, pattern: str, function: str, root: str, members: tuple[str, ...], accepted: bool, reason: str | None = None) -> None:
        self.events.append(TraceEvent(pattern, function, root, members, accepted, reason))

    def name_composites(self, start: int, func) -> None:
        """Write on the accepted events from ``self.events[start]`` on the composite function
        each became in ``func``, the function after outlining (an output of the match is
        bound there to the call, or to an item of it); a match absorbed by a later one of the
        same pattern keeps None: :meth:`claims` finds the one that absorbed it."""
        called: dict[str, str] = {}
        for b in func.bindings:
            v = b.value
            op = getattr(v, "op", None)
            if op is not None and not isinstance(op, str):
                called[b.var.name] = op.name
            elif getattr(v, "tuple_value", None) is not None and getattr(v.tuple_value, "name", None) in called:
                called[b.var.name] = called[v.tuple_value.name]
        for k in range(start, len(self.events)):
            e = self.events[k]
            if e.accepted:
                name = next((called[m] for m in reversed(e.members) if m in called), None)
                self.events[k] = attrs.evolve(e, composite=name)

    def claims(self) -> dict[tuple[str, str], TraceEvent]:
        """(function, binding) -> the accepted match that took the binding into a composite
        (the last one: a match of one pattern may absorb an earlier match of the same pattern)."""
        return {(e.function, m): e for e in self.events if e.accepted for m in e.members}

    def accepted(self, pattern: str | None = None) -> list[TraceEvent]:
        return [e for e in self.events if e.accepted and pattern in (None, e.pattern)]

    def rejected(self, pattern: str | None = None) -> list[TraceEvent]:
        return [e for e in self.events if not e.accepted and pattern in (None, e.pattern)]

    def report(self) -> str:
        """The rewrites applied, in order; then per pattern, in the order they ran: accepted
        matches, then rejected ones with why; then, once ``dpl.apply`` has run, the coverage
        table (:meth:`coverage`: the share of ops fused, and why each lone op stayed alone)."""
        lines = [str(r) for r in self.rewrites]
        for name in dict.fromkeys(e.pattern for e in self.events):
            acc, rej = self.accepted(name), self.rejected(name)
            lines.append(f"{name}: {len(acc)} accepted, {len(rej)} rejected")
            for e in acc:
                lines.append(f"  + {e.function}: {', '.join(e.members)}")
            for e in rej:
                lines.append(f"  - {e.function}: {', '.join(e.members)}: {e.reason}")
        matched = {e.pattern for e in self.events}
        quiet = [p.name for p in getattr(self.patterns, "patterns", ()) if p.name not in matched]
        if quiet:  # a rule that never matched is said too, not left out of the list
            lines.append(f"no match: {', '.join(quiet)} (dpl explain shows each one's closest misses)")
        elif not lines:
            lines.append("no pattern matched anything")
        if self.result is not None:
            lines += ["", self.coverage().table()]
        return "\n".join(lines)

    def coverage(self, target: Any = None, config: Any = None, dims: dict[str, int] | None = None):
        """A :class:`dpl.viz.Coverage` of the module ``dpl.apply`` returned: per entry function
        the ops in composites (by composite), in automatic groups and alone, each alone op with
        its reason. With ``target`` (``"cpu"``), also what the runtime heuristics decide per
        group on this machine (``config`` a FusionConfig, ``dims`` sizes of symbolic dims)."""
        from dpl.errors import DplError
        from dpl.viz.coverage import coverage
        from dpl.viz.runtime import decide

        if self.result is None:
            raise DplError("this trace has no result: pass it to dpl.apply(..., trace=trace) first")
        runtime = decide(self.result, target, config, dims) if target is not None else None
        return coverage(self.result, self, self.patterns, runtime)
