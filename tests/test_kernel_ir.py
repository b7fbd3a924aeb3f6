"""The kernel IR prints as C-like text, and the evaluator refuses kernels that misbehave."""

import numpy as np
import pytest

from dpl.ir import FunctionBuilder, Module
from dpl.kernel import KernelEvalError, evaluate, lower_function, lower_module, to_c
from dpl.kernel.ir import Axis, Bin, Buffer, Const, Kernel, Let, Load, Loop, Op, Reduce, Select, Store, Var, free_vars


def softmax_kernel():
    fb = FunctionBuilder("fused_softmax", attrs={"Primitive": True})
    x = fb.param("x", "f32", ("n", 8))
    return lower_function(fb.ret(fb.emit("nn.softmax", x, name="y")))


def test_kernel_prints_as_c_like_text():
    assert str(softmax_kernel()) == """\
kernel fused_softmax [row] (x: f32[n, 8]) -> (y: f32[n, 8]):
  for i0 in [0, n):
    f32 rowmax = maximum-reduce from -INFINITY over r in [0, 8):
      x[i0, r]
    f32 exp_floor = (rowmax - 87.0f)
    f32 rowsum = add-reduce from 0.0f over r_1 in [0, 8):
      ((x[i0, r_1] < exp_floor) ? 0.0f : exp((((x[i0, r_1] < exp_floor) ? exp_floor : x[i0, r_1]) - rowmax)))
    for i1 in [0, 8):
      y[i0, i1] = (((x[i0, i1] < exp_floor) ? 0.0f : exp((((x[i0, i1] < exp_floor) ? exp_floor : x[i0, i1]) - rowmax))) / rowsum)"""


def test_scalar_expressions_as_c():
    x = Load("x", (Var("i"),), "float16")
    assert to_c(Op("astype", (x,), (("dtype", "float32"),), "float32")) == "((float)x[i])"
    # float attributes are C literals of the operand's precision; infinities and NaN are macros
    assert to_c(Op("clip", (Var("t", "float32"),), (("min", -1.0), ("max", 1.0)), "float32")) == "(t < -1.0f ? -1.0f : t > 1.0f ? 1.0f : t)"
    assert to_c(Op("clip", (Var("t", "float64"),), (("min", float("-inf")), ("max", 0.5)), "float64")) == "(t < -INFINITY ? -INFINITY : t > 0.5 ? 0.5 : t)"
    assert to_c(Op("multiply", (Var("t", "float32"), Const(float("nan"), "float32")), (), "float32")) == "(t * NAN)"
    assert to_c(Op("add", (Var("t", "float32"), Const(-0.0, "float32")), (), "float32")) == "(t + -0.0f)"
    assert to_c(Select(Bin("<", Var("i"), Const(3, "int64")), Const(float("-inf"), "float64"), Const(True, "bool"))) == "((i < 3) ? -INFINITY : 1)"


def test_free_vars_of_statements():
    r = Reduce("s", "float32", "add", Const(0.0, "float32"), [Axis(Var("r"), Var("n"))], [Let("t", Load("x", (Var("i"), Var("r"))))], Var("t", "float32"))
    assert free_vars(r) == {"i", "n"}
    assert free_vars(Loop(Var("i"), Var("n"), [r])) == {"n"}


def hand_kernel(body, out_shape=(4,)):
    return Kernel("k", [Buffer("x", (4,), "float32")], [Buffer("y", out_shape, "float32")], body)


def test_evaluator_rejects_out_of_bounds_loads():
    i = Var("i")
    k = hand_kernel([Loop(i, Const(4, "int64"), [Store("y", (i,), Load("x", (Bin("+", i, Const(1, "int64")),)))])])
    with pytest.raises(KernelEvalError, match="out of bounds"):
        evaluate(k, np.ones(4, np.float32))


def test_evaluator_guarded_load_is_fine():
    i = Var("i")
    j = Bin("+", i, Const(1, "int64"))
    guarded = Select(Bin("<", j, Const(4, "int64")), Load("x", (j,)), Const(0.0, "float32"))
    k = hand_kernel([Loop(i, Const(4, "int64"), [Store("y", (i,), guarded)])])
    np.testing.assert_array_equal(evaluate(k, np.arange(4, dtype=np.float32)), [1, 2, 3, 0])


def test_evaluator_rejects_unwritten_outputs_and_bad_inputs():
    i = Var("i")
    k = hand_kernel([Loop(i, Const(3, "int64"), [Store("y", (i,), Load("x", (i,)))])])
    with pytest.raises(KernelEvalError, match="unwritten"):
        evaluate(k, np.ones(4, np.float32))
    with pytest.raises(KernelEvalError, match="input 'x'"):
        evaluate(k, np.ones(5, np.float32))
    with pytest.raises(KernelEvalError, match="input 'x'"):
        evaluate(k, np.ones(4, np.float64))


def test_symbolic_dims_must_agree():
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", "f32", ("n",))
    y = fb.param("y", "f32", ("n",))
    k = lower_function(fb.ret(fb.emit("add", x, y)))
    with pytest.raises(KernelEvalError, match="input 'y'"):
        evaluate(k, np.ones(3, np.float32), np.ones(4, np.float32))


def test_lower_module_takes_kernel_functions_only():
    def fn(name, attrs):
        fb = FunctionBuilder(name, attrs=attrs)
        x = fb.param("x", "f32", (3,))
        return fb.ret(fb.emit("exp", x))

    mod = Module([
        fn("main", {}),
        fn("fused_exp", {"Primitive": True}),
        fn("kernel_exp", {"Primitive": True, "Composite": "kernel.exp"}),
        fn("cublas_exp", {"Primitive": True, "Composite": "cublas.exp"}),
    ])
    assert sorted(lower_module(mod)) == ["fused_exp", "kernel_exp"]
