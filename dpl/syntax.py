"""Lark glue shared by the IR text parser and the ``.dpl`` parser: the parsers themselves (their
tables cached on disk), spans from parse-tree positions, and syntax errors that read like a
compiler's."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from importlib import resources
from pathlib import Path

import lark as _lark_package
from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from dpl.cache_dir import FILE_MODE, private_dir, read_own_file, store_dir, write_private_file
from dpl.errors import DplError, Span

log = logging.getLogger(__name__)


def open_grammar(name: str, **options) -> Lark:
    """The LALR parser of the shipped grammar ``name`` (in ``dpl.grammar``), its tables cached in
    the ``parsers`` store of the user cache (``dpl.cache_dir``) through Lark's ``cache=`` option:
    building them is most of a first parse.

    Lark's cache file is a pickle, so it is treated as the kernels are: its name holds a hash of
    everything that decides it (grammar, options, Lark and Python versions); it is handed to
    Lark only when its bytes match the SHA-256 recorded beside it; otherwise it is removed and
    written again (0600) under a file lock, one process at a time."""
    text = resources.files("dpl.grammar").joinpath(name).read_text(encoding="utf-8")
    recipe = "\0".join([text, repr(sorted((k, repr(v)) for k, v in options.items() if k != "lexer_callbacks")),
                        _lark_package.__version__, sys.version])
    directory = private_dir(store_dir("parsers"), "parsers")
    path = directory / f"{Path(name).stem}-{hashlib.sha256(recipe.encode()).hexdigest()[:32]}.lark"
    manifest = path.with_suffix(".sha256")
    if _verified(path, manifest):
        return Lark.open_from_package("dpl.grammar", name, parser="lalr", cache=str(path), **options)
    from filelock import FileLock  # only here: importing it costs more than loading the tables

    try:
        with FileLock(directory / "write.lock", mode=FILE_MODE):
            if not _verified(path, manifest):  # another process may have written it meanwhile
                manifest.unlink(missing_ok=True)
                path.unlink(missing_ok=True)  # never handed to Lark unverified
            parser = Lark.open_from_package("dpl.grammar", name, parser="lalr", cache=str(path), **options)
            os.chmod(path, FILE_MODE)  # Lark made it 0666 less the umask (inside a 0700 folder)
            write_private_file(manifest, hashlib.sha256(read_own_file(path)).hexdigest().encode())
            return parser
    except OSError as err:  # a cache that cannot be written costs time, never the parse
        log.info("parse tables of %s not cached: %s", name, err)
        return Lark.open_from_package("dpl.grammar", name, parser="lalr", **options)


def _verified(path: Path, manifest: Path) -> bool:
    try:
        return hashlib.sha256(read_own_file(path)).hexdigest().encode() == read_own_file(manifest, 128)
    except OSError:
        return False


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




# ---- strings and limits shared by both text forms -------------------------------------------

# the escapes a string literal may use, and what each stands for; the printers write these
_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_ESCAPED = {v: "\\" + k for k, v in _ESCAPES.items()}


def escape_string(value: str) -> str:
    """``value`` as a quoted literal that :func:`unescape_string` reads back exactly: quotes,
    backslashes and control characters escaped, everything else (UTF-8 text) kept as is."""
    out = []
    for ch in value:
        if ch in _ESCAPED:
            out.append(_ESCAPED[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or 0xD800 <= ord(ch) < 0xE000 or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def unescape_string(token: Token, src: "Source") -> str:
    """The value of a string literal token (quotes included), its escapes read as written:
    ``\\" \\\\ \\n \\t \\r \\uXXXX \\UXXXXXXXX``; anything else is a located error."""
    text, out, i = str(token)[1:-1], [], 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        width = {"u": 4, "U": 8}.get(nxt)
        digits = text[i + 2 : i + 2 + width] if width else ""
        if width and len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits) and int(digits, 16) <= 0x10FFFF:
            out.append(chr(int(digits, 16)))
            i += 2 + width
            continue
        col = token.column + 1 + i
        bad = text[i : i + 2 + (width or 0)]
        raise DplSyntaxError(f"unknown escape '{bad}' in a string", src.span(token.line, col, token.line, col + len(bad)),
                             hint='a string may use \\" \\\\ \\n \\t \\r \\uXXXX and \\UXXXXXXXX')
    return "".join(out)


def check_nesting(tree, src: "Source") -> None:
    """A located error for a parse tree nested deeper than MAX_NESTING, before anything
    recursive (transformers, type checks, printers) walks it."""
    from dpl.limits import MAX_NESTING, LimitError, tree_too_deep

    node = tree_too_deep(tree)
    if node is not None:
        at = src.of(node)  # the caret marks where the level past the limit starts
        raise LimitError(f"this is nested more than MAX_NESTING = {MAX_NESTING} levels deep", src.span(at.line, at.col),
                         hint="split the expression into named bindings")


def int_token(token: Token, src: "Source", what: str = "integer literal") -> int:
    """``int(token)``, or a located error for a literal longer than any dtype holds."""
    from dpl.limits import check_int_digits

    check_int_digits(str(token), src.of(token), what)
    return int(str(token))
