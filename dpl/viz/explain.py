"""``dpl explain``: for each rule, its closest misses across a whole function, and the
rewrites applied on the way.

Every binding of each entry function (as the rewrites left it) is tried as the root of each
rule. The matcher records, at each failure, how much of the pattern had matched; the
deepest failure of a try is its miss: how many of the rule's bindings matched, the rule's
binding and the sub-pattern (file:line:col) that failed, the expression it met and why. A
try whose pattern matches whole but whose ``where`` clause refuses names the conjunct and the
values it saw. Misses are ranked by how much matched. ``dpl.explain`` answers for one pattern
and one expression; this runs the same matcher (a subclass that keeps its deepest failure)
over every binding and every rule.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from dpl.errors import DplError
from dpl.ir.expr import Function, Module, Var
from dpl.pattern import nodes as n
from dpl.pattern.match import Matcher, NoMatch, show


@attrs.frozen
class Miss:
    """One try of a rule at one binding."""

    rule: str
    kind: str  # "pattern" or "rewrite"
    origin: str  # the rule's file:line:col
    function: str
    at: str  # the binding tried as the root
    matched: tuple[str, ...]  # the rule's bindings that matched
    total: int  # how many bindings the rule has
    failed_binding: str | None = None  # the rule's binding whose sub-pattern failed
    sub_pattern: str = ""  # the failing sub-pattern, and where it is written
    met: str = ""  # the expression it met ("var = mean(sq, axis=[0], keepdims=True)")
    why: str = ""
    refused: bool = False  # the pattern matched whole; the where clause (or a hook) refused

    @property
    def full(self) -> bool:
        return len(self.matched) == self.total

    def __str__(self) -> str:
        head = f"at {self.at}: {len(self.matched)} of {self.total} binding{'s' if self.total != 1 else ''} matched"
        if self.matched:
            head += f" ({', '.join(self.matched)})"
        if self.refused:
            return f"{head}; the check refused: {self.why}"
        where = f"binding '{self.failed_binding}' of the rule" if self.failed_binding else "the rule"
        return (f"{head}\n      failed at {where}: sub-pattern {self.sub_pattern}\n"
                f"      met   {self.met}\n      why   {self.why}")


@attrs.frozen
class RuleReport:
    rule: str
    kind: str
    origin: str
    matches: tuple[str, ...]  # bindings where the rule matches (check included)
    misses: tuple[Miss, ...]  # closest first
    applied: tuple[str, ...] = ()  # for a rewrite: what it changed on the way in

    def __str__(self) -> str:
        lines = [f"{self.kind} {self.rule} ({self.origin})"]
        for a in self.applied:
            lines.append(f"  applied: {a}")
        if self.matches:
            lines.append(f"  matches at {', '.join(self.matches)}")
        if not self.misses and not self.matches and not self.applied:
            lines.append("  no binding gets past the root op")
        for m in self.misses:
            lines.append(f"  closest miss {m}")
        return "\n".join(lines)


@attrs.frozen
class ExplainReport:
    rewrites: tuple  # dpl.trace.RewriteEvent, in order
    rules: tuple[RuleReport, ...]

    def __str__(self) -> str:
        lines = ["rewrites applied, in order:"]
        lines += [f"  {r}" for r in self.rewrites] or ["  none"]
        for r in self.rules:
            lines += ["", str(r)]
        return "\n".join(lines)


class _Deepest(Matcher):
    """A matcher that remembers its deepest failure and what had matched then."""

    def match(self, pattern, expr):
        self.best: tuple[int, NoMatch | None, frozenset] = (-1, None, frozenset())
        return super().match(pattern, expr)

    def fail(self, p, expr, kind, why, *args, causes=()):
        super().fail(p, expr, kind, why, *args, causes=causes)
        if not causes and len(self.memo) > self.best[0]:
            self.best = (len(self.memo), self.failure, frozenset(id(k) for k in self.memo))
        return False

    # a cached failure would skip fail(): every try starts from an empty cache
    def reset(self):
        self._cache.clear()


def explain_module(mod: Module, sources: Sequence[str], *, rule: str | None = None, at: str | None = None,
                   top: int = 3) -> ExplainReport:
    """The report of ``dpl explain`` for ``mod`` with the rules of ``sources`` (files or
    libraries). ``rule`` keeps one rule (full name or the part after the prefix); ``at``
    tries only that binding as the root (and shows its miss whatever its progress)."""
    from dpl.apply import apply
    from dpl.lang import load_rules
    from dpl.lang.compiler import pattern_set
    from dpl.trace import Trace
    from dpl.viz.coverage import entry_functions

    rules = load_rules(list(sources))
    if rule is not None:
        rules = tuple(r for r in rules if rule in (r.name, r.name.split(".", 1)[-1]))
        if not rules:
            raise DplError(f"no rule named '{rule}' in {', '.join(sources)}")
    trace = Trace()
    apply(mod, pattern_set(load_rules(list(sources))), composites=False, fuse=False, trace=trace)
    target = trace.rewritten
    entries = entry_functions(target)
    if at is not None and not any(at in {b.var.name for b in target[e].bindings} for e in entries):
        raise DplError(f"no binding '{at}' in {', '.join(entries)} (after the rewrites)",
                       hint="bindings a rewrite replaced are gone: see the rewrites applied")
    reports = []
    for r in rules:
        matches, misses = [], []
        for name in entries:
            m, x = _rule_in_function(r, target[name], at)
            matches += m
            misses += x
        misses.sort(key=lambda m: (-len(m.matched), -m.refused))
        keep = misses if at is not None else [m for m in misses if m.matched][:top]
        applied = tuple(", ".join(e.changed) + (f" (replacing {', '.join(e.removed)})" if e.removed else "")
                        for e in trace.rewrites if e.rule == r.name)
        reports.append(RuleReport(r.name, r.kind, f"{r.span.file}:{r.span.line}:{r.span.col}", tuple(matches), tuple(keep), applied))
    return ExplainReport(tuple(trace.rewrites), tuple(reports))


def _binding_names(r) -> dict[int, str]:
    """id(pattern) -> name, for the rule's bindings (not its free wildcards)."""
    return {id(p): name for name, p in r.names.items() if type(p) is not n.WildcardPattern}


def _rule_in_function(r, fn: Function, at: str | None) -> tuple[list[str], list[Miss]]:
    matcher = _Deepest(fn)
    names = _binding_names(r)
    every_name = {id(p): name for name, p in r.names.items()}
    by_line = {}
    for name, p in r.names.items():
        if id(p) in names:
            by_line.setdefault(_line(getattr(p, "origin", "")), name)
    users = _users(fn)
    roots = r.pattern.fields if r.multi_root else (r.pattern,)
    matches, misses = [], []
    for b in fn.bindings:
        if at is not None and b.var.name != at:
            continue
        for root in roots:
            matcher.reset()
            result = matcher.match(root, b.var)
            if result:
                if r.multi_root:
                    continue  # a multi-root rule is checked on all its roots at once: not here
                ok, why = r.check(r.view(result, users))
                if ok and r.kind == "rewrite":
                    ok, why = _replacement_fits(r, result, users, b)
                if ok:
                    matches.append(b.var.name)
                else:
                    matched = tuple(name for name, p in r.names.items() if id(p) in names and p in result)
                    misses.append(Miss(r.name, r.kind, "", fn.name, b.var.name, matched, len(names), why=why or "", refused=True))
                continue
            _, failure, seen = matcher.best
            if failure is None:
                failure = result
            failed = by_line.get(_line(getattr(failure.pattern, "origin", "")))
            matched = tuple(name for name, p in r.names.items() if id(p) in names and name != failed and _reached(p, seen))
            misses.append(Miss(r.name, r.kind, "", fn.name, b.var.name, matched, len(names), failed,
                               f"{short(failure.pattern, every_name)}  (at {getattr(failure.pattern, 'origin', '?')})",
                               _met(fn, matcher, failure.expr), f"{failure.kind}: {failure.reason}"))
    return matches, misses


def short(p: n.Pattern, names: dict[int, str], depth: int = 2) -> str:
    """A sub-pattern as the rule writes it, one or two levels deep; named parts by name."""
    if id(p) in names and depth < 2:
        return names[id(p)]
    if isinstance(p, n.WildcardPattern):
        return "_"
    if isinstance(p, n.OpPattern):
        return f"op {p.name}"
    if isinstance(p, n.CallPattern):
        op = p.op.name if isinstance(p.op, n.OpPattern) else short(p.op, names, depth - 1)
        if depth <= 0:
            return f"{op}(...)"
        args = [short(a, names, depth - 1) for a in p.args]
        args += [f"{k}={_attr_text(v)}" for k, v in p.attrs.items()]
        return f"{op}({', '.join(args)})"
    if isinstance(p, n.ConstantPattern):
        if p.value is None:
            return "const"
        value = getattr(p.value, "item", lambda: p.value)() if getattr(p.value, "size", 1) == 1 else p.value
        return repr(value)
    if isinstance(p, n.OrPattern):
        return f"{short(p.left, names, depth)} | {short(p.right, names, depth)}"
    if isinstance(p, n.OptionalPattern):
        return short(p.outer, names, depth).replace("(", "?(", 1)
    if isinstance(p, (n.AttrPattern, n.DTypePattern, n.ShapePattern, n.NotPattern)):
        return short(p.inner, names, depth)
    text = repr(p)
    return text if len(text) <= 80 else text[:77] + "..."


def _attr_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(_attr_text(x) for x in v) + "]"
    return repr(v)


def _heads(p: n.Pattern) -> list[n.CallPattern]:
    """The call patterns a named pattern starts with (through alternatives and options)."""
    if isinstance(p, n.CallPattern):
        return [p]
    if isinstance(p, (n.OrPattern, n.AndPattern)):
        return _heads(p.left) + _heads(p.right)
    if isinstance(p, n.OptionalPattern):
        return _heads(p.outer) + _heads(p.inner)
    if isinstance(p, (n.AttrPattern, n.DTypePattern, n.ShapePattern)):
        return _heads(p.inner)
    return []


def _reached(p: n.Pattern, seen: frozenset) -> bool:
    """Matched whole, or its op matched before something inside it failed."""
    return id(p) in seen or any(id(c.op) in seen for c in _heads(p))


def _replacement_fits(r, match, users, b) -> tuple[bool, str | None]:
    """A rewrite whose replacement cannot be built, or has another type than the value it
    replaces, leaves the module alone (dpl.lang.compiler.rewrite_rule): say so."""
    try:
        new = r.replacement(r.view(match, users), lambda e: e)
    except DplError as err:
        return False, f"the replacement cannot be built: {err.message}"
    if new.ty != b.var.ty:
        return False, f"the replacement {show(new)} has type {new.ty}, the value it would replace {b.var.ty}"
    return True, None


def _line(origin: str) -> str:
    """``file:line`` of a ``file:line:col`` origin."""
    return origin.rpartition(":")[0]


def _met(fn: Function, matcher: Matcher, e) -> str:
    if isinstance(e, Var) and e in matcher.var2val:
        return f"{e.name} = {show(matcher.var2val[e])}"
    text = matcher.label(e)
    for b in fn.bindings:  # an operand written inline: say which binding holds it
        if any(a is e for a in getattr(b.value, "args", ())):
            return f"{text}, in {b.var.name} = {show(b.value)}"
    return text


def _users(fn: Function):
    """users(expr) -> the values of the bindings that read it (for only_used_by / used_by)."""
    from dpl.ir.traverse import leaves

    var_of = {id(b.value): b.var for b in fn.bindings}
    readers: dict[int, list] = {}
    for b in fn.bindings:
        for leaf in leaves(b.value):
            if isinstance(leaf, Var):
                readers.setdefault(id(leaf), []).append(b.value)

    def users(e):
        var = e if isinstance(e, Var) else var_of.get(id(e))
        return readers.get(id(var), []) if var is not None else []

    return users


__all__ = ["ExplainReport", "Miss", "RuleReport", "explain_module"]
