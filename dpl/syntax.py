"""Lark glue shared by the IR text parser and the ``.dpl`` parser: spans from parse-tree
positions, and syntax errors that read like a compiler's."""

from __future__ import annotations

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from dpl.errors import DplError, Span


class DplSyntaxError(DplError):
    """The text does not follow the grammar."""


# terminal names as a reader would say them, for "expected ..." hints
_TERMINALS = {
    "NAME": "a name", "DTYPE_NAME": "a dtype", "SIGNED_INT": "an integer", "INT": "an integer",
    "SIGNED_NUMBER": "a number", "ESCAPED_STRING": "a string", "COMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'", "MUL_OP": "'*', '/' or '%'", "OPTIONAL": "'?'", "$END": "end of file",
    "SPECIAL_FLOAT": "a number",
}


def _describe_terminal(name: str, lark: Lark) -> str:
    if name in _TERMINALS:
        return _TERMINALS[name]
    terminal = next((t for t in lark.terminals if t.name == name), None)
    if terminal is not None and terminal.pattern.type == "str":
        return f"'{terminal.pattern.value}'"
    return name.lower()


class Source:
    """A text being parsed: makes spans (with the source line) from Lark positions."""

    def __init__(self, text: str, filename: str):
        self.lines = text.splitlines()
        self.filename = filename

    def span(self, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> Span:
        source = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if end_line != line or end_col is None or end_col <= col:
            end_col = col + 1
        return Span(self.filename, line, col, end_col, source)

    def of(self, node) -> Span:
        meta = node.meta if hasattr(node, "meta") else node
        if isinstance(node, Token):
            return self.span(node.line, node.column, node.end_line, node.end_column)
        return self.span(meta.line, meta.column, meta.end_line, meta.end_column)


def _acceptable(err: UnexpectedInput, fallback) -> set[str]:
    """The terminals the parser would take at the error, exactly: the LALR table's lists are
    broader (merged states), so ask the parser's copy to try each one."""
    parser = getattr(err, "interactive_parser", None)
    if parser is not None:
        try:
            return set(parser.accepts())
        except Exception:  # noqa: BLE001 - an approximate list is still a useful hint
            pass
    return set(fallback or ())


def syntax_error(err: UnexpectedInput, src: "Source", lark: Lark) -> DplSyntaxError:
    """A Lark error as a diagnostic: the spot, the line, a caret and what was expected."""
    line, col = getattr(err, "line", 1) or 1, getattr(err, "column", 1) or 1
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            what = "unexpected end of file"
            line, col = len(src.lines) or 1, len(src.lines[-1]) + 1 if src.lines else 1
        else:
            what = f"unexpected '{token}'"
        expected = sorted({_describe_terminal(t, lark) for t in _acceptable(err, err.expected)})
        end = col + max(1, len(str(token))) if token.type != "$END" else col + 1
    elif isinstance(err, UnexpectedCharacters):
        char = src.lines[line - 1][col - 1] if line - 1 < len(src.lines) and col - 1 < len(src.lines[line - 1]) else "?"
        what = f"unexpected character '{char}'"
        # any token is unexpected here: name what would do, when that is a short list
        expected = sorted({_describe_terminal(t, lark) for t in _acceptable(err, err.allowed)})
        expected = expected if len(expected) <= 12 else []
        end = col + 1
    else:  # UnexpectedEOF
        what = "unexpected end of file"
        expected = sorted({_describe_terminal(t, lark) for t in getattr(err, "expected", ())})
        line, col = len(src.lines) or 1, (len(src.lines[-1]) + 1) if src.lines else 1
        end = col + 1
    hint = f"expected {_join(expected)}" if expected else None
    return DplSyntaxError(what, src.span(line, col, line, end), hint=hint)


def _join(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


