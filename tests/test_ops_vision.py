"""Interpolation, convolutions of any rank (transposed too) and group/instance norms, vector
norms: each op against torch eager (torch.export path) and onnx's reference evaluator (ONNX
path), on the interpreter and the "cpu" build, with a symbolic batch; each lowering against the
interpreter; and the shapes dpl cannot hold yet refused by name."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.errors import DplError, TypeInferenceError
from dpl.ir import FunctionBuilder, Module
from dpl.kernel import evaluate, lower_function

RTOL, ATOL = 1e-4, 1e-5
rng = np.random.default_rng(7)


def _cpu():
    needs.c_compiler()
    return "cpu"


def one_op(op, *shapes, **attrs) -> dpl.Function:
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    params = [fb.param(f"p{i}", "f32", s) for i, s in enumerate(shapes)]
    y = fb.emit(op, *params, **attrs)
    return fb.ret(fb.emit("multiply", y, fb.emit("sigmoid", y)))  # with an epilogue that fuses


def sample(fn, sizes):
    return [rng.standard_normal([sizes.get(d, 0) if isinstance(d, str) else d for d in p.ty.shape]).astype(np.float32)
            for p in fn.params]


LOWERINGS = {
    "nearest_2x": ("image.resize", [("n", 3, 5, 6)], dict(size=[10, 12], coordinate_transformation_mode="asymmetric",
                                                           rounding_method="floor")),
    "nearest_table": ("image.resize", [(2, 3, 5, 6)], dict(size=[7, 4], rounding_method="round_prefer_ceil")),
    "linear": ("image.resize", [("n", 3, 5, 6)], dict(size=[7, 9], method="linear")),
    "linear_scales": ("image.resize", [(2, 3, 5)], dict(size=[7], scales=[1.5], method="linear")),
    "cubic_corners": ("image.resize", [(2, 3, 5, 6)], dict(size=[7, 4], method="cubic",
                                                            coordinate_transformation_mode="align_corners")),
    "cubic_exclude": ("image.resize", [(2, 3, 5)], dict(size=[9], method="cubic", cubic_exclude=True)),
    "trilinear": ("image.resize", [(1, 2, 3, 4, 5)], dict(size=[5, 6, 4], method="linear")),
    "conv1d": ("nn.conv1d", [("n", 4, 11), (6, 2, 3)], dict(strides=2, padding=[1, 2], dilation=2, groups=2)),
    "conv1d_same_symbolic": ("nn.conv1d", [("n", 4, "L"), (6, 4, 4)], dict(padding=[1, 2])),
    "conv3d": ("nn.conv3d", [(1, 2, 4, 5, 6), (3, 2, 2, 3, 2)], dict(strides=[1, 2, 1], padding=1)),
    "conv1d_transpose": ("nn.conv1d_transpose", [("n", 4, 11), (4, 3, 3)],
                         dict(strides=2, padding=1, dilation=2, output_padding=1, groups=2)),
    "conv2d_transpose": ("nn.conv2d_transpose", [(2, 3, 5, 6), (3, 2, 3, 2)],
                         dict(strides=[2, 3], padding=[1, 0], output_padding=[1, 2])),
    "conv1d_transpose_symbolic": ("nn.conv1d_transpose", [("n", 4, "L"), (4, 3, 3)], dict(padding=1)),
    "conv3d_transpose": ("nn.conv3d_transpose", [(1, 2, 3, 4, 3), (2, 2, 2, 2, 3)], dict(strides=2)),
    "group_norm": ("nn.group_norm", [("n", 6, "h", 5), (6,), (6,)], dict(num_groups=3)),
    "instance_norm": ("nn.group_norm", [(2, 4, 7), (4,), (4,)], dict(num_groups=4, epsilon=1e-3)),
}


@pytest.mark.parametrize("name", list(LOWERINGS))
def test_lowering_equals_the_interpreter_and_the_cpu_build(name):
    op, shapes, op_attrs = LOWERINGS[name]
    fn = one_op(op, *shapes, **op_attrs)
    kernel = lower_function(fn)
    assert kernel.kind == ("conv2d" if "conv" in op else "row" if "norm" in op else "elementwise"), str(kernel)
    exe = dpl.build(dpl.Module([attrs.evolve(fn, name="main", attrs={})]), _cpu())
    for sizes in ({"n": 2, "L": 9, "h": 4}, {"n": 3, "L": 5, "h": 3}):
        arrays = sample(fn, sizes)
        want = dpl.interpret(fn, *arrays)
        assert np.abs(want).max() > 0.1  # random inputs, not zeros
        np.testing.assert_allclose(evaluate(kernel, *arrays), want, rtol=RTOL, atol=ATOL, err_msg=str(kernel))
        np.testing.assert_allclose(np.asarray(exe(*arrays)), want, rtol=RTOL, atol=ATOL)


# -- shapes dpl cannot hold yet, and bad attributes --------------------------------------------


def _call(op, *types, **attrs):
    fb = FunctionBuilder("f")
    params = [fb.param(f"p{i}", "f32", s) for i, s in enumerate(types)]
    return fb.emit(op, *params, **attrs)


def test_symbolic_dims_pass_through_where_the_output_keeps_them():
    assert _call("nn.conv1d", ("n", 4, "L"), (6, 4, 3), padding=1).ty.shape == ("n", 6, "L")
    assert _call("nn.conv1d_transpose", ("n", 4, "L"), (4, 2, 5), padding=[1, 3]).ty.shape == ("n", 2, "L")
    assert _call("nn.conv1d", ("n", 4, 10), (6, 4, 3), strides=2).ty.shape == ("n", 6, 4)
    assert _call("nn.conv1d_transpose", (1, 4, 10), (4, 2, 3), strides=2, output_padding=1).ty.shape == (1, 2, 22)
    assert _call("image.resize", ("n", "c", 4, 4), size=[8, 8]).ty.shape == ("n", "c", 8, 8)
    assert _call("nn.group_norm", ("n", 4, "h", "w"), (4,), (4,), num_groups=2).ty.shape == ("n", 4, "h", "w")


@pytest.mark.parametrize("op, types, attrs, out", [  # a spatial dim the output changes: an expression of it
    ("nn.conv1d", [("n", 4, "L"), (6, 4, 3)], dict(strides=2, padding=1), "f32[n, 6, (L + 1) // 2]"),
    ("nn.conv1d", [("n", 4, "L"), (6, 4, 3)], {}, "f32[n, 6, L - 2]"),
    ("nn.conv2d_transpose", [(1, 4, "h", 5), (4, 2, 3, 3)], dict(strides=2), "f32[1, 2, h * 2 + 1, 11]"),
    ("nn.conv1d_transpose", [(1, 4, "L"), (4, "c", 3)], dict(groups=2, strides=3, output_padding=1), "f32[1, c * 2, L * 3 + 1]"),
])
def test_symbolic_spatial_dims_give_expressions(op, types, attrs, out):
    call = _call(op, *types, **attrs)
    assert str(call.ty) == out
    fb = FunctionBuilder("main")
    params = [fb.param(f"p{i}", "f32", s) for i, s in enumerate(types)]
    mod = Module([fb.ret(fb.emit(op, *params, **attrs))])
    rng = np.random.default_rng(0)
    for size in (5, 6, 9):  # the interpreter checks each result against the evaluated expression
        args = [rng.standard_normal([{"n": 2, "L": size, "h": size, "c": 3}.get(d, d) for d in s]).astype("float32") for s in types]
        assert dpl.interpret(mod, *args).ndim == len(types[0])


@pytest.mark.parametrize("op, types, attrs, words", [
    ("image.resize", [(1, 3, "h", 5)], dict(size=["h * 2", 0]), ["image.resize", "output size 0"]),
    ("image.resize", [(1, 3, 4)], dict(size=[8], method="bicubic"), ["image.resize", "method"]),
    ("image.resize", [(1, 3, 4)], dict(size=[8], scales=[2.0, 2.0]), ["image.resize", "scales"]),
    ("nn.conv1d_transpose", [(1, 4, 5), (4, 2, 3)], dict(strides=2, output_padding=2), ["output_padding"]),
    ("nn.conv3d", [(1, 4, 5, 5), (4, 4, 3, 3)], {}, ["nn.conv3d", "rank 5"]),
    ("nn.conv1d", [(1, 4, 2), (4, 4, 3)], {}, ["nn.conv1d", "does not fit"]),
    ("nn.group_norm", [(1, 6, 5), (6,), (6,)], dict(num_groups=4), ["nn.group_norm", "4 groups"]),
    ("nn.group_norm", [(1, 6, 5), (3,), (6,)], dict(num_groups=3), ["nn.group_norm", "shape [6]"]),
])
def test_refused_with_a_message_naming_the_op_and_the_dim(op, types, attrs, words):
    with pytest.raises(TypeInferenceError) as err:
        _call(op, *types, **attrs)
    for w in words:
        assert w in str(err.value), str(err.value)


# -- the torch.export path ---------------------------------------------------------------------


def _torch_cases():
    torch = needs.package("torch")
    nn, F = torch.nn, torch.nn.functional

    class Lambda(nn.Module):
        def __init__(self, f, *params):
            super().__init__()
            self.f = f
            self.p = nn.ParameterList(params)

        def forward(self, x):
            return self.f(x, *self.p)

    def weight(*shape):
        return nn.Parameter(torch.randn(*shape))

    x4, x3, x5 = (2, 3, 5, 6), (2, 4, 11), (2, 2, 3, 4, 5)
    return {
        "nearest2d_scale": (Lambda(lambda x: F.interpolate(x, scale_factor=2)), x4, "image.resize"),
        "nearest2d_size": (Lambda(lambda x: F.interpolate(x, size=(7, 13))), x4, "image.resize"),
        "nearest_exact": (Lambda(lambda x: F.interpolate(x, size=(7, 4), mode="nearest-exact")), x4, "image.resize"),
        "nearest1d": (Lambda(lambda x: F.interpolate(x, scale_factor=3)), x3, "image.resize"),
        "nearest3d": (Lambda(lambda x: F.interpolate(x, size=(4, 5, 3))), x5, "image.resize"),
        "bilinear": (Lambda(lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear")), x4, "image.resize"),
        "bilinear_corners": (Lambda(lambda x: F.interpolate(x, size=(9, 4), mode="bilinear", align_corners=True)), x4,
                             "image.resize"),
        "bicubic": (Lambda(lambda x: F.interpolate(x, size=(9, 11), mode="bicubic")), x4, "image.resize"),
        "bicubic_corners": (Lambda(lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True)), x4,
                            "image.resize"),
        "linear1d": (Lambda(lambda x: F.interpolate(x, scale_factor=2.5, mode="linear")), x3, "image.resize"),
        "trilinear": (Lambda(lambda x: F.interpolate(x, scale_factor=2, mode="trilinear")), x5, "image.resize"),
        "conv1d_speech": (nn.Sequential(nn.Conv1d(4, 8, 5, stride=2, padding=2, groups=2), nn.GELU(),
                                        nn.Conv1d(8, 6, 3, dilation=2)), x3, "nn.conv2d"),
        "conv1d_same": (nn.Conv1d(4, 6, 4, padding="same"), x3, "nn.conv2d"),
        "conv3d": (nn.Conv3d(2, 3, (2, 3, 2), stride=(1, 2, 1), padding=1), x5, "nn.conv3d"),
        "conv_transpose1d": (nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2), x3,
                             "nn.conv1d_transpose"),
        "conv_transpose2d": (nn.ConvTranspose2d(3, 4, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2)), x4,
                             "nn.conv2d_transpose"),
        "conv_transpose3d": (nn.ConvTranspose3d(2, 2, 2, stride=2), x5, "nn.conv3d_transpose"),
        "group_norm": (nn.GroupNorm(3, 6), (2, 6, 4, 5), "nn.group_norm"),
        "instance_norm2d": (nn.InstanceNorm2d(3, affine=True), x4, "nn.group_norm"),
        "instance_norm1d": (nn.InstanceNorm1d(4), x3, "nn.group_norm"),
        "vector_norm": (Lambda(lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True)), x4, "sqrt"),
        "norm_p1": (Lambda(lambda x: x.norm(p=1, dim=1)), x4, "abs"),
        "norm_inf": (Lambda(lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=(1, 2))), x4, "max"),
        "norm_p3": (Lambda(lambda x: torch.linalg.vector_norm(x, ord=3, dim=-1)), x4, "power"),
        "normalize": (Lambda(lambda x: F.normalize(x, dim=1)), x4, "sqrt"),
        "weight_norm": (torch.nn.utils.parametrizations.weight_norm(nn.Linear(6, 4)), x4, "sqrt"),
    }


TORCH_CASES = ["nearest2d_scale", "nearest2d_size", "nearest_exact", "nearest1d", "nearest3d", "bilinear",
               "bilinear_corners", "bicubic", "bicubic_corners", "linear1d", "trilinear", "conv1d_speech", "conv1d_same",
               "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "group_norm", "instance_norm2d",
               "instance_norm1d", "vector_norm", "norm_p1", "norm_inf", "norm_p3", "normalize", "weight_norm"]


def _ops(mod) -> set:
    return {b.value.op for fn in mod.functions.values() for b in fn.bindings
            if isinstance(b.value, dpl.Call) and isinstance(b.value.op, str)}


@pytest.mark.parametrize("name", TORCH_CASES)
def test_torch_export_matches_torch_eager(name):
    torch = needs.package("torch")
    torch.manual_seed(0)
    model, shape, op = _torch_cases()[name]
    model.eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    mod = dpl.from_torch(model, (torch.randn(*shape),), dynamic_shapes=({0: batch},))
    assert op in _ops(mod), _ops(mod)
    params = mod["main"].params
    assert params[0].ty.shape[0] == "batch"
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cnn"]), _cpu())
    for n in (2, 3):
        x = torch.randn(n, *shape[1:])
        with torch.no_grad():
            want = model(x).numpy()
        got = dpl.interpret(mod, x.numpy())
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.asarray(exe(x.numpy())), want, rtol=RTOL, atol=ATOL)


def test_a_speech_front_end_keeps_its_symbolic_length_where_the_conv_keeps_it():
    torch = needs.package("torch")
    nn = torch.nn
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.GELU(), nn.Conv1d(8, 8, 5, padding=2, groups=4)).eval()
    batch, length = torch.export.Dim("batch", max=8), torch.export.Dim("frames", min=4, max=64)
    mod = dpl.from_torch(model, (torch.randn(2, 4, 10),), dynamic_shapes=({0: batch, 2: length},))
    assert "nn.conv1d" in _ops(mod) and mod["main"].params[0].ty.shape == ("batch", 4, "frames")
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cnn"]), _cpu())
    for shape in ((2, 4, 10), (3, 4, 17)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(dpl.interpret(mod, x.numpy()), want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.asarray(exe(x.numpy())), want, rtol=RTOL, atol=ATOL)


def test_a_strided_conv_over_a_symbolic_length_has_an_expression_for_its_output_length():
    torch = needs.package("torch")
    model = torch.nn.Conv1d(4, 8, 10, stride=5).eval()
    length = torch.export.Dim("frames", min=16, max=64)
    mod = dpl.from_torch(model, (torch.randn(2, 4, 20),), dynamic_shapes=({2: length},))
    assert str(mod["main"].ret.ty) == "f32[2, 8, frames // 5 - 1]"  # (frames - 10) // 5 + 1
    for frames in (20, 33):
        x = torch.randn(2, 4, frames)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(dpl.interpret(mod, x.numpy()), want, rtol=RTOL, atol=ATOL)


# -- the ONNX path ------------------------------------------------------------------------------


def _onnx_model(op, shape, inits, attrs, opset, extra_inputs=()):
    onnx = needs.package("onnx")
    from onnx import TensorProto, helper, numpy_helper

    names = ["x"] + [n for n, _ in inits]
    nodes = [helper.make_node(op, ["x", *extra_inputs] if extra_inputs else names, ["y"], **attrs)]
    from onnx.reference import ReferenceEvaluator

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape[1:]])
    weights = [numpy_helper.from_array(v, n) for n, v in inits]

    def model_with(y):
        graph = helper.make_graph(nodes, "g", [x], [y], weights)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    # the output's type, batch dim symbolic, from the reference's result
    draft = model_with(helper.make_tensor_value_info("y", TensorProto.FLOAT, []))
    (out,) = ReferenceEvaluator(draft).run(None, {"x": _f32(*shape)})
    model = model_with(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *out.shape[1:]]))
    onnx.checker.check_model(model)
    return model


def _f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


ONNX_CASES = {
    "resize_nearest_floor": ("Resize", (2, 3, 5, 6), [("s", np.array([1, 1, 2, 1.5], np.float32))],
                             dict(coordinate_transformation_mode="asymmetric", nearest_mode="floor"), 13, ["", "s"]),
    "resize_nearest_prefer_ceil": ("Resize", (2, 3, 5, 6), [("z", np.array([7, 4], np.int64))],
                                   dict(nearest_mode="round_prefer_ceil", axes=[2, 3]), 18, ["", "", "z"]),
    "resize_linear_half_pixel": ("Resize", (2, 3, 5, 6), [("s", np.array([1, 1, 1.6, 0.5], np.float32))],
                                 dict(mode="linear"), 19, ["", "s"]),
    "resize_linear_pytorch_half_pixel": ("Resize", (2, 3, 5, 6), [("z", np.array([9, 3], np.int64))],
                                         dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel",
                                              axes=[2, 3]), 18, ["", "", "z"]),
    "resize_cubic_asymmetric": ("Resize", (2, 3, 5, 6), [("s", np.array([1, 1, 2, 2], np.float32))],
                                dict(mode="cubic", coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.5), 13,
                                ["", "s"]),
    "resize_cubic_corners_exclude": ("Resize", (2, 3, 5), [("z", np.array([8], np.int64))],
                                     dict(mode="cubic", coordinate_transformation_mode="align_corners", exclude_outside=1,
                                          axes=[2]), 18, ["", "", "z"]),
    "conv_transpose_1d": ("ConvTranspose", (2, 4, 9), [("w", _f32(4, 3, 3)), ("b", _f32(3))],
                          dict(strides=[3], pads=[1, 2], output_padding=[2], dilations=[2]), 17, ()),
    "instance_norm": ("InstanceNormalization", (2, 4, 5, 3), [("g", _f32(4)), ("b", _f32(4))], dict(epsilon=1e-4), 17, ()),
    "group_norm_21": ("GroupNormalization", (2, 6, 5), [("g", _f32(6)), ("b", _f32(6))], dict(num_groups=2), 21, ()),
    "reduce_l2": ("ReduceL2", (2, 3, 5), [("a", np.array([-1], np.int64))], dict(keepdims=1), 18, ()),
    "reduce_l1": ("ReduceL1", (2, 3, 5), [], dict(axes=[1, 2], keepdims=0), 13, ()),
    "reduce_sum_square": ("ReduceSumSquare", (2, 3, 5), [], dict(axes=[1]), 13, ()),
}


@pytest.mark.parametrize("name", list(ONNX_CASES))
def test_onnx_matches_the_reference_evaluator(name):
    needs.package("onnx")
    from onnx.reference import ReferenceEvaluator

    op, shape, inits, attrs, opset, inputs = ONNX_CASES[name]
    model = _onnx_model(op, shape, inits, attrs, opset, inputs)
    mod = dpl.from_onnx(model)
    assert mod["main"].params[0].ty.shape[0] == "N"
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cnn"]), _cpu())
    for n in (2, 3):
        x = _f32(n, *shape[1:])
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_allclose(dpl.interpret(mod, x), want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(np.asarray(exe(x)), want, rtol=RTOL, atol=ATOL)


def test_torch_onnx_export_of_a_segmentation_head_matches_torch():
    torch = needs.package("torch")
    needs.package("onnxscript")
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(3)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
            self.norm = nn.GroupNorm(2, 4)
            self.inorm = nn.InstanceNorm2d(4, affine=True)

        def forward(self, x):
            y = self.norm(self.up(x))
            y = F.interpolate(y, scale_factor=2, mode="bilinear") + F.interpolate(y, scale_factor=2, mode="nearest")
            y = self.inorm(y)
            return F.interpolate(y, size=(9, 7), mode="bicubic", align_corners=True) / torch.linalg.vector_norm(y)

    model = Head().eval()
    x = torch.randn(2, 4, 5, 6)
    import io
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
        program.save(buf) if hasattr(program, "save") else None
    import onnx

    mod = dpl.from_onnx(onnx.load_from_string(buf.getvalue()))
    assert {"image.resize", "nn.group_norm", "nn.conv2d_transpose"} <= _ops(mod), _ops(mod)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(dpl.interpret(mod, x.numpy()), want, rtol=RTOL, atol=ATOL)
    exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cnn"]), _cpu())
    np.testing.assert_allclose(np.asarray(exe(x.numpy())), want, rtol=RTOL, atol=ATOL)
