"""FuseOpsByPattern: matches of fusion patterns become ``Composite`` functions (TVM semantics).

Patterns run in priority order, each over the whole module, and the module is rewritten before
the next one runs, so an earlier pattern's composites are opaque calls to the later ones. For
one pattern, bindings are visited in order; a match is checked (the pattern's ``check`` sees
TVM's PatternCheckContext), then resolved against earlier matches of the same pattern (a
match overlapping an earlier group is dropped unless it contains it all). Only the bindings
that call and tuple-item sub-patterns matched join the group — never what a wildcard, a
variable or a constant matched.

Beyond TVM 0.27, which raises on a match whose fusion would create a cycle and silently turns
a swallowed intermediate into an extra output: dpl rejects such matches and says why, unless
``allow_leaks=True`` asks for TVM's extra-output behaviour. Every decision is reported to an
optional :class:`dpl.trace.Trace`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from dpl.errors import DplError
from dpl.ir.collector import paused_collector
from dpl.ir.expr import Call, Function, GlobalVar, Module, Var, frozen_call
from dpl.pattern import nodes as P
from dpl.pattern.fusion import FUNCTION_RETURN, BoundSoFar, CheckContext, FusionPattern  # noqa: F401 (FUNCTION_RETURN: documented here)
from dpl.pattern.match import Matcher
from dpl.transform.outline import FunctionTable, Group, outline_with_uses
from dpl.transform.uses import FunctionUses


class CodegenNameError(DplError):
    """A composite name without a ``prefix.`` when codegen annotation was asked for."""


def var_usages(func: Function) -> dict[Var, tuple[Var, ...]]:
    """{var: binding vars that use it}, params included, in program order; a variable the
    function returns also lists :data:`FUNCTION_RETURN` (last), so that a leak check over the
    users rejects a returned intermediate as TVM's does (there, through its non-dataflow var).
    (Check contexts read the same mapping lazily, from one index per function.)"""
    return dict(FunctionUses(func).var_usages.items())


class FunctionView:
    """What every pattern run over one version of a function shares: its use index, one
    matcher (whose cache serves every pattern) and the index behind the check contexts'
    bindings-seen-so-far views. Built once per version, never per pattern or per match."""

    def __init__(self, func: Function, uses: FunctionUses | None = None, previous: "FunctionView | None" = None):
        self.func = func
        self.uses = uses if uses is not None and uses.func is func else FunctionUses(func)
        self.bound = BoundSoFar.index(func.bindings)
        self._matcher: Matcher | None = None
        # the view of the function this one was outlined from, whose matcher's {var: value}
        # this one's is derived from (its cache is not: outlined values match differently)
        self._previous = previous if self.uses.change is not None else None

    @property
    def matcher(self) -> Matcher:
        if self._matcher is None:
            var2val = None
            previous = self._previous
            if previous is not None and previous._matcher is not None:
                # taken over, not copied: the previous view's matcher is dropped with it (its
                # function is outlined; nothing matches against it again)
                var2val = previous._matcher.var2val
                previous._matcher = None
                gone, made = self.uses.change
                for v in gone:
                    del var2val[v]
                for b in made:
                    var2val[b.var] = b.value
            self._previous = None
            self._matcher = Matcher(self.func, reasons=False, var2val=var2val)  # failed matches are skipped, unexplained
        return self._matcher

    def candidates(self, root: P.Pattern) -> list[int]:
        """Indices of the call bindings ``root`` may match (by its root ops), in order."""
        return self.uses.with_ops(P.root_ops(root))


@attrs.frozen
class Candidate:
    """One match, with its check context."""

    root: int  # binding index of the (last) root
    members: frozenset[int]  # binding indices the match pulls in, roots included
    context: CheckContext
    roots: frozenset[int] = frozenset()  # every root (several for a multi-root pattern)


# a multi-root pattern tries at most this many combinations of root bindings per function
MAX_ROOT_COMBINATIONS = 100_000


_MEMBER_KINDS = (P.CallPattern, P.TupleGetItemPattern)  # what a group takes in (never a wildcard's value)


def _members(m, position, func, first: dict) -> tuple[set[int], dict]:
    members, matched = set(), dict(first)
    where = position.get
    bindings = func.bindings
    for p, e in m.items():
        if isinstance(p, _MEMBER_KINDS):
            j = where(id(e))
            if j is not None:
                members.add(j)
                matched[bindings[j].var] = e
    return members, matched


def matches(pattern: FusionPattern, func: Function, taken=None, view: FunctionView | None = None) -> Iterable[Candidate]:
    """Every match of ``pattern`` rooted at a call binding of ``func``, in binding order.
    ``taken(i)`` says binding ``i`` already belongs to a group: a multi-root combination with a
    taken root is not tried at all (it could only be rejected, once per ordering of its roots).
    ``view`` is ``func``'s shared :class:`FunctionView` (made here when not given)."""
    view = view if view is not None and view.func is func else FunctionView(func)
    if pattern.multi_root:
        yield from _multi_root_matches(pattern, view, taken or (lambda i: False))
        return
    bindings = func.bindings
    position = view.uses.position
    matcher = view.matcher
    usages = view.uses.var_usages
    for i in view.candidates(pattern.pattern):
        b = bindings[i]
        m = matcher.match(pattern.pattern, b.value)
        if not m:
            continue
        members, matched = _members(m, position, func, {b.var: b.value})
        ctx = CheckContext(b.value, pattern.annotated(m), matched, usages, BoundSoFar(view.bound, i), m)
        yield Candidate(i, frozenset(members | {i}), ctx, frozenset({i}))


def _multi_root_matches(pattern: FusionPattern, view: FunctionView, taken) -> Iterable[Candidate]:
    """Beyond TVM: each root of a tuple pattern matched to its own binding, jointly (shared
    sub-patterns bind one value), combinations tried in binding order of their last root (then
    in order of the whole tuple), made lazily so that roots taken meanwhile are skipped."""
    import itertools

    from dpl.ir.expr import Tuple

    func = view.func
    roots = pattern.pattern.fields
    position = view.uses.position
    matcher = view.matcher
    usages = view.uses.var_usages
    options = []
    for r in roots:
        options.append([i for i in view.candidates(r) if matcher.match(r, func.bindings[i].value)])
    budget = MAX_ROOT_COMBINATIONS
    for last in sorted(set().union(*options)):
        if taken(last):
            continue
        combos = set()
        before = [[i for i in o if i < last] for o in options]
        for slot, opts in enumerate(options):
            if last not in opts:
                continue
            earlier = list(before)
            earlier[slot] = [last]
            combos.update(c for c in itertools.product(*earlier) if len(set(c)) == len(c))
        for combo in sorted(combos):
            if budget == 0:
                return
            if any(taken(i) for i in combo):
                continue
            budget -= 1
            joint = Tuple(tuple(func.bindings[i].var for i in combo))
            m = matcher.match(pattern.pattern, joint)
            if not m:
                continue
            members, matched = _members(m, position, func, {func.bindings[i].var: func.bindings[i].value for i in combo})
            ctx = CheckContext(joint, pattern.annotated(m), matched, usages, BoundSoFar(view.bound, last), m)
            yield Candidate(last, frozenset(members | set(combo)), ctx, frozenset(combo))


class _Partition:
    """Groups of one pattern over one function, with TVM's overlap rule and dpl's safety rules."""

    def __init__(self, view: FunctionView, pattern: FusionPattern, allow_leaks: bool, trace):
        self.view, self.func, self.pattern, self.allow_leaks, self.trace = view, view.func, pattern, allow_leaks, trace
        self.group_of: dict[int, int] = {}  # binding index -> group id (its root's index)
        self.groups: dict[int, set[int]] = {}
        self.group_attrs: dict[int, dict] = {}
        self.returned = view.uses.returned
        self.users = view.uses.users  # binding index -> the bindings that read it

    def name(self, i: int) -> str:
        return self.func.bindings[i].var.name

    def report(self, cand: Candidate, accepted: bool, reason: str | None = None) -> None:
        if self.trace is not None:
            members = tuple(self.name(i) for i in sorted(cand.members))
            self.trace.record(self.pattern.name, self.func.name, self.name(cand.root), members, accepted, reason)

    def run(self) -> list[Group]:
        for cand in matches(self.pattern, self.func, taken=lambda i: i in self.group_of, view=self.view):
            self.consider(cand)
        groups = []
        for gid, members in sorted(self.groups.items(), key=lambda kv: max(kv[1])):
            groups.append(Group(tuple(sorted(members)), self.group_attrs[gid]))
        return groups

    def consider(self, cand: Candidate) -> None:
        verdict = self.pattern.run_check(cand.context)
        if not verdict:
            if self.trace is not None:  # the reason is worded only for a trace
                self.report(cand, False, f"check said no: {verdict.reason}")
            return
        absorbed: set[int] = set()
        for i in cand.members - {cand.root}:
            gid = self.group_of.get(i)
            if gid is None:
                continue
            if not self.groups[gid] <= cand.members:
                if self.trace is not None:
                    earlier = ", ".join(self.name(j) for j in sorted(self.groups[gid]))
                    self.report(cand, False, f"overlaps an earlier match of this pattern ({earlier}) without containing it")
                return
            absorbed.add(gid)
        taken = [r for r in cand.roots if r in self.group_of]
        if taken:
            self.report(cand, False, f"its root {self.name(taken[0])} is already in an earlier match")
            return
        leak = self.leak(cand, self.declared_outputs(cand))
        if leak is not None and not self.allow_leaks:
            self.report(cand, False, leak)
            return
        cycle = self.cycle(cand, absorbed)
        if cycle is not None:
            self.report(cand, False, cycle)
            return
        gid = cand.root
        members = set(cand.members)
        for old in absorbed:
            members |= self.groups.pop(old)
            self.group_attrs.pop(old)
        self.groups[gid] = members
        self.group_attrs[gid] = self.composite_attrs(cand)
        for i in members:
            self.group_of[i] = gid
        self.report(cand, True)

    def composite_attrs(self, cand: Candidate) -> dict:
        extra = {}
        if self.pattern.attrs_getter is not None:
            extra = dict(self.pattern.attrs_getter(cand.context.annotated_expr) or {})
        return {"Composite": self.pattern.name, **extra}

    def declared_outputs(self, cand: Candidate) -> set[int]:
        """Binding indices of the intermediates the pattern declares as outputs."""
        m = cand.context.match
        values = {id(m[p]) for p in self.pattern.outputs if p in m}
        return {i for i in cand.members if id(self.func.bindings[i].value) in values}

    def leak(self, cand: Candidate, declared: set[int] = frozenset()) -> str | None:
        """An intermediate of the match that is used outside it (or returned), if any."""
        for i in sorted(cand.members - cand.roots - declared):
            if id(self.func.bindings[i].var) in self.returned:
                return f"its intermediate {self.name(i)} is returned by '{self.func.name}' (allow_leaks=True exports it)"
            outside = [u for u in self.users[i] if u not in cand.members]
            if outside:
                return f"its intermediate {self.name(i)} is also used by {self.name(outside[0])} (allow_leaks=True exports it)"
        return None

    def cycle(self, cand: Candidate, absorbed: set[int]) -> str | None:
        """A path that leaves the would-be group and comes back into it, through bindings or
        through other groups (which will become single calls)."""
        members = set(cand.members)
        for gid in absorbed:
            members |= self.groups[gid]
        last = max(members)
        stack = [(u, i) for i in members for u in self.users[i] if u not in members]
        seen: set[int] = set()
        while stack:
            node, src = stack.pop()
            if node in seen or node > last:
                continue
            seen.add(node)
            gid = self.group_of.get(node)
            nexts = self.groups[gid] if gid is not None and gid not in absorbed else {node}
            for n in nexts:
                for u in self.users[n]:
                    if u in members:
                        return (f"fusing it would create a cycle: {self.name(src)} leaves the match and "
                                f"comes back through {self.name(node)} into {self.name(u)}")
                    stack.append((u, src))
                if n != node:
                    seen.add(n)
        return None


def _roots(pattern: FusionPattern) -> tuple[P.Pattern, ...]:
    return pattern.pattern.fields if pattern.multi_root else (pattern.pattern,)


def _entry_functions(mod: Module, entry_functions: Sequence[str] | None) -> list[str]:
    if entry_functions is not None:
        for name in entry_functions:
            if name not in mod.functions:
                raise DplError(f"entry function '{name}' is not in the module (it has: {', '.join(mod.functions)})")
        return list(entry_functions)
    return [n for n, f in mod.functions.items() if not any(k in f.attrs for k in ("Primitive", "Composite", "Codegen"))]


def fuse_ops_by_pattern(mod: Module, patterns: Sequence[FusionPattern], bind_constants: bool = True,
                        annotate_codegen: bool = False, entry_functions: Sequence[str] | None = None,
                        allow_leaks: bool = False, trace=None) -> Module:
    """Composite functions for the matches of ``patterns`` (see the module docstring)."""
    patterns = list(patterns)
    if annotate_codegen:
        for p in patterns:
            if p.codegen is None:
                raise CodegenNameError(f"pattern '{p.name}' has no codegen prefix (a name such as 'cublas.{p.name}')",
                                       hint="annotate_codegen takes the backend from the part of the name before the first '.'")
    names = _entry_functions(mod, entry_functions)
    with paused_collector():  # see dpl.ir.collector: the collector would make the pass superlinear
        mod = _fuse(mod, patterns, names, bind_constants, allow_leaks, trace)
        if annotate_codegen:
            mod = annotate_codegen_functions(mod, names)
    return mod


def _fuse(mod: Module, patterns: Sequence[FusionPattern], names: list[str], bind_constants: bool, allow_leaks: bool, trace) -> Module:
    views: dict[str, FunctionView] = {}  # per entry function, until a pattern changes it
    for pattern in patterns:
        table = FunctionTable(mod)
        changed = False
        for name in names:
            func = table.functions[name]
            view = views.get(name)
            if view is None or view.func is not func:
                view = views[name] = FunctionView(func)
            if not any(view.candidates(root) for root in _roots(pattern)):
                continue  # no binding calls an op the pattern's root could match
            start = len(trace.events) if trace is not None else 0
            groups = _Partition(view, pattern, allow_leaks, trace).run()
            if groups:
                func, uses = outline_with_uses(func, groups, table, lift_constants=not bind_constants, uses=view.uses)
                if trace is not None:  # which composite function each accepted match became
                    trace.name_composites(start, func)
                table.functions[name] = func
                if uses is not None:  # the next pattern asks about the outlined function: no rescan
                    views[name] = FunctionView(func, uses, previous=view)
                changed = True
        if changed:
            mod = table.module()
    return mod


def annotate_codegen_functions(mod: Module, callers: Sequence[str]) -> Module:
    """Wrap each composite call in a function ``{Codegen: prefix, global_symbol: name}`` named
    ``<composite function>_<prefix>`` that calls the composite (which loses ``Primitive``)."""
    from dpl.ir.expr import Binding
    from dpl.ops.registry import call_function

    functions = dict(mod.functions)
    wrappers: dict[str, GlobalVar] = {}  # composite function -> its wrapper (one GlobalVar for every call)
    for name, fn in mod.functions.items():
        if "Composite" in fn.attrs and "Primitive" in fn.attrs:
            functions[name] = attrs.evolve(fn, attrs={k: v for k, v in fn.attrs.items() if k != "Primitive"})
    for caller in callers:
        func = functions[caller]
        new_bindings = []
        changed = False
        for b in func.bindings:
            v = b.value
            if isinstance(v, Call) and isinstance(v.op, GlobalVar) and "Composite" in mod.functions[v.op.name].attrs:
                comp = functions[v.op.name]
                if v.op.name not in wrappers:
                    prefix = comp.attrs["Composite"].split(".", 1)[0]
                    wname, k = f"{v.op.name}_{prefix}", 0
                    while wname in functions:
                        k += 1
                        wname = f"{v.op.name}_{prefix}{k}"
                    params = [Var(p.name, p.ty) for p in comp.params]
                    out = Var("output", comp.ret_type)
                    body = [Binding(out, call_function(GlobalVar(v.op.name), params, comp.ret_type))]
                    functions[wname] = Function(wname, params, body, out, {"Codegen": prefix, "global_symbol": wname})
                    wrappers[v.op.name] = GlobalVar(wname)
                new_bindings.append(Binding(b.var, frozen_call(wrappers[v.op.name], v.args, v.attrs, v.ty)))
                changed = True
            else:
                new_bindings.append(b)
        if changed:
            functions[caller] = attrs.evolve(func, bindings=tuple(new_bindings))
    return Module(functions)
