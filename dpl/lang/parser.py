"""Parse ``.dpl`` text into the syntax tree of :mod:`dpl.lang.ast`, with compiler-style errors."""

from __future__ import annotations

from functools import lru_cache

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError

from dpl import dtypes
from dpl.errors import DplError, Span
from dpl.ir import dims as dimexpr
from dpl.limits import MAX_ALTERNATIVES, LimitError, check_int_digits
from dpl.syntax import DplSyntaxError, Source as _Source, check_nesting, int_token, open_grammar, syntax_error, unescape_string
from dpl.lang import ast


@lru_cache(maxsize=1)
def _lark() -> Lark:
    # read from the installed package (dpl.grammar), never a path relative to this file
    return open_grammar(
        "dpl.lark", propagate_positions=True, maybe_placeholders=False,
        lexer_callbacks={"DOC": lambda token: _DOC_SINK[-1](token) if _DOC_SINK else token},
    )


class _Lit(tuple):
    """(value, dtype) of a literal, told apart from attribute lists."""


def _unlit(v):
    """Attribute values: literals lose their wrapper, lists are unwrapped item by item."""
    if isinstance(v, _Lit):
        return v[0]
    if isinstance(v, tuple):
        return tuple(_unlit(x) for x in v)
    return v


def _number(text: str, span: Span) -> int | float:
    if text in ("inf", "-inf", "nan"):
        return float(text)
    if not any(c in text for c in ".eE"):
        check_int_digits(text, span)
        return int(text)
    return float(text)


@v_args(meta=True)
class _ToAst(Transformer):
    """Parse tree -> syntax tree. Almost no logic: one method per grammar rule."""

    def __init__(self, src: _Source, docs: dict[int, str]):
        super().__init__()
        self.src, self.docs = src, docs

    def sp(self, meta) -> Span:
        return self.src.span(meta.line, meta.column, meta.end_line, meta.end_column)

    # declarations
    def start(self, meta, decls):
        return ast.File(self.src.filename, tuple(decls))

    def codegen_decl(self, meta, c):
        return ast.CodegenDecl(str(c[0]), self.sp(meta))

    def import_decl(self, meta, c):
        token = c[0]
        is_path = token.type == "ESCAPED_STRING"
        target = str(token)[1:-1] if is_path else str(token)
        return ast.ImportDecl(target, is_path, self.src.of(token))

    def def_decl(self, meta, c):
        name, *params, body = c
        return ast.DefDecl(str(name), tuple(str(p) for p in params), body, self.src.of(name))

    def equiv_decl(self, meta, c):
        left, op, right = c
        if str(op) != "==":
            raise DplSyntaxError(f"an equivalence is written with '==', not '{op}'", self.src.of(op))
        return ast.EquivDecl(left, right, self.sp(meta))

    def _doc(self, line: int) -> str | None:
        lines = []
        while line - 1 in self.docs:
            line -= 1
            lines.append(self.docs[line])
        return "\n".join(reversed(lines)) or None

    def pattern_decl(self, meta, c):
        name, body = c
        return ast.PatternDecl("pattern", name, body, None, self._doc(meta.line), self.src.span(meta.line, meta.column, meta.line, meta.column + 7))

    def rewrite_decl(self, meta, c):
        name, body, repl = c
        return ast.PatternDecl("rewrite", name, body, repl, self._doc(meta.line), self.src.span(meta.line, meta.column, meta.line, meta.column + 7))

    def body(self, meta, stmts):
        kinds = {k: [] for k in ("binding", "annotation", "where", "annotate", "check", "priority", "outputs")}
        for kind, value in stmts:
            kinds[kind].extend(value if kind in ("annotate", "outputs") else [value])
        priority = kinds["priority"][-1] if kinds["priority"] else None
        return ast.Body(
            tuple(kinds["binding"]), tuple(kinds["annotation"]), tuple(kinds["where"]),
            tuple(kinds["annotate"]), tuple(kinds["check"]), priority, tuple(kinds["outputs"]),
        )

    def binding(self, meta, c):
        return ("binding", ast.Binding(str(c[0]), c[1], self.src.of(c[0])))

    def annotation(self, meta, c):
        return ("annotation", ast.Annotation(str(c[0]), c[1], self.src.of(c[0])))

    def where_clause(self, meta, c):
        return ("where", c[0])

    def annotate_clause(self, meta, items):
        return ("annotate", items)

    def annotate_item(self, meta, c):
        return (str(c[0]), str(c[1]), self.src.of(c[1]))

    def check_clause(self, meta, c):
        return ("check", (c[0], self.sp(meta)))

    def outputs_clause(self, meta, c):
        return ("outputs", [(str(t), self.src.of(t)) for t in c])

    def priority_clause(self, meta, c):
        return ("priority", int_token(c[0], self.src, "priority"))

    def where_op(self, meta, c):
        return "where"

    def dotted(self, meta, parts):
        return ".".join(str(p) for p in parts)

    # pattern expressions
    def ref(self, meta, c):
        return ast.Ref(str(c[0]), self.sp(meta))

    def anything(self, meta, c):
        return ast.Anything(self.sp(meta))

    def any_const(self, meta, c):
        return ast.AnyConst(self.sp(meta))

    def literal_pat(self, meta, c):
        value, dtype = c[0]
        return ast.Literal(value, dtype, self.sp(meta))

    def alt(self, meta, c):
        return ast.Alt(c[0], c[1], self.sp(meta))

    def both(self, meta, c):
        return ast.Both(c[0], c[1], self.sp(meta))

    def negate(self, meta, c):
        return ast.Not(c[0], self.sp(meta))

    def tuple_pat(self, meta, c):
        return ast.TuplePat(tuple(c), self.sp(meta))

    def item(self, meta, c):
        return ast.Item(c[0], c[1], self.sp(meta))

    def index(self, meta, c):
        return int_token(c[0], self.src, "index") if c else None

    def call(self, meta, c):
        op, rest = c[0], c[1:]
        optional = bool(rest) and isinstance(rest[0], Token) and rest[0].type == "OPTIONAL"
        if optional:
            rest = rest[1:]
        args, kwargs, more = [], [], False
        for a in rest:
            if isinstance(a, tuple) and a and a[0] == "kwarg":
                kwargs.append(a[1:])
            elif a == "...":
                more = True
            else:
                args.append(a)
        # the span of a call is its op name, where a reader looks first
        span = self.src.span(meta.line, meta.column, meta.line, meta.column + len(op))
        return ast.Call(op, tuple(args), tuple(kwargs), optional, more, span)

    def kwarg(self, meta, c):
        return ("kwarg", str(c[0]), _unlit(c[1]), self.src.of(c[0]))

    def rest_args(self, meta, c):
        return "..."

    # types
    def const_type(self, meta, c):
        inner = c[0] if c else None
        return ast.TypePat(inner.dtype if inner else None, inner.dims if inner else None, True, self.sp(meta))

    def type_pat(self, meta, c):
        return c[0]

    def tensor_type(self, meta, c):
        dims = tuple(c[1:]) if len(c) > 1 or "[" in self.src.lines[meta.line - 1][meta.column - 1 : meta.end_column] else None
        return ast.TypePat(dtypes.canonical(str(c[0])), dims, False, self.sp(meta))

    def any_dtype(self, meta, c):
        return ast.TypePat(None, tuple(c), False, self.sp(meta))

    def dim_int(self, meta, c):
        return int_token(c[0], self.src, "dimension")

    def dim_sym(self, meta, c):
        return str(c[0])

    def dim_any(self, meta, c):
        return None

    def _dim_op(self, op, meta, c):
        try:
            return op(*c)
        except DplError as err:  # a division by the constant 0, an expression past MAX_DIM_SIZE
            raise err.with_span(self.sp(meta)) from None

    def dim_add(self, meta, c):
        return self._dim_op(dimexpr.add, meta, c)

    def dim_sub(self, meta, c):
        return self._dim_op(dimexpr.sub, meta, c)

    def dim_mul(self, meta, c):
        return self._dim_op(dimexpr.mul, meta, c)

    def dim_floordiv(self, meta, c):
        return self._dim_op(dimexpr.floordiv, meta, c)

    def dim_mod(self, meta, c):
        return self._dim_op(dimexpr.mod, meta, c)

    def dim_neg(self, meta, c):
        return self._dim_op(dimexpr.neg, meta, c)

    def dim_min(self, meta, c):
        return self._dim_op(dimexpr.dmin, meta, c)

    def dim_max(self, meta, c):
        return self._dim_op(dimexpr.dmax, meta, c)

    # attribute values and literals
    def attr_list(self, meta, c):
        return tuple(_unlit(x) for x in c)

    def attr_any(self, meta, c):
        return ast.ATTR_ANY

    def attr_name(self, meta, c):
        return str(c[0])

    def literal(self, meta, c):
        if isinstance(c[0], _Lit):  # true / false / none / a string
            return c[0]
        value = c[0]
        try:
            dtype = dtypes.canonical(str(c[1])) if len(c) > 1 else None
        except DplError as err:
            raise DplSyntaxError(err.message, self.src.of(c[1])) from None
        # an integer without a dtype is an i64 wherever it becomes a constant
        why = dtypes.literal_range_error(value, dtype or ("int64" if isinstance(value, int) else "float64"))
        if why is not None:
            raise LimitError(why, self.sp(meta))
        return _Lit((value, dtype))

    def number(self, meta, c):
        text = str(c[0]) if c else self.src.lines[meta.line - 1][meta.column - 1 : meta.end_column - 1]
        return _number(text, self.sp(meta))

    def true(self, meta, c):
        return _Lit((True, None))

    def false(self, meta, c):
        return _Lit((False, None))

    def none(self, meta, c):
        return _Lit((None, None))

    def string(self, meta, c):
        return _Lit((unescape_string(c[0], self.src), None))

    # predicates
    def p_or(self, meta, c):
        return ast.PBinary("or", c[0], c[1], self.sp(meta))

    def p_and(self, meta, c):
        return ast.PBinary("and", c[0], c[1], self.sp(meta))

    def p_not(self, meta, c):
        return ast.PNot(c[0], self.sp(meta))

    def p_compare(self, meta, c):
        return ast.PBinary(str(c[1]), c[0], c[2], self.sp(meta))

    def p_in(self, meta, c):
        return ast.PBinary("in", c[0], c[1], self.sp(meta))

    def p_not_in(self, meta, c):
        return ast.PBinary("not in", c[0], c[1], self.sp(meta))

    def p_arith(self, meta, c):
        return ast.PBinary(str(c[1]), c[0], c[2], self.sp(meta))

    def p_call(self, meta, c):
        return ast.PCall(str(c[0]), tuple(c[1:]), self.src.of(c[0]))

    def p_index(self, meta, c):
        return ast.PIndex(c[0], int_token(c[1], self.src, "index"), self.sp(meta))

    def p_name(self, meta, c):
        return ast.PName(str(c[0]), self.sp(meta))

    def p_literal(self, meta, c):
        return ast.PLiteral(c[0][0], self.sp(meta))

    def p_list(self, meta, c):
        return ast.PList(tuple(c), self.sp(meta))

    # replacements
    def r_ref(self, meta, c):
        return ast.RRef(str(c[0]), self.sp(meta))

    def r_literal(self, meta, c):
        value, dtype = c[0]
        return ast.RLiteral(value, dtype, self.sp(meta))

    def r_call(self, meta, c):
        op, rest = c[0], c[1:]
        args = tuple(a for a in rest if not (isinstance(a, tuple) and a and a[0] == "r_kwarg"))
        kwargs = tuple(a[1:] for a in rest if isinstance(a, tuple) and a and a[0] == "r_kwarg")
        return ast.RCall(op, args, kwargs, self.src.span(meta.line, meta.column, meta.line, meta.column + len(op)))

    def r_kwarg(self, meta, c):
        return ("r_kwarg", str(c[0]), c[1], self.src.of(c[0]))

    def r_tuple(self, meta, c):
        return ast.RTuple(tuple(c), self.sp(meta))

    def r_item(self, meta, c):
        return ast.RItem(c[0], int_token(c[1], self.src, "index"), self.sp(meta))


def parse_file(text: str, filename: str = "<string>") -> ast.File:
    """The syntax tree of a ``.dpl`` text; a :class:`DplSyntaxError` pointing at the spot otherwise."""
    src = _Source(text, filename)
    docs: dict[int, str] = {}

    def keep_doc(token: Token) -> Token:
        docs[token.line] = str(token)[2:].strip()
        return token

    _DOC_SINK.append(keep_doc)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as err:
        raise syntax_error(err, src, _lark()) from None
    finally:
        _DOC_SINK.pop()
    _check_alternatives(tree, src)
    check_nesting(tree, src)
    try:
        return _ToAst(src, docs).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, DplError):
            raise err.orig_exc from None
        raise


def _check_alternatives(tree, src: _Source) -> None:
    """MAX_ALTERNATIVES per `|` chain (a left-leaning run of `alt` nodes), counted without
    recursion, before anything builds the chain."""
    stack = [(tree, False)]
    while stack:
        node, in_chain = stack.pop()
        if node.data == "alt" and not in_chain:
            n, inner = 1, node
            while isinstance(inner, Tree) and inner.data == "alt":
                n, inner = n + 1, inner.children[0]
            if n > MAX_ALTERNATIVES:
                raise LimitError(f"{n} alternatives joined by '|'; the limit is MAX_ALTERNATIVES = {MAX_ALTERNATIVES}",
                                 src.of(node), hint="name groups of alternatives with 'def' and join those")
        stack.extend((c, node.data == "alt" and c is node.children[0]) for c in node.children if isinstance(c, Tree))


# doc comments are ignored by the parser; the lexer hands them to the collector of the parse
# that is running (the parser is built once and cached)
_DOC_SINK: list = []
