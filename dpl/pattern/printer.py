"""Print patterns back in the Python syntax that builds them.

A sub-pattern object used more than once is printed once, named, before the expression
(``w0 = wildcard(); is_op("add")(w0, w0)``), so the printed text keeps the sharing that the
matcher's "same object binds the same value" rule depends on.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from dpl import dtypes
from dpl.pattern import nodes as n


def format_pattern(p: n.Pattern) -> str:
    uses: Counter[int] = Counter()

    def count(q: n.Pattern, skip: n.Pattern | None = None):
        if q is skip:
            return
        uses[id(q)] += 1
        if uses[id(q)] > 1:
            return
        if isinstance(q, n.OptionalPattern):  # the outer pattern contains the inner once more
            count(q.inner)
            count(q.outer, skip=q.inner)
            return
        for c in q.children():
            count(c, skip)

    count(p)
    names: dict[int, str] = {}
    lets: list[str] = []

    def fmt(q: n.Pattern, top: bool = False) -> str:
        if id(q) in names:
            return names[id(q)]
        text = _node(q, fmt)
        if uses[id(q)] > 1 and not top and not isinstance(q, n.OpPattern):
            name = f"p{len(names)}" if not isinstance(q, n.WildcardPattern) else f"w{len(names)}"
            names[id(q)] = name
            lets.append(f"{name} = {text}")
            return name
        return text

    body = fmt(p, top=True)
    return "; ".join([*lets, body])


def _value(v) -> str:
    if isinstance(v, np.ndarray):
        return repr(v.item()) if v.ndim == 0 else repr(v.tolist())
    if isinstance(v, tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)


def _node(q: n.Pattern, fmt) -> str:
    if isinstance(q, n.WildcardPattern):
        return "wildcard()"
    if isinstance(q, n.OpPattern):
        return f"is_op({q.name!r})"
    if isinstance(q, n.CallPattern):
        parts = [fmt(a) for a in q.args]
        parts += [f"{k}={_value(v)}" for k, v in q.attrs.items()]
        if q.varg_default_wildcard:
            parts.append("varg_default_wildcard=True")
        callee = fmt(q.op)
        if isinstance(q.op, n.OrPattern):
            callee = f"({callee})"
        return f"{callee}({', '.join(parts)})"
    if isinstance(q, n.ConstantPattern):
        return "is_const()" if q.value is None else f"is_const({_value(q.value)})"
    if isinstance(q, n.VarPattern):
        return "is_var()" if q.name is None else f"is_var({q.name!r})"
    if isinstance(q, n.GlobalVarPattern):
        return "is_gv()" if q.name is None else f"is_gv({q.name!r})"
    if isinstance(q, n.TuplePattern):
        fields = ", ".join(fmt(f) for f in q.fields)
        return f"is_tuple([{fields}]{', unordered=True' if q.unordered else ''})"
    if isinstance(q, n.TupleGetItemPattern):
        return f"is_tuple_get_item({fmt(q.tuple)}, {q.index})"
    if isinstance(q, n.DTypePattern):
        return f"{_postfix(q.inner, fmt)}.has_dtype({dtypes.short(q.dtype)!r})"
    if isinstance(q, n.ShapePattern):
        dims = ", ".join("None" if d is None else repr(d) for d in q.shape)
        return f"{_postfix(q.inner, fmt)}.has_shape([{dims}])"
    if isinstance(q, n.AttrPattern):
        items = ", ".join(f"{k!r}: {_value(v)}" for k, v in q.attrs.items())
        return f"{_postfix(q.inner, fmt)}.has_attr({{{items}}})"
    if isinstance(q, n.OrPattern):
        return f"{_operand(q.left, fmt)} | {_operand(q.right, fmt)}"
    if isinstance(q, n.AndPattern):
        return f"{_operand(q.left, fmt)} & {_operand(q.right, fmt)}"
    if isinstance(q, n.NotPattern):
        return f"~{_operand(q.inner, fmt)}"
    if isinstance(q, n.OptionalPattern):
        return f"{_postfix(q.inner, fmt)}.optional(lambda x: {_outer_text(q)})"
    if isinstance(q, n.ExprPattern):
        from dpl.ops.registry import describe

        return f"is_expr({describe(q.expr)})"
    return type(q).__name__


def _operand(q, fmt) -> str:
    text = fmt(q)
    return f"({text})" if isinstance(q, (n.OrPattern, n.AndPattern)) and not text.isidentifier() else text


def _postfix(q, fmt) -> str:
    text = fmt(q)
    return f"({text})" if isinstance(q, (n.OrPattern, n.AndPattern, n.NotPattern)) and not text.isidentifier() else text


def _outer_text(q: n.OptionalPattern) -> str:
    """The optional's trailing pattern with its inner pattern shown as ``x``."""

    def fmt(p):
        if p is q.inner:
            return "x"
        return _node(p, fmt)

    return _node(q.outer, fmt)


n.LAYERS_ABOVE["format"] = format_pattern
