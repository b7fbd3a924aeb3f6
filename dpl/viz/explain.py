"""``dpl explain``: for each rule, where it matches and what became of each match, its
closest misses across a whole function, and the rewrites applied on the way.

The module goes through ``dpl.apply`` (rewrites, the passes before fusion, FuseOpsByPattern;
no automatic fusion) with a :class:`dpl.trace.Trace`, and every binding of each entry function,
as the fusion passes met it, is tried as the root of each rule. Where a rule's pattern matches
whole, that is a *site*, and the trace says its fate:

* ``used``: fusion made it a composite function (named);
* ``rejected``: fusion refused it: a leak, a cycle, an overlap with an earlier match, the
  ``where`` conjunct that failed and its values, or a check hook's answer (the trace's reason);
* ``taken``: a rule that ran before it (higher priority) took some of its bindings into its
  own composite (which rule, which composite);
* ``consumed``: the rule matched the module as given, but a rewrite (or a pass before fusion:
  fold, merge-products, split-slices) replaced or removed those bindings (which one, and what
  it changed);
* ``applied`` (a rewrite): the rule replaced this binding; ``unapplied``: a rewrite that still
  matches after the rewrites ran (a later rewrite made the match);
* ``unknown``: fusion recorded nothing for it (the by-pattern pass did not run).

Elsewhere a try is a *miss*. The matcher records, at each failure, how much of the pattern had
matched; the deepest failure of a try is its miss: how many of the rule's bindings matched, the
rule's binding and the sub-pattern (file:line:col) that failed, the expression it met and why.
A rewrite whose pattern matches whole but whose ``where`` clause refuses is a miss naming the
conjunct and the values it saw. Misses are ranked by how much matched; none is shown at a
binding that a site of the rule covers. ``dpl.explain`` answers for one pattern and one
expression; this runs the same matcher (a subclass that keeps its deepest failure) over every
binding and every rule.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

import attrs

from dpl.errors import DplError
from dpl.ir.expr import Function, Module, Var
from dpl.pattern import nodes as n
from dpl.pattern.match import Matcher, NoMatch, show
from dpl.pipeline import PassInstrument
from dpl.trace import Trace, rewrite_events


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

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, filter=lambda a, _: a.name not in ("rule", "kind", "origin"))

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
class Site:
    """A binding where a rule's pattern matches whole (or did, before a rewrite or a pass
    changed the module), and what fusion made of it."""

    function: str
    at: str  # the root binding
    members: tuple[str, ...]  # the module's bindings the match covers, in order
    fate: str  # used, rejected, taken, consumed, applied, unapplied or unknown (module docstring)
    detail: str = ""  # the composite it became, why it was refused, who took or consumed it
    composite: str | None = None  # used: the composite it became; taken: the one that took it
    by: str | None = None  # taken: the rule that took it; consumed: the rewrite or pass

    def as_dict(self) -> dict[str, Any]:
        return {"function": self.function, "binding": self.at, "members": list(self.members), "fate": self.fate,
                "detail": self.detail, "composite": self.composite, "by": self.by}

    def __str__(self) -> str:
        covers = f" ({', '.join(self.members)})" if self.members not in ((), (self.at,)) else ""
        detail = "" if not self.detail else f" {self.detail}" if self.detail.startswith("by ") else f": {self.detail}"
        return f"at {self.at}{covers}: {self.fate}{detail}"


@attrs.frozen
class RuleReport:
    rule: str
    kind: str
    origin: str
    sites: tuple[Site, ...]  # where the pattern matches whole, in binding order, with their fates
    misses: tuple[Miss, ...]  # closest first
    applied: tuple[str, ...] = ()  # for a rewrite: what it changed on the way in

    @property
    def matches(self) -> tuple[str, ...]:
        """The bindings where the rule matches the module fusion met."""
        return tuple(s.at for s in self.sites if s.fate not in ("consumed", "applied"))

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "kind": self.kind, "origin": self.origin, "applied": list(self.applied),
                "sites": [s.as_dict() for s in self.sites], "misses": [m.as_dict() for m in self.misses]}

    def __str__(self) -> str:
        lines = [f"{self.kind} {self.rule} ({self.origin})"]
        for a in self.applied:
            lines.append(f"  applied: {a}")
        shown = [s for s in self.sites if s.fate != "applied"]  # the applied lines say those
        if shown:
            counts = {}
            for s in shown:
                counts[s.fate] = counts.get(s.fate, 0) + 1
            where = "matches" if any(s.fate != "consumed" for s in shown) else "matched before the rewrites"
            lines.append(f"  {where} at {len(shown)} binding{'s' if len(shown) != 1 else ''}: "
                         + ", ".join(f"{v} {k}" for k, v in counts.items()))
            lines += [f"  {s}" for s in shown]
        if not self.misses and not self.sites and not self.applied:
            lines.append("  no binding gets past the root op")
        for m in self.misses:
            lines.append(f"  closest miss {m}")
        return "\n".join(lines)


@attrs.frozen
class ExplainReport:
    rewrites: tuple  # dpl.trace.RewriteEvent, in order
    rules: tuple[RuleReport, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"rewrites": [attrs.asdict(r) for r in self.rewrites], "rules": [r.as_dict() for r in self.rules]}

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


class _PassChanges(PassInstrument):
    """What each pass between the rewrites and fusion (fold, merge-products, split-slices)
    changed, worded as the rewrites' events are (the pass's name as the rule)."""

    def __init__(self):
        self.events = []

    def after(self, pass_, mod, result, seconds) -> None:
        if pass_.name != "rewrites" and not pass_.fuses and result is not mod:
            self.events += rewrite_events(f"pass {pass_.name}", "before fusion", mod, result)


def explain_module(mod: Module, sources: Sequence[str], *, rule: str | None = None, at: str | None = None,
                   top: int = 3) -> ExplainReport:
    """The report of ``dpl explain`` for ``mod`` with the rules of ``sources`` (files or
    libraries). ``rule`` keeps one rule (full name or the part after the prefix); ``at``
    tries only that binding as the root (and shows its miss whatever its progress)."""
    from dpl.apply import apply
    from dpl.lang import load_rules
    from dpl.lang.compiler import pattern_set
    from dpl.viz.coverage import entry_functions

    every = load_rules(list(sources))
    rules = every
    if rule is not None:
        rules = tuple(r for r in rules if rule in (r.name, r.name.split(".", 1)[-1]))
        if not rules:
            names = list(dict.fromkeys(x for r in every for x in (r.name, r.name.split(".", 1)[-1])))
            close = difflib.get_close_matches(rule, names, n=1)
            raise DplError(f"no rule named '{rule}' in {', '.join(sources)}" + (f"; did you mean '{close[0]}'?" if close else ""),
                           hint="dpl check " + " ".join(sources) + " lists the rules")
    trace, passes = Trace(), _PassChanges()
    # what dpl fuse does, short of automatic fusion and the Codegen wrappers (which neither
    # decide a match nor rename a composite)
    apply(mod, pattern_set(every), fuse=False, annotate_codegen=False, trace=trace, instruments=(passes,))
    target, source = trace.rewritten, trace.source
    entries = entry_functions(target)
    if at is not None and not any(at in {b.var.name for b in f[e].bindings}
                                  for f in (target, source) for e in entries if e in f.functions):
        raise DplError(f"no binding '{at}' in {', '.join(entries)}",
                       hint="bindings a rewrite replaced are gone: see the rewrites applied")
    fates = _Fates(trace, passes.events, every)
    reports = []
    for r in rules:
        sites, misses = [], []
        for name in entries:
            s, x = _rule_in_function(r, target[name], at)
            sites += [fates.of(r, site) for site in s]
            if r.multi_root:  # tried on all its roots at once by fusion only: its sites are the trace's
                sites += fates.from_trace(r, name, at)
            covered = {m for site in s for m in site.members}
            misses += [m for m in x if m.at not in covered]
            if name in source.functions:
                sites += fates.consumed(r, source[name], _rule_in_function(r, source[name], at, misses=False)[0],
                                        {site.at for site in s})
        if r.kind == "rewrite":
            sites += fates.applied(r)
        misses.sort(key=lambda m: (-len(m.matched), -m.refused))
        keep = misses if at is not None else [m for m in misses if m.matched][:top]
        applied = tuple(", ".join(e.changed) + (f" (replacing {', '.join(e.removed)})" if e.removed else "")
                        for e in trace.rewrites if e.rule == r.name)
        reports.append(RuleReport(r.name, r.kind, _origin(r), tuple(sites), tuple(keep), applied))
    return ExplainReport(tuple(trace.rewrites), tuple(reports))


def _origin(r) -> str:
    return f"{r.span.file}:{r.span.line}:{r.span.col}"


class _Fates:
    """The fate of each site, read off the trace of the ``dpl.apply`` run."""

    def __init__(self, trace: Trace, pass_events, rules):
        self.trace = trace
        self.changes = [*trace.rewrites, *pass_events]  # in the order they ran
        self.events = {(e.pattern, e.function, e.root): e for e in trace.events}  # the last decision per root
        self.claims = trace.claims()
        ran = [p.name for p in trace.patterns.patterns] if trace.patterns is not None else []
        self.rank = {name: i for i, name in enumerate(ran)}  # the order the fusion patterns ran in
        self.origin = {r.name: _origin(r) for r in rules}
        self.priority = {r.name: getattr(r, "priority", 0) for r in rules}

    def of(self, r, site: Site) -> Site:
        """A site of the module fusion met."""
        if r.kind == "rewrite":
            return attrs.evolve(site, fate="unapplied", detail="a later rewrite made this match after this one had run "
                                                                "(each rewrite runs once, in priority order)")
        e = self.events.get((r.name, site.function, site.at))
        if e is not None:
            return self._decided(site, e)
        for m in (site.at, *site.members):
            taker = self.claims.get((site.function, m))
            if taker is not None and taker.pattern == r.name:  # another match of this rule holds it
                return self._within(site, taker)
            if taker is not None:
                return self._taken(r, site, taker)
        if not self.rank:
            return attrs.evolve(site, fate="unknown", detail="no fusion pass ran")
        return attrs.evolve(site, fate="unknown", detail="fusion recorded no decision here")

    def _decided(self, site: Site, e) -> Site:
        site = attrs.evolve(site, members=e.members)
        if not e.accepted:
            return attrs.evolve(site, fate="rejected", detail=e.reason or "")
        if e.composite is not None:
            return attrs.evolve(site, fate="used", detail=f"became {e.composite}", composite=e.composite)
        into = self.claims.get((e.function, e.root))  # absorbed by a later match of the same pattern
        return self._within(site, into) if into is not None else attrs.evolve(site, fate="used")

    def _within(self, site: Site, into) -> Site:
        return attrs.evolve(site, fate="used", composite=into.composite,
                            detail=f"within its match at {into.root}, which became {into.composite}")

    def _taken(self, r, site: Site, taker) -> Site:
        earlier = self.rank.get(taker.pattern, -1) < self.rank.get(r.name, -1)
        mine, theirs = self.priority.get(r.name, 0), self.priority.get(taker.pattern, 0)
        if not earlier:
            rank = "a rule that ran after this one refused it"
        elif theirs > mine:
            rank = f"a higher-priority rule (priority {theirs}, this one {mine})"
        else:  # the same priority: the order of the files, and of the rules in a file
            rank = f"an earlier rule of the same priority ({mine}: the order of the files and rules decides)"
        detail = (f"by {taker.pattern} ({self.origin.get(taker.pattern, '?')}), {rank}: its match at {taker.root} "
                  f"({_few(taker.members)}) became {taker.composite}")
        return attrs.evolve(site, fate="taken", detail=detail, composite=taker.composite, by=taker.pattern)

    def from_trace(self, r, function: str, at: str | None) -> list[Site]:
        """The sites of a multi-root rule: the trace's decisions (explain does not try them)."""
        return [self._decided(Site(function, e.root, e.members, ""), e) for e in self.trace.events
                if e.pattern == r.name and e.function == function and at in (None, e.root)]

    def consumed(self, r, fn: Function, sites: list[Site], kept: set[str]) -> list[Site]:
        """Sites in ``fn``, as given, that a rewrite or an earlier pass changed, and where the
        rule no longer matches (it does at the bindings ``kept``)."""
        order = {b.var.name: i for i, b in enumerate(fn.bindings)}
        out = []
        for site in sites:
            covers = {site.at, *site.members}
            if site.at in kept or any(e.rule == r.name and covers & set(e.names) for e in self.changes):
                continue  # still a site, or one this rewrite applied itself
            for e in self.changes:
                if e.function != site.function or not covers & set(e.names):
                    continue
                out.append(attrs.evolve(site, fate="consumed", detail=self._what_changed(e, site, order), by=e.rule))
                break
        return out

    @staticmethod
    def _what_changed(e, site: Site, order: dict[str, int]) -> str:
        """``by rewrite R (origin), which folded sq, var into out = nn.rms_norm``: the bindings
        of the site that ``e`` removed, and the binding it replaced that follows them (a
        rewrite replaces its match's root and removes the rest); or the ones it replaced."""
        head = f"by {_change_name(e)} ({e.origin}), which"
        covers = [*site.members, *([site.at] if site.at not in site.members else [])]
        replaced = [c for c in e.changed if c.partition(" = ")[0] in covers]
        if replaced:
            return f"{head} replaced {', '.join(c.partition(' = ')[0] for c in replaced)} (now {', '.join(replaced)})"
        removed = [m for m in covers if m in e.removed]
        last = max(order.get(m, -1) for m in removed)
        after = [c for c in e.changed if order.get(c.partition(" = ")[0], -1) > last]
        into = min(after, key=lambda c: order[c.partition(" = ")[0]], default=None)
        return f"{head} {'folded' if into else 'removed'} {', '.join(removed)}" + (f" into {into}" if into else "")

    def applied(self, r) -> list[Site]:
        """A rewrite's sites: the bindings it replaced."""
        return [Site(e.function, c.partition(" = ")[0], (), "applied", c, by=r.name)
                for e in self.trace.rewrites if e.rule == r.name for c in e.changed]


def _few(names: Sequence[str], most: int = 4) -> str:
    """Names, the first few of a long list and how many more."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{', '.join(names[:most - 1])} and {len(names) - most + 1} more"


def _change_name(e) -> str:
    return e.rule if e.rule.startswith("pass ") else f"rewrite {e.rule}"


def _binding_names(r) -> dict[int, str]:
    """id(pattern) -> name, for the rule's bindings (not its free wildcards)."""
    return {id(p): name for name, p in r.names.items() if type(p) is not n.WildcardPattern}


def _rule_in_function(r, fn: Function, at: str | None, misses: bool = True) -> tuple[list[Site], list[Miss]]:
    """Where ``r`` matches whole in ``fn`` (sites, their fate not yet known) and, unless
    ``misses`` is off, its misses elsewhere. A rewrite's site is a match its check accepts and
    whose replacement fits (a refused one is a miss, as the rewrite left it alone); a fusion
    pattern's check is fusion's to run: the trace says what it answered."""
    matcher = _Deepest(fn) if misses else Matcher(fn, reasons=False)
    names = _binding_names(r)
    every_name = {id(p): name for name, p in r.names.items()}
    by_line = {}
    for name, p in r.names.items():
        if id(p) in names:
            by_line.setdefault(_line(getattr(p, "origin", "")), name)
    users = _users(fn)
    position = {id(b.value): b.var.name for b in fn.bindings}
    roots = r.pattern.fields if r.multi_root else (r.pattern,)
    sites, out = [], []
    for b in fn.bindings:
        if at is not None and b.var.name != at:
            continue
        for root in roots:
            if misses:
                matcher.reset()
            result = matcher.match(root, b.var)
            if result:
                if r.multi_root:
                    continue  # a multi-root rule is checked on all its roots at once: not here
                ok, why = True, None
                if r.kind == "rewrite":
                    ok, why = r.check(r.view(result, users))
                    if ok:
                        ok, why = _replacement_fits(r, result, users, b)
                if ok:
                    sites.append(Site(fn.name, b.var.name, _members(result, position), ""))
                elif misses:
                    matched = tuple(name for name, p in r.names.items() if id(p) in names and p in result)
                    out.append(Miss(r.name, r.kind, "", fn.name, b.var.name, matched, len(names), why=why or "", refused=True))
                continue
            if not misses:
                continue
            _, failure, seen = matcher.best
            if failure is None:
                failure = result
            failed = by_line.get(_line(getattr(failure.pattern, "origin", "")))
            matched = tuple(name for name, p in r.names.items() if id(p) in names and name != failed and _reached(p, seen))
            out.append(Miss(r.name, r.kind, "", fn.name, b.var.name, matched, len(names), failed,
                            f"{short(failure.pattern, every_name)}  (at {getattr(failure.pattern, 'origin', '?')})",
                            _met(fn, matcher, failure.expr), f"{failure.kind}: {failure.reason}"))
    return sites, out


def _members(result, position: dict[int, str]) -> tuple[str, ...]:
    """The bindings a match covers: those its call and tuple-item sub-patterns matched, in
    binding order (what FuseOpsByPattern would put in the group)."""
    order = {name: i for i, name in enumerate(position.values())}
    names = {position[id(e)] for p, e in result.items()
             if isinstance(p, (n.CallPattern, n.TupleGetItemPattern)) and id(e) in position}
    return tuple(sorted(names, key=order.__getitem__))


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
