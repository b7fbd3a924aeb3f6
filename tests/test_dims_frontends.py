"""The frontends keep the exporters' symbolic shapes as dimension expressions (issue 32, item 1):
small torch modules whose exported graphs compute shapes (a reshape merging batch with channels,
a window partition, a concat of two dynamic tensors, a pad, a strided conv1d, interpolation over
a dynamic image), each imported
with torch.export and with torch.onnx.export(dynamo=True), compared with torch eager at two
sizes on the interpreter and the CPU backend; torch's sympy sizes and ONNX's shape arithmetic
translated to dims; the errors where a size is no dim expression.

torch or onnx missing skips these tests locally but fails them under CI."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import needs

import dpl
from dpl.frontend import FrontendError
from dpl.ir import dims
from dpl.ir.printer import print_module

torch = needs.package("torch", module_level=True)
onnx = needs.package("onnx", module_level=True)
import torch.nn.functional as F  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from torch import nn  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


# -- the modules -------------------------------------------------------------------------------


class MergeBatch(nn.Module):
    def forward(self, x):  # [b, 64, 5] -> [b * 64, 5]
        return x.view(x.shape[0] * 64, -1) * 2.0


class WindowPartition(nn.Module):
    def forward(self, x):  # [b, 8, 8, c] -> windows [b * 4, 4, 4, c]
        b, h, w, c = x.shape
        x = x.view(b, h // 4, 4, w // 4, 4, c)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, 4, 4, c) + 1.0


class Concat(nn.Module):
    def forward(self, x, y):  # [2, n, 3] and [2, m, 3] -> [2, n + m, 3]
        return torch.cat([x, y], 1).relu()


class Pad(nn.Module):
    def forward(self, x):  # [2, 3, n] -> [2, 3, n + 3]
        return F.pad(x, (1, 2)) * 3.0


class StridedConv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, stride=2)

    def forward(self, x):  # [2, 4, n] -> [2, 6, (n - 3) // 2 + 1]
        return self.conv(x)


class MobileViTUnfold(nn.Module):
    """The issue's mobile vision transformer: ``[batch, 64, 8, 8]`` viewed as ``[-1, 2, 4, 2]``,
    whose first dimension torch calls ``256*s99``."""

    def forward(self, x):
        y = x.reshape(-1, 2, 4, 2).transpose(1, 2) * 2.0
        return y.reshape(x.shape[0], 64, 8, 8)


class HeadsIntoBatch(nn.Module):
    def forward(self, x):  # [b, s, 64] -> [b * 4, s, 16] -> softmax -> back
        b, s, _ = x.shape
        y = x.view(b, s, 4, 16).transpose(1, 2).reshape(b * 4, s, 16).softmax(-1)
        return y.view(b, 4, s, 16).transpose(1, 2).reshape(b, s, 64)


class FlattenAfterCat(nn.Module):
    def forward(self, x):  # [b, n, 4] -> cat -> [b, n * 2, 4] -> [b, n * 8]
        y = torch.cat([x, x * 2], 1)
        return y.reshape(y.shape[0], -1)


class RangeAndZeros(nn.Module):
    def forward(self, x):  # [n, 3]: a float range from 1 to n, zeros of n * 2 rows
        positions = torch.arange(1, x.shape[0] + 1, dtype=torch.float32)
        return x * positions[:, None], torch.zeros(x.shape[0] * 2, 3) + 1.0


class UpsampleBilinear(nn.Module):
    def forward(self, x):  # [b, 3, h, w] -> [b, 3, h * 2, w * 2], torch's scale 1 / 2
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class UpsampleBilinearBy1_5(nn.Module):
    def forward(self, x):  # [b, 3, h, w] -> [b, 3, h + h // 2, w + w // 2], the scale 1 / 1.5, not in / out
        return F.interpolate(x, scale_factor=1.5, mode="bilinear", align_corners=False)


class UpsampleCornersToSize(nn.Module):
    def forward(self, x):  # the size computed from the input's shape, corners aligned
        return F.interpolate(x, size=(x.shape[2] * 2, x.shape[3] * 2), mode="bilinear", align_corners=True)


class UpsampleNearest(nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=2, mode="nearest")


class UpsampleBicubicToSize(nn.Module):
    def forward(self, x):
        return F.interpolate(x, size=(x.shape[2] * 2, x.shape[3] * 2), mode="bicubic", align_corners=False)


def _image_dims():
    return ({0: _dim("batch", 1, 8), 2: _dim("h", 2, 64), 3: _dim("w", 2, 64)},)


def _dim(name, lo=2, hi=64):
    return torch.export.Dim(name, min=lo, max=hi)


# id, module, example shapes, dynamic_shapes, the shapes of a second size, the result's type
CASES = [
    ("merge_batch_with_channels", MergeBatch, [(3, 64, 5)], lambda: ({0: _dim("batch")},), [(5, 64, 5)],
     "f32[batch * 64, 5]"),
    ("window_partition", WindowPartition, [(3, 8, 8, 5)], lambda: ({0: _dim("batch")},), [(6, 8, 8, 5)],
     "f32[batch * 4, 4, 4, 5]"),
    ("window_partition_of_a_dynamic_image", WindowPartition, [(2, 8, 8, 5)],
     lambda: (lambda k: ({1: 4 * k, 2: 4 * k},))(_dim("k", 1, 16)), [(2, 12, 12, 5)], "f32[k * k * 2, 4, 4, 5]"),
    ("concat_of_two_dynamic", Concat, [(2, 5, 3), (2, 7, 3)], lambda: ({1: _dim("n")}, {1: _dim("m")}),
     [(2, 9, 3), (2, 4, 3)], "f32[2, m + n, 3]"),
    ("pad_of_a_dynamic_length", Pad, [(2, 3, 17)], lambda: ({2: _dim("n", 4, 256)},), [(2, 3, 30)], "f32[2, 3, n + 3]"),
    ("strided_conv1d", StridedConv1d, [(2, 4, 17)], lambda: ({2: _dim("n", 8, 256)},), [(2, 4, 24)],
     "f32[2, 6, (n + 1) // 2 - 1]"),
    ("mobilevit_unfold", MobileViTUnfold, [(3, 64, 8, 8)], lambda: ({0: _dim("batch")},), [(6, 64, 8, 8)],
     "f32[batch, 64, 8, 8]"),
    ("heads_into_batch", HeadsIntoBatch, [(3, 5, 64)], lambda: ({0: _dim("batch"), 1: _dim("s")},), [(4, 7, 64)],
     "f32[batch, s, 64]"),
    ("flatten_after_concat", FlattenAfterCat, [(3, 5, 4)], lambda: ({0: _dim("batch"), 1: _dim("n")},), [(2, 9, 4)],
     "f32[batch, n * 8]"),
    ("range_and_zeros", RangeAndZeros, [(4, 3)], lambda: ({0: _dim("n")},), [(7, 3)], "(f32[n, 3], f32[n * 2, 3])"),
    ("upsample_bilinear", UpsampleBilinear, [(2, 3, 5, 7)], _image_dims, [(3, 3, 9, 4)], "f32[batch, 3, h * 2, w * 2]"),
    ("upsample_bilinear_by_1_5", UpsampleBilinearBy1_5, [(2, 3, 5, 7)], _image_dims, [(1, 3, 9, 4)],
     "f32[batch, 3, h + h // 2, w + w // 2]"),
    ("upsample_corners_to_size", UpsampleCornersToSize, [(2, 3, 5, 7)], _image_dims, [(3, 3, 9, 4)],
     "f32[batch, 3, h * 2, w * 2]"),
    ("upsample_nearest", UpsampleNearest, [(2, 3, 5, 7)], _image_dims, [(3, 3, 9, 4)], "f32[batch, 3, h * 2, w * 2]"),
    ("upsample_bicubic_to_size", UpsampleBicubicToSize, [(2, 3, 5, 7)], _image_dims, [(3, 3, 9, 4)],
     "f32[batch, 3, h * 2, w * 2]"),
]

def _inputs(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


def _import(path, model, args, dynamic_shapes):
    if path == "torch":
        return dpl.from_torch(model, args, dynamic_shapes=dynamic_shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False)
    return dpl.from_onnx(program.model_proto)


def _assert_close(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _assert_close(g, w)
        return
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=RTOL, atol=ATOL)


_IMPORTED: dict = {}


def _imported(cid, path):
    if (cid, path) not in _IMPORTED:
        _, cls, shapes, dynamic, _, _ = next(c for c in CASES if c[0] == cid)
        model = cls().eval()
        _IMPORTED[cid, path] = model, _import(path, model, _inputs(shapes, 0), dynamic())
    return _IMPORTED[cid, path]


@pytest.mark.parametrize("path", ["torch", "onnx"])
@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_shape_arithmetic_imports_as_expressions_and_runs_on_the_interpreter(cid, path):
    _, _, shapes, _, other, result = next(c for c in CASES if c[0] == cid)
    model, mod = _imported(cid, path)
    assert str(mod["main"].ret.ty) == result
    for args in (_inputs(shapes, 1), _inputs(other, 2)):
        _assert_close(dpl.interpret(mod, *[a.numpy() for a in args]), model(*args))
    # the module prints and parses back to itself, expressions included
    assert dpl.structural_equal(dpl.parse(print_module(mod, inline_limit=None)), mod)


@pytest.mark.parametrize("path", ["torch", "onnx"])
@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_shape_arithmetic_builds_for_the_cpu(cid, path):
    needs.c_compiler()
    _, _, shapes, _, other, _ = next(c for c in CASES if c[0] == cid)
    model, mod = _imported(cid, path)
    exe = dpl.build(dpl.apply(mod), "cpu")
    for args in (_inputs(shapes, 3), _inputs(other, 4)):
        _assert_close(exe(*[a.numpy() for a in args]), model(*args))


def test_the_merge_torch_cannot_follow_is_one_reshape_to_torchs_expression():
    _, mod = _imported("mobilevit_unfold", "torch")
    reshapes = [b.value for b in mod["main"].bindings if b.value.op == "reshape"]
    assert str(reshapes[0].ty) == "f32[batch * 256, 2, 4, 2]"
    assert str(reshapes[-1].ty) == "f32[batch, 64, 8, 8]"


def test_a_merged_value_that_only_row_ops_read_stays_unmerged_until_the_output():
    # the multiply runs on [batch, 64, 5]; the output is flattened once
    _, mod = _imported("merge_batch_with_channels", "torch")
    ops = [(b.value.op, str(b.value.ty)) for b in mod["main"].bindings]
    assert ops == [("multiply", "f32[batch, 64, 5]"), ("reshape", "f32[batch * 64, 5]")]


# -- torch's sympy sizes -------------------------------------------------------------------------


def _sympy_cases():
    import sympy
    import torch.utils._sympy.functions as tf

    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    return [
        (256 * s0, "batch * 256"),
        (s0 + s1 + 2, "batch + n + 2"),
        (tf.FloorDiv(s0 - 3, 2) + 1, "(batch + 1) // 2 - 1"),
        (tf.CeilDiv(s0, 4), "(batch + 3) // 4"),
        (tf.CleanDiv(4 * s0, 4), "batch"),
        (tf.Mod(s0, 7), "batch % 7"),
        (tf.PythonMod(s0 + 1, 3), "(batch + 1) % 3"),
        (tf.ModularIndexing(s0, 2, 5), "batch // 2 % 5"),
        (tf.Min(s0, 64), "min(batch, 64)"),
        (tf.Max(s0, s1), "max(batch, n)"),
        (sympy.Min(s0 + 1, s1 + 1), "min(batch, n) + 1"),
        (s0**2 * s1, "batch * batch * n"),
        (tf.Identity(s0 * s1), "batch * n"),
    ]


def _sympy_dim(expr):
    from dpl.frontend.torch_dims import sympy_dim

    return sympy_dim(expr, {"s0": "batch", "s1": "n"}.__getitem__, "the size")


@pytest.mark.parametrize("k", range(13))
def test_torch_sizes_become_dim_expressions_that_evaluate_alike(k):
    import sympy

    expr, text = _sympy_cases()[k]
    d = _sympy_dim(expr)
    assert dims.text(d) == text
    s0, s1 = sorted(expr.free_symbols, key=str) + [None] * (2 - len(expr.free_symbols))
    for b, n in [(0, 0), (1, 5), (7, 3), (64, 129)]:
        want = expr.xreplace({s: sympy.Integer(v) for s, v in ((s0, b), (s1, n)) if s is not None})
        assert dims.evaluate(d, {"batch": b, "n": n}) == int(want), (b, n)


def test_a_size_no_dim_expression_holds_is_an_error_naming_the_part():
    import sympy

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    with pytest.raises(FrontendError, match=r"the size is the size s0/2, whose part 1/2 \(Half\) no dpl dimension "
                                            r"expression holds"):
        _sympy_dim(s0 / 2)
    with pytest.raises(FrontendError, match=r"whose part sqrt\(s0\) \(Pow\) no dpl dimension expression holds"):
        _sympy_dim(sympy.sqrt(s0))


def test_a_min_or_max_that_torchs_ranges_decide_becomes_its_operand():
    """torch knows its symbols' ranges (a Dim's min and max), dpl only that sizes are >= 0: the
    operand those ranges rule out is dropped, so the size equals the one ops derive."""
    import sympy
    import torch.utils._sympy.functions as tf
    from torch.utils._sympy.value_ranges import ValueRanges

    from dpl.frontend.torch_dims import sympy_dim

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    ranges = {s0: ValueRanges(277, 4096)}
    name = {"s0": "n"}.__getitem__
    assert dims.text(sympy_dim(tf.Max(tf.FloorDiv(s0, 10), 1) - 1, name, "the size", ranges)) == "n // 10 - 1"
    assert sympy_dim(tf.Min(s0, 64), name, "the size", ranges) == 64
    assert dims.text(sympy_dim(tf.Min(s0, 1000), name, "the size", ranges)) == "min(n, 1000)"  # either may be less
    assert dims.text(sympy_dim(tf.Max(tf.FloorDiv(s0, 10), 1), name, "the size")) == "max(n // 10, 1)"  # no ranges


# -- ONNX shape arithmetic ---------------------------------------------------------------------


def _tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _ints(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(model, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)[0]


def test_onnx_shape_arithmetic_folds_into_the_reshape_target():
    # x.view(b * 4, -1) as a Shape -> Gather -> Mul -> Unsqueeze -> Concat -> Reshape chain, and
    # the quotient of an integer Div (by 2) of the second
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Mul", ["b", "four"], ["b4"]),
        helper.make_node("Unsqueeze", ["b4", "axes"], ["b4v"]),
        helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
        helper.make_node("Div", ["c", "two"], ["c2"]),
        helper.make_node("Unsqueeze", ["c2", "axes"], ["c2v"]),
        helper.make_node("Concat", ["b4v", "c2v", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64, [], [1]),
             helper.make_tensor("four", TensorProto.INT64, [], [4]), helper.make_tensor("two", TensorProto.INT64, [], [2]),
             _ints("axes", [0]), _ints("minus1", [-1])]
    model = _model(nodes, [_tensor("x", ["batch", 8, 4])], [_tensor("y", [None, None, None])], inits)
    mod = dpl.from_onnx(model)
    assert [b.value.op for b in mod["main"].bindings] == ["reshape"]
    assert str(mod["main"].ret.ty) == "f32[batch * 4, 4, 2]"
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 4)).astype(np.float32)
        np.testing.assert_array_equal(dpl.interpret(mod, x), _reference(model, {"x": x}))


def test_onnx_size_flatten_and_reduce_prod_of_symbolic_shapes():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["count"], keepdims=1),
        helper.make_node("Reshape", ["x", "count"], ["flat"]),
        helper.make_node("Flatten", ["x"], ["y"], axis=2),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Unsqueeze", ["n", "axes"], ["nv"]),
        helper.make_node("Reshape", ["x", "nv"], ["z"]),
    ]
    model = _model(nodes, [_tensor("x", ["a", "b", 3])], [_tensor("flat", [None]), _tensor("y", [None, 3]), _tensor("z", [None])],
                   [_ints("axes", [0])])
    mod = dpl.from_onnx(model)
    assert [str(t) for t in mod["main"].ret.ty.fields] == ["f32[a * b * 3]", "f32[a * b, 3]", "f32[a * b * 3]"]
    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    for got, want in zip(dpl.interpret(mod, x), [x.reshape(-1), x.reshape(10, 3), x.reshape(-1)]):
        np.testing.assert_array_equal(got, want)


def test_onnx_div_of_a_shape_truncates_as_onnx_does():
    # ONNX's integer Div rounds towards zero: (n - 5) / 2 for n < 5 is not floor division
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Sub", ["s", "five"], ["d"]),
        helper.make_node("Div", ["d", "two"], ["q"]),
        helper.make_node("Add", ["q", "five"], ["length"]),
        helper.make_node("ConstantOfShape", ["length"], ["y"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
    ]
    model = _model(nodes, [_tensor("x", ["n"])], [_tensor("y", [None])], [_ints("five", [5]), _ints("two", [2])])
    mod = dpl.from_onnx(model)
    for n in (0, 1, 2, 5, 6, 9):
        assert dpl.interpret(mod, np.zeros(n, np.float32)).shape == (int((n - 5) / 2) + 5,), n


@pytest.mark.parametrize("k", [1, 2, 3, 7, -1, -3])
def test_truncating_division_and_remainder_are_onnx_s_for_every_value(k):
    from dpl.frontend.onnx_dims import trunc_div, trunc_mod

    for a in [dims.sub("n", 9), dims.mul("n", -3), dims.add(dims.mul("n", 2), 1), "n"]:
        q, r = trunc_div(a, k), trunc_mod(a, k)
        for n in range(0, 20):
            value = dims.evaluate(a, {"n": n})
            assert dims.evaluate(q, {"n": n}) == math.trunc(value / k) == int(np.trunc(np.int64(value) / np.int64(k)))
            assert dims.evaluate(r, {"n": n}) == int(np.fmod(value, k))


def test_onnx_max_min_and_mod_of_shapes():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Max", ["s", "four"], ["hi"]),
        helper.make_node("Min", ["hi", "ten"], ["clamped"]),
        helper.make_node("Mod", ["s", "three"], ["rem"]),
        helper.make_node("Add", ["clamped", "rem"], ["length"]),
        helper.make_node("ConstantOfShape", ["length"], ["y"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
    ]
    model = _model(nodes, [_tensor("x", ["n"])], [_tensor("y", [None])],
                   [_ints("four", [4]), _ints("ten", [10]), _ints("three", [3])])
    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == "f32[n % 3 + min(max(n, 4), 10)]"
    for n in (0, 5, 11, 14):
        assert dpl.interpret(mod, np.zeros(n, np.float32)).shape == (min(max(n, 4), 10) + n % 3,)


def test_onnx_shape_used_with_float_operands_is_refused():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Mul", ["s", "half"], ["y"])]
    model = _model(nodes, [_tensor("x", ["n"])], [_tensor("y", [None], TensorProto.INT64)],
                   [helper.make_tensor("half", TensorProto.FLOAT, [1], [0.5])])
    with pytest.raises(FrontendError, match=r"shape arithmetic with the float32 operand 'half'"):
        dpl.from_onnx(model)


def test_onnx_merged_value_moved_off_the_front_is_read_flattened():
    # Reshape to [-1, 4] merges batch with 2; a Transpose that moves that axis reads it flattened
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["m"]), helper.make_node("Transpose", ["m"], ["y"], perm=[1, 0])]
    model = _model(nodes, [_tensor("x", ["batch", 2, 4])], [_tensor("y", [4, None])], [_ints("shape", [-1, 4])])
    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == "f32[4, batch * 2]"
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    np.testing.assert_array_equal(dpl.interpret(mod, x), x.reshape(-1, 4).T)


def test_onnx_merged_value_reshaped_to_minus_one_of_other_trailing_axes():
    # MobileViT's folding: [-1, 4] merges batch with 2, then [-1, 2, 4] restores it (the
    # exporter writes the batch as -1): the -1 is not the merged axis
    nodes = [helper.make_node("Reshape", ["x", "merge"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Reshape", ["r", "fold"], ["y"])]
    model = _model(nodes, [_tensor("x", ["batch", 2, 4])], [_tensor("y", [None, 2, 4])],
                   [_ints("merge", [-1, 4]), _ints("fold", [-1, 2, 4])])
    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == "f32[batch, 2, 4]"
    x = np.random.default_rng(0).standard_normal((3, 2, 4)).astype(np.float32)
    np.testing.assert_array_equal(dpl.interpret(mod, x), np.maximum(x, 0))


def test_an_onnx_value_info_dim_the_exporter_left_unknown_is_not_zero():
    # Swin's pooler as torch.onnx writes it: Range(0, batch, 1) whose value_info dim has neither
    # a dim_param nor a dim_value; read as 0 it sliced the range to nothing
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=0, end=1), helper.make_node("Squeeze", ["s"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=1)]
    model = _model(nodes, [_tensor("x", ["batch", 2])], [_tensor("y", [None])],
                   [helper.make_tensor("zero", TensorProto.INT64, [], [0]), helper.make_tensor("one", TensorProto.INT64, [], [1])])
    model.graph.value_info.append(_tensor("r", [None], TensorProto.INT64))
    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == "f32[batch]"
    np.testing.assert_array_equal(dpl.interpret(mod, np.zeros((3, 2), np.float32)), np.arange(3, dtype=np.float32))


def test_onnx_tile_of_a_symbolic_axis():
    nodes = [helper.make_node("Tile", ["x", "reps"], ["y"])]
    model = _model(nodes, [_tensor("x", ["n", 2])], [_tensor("y", [None, None])], [_ints("reps", [3, 2])])
    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == "f32[n * 3, 4]"
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    np.testing.assert_array_equal(dpl.interpret(mod, x), np.tile(x, (3, 2)))


def test_a_merged_torch_value_is_read_flattened_by_ops_that_are_not_row_wise():
    class Mixed(nn.Module):
        def forward(self, x):  # [b, s, 8]
            y = x.reshape(-1, 8) * 2.0  # [b * s, 8], carried unmerged
            w = y.reshape(-1, 4, 2) + 1.0  # merged again with other trailing axes
            return y.softmax(0), w.sum(0)  # over the merged axis: flattened

    mod = dpl.from_torch(Mixed(), (torch.randn(3, 5, 8),), dynamic_shapes=({0: _dim("b"), 1: _dim("s")},))
    assert [str(t) for t in mod["main"].ret.ty.fields] == ["f32[b * s, 8]", "f32[4, 2]"]
    assert [b.value.op for b in mod["main"].bindings].count("reshape") == 3  # the view, two flattenings
    for shape in [(3, 5, 8), (4, 2, 8)]:
        x = torch.randn(*shape)
        for got, want in zip(dpl.interpret(mod, x.numpy()), Mixed()(x)):
            _assert_close(got, want)


def test_a_row_op_reading_a_merged_value_and_a_plain_one_of_the_merged_rows_reads_them_flattened():
    # MobileViT: the unfolded patches (carried unmerged) meet the attention's output, whose
    # first axis is the merged one already (a product read them flattened)
    class UnfoldedAttention(nn.Module):
        def forward(self, x):  # [b, 4, 4, 8] -> patches [b * 4, 4, 8]
            p = x.reshape(-1, 4, 8)
            scores = (p @ p.transpose(1, 2)).softmax(-1)
            return scores @ p + p

    mod = dpl.from_torch(UnfoldedAttention(), (torch.randn(2, 4, 4, 8),), dynamic_shapes=({0: _dim("b")},))
    assert str(mod["main"].ret.ty) == "f32[b * 4, 4, 8]"
    for batch in (2, 3):
        x = torch.randn(batch, 4, 4, 8)
        _assert_close(dpl.interpret(mod, x.numpy()), UnfoldedAttention()(x))


def test_an_onnx_input_whose_dim_param_is_an_expression():
    # torch.onnx writes a derived Dim (2 * batch) as the dim_param "2*batch"
    class Doubled(nn.Module):
        def forward(self, x, y):
            return torch.cat([x, x]) + y

    batch = torch.export.Dim("batch")
    args = (torch.randn(3, 4), torch.randn(6, 4))
    mod = _import("onnx", Doubled(), args, {"x": {0: batch}, "y": {0: 2 * batch}})
    assert [str(p.ty) for p in mod["main"].params] == ["f32[batch, 4]", "f32[batch * 2, 4]"]
    x, y = torch.randn(5, 4), torch.randn(10, 4)
    _assert_close(dpl.interpret(mod, x.numpy(), y.numpy()), Doubled()(x, y))
    # a lone input of an expression binds its symbol by solving for it; a name stays a name
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_tensor("x", ["2*n + 1", "seq-len"])], [_tensor("y", [None, None])])
    mod = dpl.from_onnx(model)
    assert str(mod["main"].params[0].ty) == "f32[n * 2 + 1, seq_len]"
    assert dpl.interpret(mod, np.ones((7, 2), np.float32)).shape == (7, 2)
    with pytest.raises(dpl.DplError, match=r"n \* 2 \+ 1"):
        dpl.interpret(mod, np.ones((6, 2), np.float32))


def test_onnx_a_size_cast_to_float_stays_a_float_through_gather():
    # Div of floats is a true division: dpl's integer shape arithmetic must not take it
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["f", "zero"], ["n"], axis=0),
        helper.make_node("Div", ["n", "n"], ["y"]),
    ]
    model = _model(nodes, [_tensor("x", ["n", 2])], [_tensor("y", [], TensorProto.FLOAT)],
                   [helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    with pytest.raises(FrontendError, match=r"\(Div, opset 17\): shape arithmetic on the size \[n\] cast to float32"):
        dpl.from_onnx(model)
