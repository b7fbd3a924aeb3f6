"""The frontends' errors, in a module of their own: every frontend module raises them, and the
package (whose ``load_model`` imports the frontends) re-exports them."""

from __future__ import annotations

import os
from typing import Sequence

from dpl.errors import MAX_MESSAGE, DplError, excerpt


class FrontendError(DplError):
    """A model construct a frontend cannot bring in: the message names the operator or node,
    where it is in the model, and what dpl supports instead."""


class UnsupportedOpsError(FrontendError):
    """Several ops a frontend does not translate, each named once with its count and where it
    first appears. The list is the point of the message: it is never cut (see
    :func:`unsupported_ops`); the places shrink instead."""

    message_limit = 8 * MAX_MESSAGE


def short_path(path: str) -> str:
    """A source file as a reader finds it: relative to the working directory when inside it,
    from the package's folder when installed (``transformers/models/...``), else as given."""
    full = os.path.abspath(path)
    here = os.getcwd() + os.sep
    if full.startswith(here):
        return full[len(here):]
    for marker in ("site-packages", "dist-packages"):
        head, sep, tail = full.rpartition(os.sep + marker + os.sep)
        if sep:
            return tail
    return path


def unsupported_ops(header: str, entries: Sequence[tuple[str, int, str]], hint: str) -> UnsupportedOpsError:
    """The error listing ``entries`` (op label, count, where it first appears): every op and
    count stays; when the message would pass the error's limit, the places are cut short, then
    left out, and only then the labels themselves are cut (a hostile model's 10k-character op
    names), never an entry."""
    limit = UnsupportedOpsError.message_limit - len(header) - 1
    for where_width in (None, 60, 0):
        lines = [f"  {label} x{count}" + _where(where, where_width) for label, count, where in entries]
        if sum(len(line) + 1 for line in lines) <= limit:
            break
    else:  # the labels alone are too long: each cut to its share of the limit, all kept
        share = max(12, limit // max(1, len(entries)) - 8)
        lines = [f"  {excerpt(label, share)} x{count}" for label, count, _ in entries]
    return UnsupportedOpsError(f"{header}\n" + "\n".join(lines), hint=hint)


def _where(where: str, width: int | None) -> str:
    if not where or width == 0:
        return ""
    return f", first at {where if width is None else excerpt(where, width)}"
