"""The ONNX frontend, differentially against onnx's own reference evaluator: each op from one
table of small graphs built with onnx.helper, whole models (MLP, CNN, a transformer block with a
symbolic batch) through import, rewrites, fusion and the CPU backend, and the errors users see.

onnx missing skips these tests locally but fails them under CI, like the TVM oracle."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import needs

import dpl
from dpl.frontend import FrontendError

onnx = needs.package("onnx", module_level=True)
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from dpl.frontend.onnx_import import onnx_params  # noqa: E402
from dpl.frontend.onnx_ops import ONNX_OPS  # noqa: E402
from dpl.ir.printer import print_module  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


# -- building small graphs --------------------------------------------------------------------


@dataclass
class In:
    """A graph input filled with random values: normal, or ``low..high`` uniform (ints for ints)."""

    shape: tuple
    dtype: str = "float32"
    low: float | None = None
    high: float | None = None

    def sample(self, rng, shape=None):
        shape = tuple(shape or self.shape)
        if self.dtype == "bool":
            return rng.random(shape) < 0.5
        if self.dtype.startswith("int"):
            return rng.integers(self.low if self.low is not None else -4, self.high if self.high is not None else 5, shape).astype(self.dtype)
        if self.low is not None:
            return rng.uniform(self.low, self.high, shape).astype(self.dtype)
        return rng.standard_normal(shape).astype(self.dtype)


@dataclass
class C:
    """An initializer."""

    value: Any
    dtype: str | None = None

    def array(self):
        return np.asarray(self.value, dtype=self.dtype)


@dataclass
class Case:
    op: str
    args: list  # In, C or None (an absent optional input)
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    outputs: int = 1
    id: str = ""
    # numpy expected outputs from the feeds, where onnx's reference evaluator departs from the spec
    spec: Any = None


def tensor_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def single_node_model(case: Case, rng):
    """The case as a one-node model, its random feeds, and the reference outputs."""
    inputs, inits, names, feeds = [], [], [], {}
    for i, a in enumerate(case.args):
        if a is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(a, C):
            inits.append(numpy_helper.from_array(a.array(), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, tensor_type(a.dtype), a.shape))
            feeds[name] = a.sample(rng)
    outs = [f"out{k}" for k in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, name=f"the_{case.op.lower()}", **case.attrs)
    return finish_model([node], inputs, inits, outs, feeds, case.opset, case.spec)


def untyped_single_node_model(case: Case):
    """The case as a one-node model without running it (outputs declared as float scalars)."""
    inputs, inits, names = [], [], []
    for i, a in enumerate(case.args):
        names.append("" if a is None else f"in{i}")
        if isinstance(a, C):
            inits.append(numpy_helper.from_array(a.array(), f"in{i}"))
        elif a is not None:
            inputs.append(helper.make_tensor_value_info(f"in{i}", tensor_type(a.dtype), a.shape))
    outs = [f"out{k}" for k in range(case.outputs)]
    node = helper.make_node(case.op, names, outs, **case.attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, []) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])


def finish_model(nodes, inputs, inits, outs, feeds, opset, spec=None):
    """Declare the outputs with the types the reference evaluator computes, then check."""
    untyped = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    draft = helper.make_model(helper.make_graph(nodes, "g", inputs, untyped, inits), opset_imports=[helper.make_opsetid("", opset)])
    expected = spec(*feeds.values()) if spec else ReferenceEvaluator(draft).run(None, feeds)
    typed = [helper.make_tensor_value_info(o, tensor_type(np.asarray(v).dtype), np.shape(v)) for o, v in zip(outs, expected)]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, typed, inits), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model, feeds, [np.asarray(v) for v in expected]


def assert_matches(got, expected):
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=RTOL, atol=ATOL)


def run_imported(mod, model, feeds):
    order = [i.name for i in model.graph.input if i.name in feeds]
    return dpl.interpret(mod, *[feeds[n] for n in order])


# -- the op table -----------------------------------------------------------------------------

F = "float32"
POS = dict(low=0.5, high=2.0)
x234, x34 = In((2, 3, 4)), In((3, 4))
img = In((2, 4, 7, 7))

OP_CASES = [
    # broadcasting arithmetic
    Case("Add", [x234, In((4,))], id="bias"),
    Case("Add", [In((2, 1, 4)), In((3, 1))], id="both_broadcast"),
    Case("Sub", [x34, x34]),
    Case("Sub", [C([1.5], F), x34], id="scalar_first"),
    Case("Mul", [x234, C([2.0], F)], id="scalar_const"),
    Case("Mul", [In((1, 3, 1)), In((2, 1, 4))]),
    Case("Div", [x34, In((3, 4), **POS)]),
    Case("Div", [x34, C(1.4142135, F)], id="by_scalar"),
    Case("Pow", [In((3, 4), **POS), C([2.0], F)], id="square"),
    Case("Pow", [In((3, 4), **POS), In((4,), low=-1.0, high=2.0)], id="tensor_exponent"),
    Case("Pow", [In((3, 4), **POS), C(3, "int64")], id="int_exponent"),
    Case("Max", [x34, In((4,)), In((3, 1))], id="variadic"),
    Case("Min", [x34, In((3, 4))]),
    # comparisons and selection
    Case("Equal", [In((3, 4), "int64", -2, 2), In((4,), "int64", -2, 2)]),
    Case("Less", [x34, In((4,))]),
    Case("LessOrEqual", [x34, In((3, 4))]),
    Case("Greater", [x34, C(0.0, F)]),
    Case("GreaterOrEqual", [x34, In((1, 4))]),
    Case("Where", [In((3, 4), "bool"), x34, In((4,))]),
    # elementwise functions
    Case("Sqrt", [In((3, 4), **POS)]),
    Case("Reciprocal", [In((3, 4), **POS)]),
    Case("Exp", [x34]),
    Case("Log", [In((3, 4), **POS)]),
    Case("Tanh", [x34]),
    Case("Sigmoid", [x34]),
    Case("Erf", [x34]),
    Case("Sin", [x34]),
    Case("Cos", [x34]),
    Case("Neg", [x34]),
    Case("Abs", [x34]),
    Case("Relu", [x234]),
    Case("Gelu", [x34], opset=20, id="erf"),
    Case("Gelu", [x34], {"approximate": "tanh"}, opset=20, id="tanh"),
    Case("Clip", [x34, C(-0.5, F), C(0.5, F)], opset=13, id="both"),
    Case("Clip", [x34, C(0.0, F)], opset=13, id="min_only"),
    Case("Clip", [x34, None, C(0.25, F)], opset=13, id="max_only"),
    Case("Clip", [x34], {"min": -0.3, "max": 0.2}, opset=10, id="attributes"),
    Case("Cast", [x34], {"to": TensorProto.FLOAT16}, id="to_f16"),
    Case("Cast", [In((3, 4), "int64")], {"to": TensorProto.FLOAT}, id="int_to_float"),
    Case("Cast", [x34], {"to": TensorProto.FLOAT}, id="same_type"),
    # matrix products
    Case("MatMul", [x234, In((4, 5))]),
    Case("MatMul", [In((4,)), In((4, 5))], id="vector"),
    Case("MatMul", [x234, In((1, 4, 5))], id="batched"),
    Case("Gemm", [In((3, 4)), In((4, 5))], id="plain"),
    Case("Gemm", [In((4, 3)), In((4, 5)), In((5,))], {"transA": 1}, id="transA"),
    Case("Gemm", [In((3, 4)), C(np.random.default_rng(1).standard_normal((5, 4)), F), C(np.arange(5.0), F)], {"transB": 1}, id="transB_const"),
    Case("Gemm", [In((3, 4)), In((4, 5)), In((1, 5))], {"alpha": 0.5, "beta": 2.0}, id="alpha_beta"),
    Case("Gemm", [In((3, 4)), In((4, 5)), In((3, 5))], {"beta": 0.0}, id="beta_zero"),
    # softmax: one axis from opset 13, the flattened tail before
    Case("Softmax", [x234], opset=13, id="last"),
    Case("Softmax", [x234], {"axis": 1}, opset=13, id="axis1"),
    # onnx's reference evaluator treats Softmax-11 as Softmax-13; the spec flattens from axis on
    Case("Softmax", [x234], {"axis": 1}, opset=11, id="v11_flattened_tail", spec=lambda x: [softmax_2d(x, 1)]),
    Case("Softmax", [x34], opset=11, id="v11_2d"),
    Case("LogSoftmax", [x234], {"axis": -1}, opset=13),
    # reductions: axes as attribute, then as input
    Case("ReduceMean", [x234], {"axes": [-1]}, id="last_keep"),
    Case("ReduceMean", [x234], {"axes": [0, 2], "keepdims": 0}, id="two_axes"),
    Case("ReduceMean", [x234], id="all"),
    Case("ReduceMean", [x234, C([1], "int64")], {"keepdims": 0}, opset=18, id="axes_input"),
    Case("ReduceSum", [x234, C([-1, 0], "int64")], opset=13, id="axes_input"),
    Case("ReduceSum", [x234], {"axes": [1], "keepdims": 0}, opset=11, id="axes_attribute"),
    Case("ReduceSum", [x234], {"noop_with_empty_axes": 1}, opset=13, id="noop"),
    Case("ReduceMax", [x234], {"axes": [1]}, id="attribute"),
    Case("ReduceMax", [x234, C([2], "int64")], {"keepdims": 0}, opset=18, id="axes_input"),
    Case("ReduceMin", [x234], {"axes": [0, 1]}),
    Case("ReduceProd", [In((2, 3, 4), **POS)], {"axes": [-1]}),
    # shapes and data movement
    Case("Reshape", [x234, C([0, -1], "int64")], id="zero_and_minus_one"),
    Case("Reshape", [x234, C([-1], "int64")], id="flat"),
    Case("Reshape", [x234, C([4, 1, 6], "int64")], opset=14, id="v14"),
    Case("Transpose", [x234], id="reverse"),
    Case("Transpose", [x234], {"perm": [0, 2, 1]}, id="perm"),
    Case("Concat", [x234, In((2, 1, 4)), In((2, 2, 4))], {"axis": 1}),
    Case("Concat", [x34, x34], {"axis": -1}, id="negative_axis"),
    Case("Slice", [In((5, 6)), C([1], "int64"), C([4], "int64")], opset=13, id="first_axis"),
    Case("Slice", [In((5, 6)), C([0, -1], "int64"), C([9, -7], "int64"), C([0, 1], "int64"), C([2, -2], "int64")], opset=13,
         id="steps_negative"),
    Case("Slice", [In((5, 6)), C([2], "int64"), C([2**63 - 1], "int64"), C([-1], "int64")], opset=13, id="to_the_end"),
    Case("Slice", [In((5, 6))], {"starts": [1, 0], "ends": [3, 4], "axes": [1, 0]}, opset=9, id="v9_attributes"),
    Case("Gather", [In((5, 3)), C([4, 0, 2], "int64")], id="rows"),
    Case("Gather", [In((3, 5)), C([[1, -1], [0, 2]], "int64")], {"axis": 1}, id="matrix_negative"),
    Case("Gather", [In((5, 3)), C(2, "int64")], id="scalar_index"),
    Case("Gather", [In((5, 3)), In((2, 2), "int64", 0, 5)], id="runtime_indices"),
    Case("Unsqueeze", [x34, C([0, 3], "int64")], opset=13),
    Case("Unsqueeze", [x34], {"axes": [-1]}, opset=11, id="v11"),
    Case("Squeeze", [In((3, 1, 4, 1)), C([1], "int64")], opset=13, id="axes"),
    Case("Squeeze", [In((1, 3, 1, 4))], opset=13, id="all_units"),
    Case("Squeeze", [In((3, 1, 4))], {"axes": [1]}, opset=11, id="v11"),
    Case("Expand", [In((3, 1)), C([2, 3, 4], "int64")]),
    Case("Expand", [In((3, 4)), C([1, 1], "int64")], id="no_change"),
    Case("Split", [In((6, 4))], {"axis": 0}, outputs=3, opset=13, id="equal"),
    Case("Split", [In((4, 7)), C([2, 5], "int64")], {"axis": 1}, outputs=2, opset=13, id="sizes"),
    Case("Split", [In((4, 7))], {"axis": -1, "num_outputs": 3}, outputs=3, opset=18, id="num_outputs_uneven"),
    Case("Flatten", [In((2, 3, 4, 5))], id="default"),
    Case("Flatten", [In((2, 3, 4, 5))], {"axis": 2}, id="axis2"),
    Case("Flatten", [In((2, 3, 4, 5))], {"axis": 0}, id="axis0"),
    Case("Flatten", [In((2, 3, 4, 5))], {"axis": -1}, id="axis_minus1"),
    Case("Shape", [x234]),
    Case("Shape", [x234], {"start": 1, "end": -1}, opset=15, id="start_end"),
    Case("Size", [x234]),
    Case("Identity", [x34]),
    Case("Dropout", [x34], opset=13),
    Case("Constant", [], {"value": numpy_helper.from_array(np.arange(6.0, dtype=F).reshape(2, 3))}, id="tensor"),
    Case("Trilu", [x234], id="upper"),
    Case("Trilu", [x234, C(1, "int64")], {"upper": 0}, id="lower_k1"),
    Case("Trilu", [In((5, 3)), C(-2, "int64")], id="upper_k_minus2"),
    Case("Trilu", [In((3, 4), "int64")], {"upper": 0}, id="int"),
    Case("Range", [C(1, "int64"), C(9, "int64"), C(3, "int64")], id="ints"),
    Case("Range", [C(0.5, F), C(-1.0, F), C(-0.25, F)], id="floats"),
    # remainders, roundings, activations (tests/test_elementwise_padding.py has more of them)
    Case("Mod", [In((3, 4), "int32", -9, 10), In((3, 4), "int32", -4, 5)], id="floor_ints_zero_divisors"),
    Case("Mod", [In((3, 4), "int64", -9, 10), In((4,), "int64", -4, 5)], {"fmod": 1}, id="fmod_ints"),
    Case("Mod", [In((3, 4), low=-5.0, high=5.0), In((3, 4), low=0.5, high=2.0)], {"fmod": 1}, id="fmod_floats"),
    Case("Mod", [In((3, 4), low=-5.0, high=5.0), C(-1.5, F)], opset=28, id="floor_floats_v28"),
    Case("Floor", [In((3, 4), low=-3.0, high=3.0)]),
    Case("Ceil", [In((3, 4), low=-3.0, high=3.0)]),
    Case("Round", [In((3, 4), low=-3.0, high=3.0)]),
    Case("Round", [C([[0.5, 1.5, 2.5, -0.5, -2.5, 3.49]], F)], id="ties_to_even"),
    Case("Sign", [x34]),
    Case("Sign", [In((3, 4), "int32", -2, 3)], id="ints"),
    Case("Softplus", [In((3, 4), low=-30.0, high=30.0)]),
    Case("HardSigmoid", [In((3, 4), low=-6.0, high=6.0)]),
    Case("HardSigmoid", [In((3, 4), low=-6.0, high=6.0)], {"alpha": 0.3, "beta": 0.4}, id="alpha_beta"),
    Case("HardSwish", [In((3, 4), low=-6.0, high=6.0)], opset=14),
    Case("Mish", [In((3, 4), low=-10.0, high=10.0)], opset=18),
    # padding and tiling
    Case("Pad", [x234], {"pads": [0, 1, 2, 0, 0, 1], "value": 0.5}, opset=10, id="v2_attributes"),
    Case("Pad", [x234], {"pads": [0, 1, 2, 1, 2, 3], "mode": "reflect"}, opset=10, id="v2_reflect_wide"),
    # onnx's reference pads with np.pad, which takes no negative pad: the spec crops
    Case("Pad", [x234, C([0, 1, -1, 0, 2, 3], "int64"), C(-2.0, F)], opset=13, id="constant_crop",
         spec=lambda x: [np.pad(x[:, :, 1:], [(0, 0), (1, 2), (0, 3)], constant_values=-2.0)]),
    Case("Pad", [x234, C([1, 0, 2, 1, 1, 1], "int64")], {"mode": "edge"}, opset=13, id="edge"),
    Case("Pad", [In((2, 3, 4), "int64"), C([0, 0, 1, 0, 0, 2], "int64"), C(7, "int64")], opset=13, id="ints"),
    Case("Pad", [x234, C([2, 1, 3, 1], "int64"), None, C([-1, 1], "int64")], {"mode": "reflect"}, opset=18, id="axes"),
    Case("Pad", [x234, C([1, 5, 0, 9], "int64"), None, C([0, 2], "int64")], {"mode": "wrap"}, opset=19, id="wrap"),
    Case("Tile", [x34, C([2, 3], "int64")]),
    Case("Tile", [x234, C([1, 2, 1], "int64")], id="one_axis"),
    # logic and the gathers of masks (torch.onnx's exports of transformers' models)
    Case("IsNaN", [C([1.0, np.nan, -np.inf, 0.0], F)], opset=20),
    Case("And", [In((3, 4), "bool"), In((4,), "bool")]),
    Case("Or", [In((3, 4), "bool"), In((3, 1), "bool")]),
    Case("Xor", [In((3, 4), "bool"), In((3, 4), "bool")]),
    Case("Not", [In((3, 4), "bool")]),
    Case("CumSum", [In((3, 4)), C(1, "int64")], id="floats"),
    Case("CumSum", [In((2, 5), "int64"), C(-1, "int64")], id="ints"),
    Case("GatherElements", [In((1, 6), "int64"), C([[2, 0, 5]], "int64")], {"axis": 1}, id="row"),
    Case("GatherND", [In((3, 5)), C(np.stack(np.broadcast_arrays(np.arange(3)[:, None], 1 + np.arange(4)[None, :]), -1),
                                    "int64")], id="range_grid"),
    # indexing, scattering, selection (more in tests/test_ops_indexing.py)
    Case("ArgMax", [x234], {"axis": 1, "keepdims": 0}, id="middle"),
    Case("ArgMin", [x234], {"axis": -1, "select_last_index": 1}, opset=13, id="last_index"),
    Case("TopK", [x234, C([2], "int64")], {"axis": -1}, outputs=2, opset=11, id="largest"),
    Case("ScatterND", [In((4, 3)), C([[1], [3]], "int64"), In((2, 3))], opset=16, id="rows"),
    Case("ScatterElements", [In((3, 4)), C([[0, 2], [3, 1]], "int64"), In((2, 2))], {"axis": 1, "reduction": "add"},
         opset=16, id="add"),
    Case("Constant", [], {"value_ints": [3, 1, 4]}, id="ints"),
    Case("ConstantOfShape", [C([2, 3], "int64")], {"value": numpy_helper.from_array(np.array([1.5], F))}),
    # normalisation
    Case("LayerNormalization", [x234, In((4,)), In((4,))], {"epsilon": 1e-3}, id="last"),
    Case("LayerNormalization", [x234, In((3, 4)), In((3, 4))], {"axis": 1}, id="two_axes"),
    Case("LayerNormalization", [x234, In((4,))], id="no_bias"),
    Case("RMSNormalization", [x234, In((4,))], {"epsilon": 1e-4}, opset=23),
    Case("BatchNormalization", [img, In((4,)), In((4,)), In((4,)), In((4,), **POS)], {"epsilon": 1e-3}, opset=15),
    # convolution and pooling
    Case("Conv", [img, In((3, 4, 3, 3))], id="plain"),
    Case("Conv", [img, In((6, 4, 3, 3)), In((6,))], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, id="stride_pad_bias"),
    Case("Conv", [img, In((6, 2, 2, 2))], {"group": 2, "dilations": [2, 2], "pads": [0, 1, 1, 0]}, id="groups_dilation"),
    # onnx's reference evaluator pads strided SAME convolutions by the wrong dims; explicit pads are the spec
    Case("Conv", [img, In((3, 4, 3, 3))], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, id="same_upper_strided",
         spec=lambda x, w: reference_node("Conv", [x, w], pads=[1, 1, 1, 1], strides=[2, 2])),
    Case("Conv", [img, In((3, 4, 2, 2))], {"auto_pad": "SAME_LOWER"}, id="same_lower"),
    Case("Conv", [In((2, 3, 9)), In((5, 3, 3)), In((5,))], {"pads": [1, 2], "strides": [2]}, id="one_d"),
    # interpolation, transposed convolution, group and instance norm (more in tests/test_ops_vision.py)
    Case("Resize", [img, None, C([1, 1, 2, 1.5], "float32")],
         {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, opset=13, id="nearest_scales"),
    Case("Resize", [img, None, None, C([2, 4, 9, 5], "int64")], {"mode": "linear"}, opset=13, id="linear_sizes"),
    Case("Resize", [img, C([], "float32"), C([1, 1, 1.5, 2], "float32")],
         {"mode": "cubic", "coordinate_transformation_mode": "align_corners", "cubic_coeff_a": -0.5, "exclude_outside": 1},
         opset=11, id="cubic_exclude"),
    # torch.onnx writes every attribute, also on a resize to the input's own size (SegFormer's first stage)
    Case("Resize", [img, None, None, C([2, 4, 7, 7], "int64")],
         {"mode": "linear", "cubic_coeff_a": -0.75, "exclude_outside": 0}, opset=13, id="to_its_own_size"),
    # onnx's reference evaluator fails on grouped ConvTranspose: tests/test_ops_vision.py checks groups against torch
    Case("ConvTranspose", [img, In((4, 3, 3, 2)), In((3,))],
         {"strides": [2, 1], "pads": [1, 0, 0, 1], "output_padding": [1, 0], "dilations": [1, 2]}, id="output_padding"),
    Case("InstanceNormalization", [img, In((4,)), In((4,))], {"epsilon": 1e-3}, id="affine"),
    Case("GroupNormalization", [img, In((4,)), In((4,))], {"num_groups": 2}, opset=21, id="per_channel"),
    Case("ReduceL1", [x234], {"axes": [-1]}, opset=13, id="last"),
    Case("ReduceL2", [x234, C([0, 2], "int64")], {"keepdims": 0}, opset=18, id="axes_input"),
    Case("ReduceSumSquare", [x234], opset=13, id="all"),
    Case("MaxPool", [img], {"kernel_shape": [2, 2], "strides": [2, 2]}, id="k2s2"),
    Case("MaxPool", [img], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, id="k3_pad"),
    Case("MaxPool", [In((2, 4, 8, 8))], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=12, id="ceil"),
    Case("MaxPool", [img], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, opset=12,
         id="ceil_drops_last"),
    Case("MaxPool", [img], {"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=12, id="dilation"),
    Case("MaxPool", [img], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, id="same_upper"),
    Case("AveragePool", [img], {"kernel_shape": [2, 2], "strides": [2, 2]}, id="k2s2"),
    Case("AveragePool", [img], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, id="pad_excluded"),
    Case("AveragePool", [img], {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "count_include_pad": 1}, id="pad_included"),
    Case("AveragePool", [img], {"kernel_shape": [3, 2], "strides": [2, 1], "auto_pad": "SAME_UPPER"}, id="same_upper"),
    Case("AveragePool", [img], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, id="ceil"),
    Case("AveragePool", [img], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, id="ceil_pad_excluded"),
    Case("AveragePool", [In((2, 4, 8, 8))], {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                            "count_include_pad": 1}, id="ceil_pad_included"),
    Case("AveragePool", [In((1, 2, 9, 9))], {"kernel_shape": [3, 2], "strides": [2, 1], "dilations": [2, 3], "pads": [2, 1, 1, 0]},
         opset=19, id="dilation"),
    Case("GlobalAveragePool", [img]),
    Case("GlobalAveragePool", [In((2, 3, 5))], id="one_d"),
    Case("GlobalMaxPool", [img]),
    # Einsum: a broadcast product and a sum over the letters the output lacks (Mamba2's scan)
    Case("Einsum", [In((2, 3, 4)), In((2, 4, 5))], {"equation": "bij,bjk->bik"}, id="batched_matmul"),
    Case("Einsum", [In((2, 3, 4, 5)), In((2, 3, 6, 5)), In((2, 5, 3, 6))], {"equation": "bclh,bcsh,bhcs->bclh"},
         id="three_operands"),
    Case("Einsum", [In((3, 4)), In((4,))], {"equation": "ij, j"}, id="implicit_output"),
    Case("Einsum", [In((2, 1, 3, 4)), In((5, 4, 2))], {"equation": "...ij,...jk->...ik"}, id="ellipsis_broadcast"),
    Case("Einsum", [In((3, 4))], {"equation": "ij->ji"}, id="transpose"),
]


def reference_node(op: str, arrays, **attrs):
    """onnx's reference evaluator on one node over graph inputs."""
    names = [f"in{i}" for i in range(len(arrays))]
    graph = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "spec",
                              [helper.make_tensor_value_info(n, tensor_type(a.dtype), a.shape) for n, a in zip(names, arrays)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, arrays)))


def softmax_2d(x, axis):
    """Softmax-11 by its spec: x seen as 2-D, rows the dims before axis, columns the rest."""
    z = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape).astype(x.dtype)


def case_id(case: Case) -> str:
    return f"{case.op}-{case.id}" if case.id else case.op


@pytest.mark.parametrize("case", OP_CASES, ids=case_id)
def test_op_matches_the_reference(case):
    if case.opset > onnx.defs.onnx_opset_version():
        needs.missing(f"onnx {onnx.__version__} predates opset {case.opset}")
    rng = np.random.default_rng(sum(map(ord, case_id(case))))
    model, feeds, expected = single_node_model(case, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dpl's types agree with ONNX's shape inference
        mod = dpl.from_onnx(model)
    assert_matches(run_imported(mod, model, feeds), expected)
    # the names the importer chose are identifiers of the text form: the module round-trips
    assert dpl.structural_equal(dpl.parse(print_module(mod, inline_limit=None)), mod)


def test_every_table_entry_is_covered_and_names_real_op_versions():
    covered = {c.op for c in OP_CASES}
    assert set(ONNX_OPS) <= covered, sorted(set(ONNX_OPS) - covered)
    for op_type, entry in ONNX_OPS.items():
        versions = {s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op_type and s.domain == ""}
        if entry.first > onnx.defs.onnx_opset_version():
            continue  # an op newer than the installed onnx
        assert entry.first in versions and entry.last in versions, (op_type, entry, sorted(versions))


# -- whole models -----------------------------------------------------------------------------


class GraphWriter:
    """A few lines per layer: nodes, initializers and fresh names for an onnx.helper graph."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def weight(self, *shape, scale=None, value=None):
        name = f"w{len(self.inits)}"
        if value is None:
            scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1] if len(shape) > 1 else 4)
            value = self.rng.standard_normal(shape) * scale
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32 if np.asarray(value).dtype.kind == "f" else None), name))
        return name

    def ints(self, *values):
        name = f"i{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def __call__(self, op, *inputs, outputs=1, **attrs):
        names = [f"/{op.lower()}_{self.count}/out{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), names, name=f"/{op.lower()}_{self.count}", **attrs))
        self.count += 1
        return names[0] if outputs == 1 else names

    def model(self, inputs, outputs, opset=17):
        graph = helper.make_graph(self.nodes, "model", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        onnx.checker.check_model(model)
        return model


def f32_input(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def mlp_model():
    g = GraphWriter(1)
    h = g("Relu", g("Gemm", "x", g.weight(32, 16), g.weight(32, scale=0.1), transB=1))
    y = g("Gemm", h, g.weight(32, 10), g.weight(1, 10, scale=0.1), alpha=0.5)
    out = g("Softmax", y, axis=-1)
    return g.model([f32_input("x", ["batch", 16])], [f32_input(out, ["batch", 10])])


def cnn_model():
    g = GraphWriter(2)
    h = g("Relu", g("Conv", "image", g.weight(8, 3, 3, 3, scale=0.3), g.weight(8, scale=0.1), pads=[1, 1, 1, 1]))
    h = g("MaxPool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = g("BatchNormalization", g("Conv", h, g.weight(16, 8, 3, 3, scale=0.2), strides=[1, 1]), g.weight(16, scale=1.0),
          g.weight(16, scale=0.1), g.weight(16, scale=0.1), g.weight(value=np.linspace(0.5, 2.0, 16)))
    h = g("AveragePool", g("Relu", h), kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1])
    wide = g("Flatten", h)
    narrow = g("Flatten", g("GlobalAveragePool", h))
    y = g("Add", g("Gemm", wide, g.weight(16 * 3 * 3, 10, scale=0.05)), g("Gemm", narrow, g.weight(10, 16), transB=1))
    return g.model([f32_input("image", ["batch", 3, 16, 16])], [f32_input(y, ["batch", 10])])


def decomposed_layer_norm(g, x, width, eps=1e-5):
    """LayerNorm as torch exports it below opset 17."""
    mu = g("ReduceMean", x, axes=[-1])
    d = g("Sub", x, mu)
    var = g("ReduceMean", g("Pow", d, g.weight(value=2.0)), axes=[-1])
    n = g("Div", d, g("Sqrt", g("Add", var, g.weight(value=eps))))
    return g("Add", g("Mul", n, g.weight(value=1.0 + 0.1 * g.rng.standard_normal(width))), g.weight(width, scale=0.1))


def erf_gelu(g, x):
    """GELU as torch exports nn.GELU() below opset 20."""
    e = g("Erf", g("Div", x, g.weight(value=1.4142135381698608)))
    return g("Mul", g("Mul", x, g("Add", e, g.weight(value=1.0))), g.weight(value=0.5))


def transformer_model(seq=8, width=16, heads=2):
    """Pre-norm block: decomposed LayerNorm, multi-head attention (Reshape with 0, Transpose,
    MatMul, scale, Softmax), LayerNormalization, an erf-GELU MLP; batch is symbolic."""
    g = GraphWriter(3)
    dh = width // heads
    h = decomposed_layer_norm(g, "x", width)

    def split_heads(t, perm):
        return g("Transpose", g("Reshape", t, g.ints(0, 0, heads, dh)), perm=perm)

    q = split_heads(g("MatMul", h, g.weight(width, width)), [0, 2, 1, 3])
    k = split_heads(g("MatMul", h, g.weight(width, width)), [0, 2, 3, 1])
    v = split_heads(g("MatMul", h, g.weight(width, width)), [0, 2, 1, 3])
    p = g("Softmax", g("Div", g("MatMul", q, k), g.weight(value=[float(np.sqrt(dh))])), axis=-1)
    a = g("Reshape", g("Transpose", g("MatMul", p, v), perm=[0, 2, 1, 3]), g.ints(0, 0, width))
    x1 = g("Add", "x", g("MatMul", a, g.weight(width, width)))
    h2 = g("LayerNormalization", x1, g.weight(width, scale=0.1, value=1 + 0.1 * g.rng.standard_normal(width)), g.weight(width, scale=0.1))
    m = erf_gelu(g, g("Add", g("MatMul", h2, g.weight(width, 4 * width)), g.weight(4 * width, scale=0.1)))
    y = g("Add", x1, g("Add", g("MatMul", m, g.weight(4 * width, width)), g.weight(width, scale=0.1)))
    return g.model([f32_input("x", ["batch", seq, width])], [f32_input(y, ["batch", seq, width])])


def rms_norm_model(width=16):
    """Llama's RMSNorm as exported: x * Reciprocal(Sqrt(mean(x^2) + eps)) * w."""
    g = GraphWriter(4)
    var = g("ReduceMean", g("Pow", "x", g.weight(value=2.0)), axes=[-1])
    r = g("Reciprocal", g("Sqrt", g("Add", var, g.weight(value=1e-6))))
    y = g("Mul", g.weight(value=1 + 0.1 * g.rng.standard_normal(width)), g("Mul", "x", r))
    return g.model([f32_input("x", ["batch", width])], [f32_input(y, ["batch", width])])


def causal_mask_model(width=8):
    """A causal mask made in the graph at the symbolic length, as exporters write it: Range over
    Gather(Shape(x)), compared, Where; and a Trilu of a ConstantOfShape of the same length. The
    symbolic dim (called batch, as in the other models) is the sequence here."""
    g = GraphWriter(5)
    length = g("Gather", g("Shape", "x"), g.ints(0), axis=0)
    length = g("Squeeze", length, g.ints(0))
    r = g("Range", g.weight(value=np.array(0, np.int64)), length, g.weight(value=np.array(1, np.int64)))
    allowed = g("GreaterOrEqual", g("Unsqueeze", r, g.ints(1)), g("Unsqueeze", r, g.ints(0)))
    scores = g("MatMul", g("MatMul", "x", g.weight(width, width)), g("Transpose", "x", perm=[1, 0]))
    probs = g("Softmax", g("Where", allowed, scores, g.weight(value=np.array(-np.inf, np.float32))), axis=-1)
    square = g("Concat", g("Unsqueeze", length, g.ints(0)), g("Unsqueeze", length, g.ints(0)), axis=0)
    ones = g("ConstantOfShape", square, value=numpy_helper.from_array(np.array([1.0], np.float32)))
    keep = g("Trilu", ones, g.weight(value=np.array(-1, np.int64)), upper=0)
    y = g("Add", probs, keep)
    return g.model([f32_input("x", ["batch", width])], [f32_input(y, ["batch", "batch"])])


MODELS = {"mlp": mlp_model, "cnn": cnn_model, "transformer": transformer_model, "rms_norm": rms_norm_model,
          "causal_mask": causal_mask_model}


def model_feeds(model, batch, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        dims = [batch if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", MODELS)
def test_model_matches_the_reference_at_two_batch_sizes(name):
    model = MODELS[name]()
    mod = dpl.from_onnx(model)
    assert all("batch" in p.ty.shape for p in mod["main"].params)
    reference = ReferenceEvaluator(model)
    for batch in (2, 5):
        feeds = model_feeds(model, batch, seed=batch)
        assert_matches(run_imported(mod, model, feeds), reference.run(None, feeds))


@pytest.mark.parametrize("name", MODELS)
def test_model_after_rewrites_fusion_and_cpu_build_still_matches(name):
    model = MODELS[name]()
    fused = dpl.apply(dpl.from_onnx(model), ["rewrites", "llm"])
    exe = dpl.build(fused, "cpu")
    reference = ReferenceEvaluator(model)
    for batch in (2, 5):
        feeds = model_feeds(model, batch, seed=10 + batch)
        assert_matches(exe(*feeds.values()), reference.run(None, feeds))


def composites(mod):
    return sorted(f.attrs["Composite"] for f in mod.functions.values() if "Composite" in f.attrs)


def test_rewrites_and_llm_patterns_claim_the_exported_transformer():
    mod = dpl.from_onnx(transformer_model())
    rewritten = dpl.apply(mod, ["rewrites"], composites=False, fuse=False, merge_products=False)
    ops = [b.value.op for b in rewritten["main"].bindings]
    assert ops.count("nn.layer_norm") == 2 and "nn.gelu" in ops, ops  # the decomposed LayerNorm and GELU
    assert "erf" not in ops and "sqrt" not in ops and "mean" not in ops
    fused = dpl.apply(mod, ["rewrites", "llm"], fuse=False)
    # the two LayerNorms stand alone (no residual add before them): kernel.layer_norm each
    assert composites(fused) == ["kernel.attention", "kernel.gelu", "kernel.layer_norm", "kernel.layer_norm"]


def single_input_model(build, width=16, seed=5):
    g = GraphWriter(seed)
    y = build(g, "x", width)
    return g.model([f32_input("x", ["batch", width])], [f32_input(y, ["batch", width])])


def tanh_gelu(g, x, width):
    """GELU(approximate='tanh') as exported below opset 20."""
    inner = g("Add", x, g("Mul", g("Pow", x, g.weight(value=3.0)), g.weight(value=0.044715)))
    t = g("Tanh", g("Mul", inner, g.weight(value=0.7978845608028654)))
    return g("Mul", g("Mul", x, g.weight(value=0.5)), g("Add", t, g.weight(value=1.0)))


def softmax_by_hand(g, x, width):
    e = g("Exp", g("Sub", x, g("ReduceMax", x, axes=[1])))
    return g("Div", e, g("ReduceSum", e, g.ints(-1)))


DECOMPOSED = {
    "rms_norm": (lambda: rms_norm_model(), "nn.rms_norm"),
    "layer_norm": (lambda: single_input_model(decomposed_layer_norm), "nn.layer_norm"),
    "gelu_erf": (lambda: single_input_model(lambda g, x, w: erf_gelu(g, x)), "nn.gelu"),
    "gelu_tanh": (lambda: single_input_model(tanh_gelu), "nn.gelu_tanh"),
    "silu": (lambda: single_input_model(lambda g, x, w: g("Mul", x, g("Sigmoid", x))), "nn.silu"),
    "softmax": (lambda: single_input_model(softmax_by_hand), "nn.softmax"),
}


@pytest.mark.parametrize("name", DECOMPOSED)
def test_exported_decompositions_become_the_standard_op(name):
    """What exporters write for ops ONNX lacks (or lacked before a recent opset) imports in the
    form the rewrite library turns into the standard op, axes and scalar constants included."""
    build, op = DECOMPOSED[name]
    model = build()
    mod = dpl.from_onnx(model)
    rewritten = dpl.apply(mod, ["rewrites"], composites=False, fuse=False)
    assert [b.value.op for b in rewritten["main"].bindings] == [op]
    feeds = model_feeds(model, 3, seed=0)
    assert_matches(dpl.interpret(rewritten, feeds["x"]), ReferenceEvaluator(model).run(None, feeds))


def test_params_kept_as_inputs_compute_the_same():
    model = transformer_model()
    mod = dpl.from_onnx(model, keep_params_as_inputs=True)
    params = onnx_params(model, mod)
    main = mod["main"]
    assert [p.name for p in main.params][:1] == ["x"] and len(main.params) == 1 + len(params)
    assert all(a.size > 1 for a in params)  # scalars (eps, exponents, scales) stay constants
    feeds = model_feeds(model, 3, seed=0)
    assert_matches(dpl.interpret(mod, feeds["x"], *params), ReferenceEvaluator(model).run(None, feeds))
    # the rewrites still see the constants they check
    ops = [b.value.op for b in dpl.apply(mod, ["rewrites"], composites=False, fuse=False)["main"].bindings]
    assert ops.count("nn.layer_norm") == 2 and "nn.gelu" in ops


def test_a_model_loads_from_a_path(tmp_path):
    model = mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    assert dpl.structural_equal(dpl.from_onnx(str(path)), dpl.from_onnx(model))
    assert dpl.structural_equal(dpl.from_onnx(path), dpl.from_onnx(model))


def test_shapes_override_fixes_a_symbolic_dimension():
    model = mlp_model()
    mod = dpl.from_onnx(model, shapes={"x": [4, 16]})
    assert mod["main"].params[0].ty.shape == (4, 16) and mod["main"].ret.ty.shape == (4, 10)
    renamed = dpl.from_onnx(model, shapes={"x": ["rows", 16]})
    assert renamed["main"].ret.ty.shape == ("rows", 10)
    feeds = model_feeds(model, 4, seed=0)
    assert_matches(dpl.interpret(mod, feeds["x"]), ReferenceEvaluator(model).run(None, feeds))


def test_importing_leaves_the_model_untouched():
    model = transformer_model()
    before = model.SerializeToString()
    dpl.from_onnx(model, shapes={"x": [2, 8, 16]})
    assert model.SerializeToString() == before


# -- errors users see -------------------------------------------------------------------------


def import_error(model, **options) -> str:
    with pytest.raises(FrontendError) as info:
        dpl.from_onnx(model, **options)
    return str(info.value)


def one_node(op, inputs, outputs, opset=17, inits=(), domain="", out_shape=(3, 4), **attrs):
    node = helper.make_node(op, [n for n, _ in inputs] + [t.name for t in inits], outputs, name="culprit", domain=domain, **attrs)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shape) for o in outputs[:1]], list(inits))
    return helper.make_model(graph, opset_imports=opsets)


X34 = ("x", (TensorProto.FLOAT, [3, 4]))
Y34 = ("x2", (TensorProto.FLOAT, [3, 4]))


def test_unsupported_op_names_op_node_index_and_opset():
    g = GraphWriter()
    y = g("Relu", "x")
    g.nodes.append(helper.make_node("Hardmax", [y], ["z"], name="the_culprit"))
    model = g.model([f32_input("x", [3, 4])], [f32_input("z", [3, 4])], opset=13)
    message = import_error(model)
    assert "ONNX node #1 'the_culprit' (Hardmax, opset 13)" in message
    assert "op type 'Hardmax' is not supported" in message
    assert "Traceback" not in message


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # the -inf row
def test_safe_softmax_guard_moves_after_the_product():
    """torch.onnx writes SDPA's softmax as Where(IsNaN(p), 0, p): dpl guards the product instead
    (the attention chain softmax -> matmul stays whole), with the same numbers, fully masked
    rows (all -inf) giving zeros."""
    g = GraphWriter()
    p = g("Softmax", "s", axis=-1)
    guarded = g("Where", g("IsNaN", p), g.weight(value=np.array(0.0, np.float32)), p)
    g("MatMul", guarded, "v")
    model = g.model([f32_input("s", [2, 3, 4]), f32_input("v", [2, 4, 5])], [f32_input(g.nodes[-1].output[0], [2, 3, 5])])
    mod = dpl.from_onnx(model)
    ops = [b.value.op for b in mod["main"].bindings]
    assert "matmul" in ops[ops.index("nn.softmax"):]  # the product reads the softmax itself
    assert "not_equal" not in ops  # the IsNaN guard is gone
    s = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    s[1, 2] = -np.inf
    v = np.random.default_rng(1).standard_normal((2, 4, 5)).astype(np.float32)
    want = onnx.reference.ReferenceEvaluator(model).run(None, {"s": s, "v": v})[0]
    got = dpl.interpret(mod, s, v)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.all(got[1, 2] == 0)


def test_every_unsupported_op_type_is_listed_at_once_with_counts_and_source_lines():
    g = GraphWriter()
    y = g("Relu", "x")
    a = g("Hardmax", y)
    b = g("Hardmax", a)
    c = g("Shrink", b)
    g.nodes.append(helper.make_node("FusedMatMul", [c, c], ["z"], name="ms", domain="com.microsoft"))
    # torch.onnx records the user's stack on each node; the innermost frame is the source line
    trace = f'File "{__file__}", line 1, in forward\n    x = 1'
    g.nodes[1].metadata_props.add(key="pkg.torch.onnx.stack_trace", value=trace)
    graph = helper.make_graph(g.nodes, "model", [f32_input("x", [3, 4])], [f32_input("z", [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    message = import_error(model)
    assert message.startswith("error: 3 op types are not supported by dpl's ONNX frontend:")
    from dpl.frontend.errors import short_path

    assert f"'Hardmax' x2, first at node #1 '/hardmax_1' ({short_path(__file__)}:1: " in message
    assert "'Shrink' x1, first at node #3" in message
    assert "'FusedMatMul' of domain 'com.microsoft' x1, first at node #4 'ms'" in message


def test_a_long_list_of_unsupported_ops_keeps_every_op():
    """A model missing many ops (a Mixtral import missed 12, and the message cut one from the
    middle): every op and its count is listed; the places shrink instead."""
    g = GraphWriter()
    value = "x"
    deep = "/" + "/".join(["very_long_folder_name"] * 12) + "/modeling.py"
    for i in range(40):
        value = g(f"CustomOperatorNumber{i:02d}", value)
        g.nodes[-1].domain = "com.example"
        g.nodes[-1].metadata_props.add(key="pkg.torch.onnx.stack_trace",
                                       value=f'File "{deep}", line {i + 1}, in forward\n    y = f(x)')
    graph = helper.make_graph(g.nodes, "model", [f32_input("x", [3, 4])], [f32_input(value, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    message = import_error(model)
    assert message.startswith("error: 40 op types are not supported by dpl's ONNX frontend:")
    for i in range(40):
        assert f"'CustomOperatorNumber{i:02d}' of domain 'com.example' x1" in message
    assert " ... " not in message.split("hint:")[0].splitlines()[0]


def test_unsupported_ops_cut_places_then_labels_never_entries():
    from dpl.frontend.errors import UnsupportedOpsError, unsupported_ops

    few = unsupported_ops("2 ops:", [("a.b", 3, "m.py:1: y = b(x)"), ("a.c", 1, "m.py:2: z = c(y)")], hint="h")
    assert str(few) == "error: 2 ops:\n  a.b x3, first at m.py:1: y = b(x)\n  a.c x1, first at m.py:2: z = c(y)\n  hint: h"
    many = [(f"op{i}", i + 1, "x" * 300) for i in range(60)]
    text = str(unsupported_ops("60 ops:", many, hint="h"))
    assert all(f"  op{i} x{i + 1}" in text for i in range(60)) and len(text) < UnsupportedOpsError.message_limit + 100
    hostile = [("n" * 10_000 + str(i), 1, "") for i in range(100)]
    text = str(unsupported_ops("100 ops:", hostile, hint="h"))
    assert text.count(" x1") == 100 and len(text) < 2 * UnsupportedOpsError.message_limit


def test_unsupported_domain():
    message = import_error(one_node("FusedMatMul", [X34, Y34], ["y"], domain="com.microsoft"))
    assert "'FusedMatMul' of domain 'com.microsoft' is not supported" in message and "#0 'culprit'" in message


def test_unsupported_op_version_names_the_versions_dpl_knows():
    message = import_error(one_node("Add", [X34, Y34], ["y"], opset=6))
    assert "ONNX node #0 'culprit' (Add, opset 6)" in message
    assert "Add version 6 (selected by opset 6) is not supported; dpl translates versions 7 to 14" in message


@pytest.mark.parametrize("op,attrs,opset,expect", [
    ("Cast", {"to": TensorProto.STRING}, 17, "attribute to='STRING' is not supported; dpl supports casts to FLOAT"),
    ("Gelu", {"approximate": "sigmoid"}, 20, "attribute approximate='sigmoid' is not supported; dpl supports 'none' and 'tanh'"),
    ("MaxPool", {"kernel_shape": [2, 2], "auto_pad": "SAME_MIDDLE"}, 17, "attribute auto_pad='SAME_MIDDLE' is not supported"),
    ("BatchNormalization", {"training_mode": 1}, 15, "attribute training_mode=1 is not supported"),
])
def test_unsupported_attribute_values_name_the_attribute(op, attrs, opset, expect):
    image = ("x", (TensorProto.FLOAT, [1, 2, 5, 5]))
    vec = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b", "m", "v")]
    inputs, inits = ([image], vec) if op == "BatchNormalization" else ([image], [])
    model = one_node(op, inputs, ["y"], opset=opset, inits=inits, out_shape=[None] * 4, **attrs)
    message = import_error(model)
    assert f"ONNX node #0 'culprit' ({op}, opset {opset})" in message and expect in message, message


def test_dynamic_reshape_shape_is_a_clear_error():
    model = one_node("Reshape", [X34, ("shape", (TensorProto.INT64, [2]))], ["y"], out_shape=[None, None])
    message = import_error(model)
    assert "ONNX node #0 'culprit' (Reshape, opset 17)" in message
    assert "the shape (input 'shape') is computed at run time; dpl needs it constant" in message
    assert "hint:" in message


def test_symbolic_shape_used_as_data_is_a_clear_error():
    # arithmetic on a symbolic shape is computed at import (tests/test_dims_frontends.py); the
    # shape as float data is a value of run time
    g = GraphWriter()
    s = g("Cast", g("Shape", "x"), to=TensorProto.FLOAT)
    y = g("Add", "x", s)
    model = g.model([f32_input("x", ["batch", 2])], [f32_input(y, [None, None])])
    message = import_error(model)
    assert "(Add, opset 17)" in message and "is a shape with symbolic dimensions [batch, 2], used here as data" in message


def test_symbolic_shapes_flow_into_reshape_targets():
    # x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    g = GraphWriter()
    n = g("Unsqueeze", g("Gather", g("Shape", "x"), g.weight(value=np.int64(0))), g.ints(0))
    y = g("Reshape", "x", g("Concat", n, g.ints(-1), axis=0))
    model = g.model([f32_input("x", ["batch", 3, 4])], [f32_input(y, ["batch", 12])])
    mod = dpl.from_onnx(model)
    assert [b.value.op for b in mod["main"].bindings] == ["reshape"] and mod["main"].ret.ty.shape == ("batch", 12)
    feeds = model_feeds(model, 5, seed=0)
    assert_matches(run_imported(mod, model, feeds), ReferenceEvaluator(model).run(None, feeds))


def test_used_secondary_outputs_are_refused():
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2], name="pool")
    graph = helper.make_graph([node], "g", [f32_input("x", [1, 1, 4, 4])],
                              [f32_input("y", [1, 1, 3, 3]), helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 1, 3, 3])])
    message = import_error(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "'pool' (MaxPool, opset 17): output 1 (Indices) is used" in message


@pytest.mark.parametrize("shapes,expect", [
    ({"y": [3, 16]}, "shapes= names 'y', which is no input of the graph (inputs: x)"),
    ({"x": [3]}, "shapes['x'] = [3] has rank 1, but the model declares rank 2"),
    ({"x": [3, 8]}, "shapes['x'] sets dimension 1 to 8, but the model fixes it at 16"),
    ({"x": [3.5, 16]}, "dimension 0 must be a size or a symbolic name"),
])
def test_bad_shape_overrides(shapes, expect):
    assert expect in import_error(mlp_model(), shapes=shapes)


def test_bad_model_arguments(tmp_path):
    assert "no ONNX model at" in import_error(str(tmp_path / "missing.onnx"))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a protobuf at all\xff" * 3)
    assert "is not a readable ONNX model" in import_error(junk)
    assert "takes an onnx.ModelProto or a path, got int" in import_error(42)
    broken = one_node("Relu", [X34], ["y"])
    broken.graph.node[0].input[0] = "nowhere"
    assert "the model is not valid ONNX" in import_error(broken)


def test_a_declared_type_dpl_disagrees_with_is_an_error():
    model = one_node("Relu", [X34], ["y"], out_shape=(3, 5))
    message = import_error(model)
    assert "output 'y' translates to f32[3, 4], but the model declares FLOAT[3, 5]" in message


def test_import_dpl_does_not_import_onnx():
    code = "import sys, dpl; dpl.from_onnx; assert 'onnx' not in sys.modules, 'onnx was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fuzzed_attributes_import_or_raise_frontend_errors():
    """Random integer attribute values on the table's nodes: the import either succeeds or says
    what is wrong; it never escapes with another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    cases = [c for c in OP_CASES if any(isinstance(v, (int, list)) for v in c.attrs.values())]

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(cases), st.data())
    def check(case, data):
        key = data.draw(st.sampled_from([k for k, v in case.attrs.items() if isinstance(v, (int, list))]))
        old = case.attrs[key]
        new = data.draw(st.integers(-3, 9)) if isinstance(old, int) else data.draw(st.lists(st.integers(-3, 9), min_size=0, max_size=5))
        mutated = Case(case.op, case.args, {**case.attrs, key: new}, case.opset, case.outputs)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the reference evaluator's NumPy warnings on odd inputs
                model, _, _ = single_node_model(mutated, np.random.default_rng(0))
        except Exception:  # the reference evaluator rejects it: declare the outputs as scalars
            try:
                model = untyped_single_node_model(mutated)
            except ValueError:  # onnx.helper cannot even write the attribute (an empty list)
                return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a disagreement with ONNX's shape inference may warn
                dpl.from_onnx(model)
        except FrontendError:
            pass

    check()


# -- measured ---------------------------------------------------------------------------------


def test_import_time_of_the_largest_test_model_is_small():
    model = transformer_model()
    start = time.perf_counter()
    dpl.from_onnx(model)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"importing the transformer block took {elapsed:.3f} s"


def test_shape_inference_disagreeing_with_the_spec_warns_but_imports():
    # ONNX's shape function for MaxPool-12 keeps the ceil_mode window the spec (and the
    # reference evaluator, PyTorch, onnxruntime) drops: dpl follows the spec and says so
    g = GraphWriter()
    y = g("Relu", g("MaxPool", "x", kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1))
    model = g.model([f32_input("x", [1, 2, 7, 7])], [f32_input(y, [1, 2, 4, 4])], opset=12)
    with pytest.warns(UserWarning, match=r"output '/maxpool_0/out0' translates to f32\[1, 2, 4, 4\], but ONNX shape inference gives FLOAT\[1, 2, 5, 5\]"):
        mod = dpl.from_onnx(model)
    feeds = model_feeds(model, 1, seed=0)
    assert_matches(run_imported(mod, model, feeds), ReferenceEvaluator(model).run(None, feeds))


def test_unreadable_initializer_data_is_a_frontend_error():
    model = mlp_model()
    weight = model.graph.initializer[0]
    weight.raw_data = weight.raw_data[:-4]  # one element short
    assert "initializer 'w0': cannot read the tensor data" in import_error(model)


def test_unused_initializers_of_any_type_are_never_read():
    model = mlp_model()
    model.graph.initializer.append(helper.make_tensor("vocabulary", TensorProto.STRING, [2], [b"a", b"b"]))
    mod = dpl.from_onnx(model)
    feeds = model_feeds(model, 2, seed=0)
    assert_matches(run_imported(mod, model, feeds), ReferenceEvaluator(model).run(None, feeds))


def test_the_command_line_reads_onnx_files(tmp_path, capsys):
    """`dpl print / run / fuse model.onnx`: the CLI imports ONNX files by their suffix."""
    from dpl.cli import main

    path = tmp_path / "transformer.onnx"
    onnx.save(transformer_model(), path)
    assert main(["print", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "func main(x: f32[batch, " in printed and "nn.softmax" in printed
    assert main(["run", str(path), "--dim", "batch=3"]) == 0
    assert "output 0: shape (3," in capsys.readouterr().out
    assert main(["fuse", str(path), "-p", "rewrites", "-p", "llm"]) == 0
    assert '@composite("kernel.attention")' in capsys.readouterr().out
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["print", str(bad)]) == 1
    assert "bad.onnx" in capsys.readouterr().err


def test_masks_at_the_symbolic_length_become_range_and_triangle_ops():
    mod = dpl.from_onnx(causal_mask_model())
    ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, dpl.Call)]
    assert "arange" in ops and "tril" in ops and "full" in ops
    assert str(mod["main"].ret.ty) == "f32[batch, batch]"


def test_a_range_whose_length_is_no_dimension_names_the_node():
    g = GraphWriter()
    step = g("Squeeze", g("Gather", g("Shape", "x"), g.ints(0), axis=0), g.ints(0))
    r = g("Range", g.weight(value=np.array(0, np.int64)), g.weight(value=np.array(10, np.int64)), step)
    model = g.model([f32_input("x", ["batch", 4])], [helper.make_tensor_value_info(r, TensorProto.INT64, [None])])
    message = import_error(model)
    assert "(Range, opset 17)" in message and "step batch must be a number" in message, message


def test_average_pooling_is_the_pooling_op_not_a_convolution():
    mod = dpl.from_onnx(cnn_model())
    ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, dpl.Call)]
    assert "nn.avg_pool2d" in ops and "nn.adaptive_avg_pool2d" in ops and ops.count("nn.conv2d") == 2
