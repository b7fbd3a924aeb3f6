"""Floats print in the shortest form that reads back to the same value in their dtype:
f32 1e-6 prints as ``1e-06`` (not its f64 widening ``9.999999974752427e-07``), in scalar
constants, tensor constants and attributes, for f16, f32 and f64."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.ir.printer import format_scalar

WIDTHS = {"float16": 16, "float32": 32, "float64": 64}


def finite(dtype: str):
    return st.floats(width=WIDTHS[dtype], allow_nan=False, allow_infinity=False).map(np.dtype(dtype).type)


def digits(text: str) -> str:
    """The significant digits of a decimal literal."""
    mantissa = re.split("[eE]", text.lstrip("-"))[0].replace(".", "")
    return mantissa.lstrip("0").rstrip("0") or "0"


def assert_shortest(text: str, value, dtype: str) -> None:
    """``text`` reads back to ``value`` in ``dtype``, and one significant digit fewer cannot."""
    npt = np.dtype(dtype).type
    assert npt(float(text)) == value, (text, value)
    k = len(digits(text))
    if k > 1 and value != 0:
        fewer = npt(float(f"{float(value):.{k - 2}e}"))
        assert fewer != value, f"{text} is not the shortest form of {value!r}: {float(value):.{k - 2}e} reads back too"


def scalar_module(value, dtype: str) -> str:
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", dtype, (3,))
    y = fb.emit("add", x, dpl.const(value, dtype), name="y")
    return dpl.Module([fb.ret(y)]).script()


@pytest.mark.parametrize("dtype", list(WIDTHS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_scalar_constants_print_shortest_and_round_trip(dtype, data):
    value = data.draw(finite(dtype))
    text = scalar_module(value, dtype)
    [literal] = re.findall(r"add\(x, ([^,:)]+)", text)
    assert_shortest(literal, value, dtype)
    [again] = [b.value.args[1] for b in dpl.parse(text)["main"].bindings]
    assert again.value.dtype == np.dtype(dtype) and again.value.tobytes() == np.asarray(value).tobytes()


@pytest.mark.parametrize("dtype", list(WIDTHS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_tensor_constants_print_shortest_and_round_trip(dtype, data):
    values = data.draw(st.lists(finite(dtype), min_size=2, max_size=6))
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", dtype, (len(values),))
    y = fb.emit("add", x, dpl.const(np.array(values, dtype)), name="y")
    text = dpl.Module([fb.ret(y)]).script()
    literals = re.search(r"= \[(.*)\]", text).group(1).split(", ")
    for literal, value in zip(literals, values):
        assert_shortest(literal, value, dtype)
    const = dpl.parse(text)["main"].bindings[0].value.args[1]
    assert const.value.tobytes() == np.array(values, dtype).tobytes()


@settings(max_examples=150, deadline=None)
@given(value=finite("float64"))
def test_float_attributes_round_trip_exactly(value):
    """Attributes are Python floats: repr, the shortest f64 form, reads back bit for bit."""
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 3))
    w = fb.param("w", "f32", (3,))
    y = fb.emit("nn.rms_norm", x, w, epsilon=float(value), name="y")
    mod = dpl.Module([fb.ret(y)])
    again = dpl.parse(mod.script())
    assert again["main"].bindings[0].value.attrs["epsilon"] == float(value)
    assert dpl.structural_equal(again, mod)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_numpy_float_attributes_print_shortest_in_their_dtype(dtype, data):
    value = data.draw(finite(dtype))
    assert_shortest(format_scalar(value), value, dtype)


def test_the_f32_epsilon_of_an_onnx_model_prints_as_written():
    needs.package("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "s"], ["y"], epsilon=1e-6)], "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(np.ones(4, "float32"), "s")])
    text = dpl.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).script()
    assert "epsilon=1e-06" in text and "9.99999" not in text
