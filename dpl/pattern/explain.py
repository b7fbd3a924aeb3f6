"""``explain(pattern, expr, func)``: why a pattern does (not) match, in words.

The report names the first sub-pattern that failed (with the file:line that built it), the
expression it met (``lv3 = exp(lv2)`` when it met a bound variable), and why: a wrong op, an
attribute, a dtype, a shape, a consistency conflict (a repeated pattern or a symbolic
dimension meeting two different values), a bound variable where ``is_var`` asked for a
parameter. When an ``|`` failed, each alternative's failure is listed.
"""

from __future__ import annotations

import attrs

from dpl.ir.expr import Expr, Function, Var
from dpl.pattern import nodes as n
from dpl.pattern.match import Match, Matcher, NoMatch, show


@attrs.frozen(eq=False)
class Explanation:
    pattern: n.Pattern
    expr: Expr
    result: Match | NoMatch
    func: Function | None = None

    @property
    def matched(self) -> bool:
        return bool(self.result)

    @property
    def failure(self) -> NoMatch | None:
        """The innermost failure (of the last alternative tried when several failed)."""
        if self.result:
            return None
        return self.result.leaves()[-1]

    def __bool__(self):
        return self.matched

    def _where(self, e) -> str:
        if isinstance(e, Var) and self.func is not None:
            for b in self.func.bindings:
                if b.var is e:
                    return f"{e.name} = {show(b.value)}"
        return show(e)

    def _failure_lines(self, f: NoMatch, indent: str) -> list[str]:
        if f.causes:
            lines = [f"{indent}none of the alternatives of {f.pattern!r} matches {self._where(f.expr)}:"]
            for i, c in enumerate(f.causes, 1):
                sub = self._failure_lines(c, indent + "    ")
                sub[0] = f"{indent}  {i}." + sub[0][len(indent) + 2:]
                lines += sub
            return lines
        return [
            f"{indent}  sub-pattern {f.pattern!r}  (built at {getattr(f.pattern, 'origin', '?')})",
            f"{indent}  met         {self._where(f.expr)}",
            f"{indent}  why         {f.kind}: {f.reason}",
        ]

    def __str__(self) -> str:
        head = f"pattern {self.pattern!r}  (built at {getattr(self.pattern, 'origin', '?')})"
        if self.result:
            lines = [head, f"matches {self._where(self.expr)}:"]
            lines += [f"  {p!r} -> {show(e)}" for p, e in self.result.items()
                      if not isinstance(p, n.OpPattern) and p is not self.pattern]
            return "\n".join(lines)
        lines = [head, f"does not match {self._where(self.expr)}:"]
        lines += self._failure_lines(self.result, "")
        return "\n".join(lines)

    __repr__ = __str__


def explain(pattern: n.Pattern, expr: Expr, func: Function | None = None) -> Explanation:
    """Match ``pattern`` against ``expr`` (looking through ``func``'s bindings) and report
    what matched or which sub-pattern failed and why. Printable."""
    return Explanation(pattern, expr, Matcher(func).match(pattern, expr), func)
