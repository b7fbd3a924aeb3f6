"""The errors dpl raises for bad input. Each names what was wrong; none is a bare traceback.

Every error may carry a source span (file, line, column, end column and the source line), which
the text form and the ``.dpl`` compiler fill in so that ``str(err)`` reads like a compiler's
diagnostic: ``file:line:col: error: message``, the line, and a caret under the span.
"""

from __future__ import annotations

import attrs


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
        if self.span is None:
            text = f"{self.kind}: {self.message}"
        else:
            text = f"{self.span}: {self.kind}: {self.message}"
            if self.span.source_line is not None:
                width = max(1, (self.span.end_col or self.span.col + 1) - self.span.col)
                text += f"\n  {self.span.source_line}\n  {' ' * (self.span.col - 1)}{'^' * width}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


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
