"""``dpl fmt``: ``.dpl`` text in its canonical layout, comments kept.

The layout (what the shipped libraries already look like):
* one declaration per line; a blank line around every ``pattern`` / ``rewrite`` block, and
  elsewhere at most one blank line where the text had any;
* in a block, one statement per line indented two spaces, the ``=`` of its bindings aligned,
  ``=> replacement`` on its own line, ``}`` alone; ``;`` separators dropped;
* inside a line, one space around binary operators and ``=``, after ``,`` and ``:`` (in a
  type annotation), none inside brackets, before ``(`` of a call, around the ``=`` of a
  keyword argument, or in ``1.0:f16`` / ``nn.relu`` / ``add?(``.

Comments are trivia the parser skips; here the lexer hands them over (a Lark lexer callback)
and each is attached to a line of the output: a comment ending a statement's last line stays
at its end (two spaces before the ``#``), a comment on a line of its own stays above the
statement that follows it, and a comment inside a statement spread over several lines moves
above that statement. A ``##`` run the parser reads as a declaration's doc (the lines right
above ``pattern``/``rewrite``) goes right above that declaration, whatever stood between.

The tokens themselves are printed as written (numbers, strings, names), so formatting never
changes what a file means; :func:`format_text` checks that the result lexes to the same
tokens and comments and gives every pattern the same doc, and that formatting it again
changes nothing.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

import attrs
from lark import Lark, Token, Tree

from dpl.errors import DplError
from dpl.lang.parser import parse_file

INDENT = "  "
_COMMENTS = ("COMMENT", "DOC")
_BLOCKS = ("pattern_decl", "rewrite_decl")


class FormatError(DplError):
    """The formatter would change what a file means (a bug in the formatter: it refuses)."""


_SINK: list = []


@lru_cache(maxsize=1)
def _lark() -> Lark:
    # the grammar of dpl/lang/parser.py, keeping every token (keywords, brackets, ';') and
    # handing comments to the running format through the lexer callbacks
    def collect(token: Token) -> Token:
        if _SINK:
            _SINK[-1].append(token)
        return token

    return Lark.open_from_package(
        "dpl.grammar", "dpl.lark", parser="lalr", propagate_positions=True, maybe_placeholders=False,
        keep_all_tokens=True, lexer_callbacks={name: collect for name in _COMMENTS},
    )


def _parse(text: str) -> tuple[Tree, list[Token]]:
    comments: list[Token] = []
    _SINK.append(comments)
    try:
        tree = _lark().parse(text)
    finally:
        _SINK.pop()
    return tree, comments


# -- one line of output --------------------------------------------------------------------------


@attrs.define
class _Line:
    """A line of the output: its tokens (with the rule each belongs to), how deep it is
    indented, the comments that go above it and at its end, and whether a blank line precedes."""

    tokens: list[tuple[Token, str]]
    depth: int
    kind: str  # a declaration's rule, "binding"/... for statements, "header", "repl", "close"
    name_width: int = 0  # bindings of one block: the width their names are padded to
    leading: list[tuple[Token, bool]] = attrs.field(factory=list)  # (comment, blank line before it)
    hoisted: list[tuple[Token, bool]] = attrs.field(factory=list)  # comments from inside it, moved above
    trailing: list[Token] = attrs.field(factory=list)
    blank: bool = False

    @property
    def first(self) -> Token:
        return self.tokens[0][0]

    @property
    def last(self) -> Token:
        return self.tokens[-1][0]

    def render(self) -> str:
        text = INDENT * self.depth + _join(self.tokens, self.name_width if self.kind == "binding" else 0)
        for c in self.trailing:
            text += "  " + str(c).rstrip()
        return text


def _flatten(node, rule: str, out: list[tuple[Token, str]]) -> list[tuple[Token, str]]:
    """The tokens under ``node``, each with the rule it belongs to; ``;`` dropped."""
    if isinstance(node, Token):
        if node.type != "SEMICOLON" and str(node) != ";":
            out.append((node, rule))
        return out
    for child in node.children:
        _flatten(child, node.data, out)
    return out


def _lines(tree: Tree) -> list[_Line]:
    lines: list[_Line] = []
    for decl in tree.children:
        kind = decl.data if isinstance(decl, Tree) else "token"
        if kind not in _BLOCKS:
            lines.append(_Line(_flatten(decl, kind, []), 0, kind))
            continue
        children = decl.children
        open_at = next(i for i, c in enumerate(children) if isinstance(c, Token) and str(c) == "{")
        lines.append(_Line(_flatten(Tree(kind, children[: open_at + 1]), kind, []), 0, "header"))
        body = children[open_at + 1]
        stmts = []
        for stmt in body.children:
            tokens = _flatten(stmt, body.data, [])
            inner = stmt.children[0] if isinstance(stmt, Tree) and stmt.data == "stmt" else stmt
            stmts.append(_Line(tokens, 1, inner.data if isinstance(inner, Tree) else "stmt"))
        width = max((len(str(s.first)) for s in stmts if s.kind == "binding"), default=0)
        for s in stmts:
            s.name_width = width
        lines.extend(stmts)
        rest = children[open_at + 2 :]
        if kind == "rewrite_decl":
            repl = _flatten(Tree("repl", rest[:-1]), "repl", [])
            lines.append(_Line(repl, 1, "repl"))
        lines.append(_Line(_flatten(rest[-1], kind, []), 0, "close"))
    return lines


# -- spacing inside a line -------------------------------------------------------------------------

_NO_SPACE_AFTER = {"(", "[", "~", "."}
_NO_SPACE_BEFORE = {")", "]", ",", ".", "?"}
_CALLABLE = {"NAME", "OPTIONAL", "DTYPE_NAME"}
_KWARG_RULES = {"kwarg", "r_kwarg"}


def _space(prev: tuple[Token, str], cur: tuple[Token, str]) -> bool:
    (p, prule), (c, crule) = prev, cur
    ps, cs = str(p), str(c)
    if ps in _NO_SPACE_AFTER or cs in _NO_SPACE_BEFORE:
        return False
    if (ps == "=" and prule in _KWARG_RULES) or (cs == "=" and crule in _KWARG_RULES):  # axis=-1
        return False
    if cs == "(":  # a call: op( / def name( / where(
        return not (p.type in _CALLABLE or prule == "where_op")
    if cs == "[":  # indexing and type dimensions: x[0], f16[_, 4], _[n]
        return not (p.type in _CALLABLE or ps in (")", "]", "_"))
    if cs == ":":
        return False
    if ps == ":" and prule == "literal":  # 1.0:f16
        return False
    return True


def _join(tokens: list[tuple[Token, str]], name_width: int) -> str:
    out = []
    for i, tok in enumerate(tokens):
        text = str(tok[0])
        if i == 0 and name_width:
            text = text.ljust(name_width)
        if i and _space(tokens[i - 1], tok):
            out.append(" ")
        out.append(text)
    return "".join(out)


# -- comments and blank lines --------------------------------------------------------------------


def _place_comments(lines: list[_Line], comments: list[Token]) -> list[tuple[Token, bool]]:
    """Attach every comment to a line and note the blank lines of the text; return the
    comments after the last token (the end of the file)."""
    owner = sorted(((tok.line, tok.column, ln) for ln in lines for tok, _ in ln.tokens), key=lambda t: t[:2])
    positions = [t[:2] for t in owner]
    # a blank line precedes an element when the text had an empty line between it and
    # whatever (token or comment) came before
    events = sorted([(c.line, c.column, c, None) for c in comments] + [(ln_, col, None, o) for ln_, col, o in owner],
                    key=lambda e: e[:2])
    gap: dict[int, bool] = {}
    previous_end = 0
    for line, col, comment, ln in events:
        had = previous_end > 0 and line - previous_end > 1
        if comment is not None:
            gap[id(comment)] = had
            previous_end = max(previous_end, comment.end_line or line)
        else:
            if (ln.first.line, ln.first.column) == (line, col):
                ln.blank = had
            previous_end = max(previous_end, line)
    # a ``##`` run on the lines right above a declaration is its doc (the parser reads it so,
    # whatever stands between): it goes with that declaration
    docs_by_line = {c.line: c for c in comments if c.type == "DOC"}
    doc_of: dict[int, _Line] = {}
    for ln in lines:
        if ln.kind == "header":
            line = ln.first.line - 1
            while line in docs_by_line:
                doc_of[id(docs_by_line[line])] = ln
                line -= 1
    end: list[tuple[Token, bool]] = []
    for c in comments:
        i = bisect.bisect_left(positions, (c.line, c.column))
        before = owner[i - 1] if i else None
        after = owner[i] if i < len(owner) else None
        blank = gap[id(c)]
        if id(c) in doc_of:  # even one ending a line: the parser makes it the doc below
            doc_of[id(c)].leading.append((c, blank))
        elif before is not None and before[0] == c.line and before[2].last.end_line == c.line:
            before[2].trailing.append(c)  # ends the statement's last line: stays there
        elif before is not None and before[0] == c.line:
            before[2].hoisted.append((c, blank))  # inside a statement spread over lines: above it
        elif after is not None and (after[2].first.line, after[2].first.column) != (after[0], after[1]):
            after[2].hoisted.append((c, blank))  # on a line of its own inside a statement
        elif after is not None:
            after[2].leading.append((c, blank))
        else:
            end.append((c, blank))
    return end


def _render(lines: list[_Line], end: list[tuple[Token, bool]]) -> str:
    out: list[str] = []

    def blank():
        if out and out[-1] != "":
            out.append("")

    after_block = False
    for i, ln in enumerate(lines):
        top = ln.depth == 0 and ln.kind != "close"
        first_in_block = bool(i) and lines[i - 1].kind == "header"
        # (comment or None for the line itself, blank line before it in the text, moved up)
        group = [(c, had, True) for c, had in ln.hoisted] + [(c, had, False) for c, had in ln.leading] + [(None, ln.blank, False)]
        force = top and (ln.kind == "header" or after_block)
        # a ``##`` moved up out of a declaration must not become that declaration's doc
        split_docs = ln.kind == "header" and any(c.type == "DOC" for c, _ in ln.hoisted)
        indent = INDENT * (1 if ln.kind == "close" else ln.depth)
        for j, (c, had, hoisted) in enumerate(group):
            want = (force or (had and not first_in_block)) if j == 0 else had
            if split_docs and not hoisted and group[j - 1][2]:
                want = True
            if c is None and ln.kind == "close":
                want = False
            if want:
                blank()
            out.append(ln.render() if c is None else indent + str(c).rstrip())
        if ln.kind == "close":
            after_block = True
        elif top:
            after_block = False
    for c, had_blank in end:
        if had_blank:
            blank()
        out.append(str(c).rstrip())
    while out and out[0] == "":
        out.pop(0)
    return "\n".join(out) + "\n" if out else ""


# -- the entry point ---------------------------------------------------------------------------------


def _layout(text: str) -> str:
    tree, comments = _parse(text)
    lines = _lines(tree)
    end = _place_comments(lines, comments)
    return _render(lines, end)


def _signature(text: str):
    """What formatting must keep: the tokens but ';', and the comments' texts in order."""
    tree, comments = _parse(text)
    tokens = [(t.type, str(t)) for t, _ in _flatten(tree, "start", [])]
    return tokens, sorted(str(c).rstrip() for c in comments)


def _docs(text: str, filename: str):
    return [getattr(d, "doc", None) for d in parse_file(text, filename).decls]


def format_text(text: str, filename: str = "<string>") -> str:
    """``text`` in the canonical layout. A syntax error is reported as ``dpl check`` would."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    docs = _docs(text, filename)  # the parser's diagnostics for bad input
    out = _layout(text)
    if _signature(out) != _signature(text) or _docs(out, filename) != docs or _layout(out) != out:
        raise FormatError(f"{filename}: formatting would change the file's meaning or is not stable; "
                          "the file is left as it is", hint="please report this as a bug, with the file")
    return out
