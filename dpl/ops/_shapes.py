"""Shape arithmetic shared by the op catalogues: broadcasting, axes, symbolic products."""

from __future__ import annotations

from typing import Sequence

from dpl.ir.dims import mul
from dpl.ir.types import Dim, TensorType
from dpl.ops.registry import CallInfo


def fmt_dims(dims) -> str:
    """A dim list as the text form writes it: ``[n, 4]``."""
    return "[" + ", ".join(map(str, dims)) + "]"


def broadcast_shapes(info: CallInfo, indices: Sequence[int] | None = None) -> tuple[Dim, ...]:
    """NumPy broadcasting of the operands' shapes; a symbolic dim only matches itself or 1."""
    indices = range(len(info.arg_types)) if indices is None else indices
    shapes = [info.tensor(i).shape for i in indices]
    ndim = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for axis in range(ndim):
        dim: Dim = 1
        for i, s in zip(indices, shapes):
            k = axis - (ndim - len(s))
            if k < 0:
                continue
            d = s[k]
            if d == 1 or d == dim:
                continue
            if dim == 1:
                dim = d
                continue
            operands = " and ".join(info.operand(j) for j in indices)
            raise info.error(f"operands {operands} cannot broadcast (dimension {axis}: {dim} vs {d})")
        out.append(dim)
    return tuple(out)


def same_dtype(info: CallInfo, indices: Sequence[int] | None = None) -> str:
    indices = list(range(len(info.arg_types))) if indices is None else list(indices)
    dts = [info.tensor(i).dtype for i in indices]
    if len(set(dts)) > 1:
        operands = " and ".join(info.operand(i) for i in indices)
        raise info.error(f"operands {operands} have different dtypes")
    return dts[0]


def normalize_axis(info: CallInfo, axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise info.error(f"{what} {axis} is out of range for rank {ndim}")
    return axis % ndim


def normalize_axes(info: CallInfo, axes, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    out = tuple([normalize_axis(info, a, ndim) for a in axes])
    if len(set(out)) != len(out):
        raise info.error(f"repeated axis in {list(axes)}")
    return out


def dim_product(dims: Sequence[Dim]) -> Dim:
    """The product of dims, canonical (``b * 64`` for ``[b, 8, 8]``), so that two products
    of the same elements compare equal."""
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


def is_full_shape(arg: TensorType, out: TensorType) -> bool:
    """An operand that is read at exactly the output index (no broadcasting)."""
    return isinstance(arg, TensorType) and arg.shape == out.shape
