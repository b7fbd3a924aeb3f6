"""Types of IR values: tensors with (possibly symbolic) shapes, and tuples of them."""

from __future__ import annotations

from typing import Union

import attrs

from dpl import dtypes
from dpl.errors import TypeInferenceError
from dpl.ir.dims import DimExpr
from dpl.limits import MAX_TENSOR_BYTES, MAX_TENSOR_ELEMENTS, LimitError, excerpt, shape_size_error

# a dimension: an int, a str (a symbol, bound from the inputs at run time), or a DimExpr (an
# expression of symbols, n * 4 or (n - 3) // 2 + 1, in the canonical form of dpl.ir.dims, which
# never holds a lone symbol or a constant)
Dim = Union[int, str, DimExpr]


def _shape(value) -> tuple[Dim, ...]:
    return tuple(d if isinstance(d, (str, DimExpr)) else int(d) for d in value)


@attrs.frozen(cache_hash=True)  # types key many dicts (CSE, shared functions): hashed once
class TensorType:
    shape: tuple[Dim, ...] = attrs.field(converter=_shape)
    dtype: str = attrs.field(converter=dtypes.canonical)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def __attrs_post_init__(self) -> None:
        _check_shape(self.shape, self.dtype)

    def __str__(self) -> str:
        return f"{dtypes.short(self.dtype)}[{', '.join(map(str, self.shape))}]"


def _check_shape(shape: tuple[Dim, ...], dtype: str) -> None:
    """Dimensions are sizes, and a static shape stays within MAX_TENSOR_ELEMENTS and
    MAX_TENSOR_BYTES, so that nothing later allocates or indexes past what exists. (Every
    type passes here: one loop, the messages built only on failure.)"""
    elements = 1
    for d in shape:
        if type(d) is int:
            if d < 0:
                dims = excerpt(", ".join(map(str, shape)), 120)
                raise TypeInferenceError(f"shape [{dims}] has the negative dimension {d}")
            elements *= d
    if elements <= _SURELY_SMALL:
        return
    why = shape_size_error(shape, dtypes.ITEMSIZE.get(dtype, 8))
    if why is not None:
        dims = excerpt(", ".join(map(str, shape)), 120)
        raise LimitError(f"a {dtypes.short(dtype)} tensor of shape [{dims}] {why}")


_SURELY_SMALL = min(MAX_TENSOR_ELEMENTS, MAX_TENSOR_BYTES // 8)  # within both limits, whatever the dtype


@attrs.frozen(cache_hash=True)
class TupleType:
    fields: tuple["Type", ...] = attrs.field(converter=tuple)

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.fields)) + ("," if len(self.fields) == 1 else "") + ")"


Type = Union[TensorType, TupleType]
