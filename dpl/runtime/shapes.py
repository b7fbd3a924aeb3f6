"""Concrete shapes: bind symbolic dims from concrete inputs, resolve types with them."""

from __future__ import annotations

from typing import Sequence

from dpl.errors import DplError
from dpl.ir.types import TensorType, TupleType, Type


class ShapeError(DplError):
    """Inputs whose shapes do not fit the function, or a dim the inputs do not determine."""


def bind_dims(types: Sequence[TensorType], shapes: Sequence[tuple[int, ...]], what: Sequence[str], dims: dict[str, int] | None = None) -> dict[str, int]:
    """Bind the symbolic dims of ``types`` from ``shapes``; a mismatch names the value."""
    dims = {} if dims is None else dims
    for ty, shape, name in zip(types, shapes, what):
        if len(shape) != ty.ndim:
            raise ShapeError(f"{name} expects rank {ty.ndim} ({ty}), got shape {tuple(shape)}")
        for axis, (want, got) in enumerate(zip(ty.shape, shape)):
            if isinstance(want, str):
                bound = dims.setdefault(want, got)
                if bound != got:
                    raise ShapeError(f"{name} has {got} in dimension {axis}, but '{want}' is already {bound}")
            elif want != got:
                raise ShapeError(f"{name} expects shape {ty}, got {tuple(shape)}")
    return dims


def concrete(ty: Type, dims: dict[str, int], what: str) -> Type:
    """``ty`` with every symbolic dim replaced by its bound value."""
    if isinstance(ty, TupleType):
        return TupleType(tuple(concrete(t, dims, what) for t in ty.fields))
    unbound = [d for d in ty.shape if isinstance(d, str) and d not in dims]
    if unbound:
        raise ShapeError(f"cannot plan {what}: dim '{unbound[0]}' of {ty} is not determined by the inputs")
    return TensorType(tuple(dims[d] if isinstance(d, str) else d for d in ty.shape), ty.dtype)
