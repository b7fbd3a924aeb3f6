"""Interpolation over symbolic axes (issue 32): ``image.resize`` of an input whose spatial axes
are symbolic has output sizes that are dims (``h * 2``, ``h + h // 2`` for a scale of 1.5, a size
the graph computed). The reference resolves them from the bound symbols; the kernel computes
each output's source coordinate in float64 from the run-time extents, as the reference does, so
the C kernel reads the same rows at every binding; both agree with torch (whose scale for a
given ``scale_factor`` is ``1 / scale_factor``, not in / out) and with ONNX's reference."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import needs

import dpl
from dpl.backends.cuda.emitter import emit_cuda
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, Module
from dpl.ir import dims as D
from dpl.ir.printer import print_module
from dpl.kernel import evaluate as kernel_evaluate, lower_function
from dpl.ops.image import COORDINATE_MODES, ROUNDING_METHODS, scaled_size

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)
RTOL, ATOL = 1e-4, 1e-5
P = D.parse


def resize_group(shape, **attrs):
    """A Primitive function resizing x: f32[shape], and a main that calls it."""
    g = FunctionBuilder("fused_resize", attrs={"Primitive": True})
    fn = g.ret(g.emit("image.resize", g.param("x", "f32", shape), **attrs))
    fb = FunctionBuilder("main")
    return Module([fb.ret(fb.call(fn, fb.param("x", "f32", shape))), fn]), fn


def sample(shape, bindings, seed):
    sizes = tuple(D.evaluate(d, bindings) for d in shape)
    return np.random.default_rng(seed).standard_normal(sizes).astype(np.float32)


# -- shapes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, attrs, out", [
    (("n", 3, "h", "w"), dict(size=[P("h * 2"), P("w * 2")], method="linear"), "f32[n, 3, h * 2, w * 2]"),
    (("n", 3, "h", "w"), dict(size=[scaled_size("h", 1.5), scaled_size("w", 0.5)], scales=[1.5, 0.5]),
     "f32[n, 3, h + h // 2, w // 2]"),
    ((2, "h", 6), dict(size=[P("h + 1"), 9], method="cubic"), "f32[2, h + 1, 9]"),
    ((2, 4, 6), dict(size=["m", 3]), "f32[2, m, 3]"),  # a static input to a symbolic size
    ((2, "h", 6), dict(size=["h * 3", 6]), "f32[2, h * 3, 6]"),  # dims written as text
])
def test_output_sizes_are_dims(shape, attrs, out):
    _, fn = resize_group(shape, **attrs)
    assert str(fn.ret.ty) == out


def test_a_scaled_size_is_the_floor_of_the_product_at_every_size():
    for scale in (2.0, 1.5, 0.5, 0.25, 3.0, 2.5, 1.25, 0.75):
        d = scaled_size("n", scale)
        assert all(D.evaluate(d, {"n": n}) == math.floor(n * scale) for n in range(300)), scale
        assert scaled_size(7, scale) == math.floor(7 * scale)
    for bad in (1.7, 1 / 3, 0.0, -2.0, math.inf):
        with pytest.raises(D.DimError):
            scaled_size("n", bad)


def test_a_module_with_symbolic_resizes_prints_and_parses_back():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 3, "h", "w"))
    y = fb.emit("image.resize", x, size=[P("h * 2"), scaled_size("w", 1.5)], scales=[2.0, 1.5], method="cubic",
                coordinate_transformation_mode="align_corners", cubic_exclude=True)
    mod = Module([fb.ret(fb.emit("image.resize", y, size=[P("h + 1"), 4], rounding_method="floor"))])
    text = print_module(mod)
    assert 'size=["h * 2", "w + w // 2"]' in text
    assert dpl.structural_equal(dpl.parse(text), mod)


def test_an_empty_symbolic_axis_is_an_error_on_every_path():
    mod, _ = resize_group((2, "h", 4), size=[P("h * 2 + 1"), 8], method="linear")
    x = np.zeros((2, 0, 4), np.float32)
    with pytest.raises(DplError, match="empty"):
        dpl.interpret(mod, x)
    needs.c_compiler()
    with pytest.raises(DplError, match="1 <= h"):  # the kernel requires a row to read
        dpl.build(mod, "cpu", config=ALWAYS)(x)


# -- the kernel equals the reference at every binding (the property) ------------------------------

SCALES = [None, 0.5, 0.75, 1.25, 1.5, 2.0, 2.5, 3.0]


@st.composite
def resizes(draw):
    """A resize of x: f32[2, h, 5]: axis 1 symbolic (its output scaled, shifted or static), axis 2
    static in (its output static or symbolic), every method, mode and rounding."""
    method = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    attrs = dict(method=method, coordinate_transformation_mode=draw(st.sampled_from(COORDINATE_MODES)),
                 rounding_method=draw(st.sampled_from(ROUNDING_METHODS)) if method == "nearest" else "round_prefer_floor",
                 cubic_alpha=draw(st.sampled_from([-0.75, -0.5])), cubic_exclude=draw(st.booleans()),
                 size_shortcuts=draw(st.booleans()))
    scale = draw(st.sampled_from(SCALES))
    given = scale if scale is not None else 1.5
    out_h = draw(st.sampled_from([scaled_size("h", given), P("h + 2"), P("h"), P("h * 2"), 7]))
    out_w = draw(st.sampled_from([3, 8, P("h + 1")]))
    attrs["size"] = [out_h, out_w]
    attrs["scales"] = None if scale is None else [scale, draw(st.sampled_from([0.75, 1.6]))]
    return attrs


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resizes())
def test_the_kernel_reads_the_references_rows_at_every_binding(attrs):
    needs.c_compiler()
    mod, fn = resize_group((2, "h", 5), **attrs)
    kernel = lower_function(fn)
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    for h in (1, 2, 5, 9):
        if any(D.evaluate(d, {"h": h}) < 1 for d in attrs["size"]):
            continue
        x = sample((2, "h", 5), {"h": h}, h)
        want = dpl.interpret(mod, x)
        for label, got in (("kernel IR", kernel_evaluate(kernel, x)), ("cpu", exe(x))):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{label} h={h} {attrs}")


def test_a_symbolic_axis_computes_its_taps_in_the_kernel_and_a_static_one_reads_tables():
    _, fn = resize_group((2, "h", 5), size=[P("h * 2"), 7], method="linear")
    text = str(lower_function(fn))
    assert "requires 1 <= h" in text
    assert "floor(" in text and "((double)h)" in text  # the coordinate from the run-time extent
    assert "weight" in text  # axis 2 (5 -> 7) keeps its table


# -- torch's interpolation: the scale it uses ----------------------------------------------------

# torch's mode -> the resize it is (what dpl.frontend.torch_image emits); scales: torch's own
TORCH = {
    "bilinear": dict(method="linear", coordinate_transformation_mode="half_pixel", size_shortcuts=True),
    "bilinear_corners": dict(method="linear", coordinate_transformation_mode="align_corners", size_shortcuts=True),
    "bicubic": dict(method="cubic", coordinate_transformation_mode="half_pixel"),
    "nearest": dict(method="nearest", coordinate_transformation_mode="asymmetric", rounding_method="floor",
                    size_shortcuts=True),
    "nearest-exact": dict(method="nearest", coordinate_transformation_mode="half_pixel",
                          rounding_method="round_prefer_ceil"),
}


def _torch(name, x, factor, recompute):
    torch = needs.package("torch")
    import torch.nn.functional as F

    mode = name.removesuffix("_corners")
    corners = {"align_corners": name.endswith("_corners")} if mode in ("bilinear", "bicubic") else {}
    return F.interpolate(torch.from_numpy(x), scale_factor=factor, mode=mode, recompute_scale_factor=recompute,
                         **corners).numpy()


@functools.lru_cache(maxsize=None)
def _torch_like(name, factor, recompute):
    """dpl's resize as torch computes ``name`` with ``scale_factor=factor``: the scale is the factor
    unless recomputed (or corner-aligned, where torch uses the sizes), then the ratio of the sizes."""
    scales = None if recompute or name.endswith("_corners") else [factor, factor]
    mod, _ = resize_group(("n", 2, "h", "w"), size=[scaled_size("h", factor), scaled_size("w", factor)], scales=scales,
                          **TORCH[name])
    return mod, dpl.build(mod, "cpu", config=ALWAYS)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(TORCH)), st.sampled_from([0.75, 1.25, 1.5, 2.0, 2.5, 3.0]), st.booleans(),
       st.integers(1, 3), st.integers(2, 13), st.integers(2, 13))
def test_the_reference_and_the_kernel_agree_with_torch_at_random_sizes_and_scales(name, factor, recompute, n, h, w):
    needs.c_compiler()
    x = sample((n, 2, h, w), {}, h * 100 + w)
    want = _torch(name, x, factor, recompute or None)
    mod, exe = _torch_like(name, factor, bool(recompute))
    for label, got in (("reference", dpl.interpret(mod, x)), ("cpu", exe(x))):
        assert got.shape == want.shape, label
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{label} {name} x{factor} {x.shape}")


def test_torch_places_samples_by_the_given_scale_unless_recomputed():
    """At h = 5 and 1.5 the size is 7: the given scale (1 / 1.5) and the ratio 5 / 7 place the
    samples differently, so exactly one resize matches each of torch's two answers."""
    needs.c_compiler()
    x = sample((1, 2, 5, 5), {}, 0)
    given, recomputed = _torch("bilinear", x, 1.5, None), _torch("bilinear", x, 1.5, True)
    assert not np.allclose(given, recomputed, rtol=RTOL, atol=ATOL)
    for recompute, want in ((False, given), (True, recomputed)):
        mod, exe = _torch_like("bilinear", 1.5, recompute)
        np.testing.assert_allclose(exe(x), want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(dpl.interpret(mod, x), want, rtol=RTOL, atol=ATOL)


# -- ONNX's Resize over symbolic axes, against onnx's reference -----------------------------------


def _onnx_resize(mode, coordinates, nearest_mode="round_prefer_floor", by_sizes=False, scales=(1.5, 2.5)):
    """Resize of x: f32[n, 2, h, w] with scales, or with sizes computed from its Shape."""
    onnx = needs.package("onnx")
    from onnx import TensorProto, helper

    attrs = dict(mode=mode, coordinate_transformation_mode=coordinates, nearest_mode=nearest_mode)
    inits = [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1.0, 1.0, *scales])]
    if by_sizes:  # sizes = [n, 2, h * 2, w + 3] from Shape arithmetic
        nodes = [helper.make_node("Shape", ["x"], ["shape"]),
                 helper.make_node("Mul", ["shape", "times"], ["scaled"]),
                 helper.make_node("Add", ["scaled", "plus"], ["sizes"]),
                 helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)]
        inits = [helper.make_tensor("times", TensorProto.INT64, [4], [1, 1, 2, 1]),
                 helper.make_tensor("plus", TensorProto.INT64, [4], [0, 0, 0, 3])]
    else:
        nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], initializer=inits)
    return onnx, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


ONNX_CASES = [(m, c, r) for c in COORDINATE_MODES for m, r in
              [("nearest", r) for r in ROUNDING_METHODS] + [("linear", "round_prefer_floor"), ("cubic", "round_prefer_floor")]]


@pytest.mark.parametrize("by_sizes", [False, True], ids=["scales", "sizes"])
@pytest.mark.parametrize("mode, coordinates, rounding", ONNX_CASES)
def test_onnx_resize_over_symbolic_axes_equals_onnxs_reference(mode, coordinates, rounding, by_sizes):
    needs.c_compiler()
    _, model = _onnx_resize(mode, coordinates, rounding, by_sizes)
    from onnx.reference import ReferenceEvaluator

    mod = dpl.from_onnx(model)
    assert str(mod["main"].ret.ty) == ("f32[n, 2, h * 2, w + 3]" if by_sizes else "f32[n, 2, h + h // 2, w * 2 + w // 2]")
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    reference = ReferenceEvaluator(model)
    for shape in ((1, 2, 3, 4), (2, 2, 6, 2)):
        x = sample(shape, {}, shape[2])
        want = reference.run(None, {"x": x})[0]
        for label, got in (("interpreter", dpl.interpret(mod, x)), ("cpu", exe(x))):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{label} {shape}")


def test_onnx_scale_no_dim_expression_holds_is_an_error():
    _, model = _onnx_resize("linear", "half_pixel", scales=(1.7, 2.0))
    with pytest.raises(dpl.DplError, match=r"scaled by 1\.7"):
        dpl.from_onnx(model)


# -- CUDA: the same kernels through NVRTC and the host twin ---------------------------------------

CUDA_CASES = [
    dict(size=[scaled_size("h", 1.5), P("h + 1")], scales=[1.5, 0.75], method="cubic", cubic_exclude=True),
    dict(size=[P("h * 2"), 8], method="linear", coordinate_transformation_mode="align_corners"),
    dict(size=[P("h + 2"), 3], coordinate_transformation_mode="pytorch_half_pixel", rounding_method="round_prefer_floor"),
]


def test_cuda_resize_kernels_over_symbolic_axes_compile_with_nvrtc(nvrtc):
    for k, attrs in enumerate(CUDA_CASES):
        _, fn = resize_group((2, "h", 5), **attrs)
        for rows_from in (0, 10**9):
            source = emit_cuda(lower_function(fn), f"k_resize{k}", rows_from)
            assert f".entry k_resize{k}(" in nvrtc.compile_ptx(source.code, f"resize{k}.cu")


def test_cuda_twin_of_the_resize_kernels_equals_the_interpreter(cxx):
    from dpl.backends.cuda.host import HostTwin

    cases = [(*resize_group((2, "h", 5), **attrs), k) for k, attrs in enumerate(CUDA_CASES)]
    sources = [emit_cuda(lower_function(fn), f"k_resize{k}", 0) for _, fn, k in cases]
    twin = HostTwin(sources, block=8)
    for (mod, _, _), source in zip(cases, sources):
        for h in (1, 4, 7):
            x = sample((2, "h", 5), {"h": h}, h)
            want = np.asarray(dpl.interpret(mod, x))
            out = np.full_like(want, np.nan)
            twin.run(source.name, [x], [out])
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, err_msg=f"{source.name} h={h}")
