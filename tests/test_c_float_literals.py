"""Ops computed in single precision keep their C templates' constants single: ``0.5`` in a
float32 GELU would promote it to double (a scalar, unvectorised ``tanh``); float64 keeps the
double constants. The numbers equal the interpreter either way."""

import numpy as np
import pytest

import needs

import dpl
from dpl.kernel.ir import Load, Op, to_c


@pytest.mark.parametrize("name", ["nn.gelu", "nn.gelu_tanh"])
def test_single_precision_templates_have_float_literals(name):
    f32 = to_c(Op(name, (Load("x", (), "float32"),), (), "float32"))
    f64 = to_c(Op(name, (Load("x", (), "float64"),), (), "float64"))
    literals = {"nn.gelu": "0.7071067811865476", "nn.gelu_tanh": "1.5957691216057308"}[name]
    assert literals + "f" in f32 and literals + "f" not in f64
    assert "(1 +" in f32  # integer literals stay as they are


def test_exponent_literals_and_names_with_digits():
    from dpl.kernel.ir import _float_literals

    assert _float_literals("(1e-5 + {0} * 2.5e-3 + x1.5 + {1})") == "(1e-5f + {0} * 2.5e-3f + x1.5 + {1})"


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", ["nn.gelu", "nn.gelu_tanh"])
def test_gelu_on_cpu_equals_the_interpreter(tmp_path, name, dtype):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    mod = dpl.parse(f"func main(x: {dtype}[4, 300]) -> {dtype}[4, 300] {{\n  y = {name}(x)\n  return y\n}}")
    x = (np.random.default_rng(0).standard_normal((4, 300)) * 3).astype({"f32": np.float32, "f64": np.float64}[dtype])
    exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path), "numpy"], config=dpl.FusionConfig(min_nodes_for_fusion=1))
    tol = 1e-6 if dtype == "f32" else 1e-13
    np.testing.assert_allclose(exe(x), dpl.interpret(mod, x), rtol=tol, atol=tol)
    assert "cpu" in exe.summary().split("functions:")[1].splitlines()[1]
