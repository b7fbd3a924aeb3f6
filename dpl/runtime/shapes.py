"""Concrete shapes: bind symbolic dims from concrete inputs, resolve types with them."""

from __future__ import annotations

from typing import Mapping, Sequence

from dpl.errors import DplError
from dpl.ir.dim_binding import DimMismatch, bind_shapes, concrete_shape
from dpl.ir.types import TensorType, TupleType, Type


class ShapeError(DplError):
    """Inputs whose shapes do not fit the function, or a dim the inputs do not determine."""


def bind_dims(types: Sequence[TensorType], shapes: Sequence[tuple[int, ...]], what: Sequence[str], dims: dict[str, int] | None = None,
              fallback: Mapping[str, int] | None = None) -> dict[str, int]:
    """Bind the symbolic dims of ``types`` from ``shapes``: plain symbols first, then a dim
    linear in one unbound symbol (``n * 2``) solved for it, then ``fallback`` (the caller's
    dims) for what the shapes leave unbound, then every dim evaluated and compared
    (:func:`dpl.ir.dim_binding.bind_shapes`); a mismatch names the value and the expression."""
    dims = {} if dims is None else dims
    entries = []
    for ty, shape, name in zip(types, shapes, what):
        if len(shape) != ty.ndim:
            raise ShapeError(f"{name} expects rank {ty.ndim} ({ty}), got shape {tuple(shape)}")
        if any(type(want) is int and want != got for want, got in zip(ty.shape, shape)):
            raise ShapeError(f"{name} expects shape {ty}, got {tuple(shape)}")
        entries.append((ty.shape, shape, name))
    try:
        return bind_shapes(entries, dims, fallback)
    except DimMismatch as err:
        raise ShapeError(err.message) from None


def concrete(ty: Type, dims: dict[str, int], what: str) -> Type:
    """``ty`` with every symbolic dim replaced by its value (expressions evaluated)."""
    if isinstance(ty, TupleType):
        return TupleType(tuple(concrete(t, dims, what) for t in ty.fields))
    if ty.is_static:
        return ty
    try:
        return TensorType(concrete_shape(ty.shape, dims, f"{ty}"), ty.dtype)
    except DimMismatch as err:
        raise ShapeError(f"cannot plan {what}: {err.message}") from None
