"""What an ONNX op translation sees of its node: attributes, inputs, and a way to emit dpl calls.

A translation function takes a :class:`NodeContext` and returns the dpl values of the node's
outputs. It never binds anything itself: :meth:`NodeContext.emit` returns typed, unbound calls
that may nest, and the importer binds them afterwards (the outermost call of an output under
the ONNX output's name). Calls whose operands are all constants are folded to constants on
the spot, so weight transposes, ``Shape -> Gather -> Concat`` chains and the like never reach
the module.

Shapes computed from symbolic dimensions (``Shape`` of a ``[batch, 16]`` input) are carried as
a :class:`ShapeValue` rather than as tensors: they can flow through the ops that shape
arithmetic uses (``Gather``, ``Concat``, ``Mul``, ``Div``..., computed as dimension expressions
by :mod:`dpl.frontend.onnx_dims`) and end as a ``Reshape``/``Expand`` target, and anything
else that asks for them is a :class:`FrontendError` that says the model computes on shapes at
run time.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import attrs
import numpy as np
import onnx
from onnx import numpy_helper

from dpl import dtypes
from dpl.errors import DplError
from dpl.frontend.errors import FrontendError
from dpl.ir import dims
from dpl.ir.expr import Call, Constant, Expr, Tuple
from dpl.ir.types import TensorType
from dpl.limits import MAX_FOLD_ELEMENTS
from dpl.ops.registry import get_op, make_call

_log = logging.getLogger(__name__)

_REQUIRED = object()


def _f32_decimal(value: float) -> float:
    """An ONNX float attribute (an f32) as the shortest decimal that reads back to the same f32:
    ``epsilon=1e-6`` in the model is 1e-06 in the IR, not the f64 widening 9.999999974752427e-07."""
    return float(str(np.float32(value)))

# ONNX element types dpl can hold, and their dpl dtypes
ONNX_DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


def onnx_dtype_name(elem_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"element type {elem_type}"


def dtype_of(elem_type: int, what: str) -> str:
    """The dpl dtype of an ONNX element type; a FrontendError naming ``what`` otherwise."""
    if elem_type not in ONNX_DTYPES:
        known = ", ".join(onnx_dtype_name(t) for t in ONNX_DTYPES)
        raise FrontendError(f"{what} has ONNX type {onnx_dtype_name(elem_type)}, which dpl does not support (it supports {known})")
    return ONNX_DTYPES[elem_type]


def tensor_to_array(tensor: onnx.TensorProto, what: str) -> np.ndarray:
    """A TensorProto (initializer or attribute) as a NumPy array of a dpl dtype."""
    dtype = dtype_of(tensor.data_type, what)
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as err:  # malformed protobuf data: a model error, reported as such
        raise FrontendError(f"{what}: cannot read the tensor data ({err})") from None
    return np.asarray(array).astype(dtypes.to_numpy(dtype), copy=False)


@attrs.frozen(eq=False)
class ShapeValue:
    """An int64 vector (or scalar) of dimensions some of which are symbolic (names or
    expressions, :mod:`dpl.ir.dims`): the value of ``Shape(x)`` for an ``x`` with symbolic
    dims, and what shape arithmetic makes of it."""

    dims: np.ndarray  # object array of ints, strs and DimExprs, 0-d or 1-d
    dtype: str = "int64"  # float32 or float64 for a size cast to a float (a float range's bound)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, (int, np.integer)) for d in self.dims.flat)

    def __str__(self) -> str:
        return "[" + ", ".join(str(d) for d in self.dims.flat) + "]"


@attrs.frozen(eq=False)
class MergedValue:
    """A tensor reshaped to ``[-1, ...]`` where the -1 merges a symbolic dimension with others
    (``[batch, 4, 17, 16]`` to ``[-1, 17, 16]``): carried unmerged (``value``, whose first
    ``lead`` axes are the merged one) through Transposes that keep the merged axis first, until
    a Reshape restores the leading axes. torch.onnx writes a key's transpose in attention so,
    and the patterns claim the unmerged form. Any other use reads it flattened, its first
    dimension the expression ``batch * 4`` (:func:`flat_shape`)."""

    value: Expr
    lead: int


Value = Expr | ShapeValue | MergedValue


def flat_shape(v: MergedValue) -> tuple:
    """The shape of a MergedValue as ONNX sees it: the merged axes' product, then the rest."""
    first = 1
    for d in v.value.ty.shape[:v.lead]:
        first = dims.mul(first, d)
    return (first,) + tuple(v.value.ty.shape[v.lead:])

# ops whose output row i depends only on row i of their (first) operands, translated on the
# unmerged tensor: elementwise ops, products with a weight, normalisations over the last axes
_ROW_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Relu", "Gelu", "Tanh", "Sigmoid", "Erf", "Sqrt", "Reciprocal",
                      "Neg", "Cast", "Identity", "Dropout", "Gemm", "MatMul", "LayerNormalization", "Softmax", "Where",
                      "IsNaN"})


def unmerged_lookup(where: str, node, lookup: Callable[[str], Value | None]):
    """A lookup that reads each MergedValue input of ``node`` unmerged, and the count of leading
    axes the result keeps merged; None where the op is not row-wise or its operands do not
    broadcast over the merged axis alone (the node then reads its inputs flattened)."""
    if node.op_type not in _ROW_OPS or (node.op_type == "Gemm" and any(
            a.name == "transA" and a.i for a in node.attribute)):
        return None
    if any(a.name == "axis" and a.i >= 0 for a in node.attribute):  # it counts from the merged axis
        return None
    merged = {n: lookup(n) for n in node.input if n and isinstance(lookup(n), MergedValue)}
    leads = {(m.lead, tuple(m.value.ty.shape[:m.lead])) for m in merged.values()}
    if len(leads) != 1:
        return None
    lead = next(iter(leads))[0]
    rank = next(iter(merged.values())).value.ty.ndim - lead + 1  # the rank torch sees
    for i, n in enumerate(node.input):
        v = lookup(n) if n else None
        weight = node.op_type in ("Gemm", "MatMul") and i == 1
        if n and n not in merged and hasattr(v, "ty") and v.ty.ndim >= rank and not weight:
            return None

    def read(name: str):
        v = lookup(name)
        return v.value if isinstance(v, MergedValue) else v

    return read, lead


@attrs.define
class NodeContext:
    """One ONNX node being translated. ``version`` is the op's version in effect (the
    ``since_version`` of its schema at the model's opset); ``opset`` is the model's."""

    node: Any  # onnx.NodeProto
    index: int
    opset: int
    version: int
    values: Callable[[str], Value | None]  # the value of an ONNX name (None: not defined)
    tensor_of: Callable[[str, Expr], Expr]  # the importer's view of an input used as a tensor
    used_outputs: frozenset[str]
    read_attrs: set[str] = attrs.field(factory=set)
    producer: Callable[[str], Any] = lambda name: None  # the node computing an ONNX name (None: an input)
    is_initializer: Callable[[str], bool] = lambda name: False
    declared: Callable[[str], tuple | None] = lambda name: None  # the shape the model declares for an ONNX name

    # -- where we are, for messages ------------------------------------------------------------

    @property
    def where(self) -> str:
        name = f" '{self.node.name}'" if self.node.name else ""
        return f"ONNX node #{self.index}{name} ({self.node.op_type}, opset {self.opset})"

    def error(self, message: str, hint: str | None = None) -> FrontendError:
        return FrontendError(f"{self.where}: {message}", hint=hint)

    def unsupported(self, attribute: str, value: Any, supported: str) -> FrontendError:
        return self.error(f"attribute {attribute}={_show(value)} is not supported; dpl supports {supported}")

    def axis(self, axis: int, ndim: int, what: str = "axis") -> int:
        """``axis`` in 0..ndim-1; an error naming ``what`` when out of range."""
        if not -ndim <= axis < ndim:
            raise self.error(f"{what} {axis} is out of range for an input of rank {ndim}")
        return axis % ndim

    def refuse_used_outputs(self, first: int, names: str) -> None:
        """Outputs from ``first`` on (``names``) are not translated: an error if anything reads them."""
        for i in range(first, len(self.node.output)):
            if self.output_used(i):
                raise self.error(f"output {i} ({names}) is used, which dpl does not support; only the first output is")

    # -- attributes ----------------------------------------------------------------------------

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """The attribute's Python value (strings decoded, tensors as arrays), or ``default``."""
        self.read_attrs.add(name)
        for a in self.node.attribute:
            if a.name == name:
                if a.ref_attr_name:
                    raise self.error(f"attribute {name} refers to a function attribute, which dpl does not support")
                value = onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode("utf-8", "replace")
                if isinstance(value, onnx.TensorProto):
                    return tensor_to_array(value, f"{self.where}: attribute {name}")
                if a.type == onnx.AttributeProto.FLOAT:
                    return _f32_decimal(value)
                if a.type == onnx.AttributeProto.FLOATS:
                    return [_f32_decimal(v) for v in value]
                if isinstance(value, list):
                    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
                return value
        if default is _REQUIRED:
            raise self.error(f"attribute {name} is required")
        return default

    def unread_attributes(self) -> list[str]:
        return [a.name for a in self.node.attribute if a.name not in self.read_attrs]

    # -- inputs --------------------------------------------------------------------------------

    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    def value(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        name = self.node.input[i]
        v = self.values(name)
        if v is None:
            raise self.error(f"input '{name}' is not defined before this node")
        return v

    def input(self, i: int) -> Expr:
        """Input ``i`` as a tensor expression."""
        v = self.value(i)
        if isinstance(v, MergedValue):  # the importer reads it flattened
            return self.tensor_of(self.node.input[i], v)
        if isinstance(v, ShapeValue):
            if v.is_static:
                return Constant(np.asarray(v.dims.astype(np.int64)).astype(dtypes.to_numpy(v.dtype)))
            raise self.error(
                f"input '{self.node.input[i]}' is a shape with symbolic dimensions {v}, used here as data",
                hint="dpl computes on symbolic shapes at import (their arithmetic, and Reshape, Expand, "
                     "ConstantOfShape and Range operands), not as data of run time; give static sizes with "
                     "from_onnx(..., shapes={...})",
            )
        return self.tensor_of(self.node.input[i], v)

    def inputs(self) -> list[Expr]:
        return [self.input(i) for i in range(self.num_inputs)]

    def constant(self, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a value known at import time (an initializer, a Constant, a folded
        expression); a FrontendError saying the value is computed at run time otherwise."""
        v = self.value(i)
        if isinstance(v, ShapeValue) and v.is_static:
            return v.dims.astype(np.int64).astype(dtypes.to_numpy(v.dtype))
        if isinstance(v, Constant):
            return np.asarray(v.value)
        raise self.error(
            f"{what} (input '{self.node.input[i]}') is computed at run time; dpl needs it constant",
            hint="dpl's IR has static attributes: fold the value into the model, or give static "
                 "input sizes with from_onnx(..., shapes={...}) so shape computations fold",
        )

    def ints_input(self, i: int, what: str) -> list[int]:
        """Input ``i``: constant integers (floats only where each is a whole number)."""
        value = self._numbers(i, what)
        if value.dtype.kind == "f" and not np.all(np.isfinite(value) & (value == np.round(value))):
            raise self.error(f"{what} (input '{self.node.input[i]}') must hold integers, got {_show(value)}")
        return [int(v) for v in value.reshape(-1)]

    def scalar_input(self, i: int, what: str) -> int | float | bool:
        """Input ``i``: one constant number (a 0-d tensor, or of shape [1] as some exporters
        write it), as a Python value."""
        value = self._numbers(i, what)
        if value.size != 1:
            raise self.error(f"{what} (input '{self.node.input[i]}') must be a scalar, got a tensor of shape {list(value.shape)}")
        return value.reshape(()).item()

    def _numbers(self, i: int, what: str) -> np.ndarray:
        value = self.constant(i, what)
        if value.dtype.kind not in "biuf":
            raise self.error(f"{what} (input '{self.node.input[i]}') must hold numbers, got a tensor of {value.dtype}")
        return value

    def dims_input(self, i: int, what: str) -> list[dims.Dim]:
        """A shape operand: constant ints, or a ShapeValue whose entries may be symbolic."""
        v = self.value(i)
        if isinstance(v, ShapeValue):
            return [d if isinstance(d, (str, dims.DimExpr)) else int(d) for d in v.dims.reshape(-1)]
        return self.ints_input(i, what)

    def output_used(self, i: int) -> bool:
        return i < len(self.node.output) and self.node.output[i] in self.used_outputs

    # -- building ------------------------------------------------------------------------------

    def emit(self, op: str, *args: Expr | Sequence[Expr], **attributes: Any) -> Expr:
        """A typed call of a dpl op (lists become tuples); folded when every operand is constant."""
        operands = [Tuple(tuple(a)) if isinstance(a, (list, tuple)) else a for a in args]
        call = make_call(op, operands, attributes)
        return fold(call)

    def scalar(self, value: float | int, like: Expr) -> Constant:
        """A 0-d constant of ``like``'s dtype."""
        return Constant(np.asarray(value, dtype=dtypes.to_numpy(like.ty.dtype)))


def fold(call: Call) -> Expr:
    """``call`` evaluated now when its operands are all constants and its type is static."""
    leaves = [f for a in call.args for f in (a.fields if isinstance(a, Tuple) else (a,))]
    if not all(isinstance(x, Constant) for x in leaves):
        return call
    ty = call.ty
    if not isinstance(ty, TensorType) or not ty.is_static:
        return call
    if math.prod(ty.shape) > MAX_FOLD_ELEMENTS:
        # too large to compute at import time and keep in the module: the op runs at run time
        _log.info("not folding %s of %s: more than MAX_FOLD_ELEMENTS = %d elements", call.op, ty, MAX_FOLD_ELEMENTS)
        return call
    arrays = [tuple(np.asarray(f.value) for f in a.fields) if isinstance(a, Tuple) else np.asarray(a.value) for a in call.args]
    try:
        result = np.asarray(get_op(call.op).ref(*arrays, **call.attrs))
    except (ArithmeticError, ValueError, IndexError) as err:  # e.g. a constant index out of range
        raise DplError(f"op '{call.op}' fails on its constant operands: {err}") from None
    if result.shape != tuple(ty.shape):
        raise DplError(f"internal error: folding {call.op} gave shape {result.shape}, expected {ty}")
    return Constant(result.astype(dtypes.to_numpy(ty.dtype), copy=False))


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return "[" + ", ".join(str(v) for v in np.asarray(value).reshape(-1).tolist()) + "]"
    return str(value)
