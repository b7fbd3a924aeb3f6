"""Guards torch cannot prove on a named ``torch.export.Dim``, proved by dpl instead.

Why. Exporting with ``Dim("seq", min=2, max=64)`` asks torch to prove that every guard its
trace put on ``seq`` holds over the whole range; a guard it cannot prove is a "Constraints
violated (seq)!" error, whether the guard narrows the range (``seq % 2 == 0``) or only
defeats torch's solver. torch 2.11 meets ``min(16*seq, 32*seq) == 16*seq`` in Hugging Face's
grouped-query attention (Llama, Qwen2, Mistral, Phi3 of tests/zoo.py): ``repeat_kv`` reshapes
the expanded key/value heads, torch's view meta gives the result a stride of
``Min(16*seq, 32*seq)``, and the contiguity check made when torch records the tensor's
metadata (``check_contiguous_sizes_strides``) compares it with ``16*seq``. torch's own ``Min``
does not simplify and its range analysis cannot decide the equality, though it holds for
every size; torch 2.13 no longer makes that guard.

What dpl does. The caller exports again with ``prefer_deferred_runtime_asserts_over_guards``:
the Dims stay as the user gave them (their names, their ranges, the equalities between axes
of one Dim are still torch's to check), and a guard torch would have had to prove becomes a
runtime assert. :func:`check` proves each such assert on a named dimension (sympy over
``lo + t``, ``t >= 0``; failing that, every size of a small range) and raises a FrontendError
naming the Dim, the guard, where it was made and a size it fails at. It returns the asserts it
proved, for the caller to log; :func:`drop_runtime_asserts` then takes them out of the program
(and again after a decomposition, whose retrace puts them back), since dpl translates no
comparison of sizes. As torch does, sizes 0 and 1 are not checked: torch traces a dynamic
size as at least 2.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Mapping, Sequence

from dpl.frontend.errors import FrontendError

EXHAUSTIVE_LIMIT = 4096  # sizes (or size tuples) a guard is evaluated at when sympy cannot prove it


def is_constraint_violation(err: BaseException) -> bool:
    """torch.export's "Constraints violated" error (a ``UserError`` of that type, or the
    symbolic-shape solver's own ``ConstraintViolationError``)."""
    kind = getattr(getattr(err, "error_type", None), "name", None)
    return kind == "CONSTRAINT_VIOLATION" or type(err).__name__ == "ConstraintViolationError"


def violations(err: BaseException) -> str:
    """torch's "Constraints violated" error on one line: the guards it could not prove, without
    its advice to rerun with logs."""
    lines = [line.strip() for line in str(err).splitlines()]
    found = [line.removeprefix("- ") for line in lines if line.startswith("- ")]
    return "; ".join(found) if found else (lines[0] if lines else type(err).__name__)


def suggestion(err: BaseException) -> str | None:
    """torch's "Suggested fixes" (``seq = Dim('seq', max=32)``), on one line."""
    lines = str(err).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Suggested fixes:"]
    if not starts:
        return None
    fixes = []
    for line in lines[starts[0] + 1:]:
        if not line.startswith("  ") or not line.strip():
            break
        fixes.append(line.strip())
    return f"torch suggests: {'; '.join(fixes)}" if fixes else None


def check(program, dynamic_shapes: Any, axes: Sequence[tuple[Any, Any]], model: str, err: BaseException) -> list[str]:
    """Prove the runtime asserts torch recorded in ``program`` instead of guards on the named
    Dims of ``dynamic_shapes``, found at ``axes`` (``(Dim, the program's size)`` per input
    axis); ``err`` is torch's first error. Returns the asserts proved, printed in the Dims'
    names, none when a named Dim is not found at an input axis (dpl cannot tell its asserts);
    raises a FrontendError for one that does not hold over its Dim's range."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    symbols: dict[Any, Any] = {}  # torch's symbol -> the Dim it stands for
    shape_env = None
    for dim, size in axes:
        expr = getattr(getattr(size, "node", None), "expr", None)
        if isinstance(expr, sympy.Symbol) and _is_named(dim):
            symbols.setdefault(expr, dim)
            shape_env = shape_env or size.node.shape_env
    if shape_env is None or any(all(d is not dim for dim in symbols.values()) for d in _named_dims(dynamic_shapes)):
        return []
    variables = {id(dim): sympy.Symbol(dim.__name__, integer=True) for dim in symbols.values()}
    to_variable = {s: variables[id(dim)] for s, dim in symbols.items()}
    ranges = {variables[id(dim)]: _dim_range(dim) for dim in symbols.values()}
    where = _assert_lines(program)
    proved: list[str] = []
    for asserted in itertools.chain.from_iterable(shape_env.deferred_runtime_asserts.values()):
        expr = shape_env.replace(asserted.expr)
        line = where.get(asserted.expr) or where.get(expr) or "torch's trace"
        if expr is sympy.true or not expr.free_symbols & symbols.keys() or free_unbacked_symbols(expr):
            continue  # what torch proved, or a data-dependent check it keeps in the graph as any export does
        others = {s: _torch_range(shape_env, s) for s in expr.free_symbols - symbols.keys()}
        expr = expr.xreplace(to_variable)
        if expr is sympy.true:  # seq <= seq: two axes of one Dim, equal as the user declared
            continue
        failure = _refute(expr, {**ranges, **others})
        if failure is not None:
            dim = next(d for s, d in symbols.items() if to_variable[s] in expr.free_symbols)
            raise FrontendError(f"torch.export.export failed on {model}: Dim '{dim.__name__}' cannot take every size in "
                                f"{_show(_dim_range(dim))}: torch's guard {expr} {failure} (made at {line})",
                                hint=suggestion(err) or f"give '{dim.__name__}' a range over which the guard holds") from err
        proved.append(str(expr))
    return list(dict.fromkeys(proved))


ASSERT_OPS = frozenset({"aten._assert_scalar.default", "aten._assert_async.msg", "aten._assert_async.default"})


def drop_runtime_asserts(torch, program) -> None:
    """Take the runtime asserts out of ``program`` (a fresh export of dpl's own, changed in
    place) with what only they used: the size arithmetic and comparisons, and the
    ``scalar_tensor`` an ``_assert_async`` reads. dpl proved those on named Dims and ignores
    the others as it does in any program; what is left reads as a plain export."""
    graph = program.graph_module.graph
    sizes = (torch.SymInt, torch.SymBool, torch.SymFloat, bool, int)
    if not any(str(node.target) in ASSERT_OPS for node in graph.nodes):
        return
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node.users:
            continue
        name = str(node.target)
        if name in ASSERT_OPS or name == "aten.scalar_tensor.default" or isinstance(node.meta.get("val"), sizes):
            graph.erase_node(node)
    program.graph_module.recompile()


def _named_dims(spec) -> list[Any]:
    """The named Dims in ``dynamic_shapes`` (its dicts, tuples and lists, at any depth)."""
    if isinstance(spec, Mapping):
        return [d for value in spec.values() for d in _named_dims(value)]
    if isinstance(spec, (tuple, list)):
        return [d for value in spec for d in _named_dims(value)]
    return [spec] if _is_named(spec) and spec.min != spec.max else []


def _is_named(dim) -> bool:
    """A ``torch.export.Dim("seq", ...)``, not derived (``2*seq``): torch ranges it."""
    return isinstance(getattr(dim, "__name__", None), str) and hasattr(dim, "min") and not hasattr(dim, "root")


def _dim_range(dim) -> tuple[int, int | None]:
    """The Dim's range as torch traces it: from 2 (sizes 0 and 1 are specialised) to its max,
    None when unbounded (torch's ``int_oo``, or ``sys.maxsize - 1`` in older releases)."""
    hi = dim.max
    return max(dim.min or 0, 2), hi if isinstance(hi, int) and hi < sys.maxsize - 1 else None


def _torch_range(shape_env, symbol) -> tuple[int, int | None]:
    """torch's range for a symbol no Dim names (its ``int_oo`` is no sympy Integer)."""
    vr = shape_env.var_to_range.get(symbol)
    if vr is None or not vr.lower.is_Integer:
        return (0, None)
    return (int(vr.lower), int(vr.upper) if vr.upper.is_Integer else None)


def _show(span: tuple[int, int | None]) -> str:
    lo, hi = span
    return f"[{lo}, {'oo' if hi is None else hi}]"


def _assert_lines(program) -> dict[Any, str]:
    """The asserted expression -> the source line that made it (``file:line in function``, the
    innermost frame of the assert's trace), from the program's ``_assert_scalar`` nodes."""
    import re

    lines: dict[Any, str] = {}
    for node in program.graph.nodes:
        if str(node.target) != "aten._assert_scalar.default" or not node.args:
            continue
        cond = node.args[0]
        val = getattr(cond, "meta", {}).get("val")
        expr = getattr(getattr(val, "node", None), "expr", None)
        trace = getattr(cond, "meta", {}).get("stack_trace") or node.meta.get("stack_trace") or ""
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
        if expr is not None and frames:
            lines.setdefault(expr, "{}:{} in {}".format(*frames[-1]))
    return lines


def _refute(expr, ranges: Mapping[Any, tuple[int, int | None]]) -> str | None:
    """None when ``expr`` holds for every value of its symbols in ``ranges``; else why not: a
    value it fails at (searched among the first ones of an unbounded or large range), or that
    it could not be proved."""
    import sympy

    if _proved(expr, ranges):
        return None
    names = sorted(expr.free_symbols, key=str)
    spans = [ranges[s] for s in names]
    cap = max(1, int(EXHAUSTIVE_LIMIT ** (1 / len(names))))
    searched = [(lo, hi if hi is not None and hi - lo < cap else lo + cap - 1) for lo, hi in spans]
    for values in itertools.product(*(range(lo, hi + 1) for lo, hi in searched)):
        value = expr.subs(dict(zip(names, values)))
        if value is sympy.true:
            continue
        at = ", ".join(f"{s} = {v}" for s, v in zip(names, values))
        return f"fails at {at}" if value is sympy.false else f"could not be evaluated at {at}"
    if searched == spans:
        return None
    return "could not be proved for " + ", ".join(f"{s} in {_show(span)}" for s, span in zip(names, spans))


def _proved(expr, ranges) -> bool:
    """sympy's proof over every symbol ``s`` written ``lo + t`` with ``t >= 0``, torch's own
    Min/Max (which simplify less) given as sympy's."""
    import sympy
    from torch.utils._sympy.functions import Max, MinMaxBase

    shifted = {s: lo + sympy.Symbol(f"_{s}", integer=True, nonnegative=True) for s, (lo, _hi) in ranges.items()}
    try:
        expr = expr.xreplace(shifted).replace(lambda e: isinstance(e, MinMaxBase),
                                               lambda e: (sympy.Max if isinstance(e, Max) else sympy.Min)(*e.args))
        return sympy.simplify(expr) is sympy.true
    except Exception:  # a torch function sympy cannot simplify: the search for a failing size decides
        return False
