"""Data types: one canonical (NumPy) name per dtype, and the short spelling the text form prints.

The IR stores canonical names (``"float32"``) so values map straight onto NumPy; the printer
emits the short names (``f32``) and every parser accepts both.
"""

from __future__ import annotations

import numpy as np

from dpl.errors import DplError

# canonical name -> short name, in the order the text form documents them
SHORT_NAMES: dict[str, str] = {
    "float64": "f64",
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "bool",
}
_BY_ANY_NAME: dict[str, str] = {**{c: c for c in SHORT_NAMES}, **{s: c for c, s in SHORT_NAMES.items()}}

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})


def canonical(name: str) -> str:
    """The canonical name of a dtype given in either spelling; a clear error otherwise."""
    try:
        return _BY_ANY_NAME[name]
    except KeyError:
        known = ", ".join(SHORT_NAMES.values())
        raise DplError(f"unknown dtype '{name}' (known: {known})") from None


def short(name: str) -> str:
    return SHORT_NAMES[name]


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def is_float_numpy(dt: np.dtype) -> bool:
    """Whether a NumPy dtype holds floating-point values: ml_dtypes' bfloat16 has kind 'V', not 'f'."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt.name == "bfloat16"


def to_numpy(dtype: str) -> np.dtype:
    """The NumPy dtype that holds values of ``dtype``; bfloat16 needs the optional ml_dtypes."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise DplError("bfloat16 values need the 'ml_dtypes' package") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def accumulator(dtype: str) -> str:
    """The dtype in which an op on ``dtype`` values sums, multiplies and takes row statistics
    (docs/architecture.md, "Numerical contract"): float64 in float64, the narrower floats in
    float32 (as the kernels and torch do), integers and bool in int64."""
    if dtype == "float64":
        return "float64"
    if dtype in FLOAT_DTYPES:
        return "float32"
    return "int64"


def accumulator_numpy(dt: np.dtype) -> np.dtype:
    """:func:`accumulator` for a NumPy dtype."""
    return np.dtype(accumulator(from_numpy(dt)))


def from_numpy(dt: np.dtype) -> str:
    name = np.dtype(dt).name
    return canonical(name)


# bytes per element, without importing ml_dtypes for bfloat16
ITEMSIZE: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
                            "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def literal_range_error(value, dtype: str) -> str | None:
    """Why a literal ``value`` is no value of ``dtype`` (out of its range), or None."""
    import math

    if isinstance(value, (bool, np.bool_)):
        return None
    if dtype in INT_DTYPES or dtype == "bool":
        if isinstance(value, float) and not value.is_integer():
            return f"{value} is not a value of dtype {short(dtype)}"
        lo, hi = (0, 1) if dtype == "bool" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
        if not lo <= value <= hi:
            return f"{value} is out of the range of {short(dtype)} ({lo} to {hi})"
        return None
    if dtype in FLOAT_DTYPES and math.isfinite(value):
        limit = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38, "float16": 65504.0,
                 "bfloat16": 3.3895313892515355e38}[dtype]
        if abs(value) > limit * (1 + 2**-9):  # beyond what rounds to the largest finite value
            return f"{value} is out of the range of {short(dtype)} (its largest value is {limit:g})"
    return None
