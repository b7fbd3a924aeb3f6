"""Where a ``strided_slice`` starts and how long it is along each axis, symbolic dims included.

Static axes follow Python's slice rules (Relax's too: bounds clamp into the dimension). A
symbolic dimension ``n`` or a symbolic end ``T`` gives an extent only when it is a dimension a
type can hold, so dpl accepts the forms whose extent is one, each under a condition on the run
-time sizes that Relax would meet by clamping and dpl checks instead (a slice that would come
out shorter than its type is an error, never a silently shorter tensor):

- ``[0:T]`` along a dimension ``d`` has extent ``T`` and needs ``T <= d`` (``[0:n]`` along
  ``n`` is the whole axis);
- along a symbolic ``n``: ``[b:e]`` with ``0 <= b <= e`` has extent ``e - b`` and needs
  ``e <= n``; ``[-k:]`` (to the end) has extent ``k`` and needs ``k <= n``; ``[-k:-j]`` has
  extent ``k - j`` and needs ``k <= n``; ``[0:]`` is the whole axis.

"To the end" is an end at or beyond :data:`TO_END` or the axis's own symbol. Everything else
involving a symbolic size (a stride other than 1, ``[1:]`` of ``n``, which is ``n - 1``) is a
:class:`TypeInferenceError` naming the axis.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from dpl.ir.types import Dim, TensorType
from dpl.ops._shapes import normalize_axes
from dpl.ops.registry import CallInfo

TO_END = 2**31 - 1  # an end at least this large means "to the end" of a symbolic dimension


@attrs.frozen
class AxisSlice:
    """One sliced axis: element ``i`` of the result reads ``start + i * stride``. ``start`` is
    an int, or ``(n, -k)`` for ``n - k`` when counted from the end of a symbolic ``n``.
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

    if s != 1:
        raise refuse("has a symbolic length; only stride 1 slices a symbolic dimension")
    if e == size:
        e = TO_END  # to the end of a symbolic axis, spelled with its own name
    if isinstance(e, str):
        if b != 0:
            raise refuse(f"has length {e} - {b}, which is no dimension; a slice to a symbolic end starts at 0")
        return AxisSlice(axis, 0, e, 1, () if e == size else ((e, size),))
    # a symbolic size with a static end
    to_end = e >= TO_END
    if b >= 0 and to_end:
        if b != 0:
            raise refuse(f"has length {size} - {b}, which is no dimension")
        return AxisSlice(axis, 0, size, 1)
    if b >= 0 and e >= 0:
        return AxisSlice(axis, b, max(e - b, 0), 1, ((e, size),) if e > b else ())
    if b < 0 and (to_end or e < 0):
        extent = -b if to_end else max(e - b, 0)
        return AxisSlice(axis, (size, b), extent, 1, ((-b, size),))
    raise refuse(f"has a length that depends on {size}, which is no dimension")


def sliced_shape(x: TensorType, slices: Sequence[AxisSlice]) -> tuple[Dim, ...]:
    shape = list(x.shape)
    for sl in slices:
        shape[sl.axis] = sl.extent
    return tuple(shape)
