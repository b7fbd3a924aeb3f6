"""Every op's OpPatternKind, checked against TVM 0.27.

For each representative call in ``CASES`` the test builds the call twice: in dpl (with
``FunctionBuilder``) and in TVM Relax (with ``relax.BlockBuilder``), then runs TVM's
``LegalizeOps`` and ``AnnotateTIROpPattern`` and reads the kind FuseOps would give the call's
binding (see ``tvm_kind``). Three things must agree: the kind written in the table, the kind
TVM computes, and ``dpl.op_kind`` of the dpl call. The table is therefore a checked record of
TVM's behaviour; when dpl disagrees, the op's kind function in ``dpl/ops/*.py`` is wrong.

What FuseOps sees. After LegalizeOps every call in the table becomes exactly one ``call_tir``
binding (ops whose lowering has several stages, such as softmax, layer_norm, gelu or a padded
conv2d, become *one* PrimFunc with several blocks, and the analysis takes the whole PrimFunc),
so the kind is that PrimFunc's ``op_pattern``. A scalar constant operand is folded into the
PrimFunc, and ``full`` of a constant fill takes no arguments at all. A call that TVM leaves
high-level is a non-``call_tir`` call, which FuseOps' graph builder marks kOpaque (8).

Rules the table pins down, beyond the obvious ones (each was a dpl bug this file found):
* a matmul with a 1-D operand is CommReduce, not OutEWiseFusable (no FMA with reuse on both
  sides); a reduction over no axis, an identity permutation, a one-piece split or concat, a
  same-shape broadcast_to, a squeeze/expand_dims of no axis are copies, hence ElemWise;
* ``full`` of a parameter fill value is Broadcast (a rank-0 input read everywhere), of a
  constant ElemWise; strided_slice clamps ``begin`` first, so begin -8 of a dim 8 is ElemWise;
* ``reshape`` of a tensor with a symbolic dimension is Opaque: TVM's index holds ``% n``.
Known type difference (kinds still compared): Relax's split into one piece returns a tensor,
dpl's a 1-tuple (``TYPE_DIFFERENCES``).

Ops TVM cannot legalize on the CPU: none of dpl's ops (``UNLEGALIZED`` is empty).
``test_unlegalized_table_is_true`` keeps that statement true: it legalizes every case and
requires the set of ops TVM left high-level to equal the table's keys, so an op added later
that TVM cannot lower must be listed there, with the kind dpl chose and why.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Tuple, const
from dpl.ir.types import TensorType
from dpl.ops import OpPatternKind as K
from dpl.ops import all_ops, make_call

# -- the table ----------------------------------------------------------------------------------


class T(NamedTuple):
    """A tensor parameter."""

    shape: tuple
    dtype: str = "float32"


class S(NamedTuple):
    """A constant operand (a scalar unless ``value`` is an array)."""

    value: Any
    dtype: str = "float32"


class Tup(NamedTuple):
    """A tuple of tensor parameters (concat's one argument)."""

    fields: tuple


class Case(NamedTuple):
    id: str
    op: str
    operands: tuple
    attrs: dict
    kind: K


def case(id, op, operands, attrs, kind):
    return Case(id, op, tuple(operands), dict(attrs), kind)


F48 = T((4, 8))
BOOL48 = T((4, 8), "bool")

UNARY = [
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "negative", "abs",
    "square", "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu",
]
BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum"]
COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
REDUCE_KIND = {"sum": K.COMM_REDUCE, "prod": K.COMM_REDUCE, "max": K.COMM_REDUCE, "min": K.COMM_REDUCE,
               "mean": K.OUT_EWISE_FUSABLE, "variance": K.OUT_EWISE_FUSABLE}

CASES: list[Case] = [
    # unary math and activations: one load at the store index
    *[case(op, op, [F48], {}, K.ELEMWISE) for op in UNARY],
    case("clip", "clip", [F48], {"min": -0.5, "max": 0.5}, K.ELEMWISE),
    case("astype/f16", "astype", [F48], {"dtype": "float16"}, K.ELEMWISE),
    case("astype/i32", "astype", [F48], {"dtype": "int32"}, K.ELEMWISE),
    case("astype/same", "astype", [F48], {"dtype": "float32"}, K.ELEMWISE),
    case("astype/bool", "astype", [F48], {"dtype": "bool"}, K.ELEMWISE),
    *[case(f"{op}/f16", op, [T((4, 8), "float16")], {}, K.ELEMWISE) for op in ("exp", "nn.gelu", "nn.silu")],
    *[case(f"{op}/int", op, [T((4, 8), "int32")], {}, K.ELEMWISE) for op in ("negative", "abs", "square", "nn.relu")],
    case("clip/int", "clip", [T((4, 8), "int32")], {"min": 0, "max": 3}, K.ELEMWISE),
    case("clip/rank0", "clip", [T(())], {"min": 0, "max": 1}, K.ELEMWISE),
    # binary arithmetic: ElemWise as soon as one operand is read at the output index
    *[case(f"{op}/same", op, [F48, F48], {}, K.ELEMWISE) for op in BINARY],
    *[case(f"{op}/bias", op, [F48, T((8,))], {}, K.ELEMWISE) for op in BINARY],
    *[case(f"{op}/scalar_const", op, [F48, S(2.0)], {}, K.ELEMWISE) for op in BINARY],
    *[case(f"{op}/pure_broadcast", op, [T((8, 1)), T((1, 8))], {}, K.BROADCAST) for op in BINARY],
    case("add/scalar_param", "add", [F48, T(())], {}, K.ELEMWISE),
    *[case(f"{op}/int_bias", op, [T((4, 8), "int32"), T((8,), "int32")], {}, K.ELEMWISE) for op in ("add", "divide", "maximum")],
    case("multiply/int_pure_broadcast", "multiply", [T((8, 1), "int32"), T((1, 8), "int32")], {}, K.BROADCAST),
    case("add/scalar_first", "add", [S(1.0), F48], {}, K.ELEMWISE),
    case("add/rank_up", "add", [T((8,)), T((1, 8))], {}, K.ELEMWISE),
    case("add/column_bias", "add", [F48, T((4, 1))], {}, K.ELEMWISE),
    case("add/row_by_column", "add", [T((4, 1)), T((8,))], {}, K.BROADCAST),
    case("add/symbolic_bias", "add", [T(("n", 8)), T((8,))], {}, K.ELEMWISE),
    case("add/symbolic_broadcast", "add", [T(("n", 1)), T((1, 8))], {}, K.BROADCAST),
    # a scalar constant is folded into the kernel; a tensor constant is an input like any other
    case("add/two_scalar_consts", "add", [S(1.0), S(2.0)], {}, K.ELEMWISE),
    case("add/const_row", "add", [T((8, 1)), S(np.full((1, 8), 0.5, "float32"))], {}, K.BROADCAST),
    case("add/const_unit", "add", [T((8, 1)), S(np.full((1, 1), 0.5, "float32"))], {}, K.ELEMWISE),
    case("add/rank0_params", "add", [T(()), T(())], {}, K.ELEMWISE),
    # comparisons
    *[case(f"{op}/same", op, [F48, F48], {}, K.ELEMWISE) for op in COMPARE],
    *[case(f"{op}/pure_broadcast", op, [T((8, 1)), T((1, 8))], {}, K.BROADCAST) for op in COMPARE],
    case("less/scalar_const", "less", [F48, S(0.0)], {}, K.ELEMWISE),
    # where
    case("where/same", "where", [BOOL48, F48, F48], {}, K.ELEMWISE),
    case("where/full_cond", "where", [BOOL48, T((8,)), S(0.0)], {}, K.ELEMWISE),
    case("where/full_value", "where", [T((4, 1), "bool"), F48, T((8,))], {}, K.ELEMWISE),
    case("where/pure_broadcast", "where", [T((4, 1), "bool"), T((1, 8)), T((4, 1))], {}, K.BROADCAST),
    case("where/scalar_consts", "where", [T((1, 8), "bool"), S(1.0), S(0.0)], {}, K.ELEMWISE),
    case("where/symbolic_broadcast", "where", [T(("n", 1), "bool"), T((1, 8)), T(("n", 1))], {}, K.BROADCAST),
    case("where/scalar_cond", "where", [T((), "bool"), F48, F48], {}, K.ELEMWISE),
    # reductions: sum/max/min/prod are CommReduce; mean/variance end in an output block -> 4
    *[
        case(f"{op}/{'keep' if keep else 'drop'}", op, [F48], {"axis": [1], "keepdims": keep}, REDUCE_KIND[op])
        for op in REDUCE_KIND
        for keep in (False, True)
    ],
    case("sum/all", "sum", [F48], {}, K.COMM_REDUCE),
    case("mean/all", "mean", [F48], {}, K.OUT_EWISE_FUSABLE),
    case("sum/axis0", "sum", [T((4, 8, 2))], {"axis": [0, 2]}, K.COMM_REDUCE),
    case("sum/symbolic", "sum", [T(("n", 8))], {"axis": [0]}, K.COMM_REDUCE),
    case("sum/unit_axis", "sum", [T((4, 1))], {"axis": [1]}, K.COMM_REDUCE),
    case("mean/symbolic", "mean", [T(("n", 8))], {"axis": [0]}, K.OUT_EWISE_FUSABLE),
    case("sum/symbolic_keep", "sum", [T(("b", "n", 8))], {"axis": [1], "keepdims": True}, K.COMM_REDUCE),
    case("mean/unit_axis", "mean", [T((4, 1))], {"axis": [1]}, K.OUT_EWISE_FUSABLE),
    # reducing over no axis is a copy
    *[case(f"{op}/no_axes", op, [F48], {"axis": []}, K.ELEMWISE) for op in REDUCE_KIND],
    case("sum/rank0", "sum", [T(())], {}, K.ELEMWISE),
    # complex ops
    case("matmul/2d", "matmul", [T((4, 8)), T((8, 16))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/batched", "matmul", [T((2, 4, 8)), T((8, 16))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/unit_dims", "matmul", [T((1, 8)), T((8, 1))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/batch_broadcast", "matmul", [T((2, 4, 8)), T((1, 8, 16))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/symbolic", "matmul", [T(("n", 8)), T((8, 16))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/symbolic_batched", "matmul", [T(("b", "n", 8)), T(("b", 8, "n"))], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/int", "matmul", [T((4, 8), "int32"), T((8, 2), "int32")], {}, K.OUT_EWISE_FUSABLE),
    case("matmul/out_dtype", "matmul", [T((4, 8), "float16"), T((8, 16), "float16")], {"out_dtype": "float32"}, K.OUT_EWISE_FUSABLE),
    # a 1-D operand: one load holds every output index, no FMA with reuse, a plain reduction
    case("matmul/matrix_vector", "matmul", [T((4, 8)), T((8,))], {}, K.COMM_REDUCE),
    case("matmul/vector_matrix", "matmul", [T((8,)), T((8, 16))], {}, K.COMM_REDUCE),
    case("matmul/vector_batched", "matmul", [T((8,)), T((2, 8, 16))], {}, K.COMM_REDUCE),
    case("matmul/dot", "matmul", [T((8,)), T((8,))], {}, K.COMM_REDUCE),
    case("nn.conv2d", "nn.conv2d", [T((1, 3, 8, 8)), T((4, 3, 3, 3))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/padded", "nn.conv2d", [T((1, 3, 8, 8)), T((4, 3, 3, 3))], {"padding": [1, 1], "strides": [2, 2]}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/dilated", "nn.conv2d", [T((1, 3, 8, 8)), T((4, 3, 3, 3))], {"dilation": 2}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/depthwise", "nn.conv2d", [T((1, 4, 8, 8)), T((4, 1, 3, 3))], {"groups": 4}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/f16_out_f32", "nn.conv2d", [T((1, 3, 8, 8), "float16"), T((4, 3, 3, 3), "float16")], {"out_dtype": "float32"}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/symbolic_batch", "nn.conv2d", [T(("n", 3, 8, 8)), T((4, 3, 3, 3))], {"padding": 1}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/1x1", "nn.conv2d", [T((1, 3, 8, 8)), T((4, 3, 1, 1))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.conv2d/grouped", "nn.conv2d", [T((1, 4, 8, 8)), T((4, 2, 3, 3))], {"groups": 2}, K.OUT_EWISE_FUSABLE),
    case("nn.max_pool2d", "nn.max_pool2d", [T((1, 3, 8, 8))], {"pool_size": [2, 2], "strides": [2, 2]}, K.OUT_EWISE_FUSABLE),
    case("nn.max_pool2d/ceil_mode", "nn.max_pool2d", [T((1, 3, 7, 7))], {"pool_size": 2, "strides": 2, "ceil_mode": True}, K.OUT_EWISE_FUSABLE),
    case("nn.max_pool2d/dilated", "nn.max_pool2d", [T((1, 3, 8, 8))], {"pool_size": 2, "dilation": 2}, K.OUT_EWISE_FUSABLE),
    case("nn.max_pool2d/1x1", "nn.max_pool2d", [T((1, 3, 8, 8))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.max_pool2d/padded", "nn.max_pool2d", [T((1, 3, 8, 8))], {"pool_size": [3, 3], "padding": [1, 1]}, K.OUT_EWISE_FUSABLE),
    case("nn.softmax", "nn.softmax", [F48], {}, K.OUT_EWISE_FUSABLE),
    case("nn.softmax/unit_axis", "nn.softmax", [T((4, 1))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.softmax/axis0", "nn.softmax", [F48], {"axis": 0}, K.OUT_EWISE_FUSABLE),
    case("nn.log_softmax", "nn.log_softmax", [F48], {}, K.OUT_EWISE_FUSABLE),
    case("nn.softmax/symbolic", "nn.softmax", [T(("n", "m"))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.softmax/1d", "nn.softmax", [T((8,))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.layer_norm/2axes", "nn.layer_norm", [T((2, 4, 8)), T((4, 8)), T((4, 8))], {"axes": [1, 2]}, K.OUT_EWISE_FUSABLE),
    case("nn.layer_norm/no_affine", "nn.layer_norm", [F48, T((8,)), T((8,))], {"center": False, "scale": False}, K.OUT_EWISE_FUSABLE),
    case("nn.layer_norm/symbolic", "nn.layer_norm", [T(("n", 8)), T((8,)), T((8,))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.rms_norm/2axes", "nn.rms_norm", [T((2, 4, 8)), T((4, 8))], {"axes": [1, 2]}, K.OUT_EWISE_FUSABLE),
    case("nn.rms_norm/symbolic", "nn.rms_norm", [T(("b", "n", 8)), T((8,))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.layer_norm", "nn.layer_norm", [F48, T((8,)), T((8,))], {}, K.OUT_EWISE_FUSABLE),
    case("nn.rms_norm", "nn.rms_norm", [F48, T((8,))], {}, K.OUT_EWISE_FUSABLE),
    # data movement
    case("take/axis0", "take", [F48, T((3,), "int64")], {"axis": 0}, K.OPAQUE),
    case("take/1d", "take", [T((32,)), T((3,), "int32")], {}, K.OPAQUE),
    case("take/scalar_index", "take", [F48, T((), "int64")], {"axis": 1}, K.OPAQUE),
    case("reshape/identity", "reshape", [F48], {"shape": [4, 8]}, K.INJECTIVE),
    case("reshape/flatten", "reshape", [F48], {"shape": [-1]}, K.INJECTIVE),
    # a symbolic input dimension puts ``% n`` into the load index: Opaque
    case("reshape/symbolic_split", "reshape", [T(("n", 8))], {"shape": ["n", 2, 4]}, K.OPAQUE),
    case("reshape/symbolic_merge", "reshape", [T(("b", "n", 2, 4))], {"shape": ["b", "n", 8]}, K.OPAQUE),
    case("reshape/symbolic_identity", "reshape", [T(("n", 8))], {"shape": ["n", 8]}, K.OPAQUE),
    case("reshape/symbolic_unit", "reshape", [T(("n",))], {"shape": [1, "n"]}, K.OPAQUE),
    case("take/symbolic", "take", [T(("n", 8)), T(("m",), "int64")], {"axis": 0}, K.OPAQUE),
    case("reshape", "reshape", [F48], {"shape": [8, 4]}, K.INJECTIVE),
    case("reshape/split_dim", "reshape", [F48], {"shape": [4, 2, 4]}, K.INJECTIVE),
    case("permute_dims", "permute_dims", [F48], {}, K.INJECTIVE),
    case("permute_dims/3d", "permute_dims", [T((2, 4, 8))], {"axes": [0, 2, 1]}, K.INJECTIVE),
    case("permute_dims/unit_swap", "permute_dims", [T((1, 4, 8))], {"axes": [1, 0, 2]}, K.INJECTIVE),
    case("permute_dims/symbolic", "permute_dims", [T(("b", "n", 8))], {"axes": [0, 2, 1]}, K.INJECTIVE),
    case("permute_dims/identity", "permute_dims", [F48], {"axes": [0, 1]}, K.ELEMWISE),
    case("permute_dims/1d", "permute_dims", [T((8,))], {}, K.ELEMWISE),
    case("concat", "concat", [Tup((F48, T((2, 8))))], {"axis": 0}, K.INJECTIVE),
    case("concat/axis1", "concat", [Tup((F48, T((4, 2)), T((4, 1))))], {"axis": 1}, K.INJECTIVE),
    case("split/sections", "split", [F48], {"indices_or_sections": 2, "axis": 1}, K.INJECTIVE),
    case("split/indices", "split", [F48], {"indices_or_sections": [1, 3]}, K.INJECTIVE),
    case("concat/one", "concat", [Tup((F48,))], {"axis": 0}, K.ELEMWISE),
    case("concat/empty_field", "concat", [Tup((F48, T((0, 8))))], {"axis": 0}, K.INJECTIVE),
    case("split/symbolic", "split", [T(("n", 8))], {"indices_or_sections": [2, 5], "axis": 1}, K.INJECTIVE),
    case("concat/symbolic", "concat", [Tup((T(("n", 8)), T(("n", 2))))], {"axis": 1}, K.INJECTIVE),
    case("split/one_section", "split", [F48], {"indices_or_sections": 1}, K.ELEMWISE),
    case("split/no_indices", "split", [F48], {"indices_or_sections": []}, K.ELEMWISE),
    case("strided_slice/begin0", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [0], "end": [5]}, K.ELEMWISE),
    case("strided_slice/begin0_2axes", "strided_slice", [T((8, 8))], {"axes": [0, 1], "begin": [0, 0], "end": [5, 3], "strides": [1, 1]}, K.ELEMWISE),
    case("strided_slice/begin1", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [1], "end": [5]}, K.INJECTIVE),
    case("strided_slice/stride2", "strided_slice", [T((8, 8))], {"axes": [1], "begin": [0], "end": [8], "strides": [2]}, K.INJECTIVE),
    case("strided_slice/begin_negative", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [-3], "end": [8]}, K.INJECTIVE),
    case("strided_slice/begin_minus_size", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [-8], "end": [5]}, K.ELEMWISE),
    case("strided_slice/begin_clamped", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [-100], "end": [5]}, K.ELEMWISE),
    case("strided_slice/whole", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [0], "end": [8]}, K.ELEMWISE),
    case("strided_slice/no_axes", "strided_slice", [T((8, 8))], {"axes": [], "begin": [], "end": []}, K.ELEMWISE),
    case("strided_slice/empty_at_0", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [0], "end": [0]}, K.ELEMWISE),
    case("strided_slice/empty_at_end", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [8], "end": [8]}, K.INJECTIVE),
    case("strided_slice/stride2_one_row", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [0], "end": [1], "strides": [2]}, K.INJECTIVE),
    case("strided_slice/symbolic_begin0", "strided_slice", [T(("n", 8))], {"axes": [1], "begin": [0], "end": [4]}, K.ELEMWISE),
    case("strided_slice/symbolic_begin1", "strided_slice", [T(("n", 8))], {"axes": [1], "begin": [1], "end": [4]}, K.INJECTIVE),
    case("strided_slice/end_past_size", "strided_slice", [T((8, 8))], {"axes": [1], "begin": [0], "end": [100]}, K.ELEMWISE),
    case("strided_slice/end_negative", "strided_slice", [T((8, 8))], {"axes": [1], "begin": [0], "end": [-1]}, K.ELEMWISE),
    case("strided_slice/reverse_whole", "strided_slice", [T((8, 8))], {"axes": [1], "begin": [-1], "end": [-100], "strides": [-1]}, K.INJECTIVE),
    case("strided_slice/reverse", "strided_slice", [T((8, 8))], {"axes": [0], "begin": [7], "end": [-9], "strides": [-1]}, K.INJECTIVE),
    case("broadcast_to", "broadcast_to", [T((1, 8))], {"shape": [4, 8]}, K.BROADCAST),
    case("broadcast_to/rank_up", "broadcast_to", [T((8,))], {"shape": [2, 4, 8]}, K.BROADCAST),
    case("broadcast_to/unit_rank_up", "broadcast_to", [T((8,))], {"shape": [1, 8]}, K.BROADCAST),
    case("broadcast_to/symbolic", "broadcast_to", [T(("n", 1))], {"shape": ["n", 8]}, K.BROADCAST),
    case("broadcast_to/same_shape", "broadcast_to", [F48], {"shape": [4, 8]}, K.ELEMWISE),
    case("expand_dims", "expand_dims", [F48], {"axis": [1]}, K.BROADCAST),
    case("expand_dims/front", "expand_dims", [F48], {"axis": [0]}, K.BROADCAST),
    case("squeeze", "squeeze", [T((4, 1, 8))], {"axis": [1]}, K.BROADCAST),
    case("squeeze/all", "squeeze", [T((1, 4, 1, 8))], {}, K.BROADCAST),
    case("squeeze/symbolic", "squeeze", [T(("n", 1, 8))], {"axis": [1]}, K.BROADCAST),
    case("expand_dims/symbolic", "expand_dims", [T(("n", 8))], {"axis": [1]}, K.BROADCAST),
    case("expand_dims/two", "expand_dims", [F48], {"axis": [0, 3]}, K.BROADCAST),
    case("squeeze/nothing_to_drop", "squeeze", [F48], {}, K.ELEMWISE),
    case("squeeze/no_axes", "squeeze", [T((4, 1, 8))], {"axis": []}, K.ELEMWISE),
    case("expand_dims/no_axes", "expand_dims", [F48], {"axis": []}, K.ELEMWISE),
    # creation
    case("full/const", "full", [S(1.5)], {"shape": [4, 8]}, K.ELEMWISE),
    case("full/int_const", "full", [S(2, "int32")], {"shape": [4], "dtype": "float32"}, K.ELEMWISE),
    # a fill value that is a parameter is a rank-0 input broadcast to every element
    case("full/param", "full", [T(())], {"shape": [4, 8]}, K.BROADCAST),
    case("full/int_param", "full", [T((), "int32")], {"shape": [4], "dtype": "float32"}, K.BROADCAST),
    case("full/param_rank0", "full", [T(())], {"shape": []}, K.ELEMWISE),
    case("zeros", "zeros", [], {"shape": [4, 8]}, K.ELEMWISE),
    case("ones", "ones", [], {"shape": [4, 8], "dtype": "int32"}, K.ELEMWISE),
    case("full/bool", "full", [S(True, "bool")], {"shape": [4]}, K.ELEMWISE),
]

# case -> why dpl's result type differs from Relax's (the kind is compared all the same)
TYPE_DIFFERENCES = {
    "split/one_section": "Relax's split into one piece returns the tensor, dpl's a 1-tuple",
    "split/no_indices": "Relax's split into one piece returns the tensor, dpl's a 1-tuple",
}

# op -> (the kind dpl chose, why), for every op TVM 0.27 leaves high-level on the CPU.
UNLEGALIZED: dict[str, tuple[K, str]] = {}

# -- building the call on both sides ------------------------------------------------------------


def build_dpl(c: Case):
    """A dpl function whose one binding is the case's call; returns it and the call."""
    fb = FunctionBuilder("main")
    names = iter(f"p{i}" for i in range(100))

    def operand(o):
        if isinstance(o, T):
            return fb.param(next(names), o.dtype, o.shape)
        if isinstance(o, S):
            return const(o.value, o.dtype)
        return Tuple(tuple(operand(f) for f in o.fields))

    call = make_call(c.op, [operand(o) for o in c.operands], c.attrs)
    fb.bind(call, name="out")
    return fb, call


def build_tvm(fb: FunctionBuilder, call):
    """The same function in TVM Relax, built with a BlockBuilder."""
    from tvm import relax, tirx

    syms: dict[str, Any] = {}

    def dims(shape):
        return [syms.setdefault(d, tirx.Var(d, "int64")) if isinstance(d, str) else d for d in shape]

    def ty(t: TensorType):
        return relax.TensorType(dims(t.shape), t.dtype)

    params = [relax.Var(p.name, ty(p.ty)) for p in fb.params]
    env = dict(zip(fb.params, params))

    def arg(e):
        if isinstance(e, Tuple):
            return relax.Tuple([arg(f) for f in e.fields])
        if isinstance(e, dpl.Constant):
            return relax.const(e.value, e.ty.dtype)
        return env[e]

    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            attrs = {k: dims(v) if k == "shape" else v for k, v in call.attrs.items()}
            out = bb.emit_output(relax_call(call.op, [arg(a) for a in call.args], attrs), name_hint="out")
        bb.emit_func_output(out)
    return bb.get()


def relax_call(op: str, args: list, attrs: dict):
    """``relax.op.<op>(...)`` for a dpl op; dpl's attribute names are Relax's, except where noted."""
    from tvm import relax

    fn = relax.op
    for part in op.split("."):
        fn = getattr(fn, part)
    if op == "full":  # dpl takes the fill value as the operand and the shape as an attribute
        return fn(attrs["shape"], args[0], attrs["dtype"])
    if op in ("zeros", "ones"):
        return fn(attrs["shape"], attrs["dtype"])
    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items() if v is not None}
    return fn(*args, **kwargs)


# -- reading TVM's kind -------------------------------------------------------------------------


def legalize(mod):
    from tvm import relax

    mod = relax.transform.LegalizeOps()(mod)
    return relax.transform.AnnotateTIROpPattern()(mod)


def call_bindings(mod):
    """The call values bound in ``main``'s dataflow block."""
    from tvm import relax

    block = mod["main"].body.blocks[0]
    return [b.value for b in block.bindings if isinstance(b.value, relax.Call)]


def tvm_kind(mod) -> tuple[K, bool]:
    """The kind FuseOps' graph builder gives the call's binding, and whether TVM legalized it.

    A ``call_tir`` takes its PrimFunc's ``op_pattern`` (kOpaque when missing); any other call
    (a high-level op TVM could not lower) is kOpaque.
    """
    import tvm

    calls = call_bindings(mod)
    assert len(calls) == 1, f"expected the call to legalize into one binding, got {calls}"
    call = calls[0]
    if call.op != tvm.ir.Op.get("relax.call_tir"):
        return K.OPAQUE, False
    func = mod[call.args[0]]
    pattern = func.attrs["op_pattern"] if func.attrs is not None and "op_pattern" in func.attrs else K.OPAQUE
    return K(int(pattern)), True


# -- the tests ----------------------------------------------------------------------------------


def kind_table(tvm) -> list[tuple[Case, K, K, bool]]:
    """(case, dpl kind, TVM kind, legalized) for every case; printed by ``python -m``."""
    rows = []
    for c in CASES:
        fb, call = build_dpl(c)
        kind, legalized = tvm_kind(legalize(build_tvm(fb, call)))
        rows.append((c, dpl.op_kind(call), kind, legalized))
    return rows


@pytest.mark.oracle
@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_kind_matches_tvm(c: Case, tvm):
    fb, call = build_dpl(c)
    mod = build_tvm(fb, call)
    # the two builds agree on the result type, so they are the same call
    ret = mod["main"].ret_ty
    if c.id not in TYPE_DIFFERENCES:
        assert relax_type_str(ret) == dpl_type_str(call.ty), f"{c.id}: TVM built {ret}, dpl {call.ty}"
    kind, _ = tvm_kind(legalize(mod))
    assert kind == c.kind, f"{c.id}: TVM 0.27 gives {kind.name}, the table says {c.kind.name}"
    assert dpl.op_kind(call) == kind, f"{c.id}: dpl gives {dpl.op_kind(call).name}, TVM 0.27 {kind.name}"


@pytest.mark.oracle
def test_unlegalized_table_is_true(tvm):
    left_high_level = set()
    for c in CASES:
        fb, call = build_dpl(c)
        _, legalized = tvm_kind(legalize(build_tvm(fb, call)))
        if not legalized:
            left_high_level.add(c.op)
    assert left_high_level == set(UNLEGALIZED)
    for op, (kind, why) in UNLEGALIZED.items():
        assert why, f"{op}: say why dpl chose {kind.name}"
        for c in CASES:
            if c.op == op:
                assert dpl.op_kind(build_dpl(c)[1]) == kind


@pytest.mark.oracle
def test_unlegalized_detection_works(tvm):
    """``tvm_kind`` does tell a high-level call from a lowered one: ``cumsum`` has no CPU
    legalization in TVM 0.27, and FuseOps sees it as kOpaque."""
    from tvm import relax

    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.cumsum(x, axis=1))
        bb.emit_func_output(out)
    assert tvm_kind(legalize(bb.get())) == (K.OPAQUE, False)


def test_every_op_is_in_the_table():
    covered = {c.op for c in CASES}
    missing = sorted(set(all_ops()) - covered)
    assert not missing, f"ops without a kind case in tests/test_kinds_tvm.py: {missing}"


def test_table_kinds_hold_in_dpl():
    """The table's kinds are dpl's, also where TVM is not installed."""
    kinds = {c.id: dpl.op_kind(build_dpl(c)[1]) for c in CASES}
    wrong = [(c.id, kinds[c.id].name, c.kind.name) for c in CASES if kinds[c.id] != c.kind]
    assert not wrong


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def dpl_type_str(t) -> str:
    if isinstance(t, TensorType):
        return f"{t.dtype}{list(t.shape)}"
    return "(" + ", ".join(dpl_type_str(f) for f in t.fields) + ")"


def relax_type_str(t) -> str:
    from tvm import relax

    if isinstance(t, relax.TupleType):
        return "(" + ", ".join(relax_type_str(f) for f in t.fields) + ")"
    shape = [str(d) if not hasattr(d, "value") else int(d.value) for d in t.shape.values]
    return f"{t.dtype}{shape}"


if __name__ == "__main__":  # print the table: python tests/test_kinds_tvm.py
    import tvm as _tvm

    for c, mine, theirs, legalized in kind_table(_tvm):
        flag = "" if mine == theirs else "   <-- dpl differs"
        print(f"{c.id:34} {c.op:15} TVM {theirs.name:18} dpl {mine.name:18}{'' if legalized else ' (not legalized)'}{flag}")
