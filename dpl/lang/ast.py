"""The syntax tree of a ``.dpl`` file: small frozen classes, one per grammar construct.

The Lark transformer in :mod:`dpl.lang.parser` maps parse-tree nodes straight onto these, so
all meaning lives in :mod:`dpl.lang.compiler`. Every node keeps its :class:`~dpl.errors.Span`.
"""

from __future__ import annotations

from typing import Any, Union

import attrs

from dpl.errors import Span

# -- pattern expressions -----------------------------------------------------------------------


@attrs.frozen
class Ref:
    """A name: a binding of the pattern or, if nothing binds it, a wildcard."""

    name: str
    span: Span


@attrs.frozen
class Anything:
    """``_``: an anonymous wildcard."""

    span: Span


@attrs.frozen
class AnyConst:
    """``const``: any constant."""

    span: Span


@attrs.frozen
class Literal:
    """A literal value (``2.0``, ``1e-6:f16``): matches a constant of that value."""

    value: Any
    dtype: str | None
    span: Span


@attrs.frozen
class AttrAny:
    """``_`` as an attribute value: present with any value."""


ATTR_ANY = AttrAny()


@attrs.frozen
class Call:
    op: str
    args: tuple["PExpr", ...]
    kwargs: tuple[tuple[str, Any, Span], ...]
    optional: bool  # ``op?(x)``: op(x) or just x
    rest: bool  # a trailing ``...``: more arguments may follow
    span: Span


@attrs.frozen
class Alt:
    left: "PExpr"
    right: "PExpr"
    span: Span


@attrs.frozen
class Both:
    left: "PExpr"
    right: "PExpr"
    span: Span


@attrs.frozen
class Not:
    operand: "PExpr"
    span: Span


@attrs.frozen
class TuplePat:
    fields: tuple["PExpr", ...]
    span: Span


@attrs.frozen
class Item:
    base: "PExpr"
    index: int | None  # None: any index
    span: Span


PExpr = Union[Ref, Anything, AnyConst, Literal, Call, Alt, Both, Not, TuplePat, Item]

# -- types -------------------------------------------------------------------------------------


@attrs.frozen
class TypePat:
    """``f16[_, 4096]``, ``_[n, k]``, ``const``, ``const f32[]``: dims are int, a symbol or None (any)."""

    dtype: str | None
    dims: tuple[int | str | None, ...] | None
    const: bool
    span: Span


# -- where predicates --------------------------------------------------------------------------


@attrs.frozen
class PName:
    name: str
    span: Span


@attrs.frozen
class PLiteral:
    value: Any
    span: Span


@attrs.frozen
class PList:
    items: tuple["Pred", ...]
    span: Span


@attrs.frozen
class PCall:
    fn: str
    args: tuple["Pred", ...]
    span: Span


@attrs.frozen
class PIndex:
    base: "Pred"
    index: int
    span: Span


@attrs.frozen
class PBinary:
    """Comparison, arithmetic, ``in`` / ``not in``, ``and`` / ``or``."""

    op: str
    left: "Pred"
    right: "Pred"
    span: Span


@attrs.frozen
class PNot:
    operand: "Pred"
    span: Span


Pred = Union[PName, PLiteral, PList, PCall, PIndex, PBinary, PNot]

# -- replacements ------------------------------------------------------------------------------


@attrs.frozen
class RRef:
    name: str
    span: Span


@attrs.frozen
class RLiteral:
    value: Any
    dtype: str | None
    span: Span


@attrs.frozen
class RCall:
    op: str
    args: tuple["Repl", ...]
    kwargs: tuple[tuple[str, Pred, Span], ...]
    span: Span


@attrs.frozen
class RTuple:
    fields: tuple["Repl", ...]
    span: Span


@attrs.frozen
class RItem:
    base: "Repl"
    index: int
    span: Span


Repl = Union[RRef, RLiteral, RCall, RTuple, RItem]

# -- declarations ------------------------------------------------------------------------------


@attrs.frozen
class Binding:
    name: str
    value: PExpr
    span: Span


@attrs.frozen
class Annotation:
    name: str
    type: TypePat
    span: Span


@attrs.frozen
class Body:
    bindings: tuple[Binding, ...]
    annotations: tuple[Annotation, ...]
    wheres: tuple[Pred, ...]
    annotates: tuple[tuple[str, str, Span], ...]  # (key, name, span)
    checks: tuple[tuple[str, Span], ...]
    priority: int | None
    outputs: tuple[tuple[str, Span], ...] = ()


@attrs.frozen
class CodegenDecl:
    name: str
    span: Span


@attrs.frozen
class PatternDecl:
    kind: str  # "pattern" or "rewrite"
    name: str
    body: Body
    replacement: Repl | None
    doc: str | None
    span: Span


@attrs.frozen
class ImportDecl:
    target: str  # a path (quoted in the source) or a shipped library name
    is_path: bool
    span: Span


@attrs.frozen
class DefDecl:
    name: str
    params: tuple[str, ...]
    body: PExpr
    span: Span


@attrs.frozen
class EquivDecl:
    left: PExpr
    right: PExpr
    span: Span


@attrs.frozen
class File:
    path: str
    decls: tuple[CodegenDecl | ImportDecl | DefDecl | EquivDecl | PatternDecl, ...]
