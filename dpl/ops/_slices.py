"""Where a ``strided_slice`` starts and how long it is along each axis, symbolic dims included.

Static axes follow Python's slice rules (Relax's too: bounds clamp into the dimension). Along a
symbolic dimension ``n`` (a symbol or an expression), or to a symbolic end ``T``, the extent is
a dimension expression (:mod:`dpl.ir.dims`) valid under a condition on the run-time sizes that
Relax would meet by clamping and dpl checks instead (a slice that would come out shorter than
its type is an error, never a silently shorter tensor):

- ``[b:T]`` along a dimension ``d`` has extent ``T - b`` and needs ``b <= T <= d`` (``[0:n]``
  along ``n`` is the whole axis);
- along a symbolic ``n``: ``[b:e]`` with ``0 <= b <= e`` has extent ``e - b`` and needs
  ``e <= n``; ``[b:]`` (to the end) has extent ``n - b`` and needs ``b <= n``; ``[b:-j]`` has
  extent ``n - j - b`` and needs ``b + j <= n``; ``[-k:]`` has extent ``k`` and needs
  ``k <= n``; ``[-k:-j]`` has extent ``k - j`` and needs ``k <= n``;
- a stride ``s > 1`` takes every s-th element: the extent is ``(length + s - 1) // s``.

"To the end" is an end at or beyond :data:`TO_END` or the axis's own dim. A condition a type
proves already (``n - 1 <= n``) is not listed. What remains refused (a negative stride, ``[-k:e]``
with ``e >= 0``, ``[-k:T]``) is a :class:`TypeInferenceError` naming the axis.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from dpl.ir.dims import add, floordiv, provably_nonnegative, sub
from dpl.ir.types import Dim, TensorType
from dpl.ops._shapes import normalize_axes
from dpl.ops.registry import CallInfo

TO_END = 2**31 - 1  # an end at least this large means "to the end" of a symbolic dimension


@attrs.frozen
class AxisSlice:
    """One sliced axis: element ``i`` of the result reads ``start + i * stride``. ``start`` is
    an int, or ``(n, -k)`` for ``n - k`` when counted from the end of a symbolic ``n`` (a
    symbol or an expression).
    ``requires`` lists ``(small, large)`` pairs of dims that must satisfy ``small <= large``."""

    axis: int
    start: int | tuple[str, int]
    extent: Dim
    stride: int
    requires: tuple[tuple[Dim, Dim], ...] = ()


def slice_axes(info: CallInfo, x: TensorType) -> list[AxisSlice]:
    axes, begin, end = info.attrs["axes"], info.attrs["begin"], info.attrs["end"]
    strides = info.attrs["strides"] or (1,) * len(axes)
    if not len(axes) == len(begin) == len(end) == len(strides):
        raise info.error("axes, begin, end and strides must have the same length")
    if 0 in strides:
        raise info.error("strides must not be 0")
    return [_axis_slice(info, a, x.shape[a], b, e, s) for a, b, e, s in zip(normalize_axes(info, axes, x.ndim), begin, end, strides)]


def _axis_slice(info: CallInfo, axis: int, size: Dim, b: int, e: Dim, s: int) -> AxisSlice:
    if isinstance(size, int) and isinstance(e, int):
        r = range(size)[slice(b, e, s)]
        return AxisSlice(axis, r.start, len(r), s)

    def refuse(why: str):
        return info.error(f"slice [{b}:{e}:{s}] of axis {axis} ({size}) of {info.operand(0)} {why}")

    if s < 1:
        raise refuse("has a symbolic length; only a positive stride slices a symbolic dimension")
    if e == size:
        e = TO_END  # to the end of a symbolic axis, spelled with its own name
    if not isinstance(e, int):  # a symbolic end: [b:e] has length e - b, assuming b <= e <= size
        if b < 0:
            raise refuse(f"starts {-b} before the end of the axis and ends at the symbolic {e}; its length is no dimension")
        return AxisSlice(axis, b, _strided(sub(e, b), s), s, _needs((b, e), (e, size)))
    # a symbolic size with a static end
    to_end = e >= TO_END
    if b >= 0 and to_end:  # [b:] has length size - b, assuming b <= size
        return AxisSlice(axis, b, _strided(sub(size, b), s), s, _needs((b, size)))
    if b >= 0 and e >= 0:
        return AxisSlice(axis, b, _strided(max(e - b, 0), s), s, ((e, size),) if e > b else ())
    if b >= 0:  # [b:-j] has length size - j - b, assuming b + j <= size
        return AxisSlice(axis, b, _strided(sub(add(size, e), b), s), s, _needs((b - e, size)))
    if to_end or e < 0:
        extent = -b if to_end else max(e - b, 0)
        return AxisSlice(axis, (size, b), _strided(extent, s), s, ((-b, size),))
    raise refuse(f"has a length that depends on {size}, which is no dimension")


def _strided(length: Dim, s: int) -> Dim:
    """Elements of a slice of ``length`` (>= 0) taken every ``s``: ceil(length / s)."""
    return length if s == 1 else floordiv(add(length, s - 1), s)


def _needs(*pairs: tuple[Dim, Dim]) -> tuple[tuple[Dim, Dim], ...]:
    """The ``(small, large)`` conditions not already provable."""
    return tuple((a, b) for a, b in pairs if not provably_nonnegative(sub(b, a)))


def sliced_shape(x: TensorType, slices: Sequence[AxisSlice]) -> tuple[Dim, ...]:
    shape = list(x.shape)
    for sl in slices:
        shape[sl.axis] = sl.extent
    return tuple(shape)
