"""Macros and equivalences: syntax-tree rewrites done before a pattern is compiled.

* ``def act(y) = nn.relu(y) | nn.gelu(y)`` — a call ``act(e)`` is replaced by the body with
  ``y`` standing for ``e``. A body may use only its parameters and ``_``.
* ``equiv power(x, 2.0) == multiply(x, x)`` — wherever a pattern has a call shaped like one
  side, it also accepts the other: the call becomes ``original | other``. Each such site
  doubles the number of variants; the compiler reports the count and refuses a pattern whose
  variants pass :data:`MAX_VARIANTS`.

A placeholder that appears twice on a side (``x`` in ``multiply(x, x)``) is the *same* syntax
node in the result, so it compiles to one pattern object and must match one value.
"""

from __future__ import annotations

import attrs

from dpl.errors import DplError, Span
from dpl.lang import ast
from dpl.limits import MAX_MACRO_NODES, MAX_NESTING, MAX_VARIANTS, LimitError  # noqa: F401 (MAX_VARIANTS: re-exported)
from dpl.ops.registry import lookup



# counts of variants saturate here: nested equivalence sites square the count at every level
VARIANTS_COUNTED = 10**6


class MacroError(DplError):
    pass


class EquivError(DplError):
    pass


@attrs.define
class Scope:
    """The macros and equivalences visible in a file (its own and its imports')."""

    macros: dict[str, ast.DefDecl] = attrs.field(factory=dict)
    equivs: list[ast.EquivDecl] = attrs.field(factory=list)


def _refs(e: ast.PExpr):
    if isinstance(e, ast.Ref):
        yield e
    for child in _children(e):
        yield from _refs(child)


def _children(e: ast.PExpr) -> tuple:
    if isinstance(e, ast.Call):
        return e.args
    if isinstance(e, (ast.Alt, ast.Both)):
        return (e.left, e.right)
    if isinstance(e, ast.Not):
        return (e.operand,)
    if isinstance(e, ast.TuplePat):
        return e.fields
    if isinstance(e, ast.Item):
        return (e.base,)
    return ()


def _rebuild(e: ast.PExpr, children: list) -> ast.PExpr:
    if isinstance(e, ast.Call):
        return attrs.evolve(e, args=tuple(children))
    if isinstance(e, (ast.Alt, ast.Both)):
        return attrs.evolve(e, left=children[0], right=children[1])
    if isinstance(e, ast.Not):
        return attrs.evolve(e, operand=children[0])
    if isinstance(e, ast.TuplePat):
        return attrs.evolve(e, fields=tuple(children))
    if isinstance(e, ast.Item):
        return attrs.evolve(e, base=children[0])
    return e


def check_def(d: ast.DefDecl, scope: Scope, errors: list[DplError]) -> None:
    if lookup(d.name) is not None:
        errors.append(MacroError(f"macro '{d.name}' has the name of an op", d.span, hint="give the macro another name"))
        return
    if d.name in scope.macros:
        first = scope.macros[d.name].span
        errors.append(MacroError(f"macro '{d.name}' is already defined at {first}", d.span))
        return
    if len(set(d.params)) != len(d.params):
        errors.append(MacroError(f"macro '{d.name}' repeats a parameter name", d.span))
        return
    for ref in _refs(d.body):
        if ref.name not in d.params:
            errors.append(MacroError(f"undefined name '{ref.name}' in macro '{d.name}'", ref.span,
                                     hint=f"a macro body may use only its parameters ({', '.join(d.params) or 'none'}) and _"))
    scope.macros[d.name] = d


def check_equiv(e: ast.EquivDecl, errors: list[DplError]) -> bool:
    ok = True
    for side in (e.left, e.right):
        if not isinstance(side, ast.Call) or side.optional or side.rest:
            errors.append(EquivError("each side of an equivalence must be a plain op call", e.span))
            return False
        for call in _calls(side):
            if lookup(call.op) is None:
                errors.append(EquivError(f"unknown op '{call.op}' in equivalence", call.span))
                ok = False
    left, right = {r.name for r in _refs(e.left)}, {r.name for r in _refs(e.right)}
    if left != right:
        errors.append(EquivError(f"both sides of an equivalence must use the same names ({', '.join(sorted(left ^ right))} on one side only)", e.span))
        ok = False
    return ok


def _calls(e: ast.PExpr):
    if isinstance(e, ast.Call):
        yield e
    for child in _children(e):
        yield from _calls(child)


class _Budget:
    """What one pattern's macro expansion may still build: MAX_MACRO_NODES nodes, nested at
    most MAX_NESTING deep. Past either, one error and the rest expands to nothing."""

    def __init__(self):
        self.nodes, self.failed = MAX_MACRO_NODES, False

    def spend(self, e: ast.PExpr, depth: int, errors: list[DplError]) -> bool:
        if self.failed:
            return False
        self.nodes -= 1
        if self.nodes < 0:
            errors.append(LimitError(f"macros expand this pattern past MAX_MACRO_NODES = {MAX_MACRO_NODES} nodes", e.span,
                                     hint="each use of a macro copies its body: a macro using another twice doubles it at every level"))
        elif depth > MAX_NESTING:
            errors.append(LimitError(f"macros expand this pattern more than MAX_NESTING = {MAX_NESTING} levels deep", e.span))
        else:
            return True
        self.failed = True
        return False


def expand_macros(e: ast.PExpr, scope: Scope, errors: list[DplError], stack: tuple[str, ...] = (),
                  depth: int = 0, budget: _Budget | None = None) -> ast.PExpr:
    budget = budget or _Budget()
    if not budget.spend(e, depth, errors):
        return ast.Anything(e.span)
    if isinstance(e, ast.Call) and e.op in scope.macros:
        d = scope.macros[e.op]
        if e.op in stack:
            chain = " -> ".join((*stack[stack.index(e.op):], e.op))
            errors.append(MacroError(f"macro '{e.op}' expands into itself: {chain}", e.span))
            return ast.Anything(e.span)
        if e.kwargs or e.optional or e.rest:
            errors.append(MacroError(f"macro '{e.op}' takes only positional arguments", e.span))
            return ast.Anything(e.span)
        if len(e.args) != len(d.params):
            errors.append(MacroError(f"macro '{e.op}' takes {len(d.params)} argument{'s' if len(d.params) != 1 else ''}, got {len(e.args)}", e.span))
            return ast.Anything(e.span)
        args = [expand_macros(a, scope, errors, stack, depth + 1, budget) for a in e.args]
        body = _substitute(d.body, dict(zip(d.params, args)))
        return expand_macros(body, scope, errors, (*stack, e.op), depth, budget)
    children = _children(e)
    if not children:
        return e
    return _rebuild(e, [expand_macros(c, scope, errors, stack, depth + 1, budget) for c in children])


def _substitute(e: ast.PExpr, values: dict) -> ast.PExpr:
    if isinstance(e, ast.Ref):
        return values.get(e.name, e)
    if isinstance(e, (ast.Anything, ast.AnyConst, ast.Literal)):
        # a new node per use: the compiler gives one syntax node one pattern object, and a
        # `_` of a macro used twice must not have to match one value at both places
        return attrs.evolve(e)
    children = _children(e)
    if not children:
        return e
    return _rebuild(e, [_substitute(c, values) for c in children])


def same_syntax(a: ast.PExpr, b: ast.PExpr) -> bool:
    """Equal as written, spans aside."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, ast.Ref):
        return a.name == b.name
    if isinstance(a, ast.Literal):
        return a.value == b.value and a.dtype == b.dtype
    if isinstance(a, ast.Call):
        return (a.op, a.optional, a.rest, [(k, v) for k, v, _ in a.kwargs]) == (b.op, b.optional, b.rest, [(k, v) for k, v, _ in b.kwargs]) and len(a.args) == len(b.args) and all(same_syntax(x, y) for x, y in zip(a.args, b.args))
    if isinstance(a, (ast.Anything, ast.AnyConst)):
        return True
    ca, cb = _children(a), _children(b)
    return bool(ca) and len(ca) == len(cb) and all(same_syntax(x, y) for x, y in zip(ca, cb))


def _unify(pat: ast.PExpr, node: ast.PExpr, bound: dict) -> bool:
    if isinstance(pat, ast.Ref):
        if pat.name in bound:
            return same_syntax(bound[pat.name], node)
        bound[pat.name] = node
        return True
    if isinstance(pat, ast.Anything):
        return True
    if isinstance(pat, ast.Literal):
        return isinstance(node, ast.Literal) and node.value == pat.value and (pat.dtype is None or pat.dtype == node.dtype)
    if isinstance(pat, ast.Call):
        return (
            isinstance(node, ast.Call) and not node.optional and not node.rest and node.op == pat.op
            and len(node.args) == len(pat.args)
            and [(k, v) for k, v, _ in node.kwargs] == [(k, v) for k, v, _ in pat.kwargs]
            and all(_unify(p, n, bound) for p, n in zip(pat.args, node.args))
        )
    return False


def _instantiate(e: ast.PExpr, bound: dict, span: Span) -> ast.PExpr:
    if isinstance(e, ast.Ref):
        return bound[e.name]
    if isinstance(e, ast.Call):
        return ast.Call(e.op, tuple(_instantiate(a, bound, span) for a in e.args), e.kwargs, False, False, span)
    if isinstance(e, (ast.Literal, ast.Anything, ast.AnyConst)):
        return attrs.evolve(e, span=span)
    return e


def apply_equivs(e: ast.PExpr, equivs: list[ast.EquivDecl]) -> tuple[ast.PExpr, int]:
    """The expression with every equivalence site turned into an alternative, and the
    number of variants it now stands for."""
    if not equivs:
        return e, 1
    variants = 1
    children = _children(e)
    if children:
        new_children = []
        for c in children:
            nc, v = apply_equivs(c, equivs)
            new_children.append(nc)
            variants *= v
        e = _rebuild(e, new_children)
    if isinstance(e, ast.Call) and not e.optional:
        for eq in equivs:
            for lhs, rhs in ((eq.left, eq.right), (eq.right, eq.left)):
                bound: dict = {}
                if _unify(lhs, e, bound):
                    e = ast.Alt(e, _instantiate(rhs, bound, e.span), e.span)
                    variants *= 2
                    break
            else:
                continue
            break
    return e, variants


def count_variants(e: ast.PExpr, memo: dict | None = None) -> int:
    """How many plain patterns an expression stands for: alternatives add, operands multiply,
    an optional op doubles. Shared nodes are counted once each (memo), so nested equivalence
    sites cost linear time, not exponential."""
    memo = {} if memo is None else memo
    if id(e) in memo:
        return memo[id(e)]
    if isinstance(e, ast.Alt):
        n = count_variants(e.left, memo) + count_variants(e.right, memo)
    else:
        n = 2 if isinstance(e, ast.Call) and e.optional else 1
        for child in _children(e):
            n *= count_variants(child, memo)
    n = min(n, VARIANTS_COUNTED)  # past MAX_VARIANTS the exact count no longer matters
    memo[id(e)] = n
    return n
