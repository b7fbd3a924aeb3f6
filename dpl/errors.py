"""The errors dpl raises for bad input. Each names what was wrong; none is a bare traceback.

Every error may carry a source span (file, line, column, end column and the source line), which
the text form and the ``.dpl`` compiler fill in so that ``str(err)`` reads like a compiler's
diagnostic: ``file:line:col: error: message``, the line, and a caret under the span.
"""

from __future__ import annotations

import attrs

# characters of a source line an error quotes (a window around the caret), and of its message
# or hint (a value quoted in a message may be a whole string literal); dpl.limits names them too
MAX_EXCERPT = 160
MAX_MESSAGE = 1000


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for one: "1 thread", "4 buffers" (messages count things)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def excerpt(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text
    keep = max(8, limit // 2 - 4)
    return f"{text[:keep]} ... {text[-keep:]}"


@attrs.frozen
class Span:
    """Where something came from: a file, 1-based line and column, and the text of that line."""

    file: str
    line: int
    col: int
    end_col: int | None = None
    source_line: str | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class DplError(Exception):
    """Base of every error dpl reports to users."""

    kind = "error"
    message_limit = MAX_MESSAGE  # longer messages are cut to their head and tail (excerpt)

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def with_span(self, span: Span | None) -> "DplError":
        """Attach a span if the error has none yet (the innermost location wins)."""
        if self.span is None and span is not None:
            self.span = span
        return self

    def __str__(self) -> str:
        message = excerpt(self.message, self.message_limit)
        if self.span is None:
            text = f"{self.kind}: {message}"
        else:
            text = f"{self.span}: {self.kind}: {message}"
            if self.span.source_line is not None:
                text += "\n" + _quote(self.span)
        if self.hint:
            text += f"\n  hint: {excerpt(self.hint)}"
        return text


def _quote(span: Span) -> str:
    """The source line and a caret under the span; a long line is cut to a window around the
    span (``MAX_EXCERPT`` characters), so that a 1 MB line is not printed whole."""
    line, start = span.source_line, span.col - 1
    width = max(1, (span.end_col or span.col + 1) - span.col)
    if len(line) > MAX_EXCERPT:
        width = min(width, MAX_EXCERPT // 2)
        lo = max(0, min(start - MAX_EXCERPT // 4, len(line) - MAX_EXCERPT))
        hi = lo + MAX_EXCERPT
        head, tail = ("... " if lo > 0 else ""), (" ..." if hi < len(line) else "")
        line, start = head + line[lo:hi] + tail, start - lo + len(head)
    return f"  {line}\n  {' ' * start}{'^' * width}"


class UnknownOpError(DplError):
    pass


class ArityError(DplError):
    pass


class UnknownAttributeError(DplError):
    pass


class AttributeValueError(DplError):
    pass


class TypeInferenceError(DplError):
    """Shapes or dtypes of a call's operands do not fit the op."""


class InterpretError(DplError):
    """Inputs given to the interpreter do not fit the function's parameters."""
