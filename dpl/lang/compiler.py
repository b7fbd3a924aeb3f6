"""Compile ``.dpl`` syntax trees into DPL pattern objects, checks and rewrite rules.

The rules of the language live here:

* a name bound in the body is that binding's pattern; a name that nothing binds is a wildcard;
  every use of a name is the *same* pattern object, so it must match the same value;
* the root is the binding that no other binding consumes;
* ``op?(x, ...)`` is ``op(x, ...)`` when present, else ``x``;
* a pattern's name is ``prefix.name`` with the prefix of the ``codegen`` line above it, unless
  the name is already dotted;
* priority is file order; ``priority N`` moves a rule ahead of those with a lower number
  (the default is 0), keeping file order among equals.

Every semantic error of a file is collected and reported together.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from dpl import dtypes
from dpl.errors import DplError, Span
from dpl.ir.builder import const
from dpl.ir.expr import Expr, Tuple, TupleGetItem, Var
from dpl.lang import ast
from dpl.lang.expand import MAX_VARIANTS, VARIANTS_COUNTED, Scope, apply_equivs, check_def, check_equiv, count_variants, expand_macros
from dpl.lang.hooks import ask_hook, lookup_hook
from dpl.lang.predicates import Compiled, MatchView, PredicateCompiler, compile_conjunct, conjuncts, evaluate
from dpl.ops.registry import REQUIRED, get_op, make_call
from dpl.pattern import nodes as P
from dpl.pattern.fusion import FusionPattern, PatternSet, RewriteRule
from dpl.pattern.match import Match, NoMatch


class LangError(DplError):
    """A semantic error in a ``.dpl`` file."""


class UndefinedNameError(LangError):
    pass


class UnusedNameError(LangError):
    pass


class DuplicateNameError(LangError):
    pass


class DuplicatePatternError(LangError):
    pass


class UnknownCheckHookError(LangError):
    pass


class BindingCycleError(LangError):
    pass


class MissingCodegenError(LangError):
    pass


class RootError(LangError):
    pass


class DplErrors(DplError):
    """Several errors of one file, reported together."""

    def __init__(self, errors: list[DplError]):
        self.errors = sorted(errors, key=lambda e: (e.span.file, e.span.line, e.span.col) if e.span else ("", 0, 0))
        super().__init__(f"{len(self.errors)} errors")

    def __str__(self) -> str:
        body = "\n".join(str(e) for e in self.errors)
        return f"{body}\n{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"


@attrs.frozen
class Rule:
    """What one ``pattern`` or ``rewrite`` declaration compiled to."""

    kind: str  # "pattern" or "rewrite"
    name: str  # full name: "cublas.matmul_bias"
    pattern: P.Pattern  # the root's pattern
    names: Mapping[str, P.Pattern]  # every named pattern, to read a match by name
    annotations: Mapping[str, P.Pattern]
    predicates: tuple[tuple[Compiled, Span], ...]
    hooks: tuple[tuple[str, Callable], ...]
    replacement: Callable[[MatchView, Callable[[Expr], Expr]], Expr] | None
    priority: int
    doc: str | None
    span: Span
    ops: tuple[str, ...]  # the ops the pattern mentions, in order
    outputs: tuple[P.Pattern, ...] = ()  # intermediates the fused function also returns
    multi_root: bool = False  # several unconsumed bindings: ``pattern`` is the tuple of the roots
    variants: int = 1  # how many plain patterns this one stands for (alternatives, optional ops, equivalences)

    @property
    def codegen(self) -> str | None:
        return self.name.split(".", 1)[0] if "." in self.name else None

    @property
    def root_op(self) -> str:
        if self.multi_root:
            return ",".join("|".join(sorted(P.root_ops(r) or {"*"})) for r in self.pattern.fields)
        roots = P.root_ops(self.pattern)
        return "|".join(sorted(roots)) if roots else "*"

    def view(self, match: Mapping[P.Pattern, Expr], users=None, users_from=None) -> MatchView:
        if isinstance(match, Match):
            match = match.as_dict()  # its dict's lookups, not the Mapping protocol's per name
        exprs = {name: match[pat] for name, pat in self.names.items() if pat in match}
        return MatchView(exprs, users, users_from)

    def check(self, view: MatchView) -> tuple[bool, str | None]:
        """Run the ``where`` predicates and the hooks: (accepted, reason when not)."""
        failure = self.first_failure(view)
        return (True, None) if failure is None else (False, failure())

    def first_failure(self, view: MatchView) -> Callable[[], str] | None:
        """Run the ``where`` predicates and the hooks: None when all hold, else a function
        that words the first failure (called only by whoever reports it: most rejections of a
        large module are never read)."""
        for pred, span in self.predicates:
            ok, why = evaluate(pred, view)
            if not ok:
                return lambda: _predicate_failure(pred, span, why, view)
        for name, hook in self.hooks:
            answer = ask_hook(name, hook, view, self.name, self.span)
            if not answer:
                return lambda: _hook_failure(name, answer)
        return None


def _predicate_failure(pred, span: Span, why: str | None, view: MatchView) -> str:
    where = getattr(pred, "text", None) or (span.source_line.strip() if span.source_line else "where clause")
    values = pred.values(view) if hasattr(pred, "values") else ""
    return f"{span}: '{where}' does not hold" + (f" ({why})" if why else "") + (f": {values}" if values else "")


def _hook_failure(name: str, answer) -> str:
    reason = getattr(answer, "reason", None)
    reason = reason() if callable(reason) else reason
    return f"check hook '{name}' said no" + (f": {reason}" if reason else "")


@attrs.frozen
class CompiledFile:
    path: str
    rules: tuple[Rule, ...]


# -- what rules become: the DPL objects FuseOpsByPattern and rewriting consume ---------------


def _users_from(ctx):
    """users(expr) over a fusion CheckContext: the values of the bindings that use ``expr``
    (a user whose binding the context has not reached yet is its variable)."""
    bound = ctx.value_to_bound_var
    value_of = getattr(bound, "value_of", None)

    def users(e: Expr) -> list:
        nonlocal value_of
        var = e if isinstance(e, Var) else bound.get(e)
        if var is None:
            return []
        if value_of is None:  # a plain mapping: index it once, on first use
            index = {id(v): value for value, v in bound.items()}
            value_of = lambda u: index.get(id(u))  # noqa: E731
        return [value_of(u) or u for u in ctx.var_usages.get(var, ())]

    return users


def fusion_pattern(rule: Rule) -> FusionPattern:
    """A ``pattern`` rule as TVM's FusionPattern; its check runs the where clauses and hooks."""

    def check(ctx) -> bool | NoMatch:
        failure = rule.first_failure(rule.view(ctx.match, users_from=lambda: _users_from(ctx)))
        return True if failure is None else NoMatch(rule.pattern, ctx.matched_expr, "check", failure)

    has_check = bool(rule.predicates or rule.hooks)
    return FusionPattern(rule.name, rule.pattern, rule.annotations, check if has_check else None, outputs=rule.outputs,
                         multi_root=rule.multi_root, origin=_origin(rule.span))


def rewrite_rule(rule: Rule) -> RewriteRule:
    """A ``rewrite`` rule; a replacement that cannot be built or does not keep the type of
    the value it replaces means "no match" (a library rule never breaks a module)."""

    def rewriter(value: Expr, match) -> Expr | None:
        view = rule.view(match)
        if rule.first_failure(view) is not None:
            return None
        try:
            new = rule.replacement(view, lambda e: e)
        except DplError:
            return None
        return new if new.ty == value.ty else None

    return RewriteRule(rule.name, rule.pattern, rewriter, origin=_origin(rule.span), span=rule.span)


def pattern_set(rules) -> PatternSet:
    return PatternSet(
        tuple(fusion_pattern(r) for r in rules if r.kind == "pattern"),
        tuple(rewrite_rule(r) for r in rules if r.kind == "rewrite"),
    )


# -- the compiler ------------------------------------------------------------------------------


class ImportError_(LangError):
    """An import that cannot be resolved, or a cycle of imports."""


def compile_file(tree: ast.File, resolver=None) -> CompiledFile:
    """Compile a file; ``resolver(import_decl, importing_file) -> (key, ast.File)`` reads
    imported files (see :func:`dpl.lang.load_rules`)."""
    errors: list[DplError] = []
    rules = _Unit(resolver, errors).compile(tree, Scope(), ())
    seen: dict[str, Span] = {}
    unique = []
    for rule in rules:
        if rule.name in seen:
            errors.append(DuplicatePatternError(f"{rule.kind} '{rule.name}' is already defined at {seen[rule.name]}", rule.span))
            continue
        seen[rule.name] = rule.span
        unique.append(rule)
    if errors:
        raise errors[0] if len(errors) == 1 else DplErrors(errors)
    order = sorted(range(len(unique)), key=lambda i: (-unique[i].priority, i))
    return CompiledFile(tree.path, tuple(unique[i] for i in order))


class _Unit:
    """Compiles a file and, through the resolver, what it imports (each file once)."""

    def __init__(self, resolver, errors: list[DplError]):
        self.resolver, self.errors = resolver, errors
        self.done: dict[str, Scope] = {}

    def compile(self, tree: ast.File, scope: Scope, stack: tuple[str, ...]) -> list[Rule]:
        rules: list[Rule] = []
        prefix: str | None = None
        for decl in tree.decls:
            if isinstance(decl, ast.CodegenDecl):
                prefix = decl.name
            elif isinstance(decl, ast.ImportDecl):
                rules.extend(self._import(decl, tree.path, scope, stack))
            elif isinstance(decl, ast.DefDecl):
                check_def(decl, scope, self.errors)
            elif isinstance(decl, ast.EquivDecl):
                if check_equiv(decl, self.errors):
                    scope.equivs.append(decl)
            else:
                rule = _DeclCompiler(decl, prefix, scope, self.errors).compile()
                if rule is not None:
                    rules.append(rule)
        return rules

    def _import(self, decl: ast.ImportDecl, importer: str, scope: Scope, stack: tuple[str, ...]) -> list[Rule]:
        if self.resolver is None:
            self.errors.append(ImportError_("imports need a file to resolve them against", decl.span))
            return []
        try:
            key, tree = self.resolver(decl, importer)
        except DplError as err:
            self.errors.append(err.with_span(decl.span))
            return []
        if key in stack or key == importer:
            chain = " -> ".join((*stack, importer, key)) if importer not in stack else " -> ".join((*stack, key))
            self.errors.append(ImportError_(f"import cycle: {chain}", decl.span))
            return []
        if key in self.done:  # imported before: its definitions, not its rules again
            _merge(scope, self.done[key])
            return []
        inner = Scope()
        rules = self.compile(tree, inner, (*stack, importer))
        self.done[key] = inner
        _merge(scope, inner)
        return rules


_DYNAMIC = object()


def _static_value(p) -> Any:
    """The value of a replacement attribute written as a literal or a list of literals, else
    _DYNAMIC (computed from the match when the rule fires)."""
    if isinstance(p, ast.PLiteral):
        return p.value
    if isinstance(p, ast.PList):
        items = [_static_value(i) for i in p.items]
        return _DYNAMIC if any(i is _DYNAMIC for i in items) else tuple(items)
    return _DYNAMIC


def _merge(scope: Scope, other: Scope) -> None:
    for name, d in other.macros.items():
        scope.macros.setdefault(name, d)
    scope.equivs.extend(e for e in other.equivs if e not in scope.equivs)


def _origin(span: Span) -> str:
    return f"{span.file}:{span.line}:{span.col}"


class _DeclCompiler:
    def __init__(self, decl: ast.PatternDecl, prefix: str | None, scope: Scope, errors: list[DplError]):
        self.decl, self.prefix, self.errors = decl, prefix, errors
        self.n_errors = len(errors)
        body = decl.body
        self.variants = 1
        expanded = []
        for b in body.bindings:
            value = expand_macros(b.value, scope, errors)
            value, _ = apply_equivs(value, scope.equivs)
            self.variants = min(self.variants * count_variants(value), VARIANTS_COUNTED)
            expanded.append(attrs.evolve(b, value=value))
        if self.variants > MAX_VARIANTS:
            count = f"more than {VARIANTS_COUNTED - 1}" if self.variants >= VARIANTS_COUNTED else str(self.variants)
            self.err(LangError, f"{decl.kind} '{decl.name}' expands into {count} variants (the limit is {MAX_VARIANTS})", decl.span,
                     hint="write the pattern more specifically, or split it")
        self.memo: dict[int, P.Pattern] = {}
        self.bindings: dict[str, ast.Binding] = {}
        for b in expanded:
            if b.name == "_":
                self.err(DuplicateNameError, "'_' cannot be bound", b.span)
            elif b.name in self.bindings:
                first = self.bindings[b.name].span
                self.err(DuplicateNameError, f"'{b.name}' is bound twice (first at line {first.line})", b.span)
            else:
                self.bindings[b.name] = b
        self.free: dict[str, Span] = {}  # names used but not bound: wildcards
        self.deps: dict[str, list[str]] = {name: [] for name in self.bindings}
        self.ops: list[str] = []
        self.scanned: set[tuple[int, str]] = set()
        for b in self.bindings.values():
            self._scan(b.value, b.name)
        self.types: dict[str, list[ast.TypePat]] = {}
        for a in body.annotations:
            if a.name not in self.bindings and a.name not in self.free:
                self.err(UnusedNameError, f"'{a.name}' is annotated but not used in the pattern", a.span)
            self.types.setdefault(a.name, []).append(a.type)
        self.final: dict[str, P.Pattern] = {}
        self.building: list[str] = []

    def err(self, cls, message: str, span: Span, hint: str | None = None) -> None:
        self.errors.append(cls(message, span, hint))

    @property
    def failed(self) -> bool:
        return len(self.errors) > self.n_errors

    # -- names and ops --------------------------------------------------------------------
    def _scan(self, e: ast.PExpr, owner: str) -> None:
        # equivalences and macros share nodes (a placeholder used twice): visit each once, so
        # that a pattern of nested sites costs linear time, not exponential
        if (id(e), owner) in self.scanned:
            return
        self.scanned.add((id(e), owner))
        if isinstance(e, ast.Ref):
            if e.name in self.bindings:
                self.deps[owner].append(e.name)
            else:
                self.free.setdefault(e.name, e.span)
        elif isinstance(e, ast.Call):
            self.ops.append(e.op)
            self._check_call(e)
            for a in e.args:
                self._scan(a, owner)
        elif isinstance(e, (ast.Alt, ast.Both)):
            self._scan(e.left, owner)
            self._scan(e.right, owner)
        elif isinstance(e, ast.Not):
            self._scan(e.operand, owner)
        elif isinstance(e, ast.TuplePat):
            for f in e.fields:
                self._scan(f, owner)
        elif isinstance(e, ast.Item):
            self._scan(e.base, owner)

    def _check_call(self, c: ast.Call) -> None:
        try:
            op = get_op(c.op)
        except DplError as e:
            self.errors.append(e.with_span(c.span))
            return
        lo, hi = op.num_args
        n = len(c.args)
        if c.optional and n == 0:
            self.err(LangError, f"optional '{c.op}?' needs the operand it may be skipped to", c.span)
        if (hi >= 0 and n > hi) or (n < lo and not c.rest):
            want = str(lo) if lo == hi else f"{lo} to {hi}" if hi >= 0 else f"at least {lo}"
            from dpl.errors import ArityError

            self.err(ArityError, f"op '{c.op}' takes {want} argument{'s' if want != '1' else ''}, got {n}", c.span)
        for key, value, span in c.kwargs:
            if key not in op.attrs:
                from dpl.errors import UnknownAttributeError

                known = ", ".join(op.attrs) or "none"
                self.err(UnknownAttributeError, f"op '{c.op}' has no attribute '{key}' (its attributes: {known})", span)
            elif value is not ast.ATTR_ANY:
                try:
                    op.attrs[key].convert(c.op, key, value)
                except DplError as e:
                    self.errors.append(e.with_span(span))

    # -- building patterns ------------------------------------------------------------------
    def name_pattern(self, name: str, span: Span) -> P.Pattern:
        if name in self.final:
            return self.final[name]
        if name in self.building:
            cycle = self.building[self.building.index(name):] + [name]
            self.err(BindingCycleError, f"bindings form a cycle: {' -> '.join(cycle)}", self.bindings[name].span)
            return P.WildcardPattern(origin=_origin(span))
        if name in self.bindings:
            self.building.append(name)
            base = self.expr(self.bindings[name].value)
            self.building.pop()
        else:
            base = P.WildcardPattern(origin=_origin(self.free.get(name, span)))
        pat = self._annotate(name, base)
        self.final[name] = pat
        return pat

    def _annotate(self, name: str, pat: P.Pattern) -> P.Pattern:
        for t in self.types.get(name, ()):
            if t.const:
                pat = P.ConstantPattern(None, origin=_origin(t.span)) if isinstance(pat, P.WildcardPattern) else pat & P.ConstantPattern(None, origin=_origin(t.span))
            if t.dtype is not None:
                pat = P.DTypePattern(pat, t.dtype, origin=_origin(t.span))
            if t.dims is not None:
                pat = P.ShapePattern(pat, tuple(t.dims), origin=_origin(t.span))
        return pat

    def expr(self, e: ast.PExpr) -> P.Pattern:
        # one syntax node -> one pattern object, also where equivalences reuse a node twice
        if id(e) in self.memo:
            return self.memo[id(e)]
        pat = self._expr(e)
        if not isinstance(e, ast.Ref):
            self.memo[id(e)] = pat
        return pat

    def _expr(self, e: ast.PExpr) -> P.Pattern:
        if isinstance(e, ast.Ref):
            return self.name_pattern(e.name, e.span)
        if isinstance(e, ast.Anything):
            return P.WildcardPattern(origin=_origin(e.span))
        if isinstance(e, ast.AnyConst):
            return P.ConstantPattern(None, origin=_origin(e.span))
        if isinstance(e, ast.Literal):
            import numpy as np

            value = np.asarray(e.value, dtype=dtypes.to_numpy(e.dtype) if e.dtype else None)
            value.setflags(write=False)
            pat = P.ConstantPattern(value, origin=_origin(e.span))
            return P.DTypePattern(pat, e.dtype, origin=_origin(e.span)) if e.dtype else pat
        if isinstance(e, ast.Call):
            return self._call(e)
        if isinstance(e, ast.Alt):
            return P.OrPattern(self.expr(e.left), self.expr(e.right), origin=_origin(e.span))
        if isinstance(e, ast.Both):
            return P.AndPattern(self.expr(e.left), self.expr(e.right), origin=_origin(e.span))
        if isinstance(e, ast.Not):
            return P.NotPattern(self.expr(e.operand), origin=_origin(e.span))
        if isinstance(e, ast.TuplePat):
            return P.TuplePattern(tuple(self.expr(f) for f in e.fields), origin=_origin(e.span))
        if isinstance(e, ast.Item):
            return P.TupleGetItemPattern(self.expr(e.base), e.index, origin=_origin(e.span))
        raise AssertionError(e)

    def _call(self, c: ast.Call) -> P.Pattern:
        args = [self.expr(a) for a in c.args]
        attrs_ = {}
        if not self.failed:
            op = get_op(c.op)
            attrs_ = {k: op.attrs[k].convert(c.op, k, v) for k, v, _ in c.kwargs if v is not ast.ATTR_ANY}
        callee = P.OpPattern(c.op, origin=_origin(c.span))
        call = P.CallPattern(callee, tuple(args), attrs_, c.rest, origin=_origin(c.span))
        if c.optional and args:
            return P.OptionalPattern(args[0], call, origin=_origin(c.span))
        return call

    # -- the declaration ----------------------------------------------------------------------
    def full_name(self) -> str | None:
        d = self.decl
        if "." in d.name or d.kind == "rewrite":
            return d.name
        if self.prefix is None:
            self.err(MissingCodegenError, f"pattern '{d.name}' has no codegen prefix", d.span,
                     hint=f"write 'codegen <backend>' above it, or name it '<backend>.{d.name}'")
            return None
        return f"{self.prefix}.{d.name}"

    def roots(self) -> list[str]:
        used = {dep for deps in self.deps.values() for dep in deps}
        return [n for n in self.bindings if n not in used]

    def compile(self) -> Rule | None:
        d = self.decl
        name = self.full_name()
        if not self.bindings:
            self.err(RootError, f"{d.kind} '{d.name}' binds nothing", d.span, hint="write at least one binding such as 'out = nn.relu(x)'")
            return None
        for n in self.bindings:  # builds every binding, reporting cycles
            self.name_pattern(n, self.bindings[n].span)
        roots = self.roots()
        if not roots and not self.failed:
            self.err(BindingCycleError, f"{d.kind} '{d.name}' has no root: every binding is consumed by another", d.span)
        elif len(roots) > 1 and d.kind == "rewrite":
            names = ", ".join(f"'{r}'" for r in roots)
            self.err(RootError, f"rewrite '{d.name}' has several roots ({names}); nothing consumes them", self.bindings[roots[1]].span,
                     hint="a rewrite replaces one value: the binding no other binding consumes")
        for r in roots:  # a root that only renames a wildcard would claim every value of the module
            value = self.bindings[r].value
            if isinstance(value, ast.Ref) and value.name not in self.bindings:
                self.err(RootError, f"'{r} = {value.name}' makes a root of '{value.name}', which nothing binds: it would "
                                    f"match every value", self.bindings[r].span,
                         hint=f"bind '{r}' to an op call (e.g. '{r} = nn.relu({value.name})'), or use '{value.name}' as an "
                              f"argument of another binding")
        known = set(self.bindings) | set(self.free)
        preds = PredicateCompiler(known, self.errors)
        # each conjunct of a where clause checked (and reported) on its own
        predicates = tuple((compile_conjunct(preds, c), c.span) for w in d.body.wheres for c in conjuncts(w))
        annotations = {}
        for key, ref, span in d.body.annotates:
            if ref not in known:
                self.err(UndefinedNameError, f"undefined name '{ref}' in annotate", span)
            elif key in annotations:
                self.err(DuplicateNameError, f"annotation '{key}' is given twice", span)
            else:
                annotations[key] = self.final.get(ref) or self.name_pattern(ref, span)
        hooks = []
        for hook_name, span in d.body.checks:
            hook = lookup_hook(hook_name)
            if hook is None:
                self.err(UnknownCheckHookError, f"unknown check hook '{hook_name}'", span,
                         hint="register it from Python with @dpl.check_hook(\"" + hook_name + "\") before loading the file")
            else:
                hooks.append((hook_name, hook))
        outputs = []
        for out_name, span in d.body.outputs:
            if out_name not in self.bindings:
                self.err(UndefinedNameError, f"'{out_name}' in outputs is not a binding of the pattern", span)
            elif d.kind == "rewrite":
                self.err(LangError, "a rewrite has no outputs: its replacement takes the root's place", span)
            else:
                outputs.append(self.final[out_name])
        replacement = _ReplCompiler(self, known).compile(d.replacement) if d.replacement is not None else None
        if self.failed or name is None:
            return None
        root = self.final[roots[0]]
        if len(roots) > 1:  # a graph pattern: every root is matched, each to its own binding
            root = P.TuplePattern(tuple(self.final[r] for r in roots), origin=_origin(d.span))
        return Rule(
            d.kind, name, root, dict(self.final), annotations, predicates, tuple(hooks), replacement,
            d.body.priority or 0, d.doc, d.span, tuple(dict.fromkeys(self.ops)), tuple(outputs), len(roots) > 1, self.variants,
        )


class _ReplCompiler:
    """Replacement syntax -> a function building the new expression from a match."""

    def __init__(self, decl: _DeclCompiler, known: set[str]):
        self.decl, self.known = decl, known
        self.preds = PredicateCompiler(known, decl.errors)

    def compile(self, r: ast.Repl):
        if isinstance(r, ast.RRef):
            if r.name not in self.known:
                self.decl.err(UndefinedNameError, f"undefined name '{r.name}' in replacement", r.span,
                              hint="a replacement can use the names the pattern binds or leaves free")
            name = r.name
            return lambda view, as_var: as_var(view.expr(name))
        if isinstance(r, ast.RLiteral):
            value, dtype = r.value, r.dtype
            return lambda view, as_var: const(value, dtype)
        if isinstance(r, ast.RTuple):
            fields = [self.compile(f) for f in r.fields]
            return lambda view, as_var: Tuple(tuple(f(view, as_var) for f in fields))
        if isinstance(r, ast.RItem):
            base, index = self.compile(r.base), r.index
            return lambda view, as_var: TupleGetItem(base(view, as_var), index)
        if isinstance(r, ast.RCall):
            return self._call(r)
        raise AssertionError(r)

    def _call(self, r: ast.RCall):
        args = [self.compile(a) for a in r.args]
        kwargs = [(k, self.preds.compile(v), span) for k, v, span in r.kwargs]
        try:
            op = get_op(r.op)
        except DplError as e:
            self.decl.errors.append(e.with_span(r.span))
            return lambda view, as_var: None
        from dpl.errors import ArityError, UnknownAttributeError

        lo, hi = op.num_args
        if len(args) < lo or (hi >= 0 and len(args) > hi):
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            self.decl.err(ArityError, f"op '{r.op}' takes {want} argument{'s' if want != '1' else ''}, got {len(args)}", r.span)
        for (k, _, span), (_, written, _) in zip(kwargs, r.kwargs):
            if k not in op.attrs:
                known = ", ".join(op.attrs) or "none"
                self.decl.err(UnknownAttributeError, f"op '{r.op}' has no attribute '{k}' (its attributes: {known})", span)
                continue
            value = _static_value(written)
            if value is not _DYNAMIC:  # a value written out is checked now, not at each rewrite
                try:
                    op.attrs[k].convert(r.op, k, value)
                except DplError as err:
                    self.decl.errors.append(err.with_span(span))
        missing = [k for k, spec in op.attrs.items() if spec.default is REQUIRED and k not in {k for k, _, _ in kwargs}]
        if missing:
            self.decl.err(LangError, f"op '{r.op}' needs attribute '{missing[0]}'", r.span)
        name = r.op

        def build(view, as_var):
            values = {k: v(view) for k, v, _ in kwargs}
            return make_call(name, [a(view, as_var) for a in args], values)

        return build
