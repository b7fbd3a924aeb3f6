"""Pattern objects of the Dataflow Pattern Language (DPL), with TVM Relax's vocabulary.

Patterns are small frozen values that read like the IR they match::

    x, w = wildcard(), wildcard()
    mm = is_op("matmul")(x, w)
    act = is_op("nn.relu")(mm) | is_op("nn.gelu")(mm)

They compare and hash by **identity**: a pattern object used twice in one pattern must bind
the same expression both times (TVM's memo rule), so two ``wildcard()`` calls are two
different patterns. Every pattern remembers the ``file:line`` that built it (``origin``), and
``repr`` prints it back in the syntax it was written in.

Differences from TVM, on purpose:

* ``is_gv(name)`` compares the GlobalVar's name **exactly**. TVM 0.27 matches any GlobalVar
  whose name *contains* the string (``is_gv("x")`` matches ``fused_x``); that is a quirk we
  do not copy.
* ``has_shape`` binds symbolic dimensions (strings) consistently across one match, and accepts
  ``None`` or ``"_"`` for "any dimension"; TVM compares against its own symbolic variables.
* ``p.optional(lambda x: ...)`` exists (TVM's Relax DPL has no optional pattern).
* Building a call pattern never registers graph edges implicitly; edges come only from
  ``^`` / ``>>`` / ``used_by`` / ``only_used_by`` (see :mod:`dpl.pattern.context`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterator, Mapping, Sequence

import attrs
import numpy as np

from dpl import dtypes
from dpl.errors import DplError
from dpl.limits import MAX_ALTERNATIVES, LimitError
from dpl.ir.dims import DimExpr, parse as parse_dim
from dpl.ir.expr import Expr, freeze_attr_value

_HERE = os.path.dirname(os.path.abspath(__file__))

# What a node does through the modules above it: graph edges (``a ^ b``, ``a >> b``) are
# dpl.pattern.context's, the text of a pattern dpl.pattern.printer's. Each fills its entries
# when imported (the dpl.pattern package imports both), so no node imports upwards.
LAYERS_ABOVE: dict[str, Callable] = {}


class PatternError(DplError):
    """A pattern was built wrongly (unknown op, attribute, dtype, bad index...)."""


def _origin() -> str:
    """``file:line`` of the first frame outside dpl.pattern: where the user built the pattern."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith("<attrs generated")
                                 or os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _origin_field():
    return attrs.field(factory=_origin, kw_only=True, repr=False)


class Pattern:
    """Base of every pattern: the operators and builder methods shared by all of them."""

    __slots__ = ()

    # -- composition -------------------------------------------------------------------
    def __call__(self, *args: "Pattern", varg_default_wildcard: bool = False, **attr_constraints: Any) -> "CallPattern":
        """``p(a, b, k=v)``: a call whose callee matches ``p``, with attribute constraints."""
        return CallPattern(self, tuple(_as_pattern(a) for a in args), _attr_constraints(self, attr_constraints), varg_default_wildcard)

    def __or__(self, other: "Pattern") -> "OrPattern":
        other = _as_pattern(other)
        n = _alternatives(self) + _alternatives(other)
        if n > MAX_ALTERNATIVES:
            raise LimitError(f"pattern built at {_origin()}: {n} alternatives joined by '|'; the limit is "
                             f"MAX_ALTERNATIVES = {MAX_ALTERNATIVES}",
                             hint="split them into several patterns")
        return OrPattern(self, other)

    def __and__(self, other: "Pattern") -> "AndPattern":
        return AndPattern(self, _as_pattern(other))

    def __invert__(self) -> "NotPattern":
        return NotPattern(self)

    def has_dtype(self, dtype: str) -> "DTypePattern":
        try:
            return DTypePattern(self, dtypes.canonical(dtype))
        except DplError as err:
            raise PatternError(f"has_dtype: {err.message}") from None

    def has_shape(self, shape: Sequence[int | str | None]) -> "ShapePattern":
        """Constrain the tensor shape: ints exactly, ``None``/``"_"`` any, strings symbolic
        (one name binds one dimension consistently across the whole match)."""
        dims = []
        for d in shape:
            if d is None or d == "_":
                dims.append(None)
            elif isinstance(d, (int, np.integer)) and not isinstance(d, bool):
                dims.append(int(d))
            elif isinstance(d, DimExpr):
                dims.append(d)
            elif isinstance(d, str):  # a name binds; an expression ("n * 4") compares once its names are bound
                try:
                    dims.append(parse_dim(d))
                except DplError as err:
                    raise PatternError(f"has_shape: {err.message}") from None
            else:
                raise PatternError(f"has_shape: a dimension must be an int, a symbolic name, an expression or None, got {d!r}")
        return ShapePattern(self, tuple(dims))

    def has_attr(self, attrs_: Mapping[str, Any]) -> "AttrPattern":
        return AttrPattern(self, _attr_constraints(_callee(self), dict(attrs_)))

    def optional(self, make: Callable[["Pattern"], "Pattern"]) -> "OptionalPattern":
        """``p.optional(lambda x: is_op("nn.relu")(x))``: ``relu(p)`` when the trailing op is
        there, else ``p`` itself (tried in that order, so the longer match wins)."""
        outer = make(self)
        if not isinstance(outer, Pattern):
            raise PatternError(f"optional: the function must return a pattern, got {type(outer).__name__}")
        return OptionalPattern(self, outer)

    # -- graph edges (see dpl.pattern.context) -----------------------------------------
    def used_by(self, other, index: int = -1):
        return LAYERS_ABOVE["edge"](self, other, "used_by", index)

    def only_used_by(self, other, index: int = -1):
        return LAYERS_ABOVE["edge"](self, other, "only_used_by", index)

    def fork_to(self, *others):
        return LAYERS_ABOVE["union"](*(self.used_by(o) for o in others))

    def __xor__(self, other):
        return self.used_by(other)

    def __rshift__(self, other):
        return self.only_used_by(other)

    # -- introspection ------------------------------------------------------------------
    def children(self) -> tuple["Pattern", ...]:
        return ()

    def walk(self) -> Iterator["Pattern"]:
        """Every node of this pattern once, parents before children."""
        seen: set[int] = set()
        stack = [self]
        while stack:
            p = stack.pop()
            if id(p) in seen:
                continue
            seen.add(id(p))
            yield p
            stack.extend(reversed(p.children()))

    def dup(self, memo: dict | None = None) -> "Pattern":
        """A copy with new identities for every node (sharing inside it kept), so it binds
        independently of the original."""
        memo = {} if memo is None else memo
        if id(self) in memo:
            return memo[id(self)]
        changes = {}
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if isinstance(value, Pattern):
                changes[field.name] = value.dup(memo)
            elif isinstance(value, tuple) and value and all(isinstance(v, Pattern) for v in value):
                changes[field.name] = tuple(v.dup(memo) for v in value)
        copy = attrs.evolve(self, **changes)
        memo[id(self)] = copy
        return copy

    def __repr__(self) -> str:
        return LAYERS_ABOVE["format"](self)

    __str__ = __repr__


def _frozen(cls):
    return attrs.frozen(eq=False, repr=False)(cls)


@_frozen
class WildcardPattern(Pattern):
    origin: str = _origin_field()


@_frozen
class OpPattern(Pattern):
    """The callee of an op call: ``is_op("matmul")``; calling it builds a :class:`CallPattern`."""

    name: str
    origin: str = _origin_field()


@_frozen
class CallPattern(Pattern):
    op: Pattern
    args: tuple[Pattern, ...]
    attrs: Mapping[str, Any] = attrs.field(factory=dict)
    varg_default_wildcard: bool = False
    origin: str = _origin_field()

    def children(self):
        return (self.op, *self.args)


@_frozen
class ConstantPattern(Pattern):
    """A constant; with ``value`` only a constant of that value (same shape, equal elements)."""

    value: Any = None
    origin: str = _origin_field()


@_frozen
class VarPattern(Pattern):
    """A variable that is not bound in the function (a parameter); ``name`` exact when given."""

    name: str | None = None
    origin: str = _origin_field()


@_frozen
class GlobalVarPattern(Pattern):
    """A module function reference, by exact name (TVM's substring match is not copied)."""

    name: str | None = None
    origin: str = _origin_field()


@_frozen
class TuplePattern(Pattern):
    fields: tuple[Pattern, ...]
    unordered: bool = False
    origin: str = _origin_field()

    def children(self):
        return self.fields

    def __getitem__(self, index: int | None) -> "TupleGetItemPattern":
        """``t[i]`` sugar; negative indices count from the end; ``t[None]`` is any index."""
        if index is not None:
            if not -len(self.fields) <= index < len(self.fields):
                raise IndexError(f"tuple pattern index {index} out of range for {len(self.fields)} fields")
            index %= len(self.fields)
        return TupleGetItemPattern(self, index)


@_frozen
class TupleGetItemPattern(Pattern):
    tuple: Pattern
    index: int | None = None  # None: any index
    origin: str = _origin_field()

    def children(self):
        return (self.tuple,)


@_frozen
class DTypePattern(Pattern):
    inner: Pattern
    dtype: str
    origin: str = _origin_field()

    def children(self):
        return (self.inner,)


@_frozen
class ShapePattern(Pattern):
    inner: Pattern
    shape: tuple[int | str | None, ...]
    origin: str = _origin_field()

    def children(self):
        return (self.inner,)


@_frozen
class AttrPattern(Pattern):
    inner: Pattern
    attrs: Mapping[str, Any]
    origin: str = _origin_field()

    def children(self):
        return (self.inner,)


@_frozen
class OrPattern(Pattern):
    left: Pattern
    right: Pattern
    origin: str = _origin_field()

    def children(self):
        return (self.left, self.right)


@_frozen
class AndPattern(Pattern):
    left: Pattern
    right: Pattern
    origin: str = _origin_field()

    def children(self):
        return (self.left, self.right)


@_frozen
class NotPattern(Pattern):
    inner: Pattern
    origin: str = _origin_field()

    def children(self):
        return (self.inner,)


@_frozen
class OptionalPattern(Pattern):
    """``inner.optional(f)``: matches ``outer = f(inner)`` if it can, else ``inner``."""

    inner: Pattern
    outer: Pattern
    origin: str = _origin_field()

    def children(self):
        return (self.outer, self.inner)


@_frozen
class ExprPattern(Pattern):
    """A given expression: the same object, or a structurally equal one."""

    expr: Expr
    origin: str = _origin_field()


# -- constructors, named as in TVM --------------------------------------------------------

def wildcard() -> WildcardPattern:
    return WildcardPattern(origin=_origin())


def is_op(name: str) -> OpPattern:
    from dpl.ops.registry import get_op

    try:
        get_op(name)
    except DplError as err:
        hint = err.hint
        if name.startswith("relax."):
            hint = f"dpl op names have no 'relax.' prefix: is_op({name[len('relax.'):]!r})"
        raise PatternError(f"is_op: {err.message}", hint=hint) from None
    return OpPattern(name, origin=_origin())


def is_const(value: Any = None) -> ConstantPattern:
    if value is not None:
        value = np.asarray(value)
        value.setflags(write=False)
    return ConstantPattern(value, origin=_origin())


def is_var(name: str | None = None) -> VarPattern:
    return VarPattern(name or None, origin=_origin())


def is_gv(name: str | None = None) -> GlobalVarPattern:
    return GlobalVarPattern(name or None, origin=_origin())


def is_tuple(fields: Sequence[Pattern], unordered: bool = False) -> TuplePattern:
    return TuplePattern(tuple(_as_pattern(f) for f in fields), unordered, origin=_origin())


def is_tuple_get_item(tup: Pattern, index: int | None = None) -> TupleGetItemPattern:
    if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        raise PatternError(f"is_tuple_get_item: the index must be an int or None, got {index!r}")
    if index == -1:
        index = None  # TVM: -1 means any index
    return TupleGetItemPattern(_as_pattern(tup), index, origin=_origin())


def is_expr(expr: Expr) -> ExprPattern:
    return ExprPattern(expr, origin=_origin())


def has_dtype(dtype: str, pattern: Pattern | None = None) -> DTypePattern:
    return (pattern or WildcardPattern(origin=_origin())).has_dtype(dtype)


def has_shape(shape: Sequence[int | str | None], pattern: Pattern | None = None) -> ShapePattern:
    return (pattern or WildcardPattern(origin=_origin())).has_shape(shape)


def has_attr(attrs_: Mapping[str, Any], pattern: Pattern | None = None) -> AttrPattern:
    return (pattern or WildcardPattern(origin=_origin())).has_attr(attrs_)


# -- helpers ------------------------------------------------------------------------------

def _alternatives(p: Pattern) -> int:
    """Leaves of the `|` tree at ``p`` (1 for any other pattern), counted without recursion
    and only up to just past MAX_ALTERNATIVES."""
    n, stack = 0, [p]
    while stack and n <= MAX_ALTERNATIVES:
        q = stack.pop()
        if isinstance(q, OrPattern):
            stack += [q.left, q.right]
        else:
            n += 1
    return n + len(stack)


def _as_pattern(value: Any) -> Pattern:
    if isinstance(value, Pattern):
        return value
    if isinstance(value, (list, tuple)):
        return TuplePattern(tuple(_as_pattern(v) for v in value), origin=_origin())
    raise PatternError(f"expected a pattern, got {type(value).__name__} {value!r}",
                       hint="wrap expressions with is_expr(...) and constants with is_const(value)")


def _callee(p: Pattern) -> Pattern | None:
    """The callee pattern of a call-like pattern (through dtype/shape/attr wrappers)."""
    while isinstance(p, (DTypePattern, ShapePattern, AttrPattern)):
        p = p.inner
    return p.op if isinstance(p, CallPattern) else None


def _attr_constraints(callee: Pattern | None, given: Mapping[str, Any]) -> Mapping[str, Any]:
    """Check attribute constraints against the op's schema and canonicalise their values,
    so that ``axis=-1`` and ``axis=[-1]`` mean the same as in the IR."""
    if not given:
        return {}
    if not isinstance(callee, OpPattern):
        return {k: freeze_attr_value(v) for k, v in given.items()}
    from dpl.ops.registry import get_op

    op = get_op(callee.name)
    out = {}
    for key, value in given.items():
        if key not in op.attrs:
            known = ", ".join(op.attrs) or "none"
            raise PatternError(f"op '{op.name}' has no attribute '{key}' (its attributes: {known})")
        try:
            out[key] = op.attrs[key].convert(op.name, key, value)
        except DplError as err:
            raise PatternError(err.message) from None
    return out


def root_ops(p: Pattern) -> frozenset[str] | None:
    """The op names a binding's value must call for ``p`` to possibly match it, or None
    (any expression may match). Used to index patterns by root op."""
    if isinstance(p, CallPattern):
        return _callee_ops(p.op)
    if isinstance(p, (DTypePattern, ShapePattern, AttrPattern)):
        return root_ops(p.inner)
    if isinstance(p, (OrPattern, OptionalPattern)):
        a, b = (p.left, p.right) if isinstance(p, OrPattern) else (p.outer, p.inner)
        ra, rb = root_ops(a), root_ops(b)
        return None if ra is None or rb is None else ra | rb
    if isinstance(p, AndPattern):
        ra, rb = root_ops(p.left), root_ops(p.right)
        if ra is None:
            return rb
        return ra if rb is None else ra & rb
    return None


def required_ops(p: Pattern) -> frozenset[str]:
    """Op names every expression ``p`` matches calls somewhere (itself or among what it reads
    through arguments and bindings): a function calling none of one of them cannot match, so
    a rewrite skips it without trying a binding. Conservative (empty where unsure)."""
    if isinstance(p, CallPattern):
        own = frozenset([p.op.name]) if isinstance(p.op, OpPattern) else frozenset()
        return own.union(*(required_ops(a) for a in p.args))
    if isinstance(p, (DTypePattern, ShapePattern, AttrPattern)):
        return required_ops(p.inner)
    if isinstance(p, OrPattern):
        return required_ops(p.left) & required_ops(p.right)
    if isinstance(p, OptionalPattern):
        return required_ops(p.outer) & required_ops(p.inner)
    if isinstance(p, AndPattern):
        return required_ops(p.left) | required_ops(p.right)
    if isinstance(p, TuplePattern):
        return frozenset().union(*(required_ops(f) for f in p.fields))
    if isinstance(p, TupleGetItemPattern):
        return required_ops(p.tuple)
    return frozenset()


def _callee_ops(op: Pattern) -> frozenset[str] | None:
    if isinstance(op, OpPattern):
        return frozenset([op.name])
    if isinstance(op, OrPattern):
        a, b = _callee_ops(op.left), _callee_ops(op.right)
        return None if a is None or b is None else a | b
    return None
