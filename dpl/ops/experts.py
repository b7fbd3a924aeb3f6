"""The grouped matrix product of mixture-of-experts layers: ``grouped_matmul(x, w, offsets)``.

transformers' experts sort the routed rows by expert and multiply each expert's run of rows by
that expert's weight (``grouped_mm``, ``transformers::grouped_mm_fallback``): ``x [S, K]``,
``w [E, K, N]``, ``offsets [E]`` the cumulative row counts, so expert ``e`` owns rows
``offsets[e-1] .. offsets[e]``; rows past ``offsets[-1]`` belong to no expert and are zero.

One op rather than a gather of each row's weight and a batched product: the gather holds
``S * K * N`` weights (15 GB for Mixtral's 256 routed rows), the runs only the ``S * N``
result. Opaque, as TVM treats any product whose operands a tensor's values select.
"""

from __future__ import annotations

import numpy as np

from dpl import dtypes
from dpl.errors import InterpretError
from dpl.ir.types import TensorType
from dpl.ops.registry import CallInfo, OpPatternKind, register

_OFFSET_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def expert_runs(offsets, rows: int) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of each expert that owns rows: the runs ``offsets`` (the
    cumulative row counts, non-decreasing) cut from ``rows`` rows; an offset past the last row
    ends at it. Shared by the reference and the backends, so they cut the same runs."""
    ends = np.asarray(offsets).astype(np.int64).reshape(-1)
    if ends.size and (ends[0] < 0 or bool((np.diff(ends) < 0).any())):
        raise InterpretError(f"'grouped_matmul': offsets {ends.tolist()} must be non-negative and non-decreasing "
                             "(the cumulative row counts of experts whose rows are sorted by expert)")
    ends = np.minimum(ends, rows)
    starts = np.concatenate([[0], ends[:-1]])
    return [(e, int(s), int(t)) for e, (s, t) in enumerate(zip(starts, ends)) if t > s]


def _infer(info: CallInfo) -> TensorType:
    x, w, offsets = info.tensor(0), info.tensor(1), info.tensor(2)
    if x.ndim != 2 or w.ndim != 3 or offsets.ndim != 1:
        raise info.error(f"operands {info.operand(0)}, {info.operand(1)} and {info.operand(2)} must be rows [S, K], "
                         "experts' weights [E, K, N] and offsets [E]")
    if x.dtype != w.dtype:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} have different dtypes")
    if offsets.dtype not in _OFFSET_DTYPES:
        raise info.error(f"offsets {info.operand(2)} must have an integer dtype")
    if x.shape[1] != w.shape[1]:
        raise info.error(f"operands {info.operand(0)} and {info.operand(1)} have mismatched reduction dimensions "
                         f"({x.shape[1]} vs {w.shape[1]})")
    if offsets.shape[0] != w.shape[0]:
        raise info.error(f"offsets {info.operand(2)} must hold one offset per expert of {info.operand(1)}")
    return TensorType((x.shape[0], w.shape[2]), x.dtype)


def _ref(x, w, offsets):
    """Each expert's run of rows times its weight (NumPy's BLAS), into a zeroed result: no
    intermediate larger than the result."""
    acc = dtypes.accumulator_numpy(x.dtype)
    out = np.zeros((x.shape[0], w.shape[2]), acc)
    for e, start, end in expert_runs(offsets, x.shape[0]):
        np.matmul(x[start:end].astype(acc, copy=False), w[e].astype(acc, copy=False), out=out[start:end])
    return out.astype(x.dtype, copy=False)


register(
    "grouped_matmul",
    num_args=3,
    infer=_infer,
    kind=OpPatternKind.OPAQUE,
    ref=_ref,
    doc="each expert's run of rows (offsets: cumulative counts) times its weight; rows past the last offset zero",
)
