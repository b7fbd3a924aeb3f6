"""The limits dpl puts on what it reads, in one place. Each is a plain constant; crossing one
raises a :class:`LimitError` that names the limit and, where there is a source, points at it.

Hostile or mistaken input (a 1000-deep expression, a 4301-digit dimension, a shape of a
petabyte, ``import "/dev/zero"``) must end in a diagnostic, never in a RecursionError, a
MemoryError or a hang. The numbers are far above anything a real model or pattern file needs.
"""

from __future__ import annotations

import math
from typing import Iterable

from dpl.errors import MAX_EXCERPT, MAX_MESSAGE, DplError, Span, excerpt  # noqa: F401 (limits named here)

# -- text ------------------------------------------------------------------------------------
# how deeply expressions, types and attribute lists may nest in .ir and .dpl texts (levels of
# brackets, `~`, and chained operators such as `a + b + ...`)
MAX_NESTING = 100
# how deeply calls of module functions may nest (f calls g calls h ...), checked by the IR
# parser and when a module is built
MAX_CALL_DEPTH = 64
# alternatives of one `|` chain: in a .dpl file, and built with `|` through the Python API
MAX_ALTERNATIVES = 64
# nodes one .dpl pattern may grow to while its macros expand (a macro that uses a parameter
# twice doubles its argument at every level)
MAX_MACRO_NODES = 100_000
# plain patterns one .dpl pattern may stand for (alternatives, equivalences, optional ops)
MAX_VARIANTS = 1024
# digits of an integer literal (int64 needs at most 19)
MAX_INT_DIGITS = 20
# bytes of one .ir or .dpl source file read from disk (an import included)
MAX_SOURCE_BYTES = 16 * 1024 * 1024
# elements of one list computed in a `where` clause (`[1] * n`, `a + b`)
MAX_WHERE_LIST = 4096

# -- shapes ----------------------------------------------------------------------------------
# a static tensor shape, checked when a type is built: elements and bytes
MAX_TENSOR_ELEMENTS = 2**40
MAX_TENSOR_BYTES = 2**42  # 4 TiB

# -- rewriting -------------------------------------------------------------------------------
# how far one rule's `rewrite` rounds may grow a function: at most MAX_REWRITE_GROWTH times the
# bindings it had before the rule, plus MAX_REWRITE_EXTRA (a replacement that contains its own
# match, `relu(x) => relu(relu(x))`, doubles the function each round long before the round
# limit is reached)
MAX_REWRITE_GROWTH = 16
MAX_REWRITE_EXTRA = 1024

# -- sidecars --------------------------------------------------------------------------------
# bytes of the header of one .npy entry of a module's .npz sidecar (NumPy's own default)
MAX_NPY_HEADER = 10_000

# -- frontends -------------------------------------------------------------------------------
# elements of one tensor an importer computes at import time (ONNX constant folding); a larger
# result is left to run time, or reported when it cannot be
MAX_FOLD_ELEMENTS = 2**24

# -- diagnostics -----------------------------------------------------------------------------
# MAX_EXCERPT, MAX_MESSAGE and excerpt() live in dpl.errors (which quotes with them) and are
# imported above, so every limit is still named here


class LimitError(DplError):
    """Input larger than one of the limits of :mod:`dpl.limits`."""


def check_int_digits(text: str, span: Span | None = None, what: str = "integer literal") -> None:
    """Before ``int(text)``: a literal too long for any dtype (Python refuses 4301 digits)."""
    digits = len(text.lstrip("+-"))
    if digits > MAX_INT_DIGITS:
        raise LimitError(f"{what} {excerpt(text, 40)} has {digits} digits; the limit is MAX_INT_DIGITS = {MAX_INT_DIGITS}",
                         span, hint="no dtype holds an integer this large")


def shape_size_error(shape: Iterable, itemsize: int) -> str | None:
    """Why a static shape is too large (elements or bytes), or None. Symbolic dims are skipped."""
    elements = math.prod(d for d in shape if isinstance(d, int))
    if elements > MAX_TENSOR_ELEMENTS:
        return f"has {elements} elements; the limit is MAX_TENSOR_ELEMENTS = 2**{int(math.log2(MAX_TENSOR_ELEMENTS))}"
    if elements * itemsize > MAX_TENSOR_BYTES:
        return f"takes {elements * itemsize} bytes; the limit is MAX_TENSOR_BYTES = 2**{int(math.log2(MAX_TENSOR_BYTES))}"
    return None


def tree_too_deep(tree, limit: int = MAX_NESTING):
    """The first Lark subtree nested deeper than ``limit`` (without recursing), or None."""
    from lark import Tree

    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, Tree))
    return None
