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


@attrs.define
class Trace:
    events: list[TraceEvent] = attrs.field(factory=list)
    # set by dpl.apply: the module it was given, the module after the rewrites, the result and
    # the PatternSet, so that coverage() and the pictures can say what happened to every op
    source: Any = None
    rewritten: Any = None
    result: Any = None
    patterns: Any = None

    def record(self, pattern: str, function: str, root: str, members: tuple[str, ...], accepted: bool, reason: str | None = None) -> None:
        self.events.append(TraceEvent(pattern, function, root, members, accepted, reason))

    def accepted(self, pattern: str | None = None) -> list[TraceEvent]:
        return [e for e in self.events if e.accepted and pattern in (None, e.pattern)]

    def rejected(self, pattern: str | None = None) -> list[TraceEvent]:
        return [e for e in self.events if not e.accepted and pattern in (None, e.pattern)]

    def report(self) -> str:
        """Per pattern, in the order they ran: accepted matches, then rejected ones with why."""
        lines = []
        for name in dict.fromkeys(e.pattern for e in self.events):
            acc, rej = self.accepted(name), self.rejected(name)
            lines.append(f"{name}: {len(acc)} accepted, {len(rej)} rejected")
            for e in acc:
                lines.append(f"  + {e.function}: {', '.join(e.members)}")
            for e in rej:
                lines.append(f"  - {e.function}: {', '.join(e.members)}: {e.reason}")
        return "\n".join(lines) if lines else "no pattern matched anything"

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
