"""An Executable takes its inputs by name too (issue 31, item 3): the keywords a torch model was
imported with, an ONNX model's input names as the model spells them, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import dpl
import needs
from dpl.errors import DplError

MODULE = """\
func main(x: f32[n, 4], mask: f32[n, 4], w: f32[4, 4]) -> f32[n, 4] {
  y = matmul(x, w)
  z = multiply(y, mask)
  return z
}
"""


@pytest.fixture(scope="module")
def exe():
    return dpl.build(dpl.parse(MODULE), "numpy")


def inputs(n=3):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype("float32") for s in ((n, 4), (n, 4), (4, 4))]


def test_names_and_positions_mix_in_parameter_order(exe):
    x, mask, w = inputs()
    want = exe(x, mask, w)
    np.testing.assert_array_equal(exe(x=x, mask=mask, w=w), want)
    np.testing.assert_array_equal(exe(w=w, mask=mask, x=x), want)
    np.testing.assert_array_equal(exe(x, w=w, mask=mask), want)


@pytest.mark.parametrize("call, message", [
    (lambda e, x, m, w: e(x, m, w, x=x), "input 'x' of 'main' is given by position and by name"),
    (lambda e, x, m, w: e(x, mask=m), "'main' misses the input w"),
    (lambda e, x, m, w: e(x=x, masc=m, w=w), "'main' got the keyword 'masc', which names no input; did you mean 'mask'?"),
    (lambda e, x, m, w: e(x, m, w, x, w=w), "'main' takes 3 inputs (x, mask, w), got 4 by position"),
])
def test_a_wrong_name_is_said(exe, call, message):
    with pytest.raises(DplError) as err:
        call(exe, *inputs())
    assert message in str(err.value)


def test_a_torch_model_is_called_with_its_keywords():
    needs.package("torch")
    import torch

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, input_ids, attention_mask):
            return self.proj(input_ids) * attention_mask

    model = Masked().eval()
    kwargs = {"input_ids": torch.randn(2, 8), "attention_mask": torch.ones(2, 8)}
    exe = dpl.build(dpl.apply(dpl.from_torch(model, (), kwargs), ["llm"]), "cpu")
    got = exe(**{k: v.numpy() for k, v in kwargs.items()})
    np.testing.assert_allclose(got, model(**kwargs).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_an_onnx_model_takes_its_input_names_as_written():
    needs.package("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Mul", ["input.1", "scale"], ["y"])], "g",
                              [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    mod = dpl.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    exe = dpl.build(mod, "numpy")
    a, s = np.arange(6, dtype="float32").reshape(2, 3), np.array([1, 2, 3], "float32")
    np.testing.assert_array_equal(exe(**{"input.1": a, "scale": s}), a * s)
