"""Types of IR values: tensors with (possibly symbolic) shapes, and tuples of them."""

from __future__ import annotations

from typing import Union

import attrs

from dpl import dtypes

Dim = Union[int, str]  # a string dimension is symbolic (bound from the inputs at run time)


def _shape(value) -> tuple[Dim, ...]:
    return tuple(d if isinstance(d, str) else int(d) for d in value)


@attrs.frozen
class TensorType:
    shape: tuple[Dim, ...] = attrs.field(converter=_shape)
    dtype: str = attrs.field(converter=dtypes.canonical)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        return f"{dtypes.short(self.dtype)}[{', '.join(map(str, self.shape))}]"


@attrs.frozen
class TupleType:
    fields: tuple["Type", ...] = attrs.field(converter=tuple)

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.fields)) + ("," if len(self.fields) == 1 else "") + ")"


Type = Union[TensorType, TupleType]
