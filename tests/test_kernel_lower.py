"""Every lowering is checked numerically: the kernel's evaluation equals dpl.interpret of the
group it came from, on random inputs (symbolic dims drawn at random as well)."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, const
from dpl.kernel import LoweringError, evaluate, lower_function
from dpl.kernel import ir

rng = np.random.default_rng(7)


def random_inputs(fn, positive=False):
    dims = {}
    arrays = []
    for p in fn.params:
        shape = [dims.setdefault(d, int(rng.integers(2, 7))) if isinstance(d, str) else d for d in p.ty.shape]
        dt = p.ty.dtype
        if dt == "bool":
            a = rng.random(shape) > 0.5
        elif dt.startswith(("int", "uint")):
            a = rng.integers(1, 6, shape).astype(dt)
        elif positive:
            a = (rng.random(shape) + 0.5).astype(dt)
        else:
            a = rng.standard_normal(shape).astype(dt)
        arrays.append(a)
    return arrays


def check(fn, positive=False, rtol=2e-5, atol=2e-5, kind=None, trials=2):
    """Lower ``fn``, run the kernel and dpl.interpret on the same random inputs, compare."""
    k = lower_function(fn)
    for _ in range(trials):
        arrays = random_inputs(fn, positive)
        want = dpl.interpret(fn, *arrays)
        got = evaluate(k, *arrays)
        wants = want if isinstance(want, tuple) else (want,)
        gots = got if isinstance(got, tuple) else (got,)
        assert len(gots) == len(wants)
        for g, w in zip(gots, wants):
            assert g.dtype == w.dtype and g.shape == w.shape, str(k)
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=str(k))
    # only the function's parameters, constants and outputs are buffers: nothing intermediate
    loaded = {e.buffer for s in ir.walk(k.body) for x in _exprs(s) for e in ir.walk_exprs(x) if isinstance(e, ir.Load)}
    assert loaded <= {p.name for p in k.params} | set(k.constants)
    if kind is not None:
        assert k.kind == kind, str(k)
    return k


def _exprs(s):
    if isinstance(s, ir.Let):
        return (s.value,)
    if isinstance(s, ir.Store):
        return (s.value, *s.indices)
    if isinstance(s, ir.Reduce):
        return (s.value,)
    return (s.extent,)


def prim(name="f"):
    return FunctionBuilder(name, attrs={"Primitive": True})


def nests(k):
    return len(k.body) - sum(1 for s in k.body if not isinstance(s, ir.Loop))


# -- elementwise and broadcast -----------------------------------------------------------------


def test_elementwise_chain_symbolic():
    fb = prim()
    x = fb.param("x", "f32", ("n", 8))
    y = fb.param("y", "f32", ("n", 8))
    k = check(fb.ret(fb.emit("add", fb.emit("exp", x), y)), kind="elementwise")
    assert "exp(x[i0, i1])" in str(k)
    assert k.dims == ("n",)


def test_bias_relu_scale_with_constants():
    fb = prim()
    x = fb.param("x", "f32", (4, 8))
    b = fb.param("b", "f32", (8,))
    y = fb.emit("nn.relu", fb.emit("add", x, b))
    w = const(rng.standard_normal((1, 8)).astype("float32"), name="w")
    check(fb.ret(fb.emit("multiply", fb.emit("multiply", y, 0.5), w)))


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "erf", "negative", "abs", "square", "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "sin", "cos"])
def test_unary_ops(op):
    fb = prim()
    x = fb.param("x", "f32", ("n", 5))
    check(fb.ret(fb.emit(op, x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["log", "sqrt", "rsqrt"])
def test_unary_ops_positive(op):
    fb = prim()
    x = fb.param("x", "f32", (3, 5))
    check(fb.ret(fb.emit(op, x)), positive=True)


@pytest.mark.parametrize("op", ["subtract", "divide", "power", "maximum", "minimum"])
def test_binary_broadcast(op):
    fb = prim()
    x = fb.param("x", "f32", (3, 1, 5))
    y = fb.param("y", "f32", (4, 1))
    check(fb.ret(fb.emit(op, x, y)), positive=True, rtol=1e-4)


def test_where_compare_clip_astype():
    fb = prim()
    x = fb.param("x", "f32", (6, 4))
    y = fb.param("y", "f32", (4,))
    c = fb.emit("greater", x, y)
    w = fb.emit("where", c, x, fb.emit("clip", y, min=-0.5, max=0.5))
    h = fb.emit("astype", fb.emit("astype", w, dtype="f16"), dtype="f32")
    check(fb.ret(fb.emit("add", h, 1.0)), rtol=1e-3, atol=1e-3)


def test_integer_arithmetic():
    fb = prim()
    x = fb.param("x", "i32", (5, 3))
    y = fb.param("y", "i32", (3,))
    check(fb.ret(fb.emit("divide", fb.emit("multiply", x, y), y)))


def test_full_and_zeros():
    fb = prim()
    x = fb.param("x", "f32", (2, 3))
    v = fb.param("v", "f32", ())
    f = fb.emit("full", v, shape=[2, 3])
    z = fb.emit("ones", shape=[2, 3])
    check(fb.ret(fb.emit("add", fb.emit("multiply", x, f), z)))


# -- injective producers inlined by index mapping ----------------------------------------------


def test_transpose_into_add():
    fb = prim()
    x = fb.param("x", "f32", (3, 4, 5))
    y = fb.param("y", "f32", (5, 3, 4))
    t = fb.emit("permute_dims", x, axes=[2, 0, 1])
    check(fb.ret(fb.emit("add", t, y)), kind="elementwise")


def test_reverse_transpose():
    fb = prim()
    x = fb.param("x", "f32", ("n", 4))
    check(fb.ret(fb.emit("exp", fb.emit("permute_dims", x))))


@pytest.mark.parametrize("src, dst", [((2, 3, 4), (6, 4)), ((6, 4), (4, 6)), ((24,), (2, 3, 4)), ((2, 12), (4, 2, 3)), (("n", 4, 6), ("n", 24)), (("n", 6), ("n", 2, -1))])
def test_reshape(src, dst):
    fb = prim()
    x = fb.param("x", "f32", src)
    r = fb.emit("reshape", fb.emit("exp", x), shape=dst)
    check(fb.ret(fb.emit("negative", r)))


def test_strided_slice_forward_and_backward():
    fb = prim()
    x = fb.param("x", "f32", (8, 10))
    a = fb.emit("strided_slice", x, axes=[0, 1], begin=[1, 9], end=[7, 0], strides=[2, -3])
    b = fb.emit("strided_slice", x, axes=[0, 1], begin=[5, -3], end=[8, 10])
    check(fb.ret(fb.emit("add", a, b)))


def test_concat_with_producers():
    fb = prim()
    x = fb.param("x", "f32", (3, 2))
    y = fb.param("y", "f32", (3, 4))
    z = fb.param("z", "f32", (3, 1))
    e = fb.emit("exp", x)
    cat = fb.emit("concat", [e, y, fb.emit("negative", z)], axis=1)
    k = check(fb.ret(fb.emit("multiply", cat, cat)))
    assert "?" in str(k)


def test_split_and_tuple_items():
    fb = prim()
    x = fb.param("x", "f32", (4, 9))
    parts = fb.emit("split", x, indices_or_sections=3, axis=1)
    a = fb.item(parts, 0)
    c = fb.item(parts, 2)
    check(fb.ret(fb.emit("subtract", fb.emit("exp", a), c)))


def test_split_at_indices():
    fb = prim()
    x = fb.param("x", "f32", (7, 2))
    parts = fb.emit("split", x, indices_or_sections=[2, 5], axis=0)
    check(fb.ret(fb.emit("add", fb.item(parts, 2), fb.item(parts, 0)), fb.item(parts, 1)))


def test_expand_squeeze_broadcast():
    fb = prim()
    x = fb.param("x", "f32", (4,))
    y = fb.param("y", "f32", (3, 1, 4, 1))
    e = fb.emit("expand_dims", x, axis=[0, 2])  # [1, 4, 1]
    b = fb.emit("broadcast_to", e, shape=[3, 4, 5])
    s = fb.emit("squeeze", y, axis=[1])  # [3, 4, 1]
    check(fb.ret(fb.emit("add", b, s)))


def test_squeeze_all():
    fb = prim()
    x = fb.param("x", "f32", (1, 5, 1))
    check(fb.ret(fb.emit("exp", fb.emit("squeeze", x))))


# -- reductions: prologue into the reduction, epilogue after -----------------------------------


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "variance"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_with_prologue(op, keepdims):
    fb = prim()
    x = fb.param("x", "f32", ("n", 6))
    e = fb.emit("exp", fb.emit("multiply", x, 0.3))
    k = check(fb.ret(fb.emit(op, e, axis=[-1], keepdims=keepdims)), rtol=1e-4)
    assert k.kind == "reduce"


def test_reduction_over_several_and_all_axes():
    fb = prim()
    x = fb.param("x", "f32", (3, 4, 5))
    a = fb.emit("sum", x, axis=[0, 2])
    b = fb.emit("max", x)
    check(fb.ret(fb.emit("add", a, b)), rtol=1e-4)


def test_reduction_middle_axis_with_epilogue():
    fb = prim()
    x = fb.param("x", "f32", (3, "n", 5))
    s = fb.emit("mean", fb.emit("square", x), axis=[1], keepdims=True)
    check(fb.ret(fb.emit("sqrt", fb.emit("add", s, 1e-5))), rtol=1e-4)


def test_reduction_of_broadcast_value():
    # the reduced value does not depend on the reduction index: it is added n times
    fb = prim()
    x = fb.param("x", "f32", (3, 1))
    b = fb.emit("broadcast_to", x, shape=[3, 7])
    check(fb.ret(fb.emit("sum", b, axis=[1])), rtol=1e-5)


def test_scalar_output():
    fb = prim()
    x = fb.param("x", "f32", (4, 5))
    k = check(fb.ret(fb.emit("sum", fb.emit("abs", x))), rtol=1e-5)
    assert k.outputs[0].shape == ()


# -- anchors with epilogues --------------------------------------------------------------------


@pytest.mark.parametrize("act", ["nn.relu", "nn.gelu", "nn.silu", "nn.gelu_tanh"])
def test_matmul_bias_activation(act):
    fb = prim()
    x = fb.param("x", "f32", ("n", 16))
    w = fb.param("w", "f32", (16, 8))
    b = fb.param("b", "f32", (8,))
    y = fb.emit(act, fb.emit("add", fb.emit("matmul", x, w), b))
    k = check(fb.ret(y), rtol=1e-4, atol=1e-5, kind="matmul")
    assert nests(k) == 1


def test_matmul_residual_and_transposed_weight():
    fb = prim()
    x = fb.param("x", "f32", (5, 6))
    w = fb.param("w", "f32", (7, 6))
    r = fb.param("r", "f32", (5, 7))
    mm = fb.emit("matmul", x, fb.emit("permute_dims", w))
    check(fb.ret(fb.emit("add", mm, r)), rtol=1e-4, atol=1e-5, kind="matmul")


@pytest.mark.parametrize("a, b", [((2, 3, 4, 5), (5, 6)), ((3, 1, 4, 5), (2, 5, 3)), ((5,), (5, 3)), ((4, 5), (5,)), ((5,), (5,))])
def test_matmul_batching_and_vectors(a, b):
    fb = prim()
    x = fb.param("x", "f32", a)
    y = fb.param("y", "f32", b)
    check(fb.ret(fb.emit("matmul", x, y)), rtol=1e-4, atol=1e-5)


def test_matmul_f16_out_dtype():
    fb = prim()
    x = fb.param("x", "f16", (4, 8))
    y = fb.param("y", "f16", (8, 3))
    check(fb.ret(fb.emit("matmul", x, y, out_dtype="f32")), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "attrs",
    [dict(), dict(padding=[1, 1]), dict(strides=[2, 2], padding=[1, 2, 0, 1]), dict(dilation=[2, 1], padding=[2]), dict(groups=2, padding=[1])],
)
def test_conv2d_bias_relu(attrs):
    fb = prim()
    x = fb.param("x", "f32", (2, 4, 7, 6))
    w = fb.param("w", "f32", (6, 4 // attrs.get("groups", 1), 3, 3))
    b = fb.param("b", "f32", (6, 1, 1))
    y = fb.emit("nn.relu", fb.emit("add", fb.emit("nn.conv2d", x, w, **attrs), b))
    check(fb.ret(y), rtol=1e-4, atol=1e-5, kind="conv2d")


@pytest.mark.parametrize("attrs", [dict(pool_size=[2, 2], strides=[2, 2]), dict(pool_size=[3, 3], padding=[1]), dict(pool_size=[2, 2], strides=[2, 2], ceil_mode=True)])
def test_max_pool2d(attrs):
    fb = prim()
    x = fb.param("x", "f32", (1, 2, 5, 5))
    check(fb.ret(fb.emit("nn.max_pool2d", x, **attrs)), kind="pool")


# -- high-level ops: one row kernel each -------------------------------------------------------


def one_row_kernel(k):
    assert k.kind == "row", str(k)
    assert len(k.body) == 1 and isinstance(k.body[0], ir.Loop), str(k)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("f16", 2e-3)])
def test_softmax_alone(op, dtype, tol):
    fb = prim()
    x = fb.param("x", dtype, ("n", 12))
    one_row_kernel(check(fb.ret(fb.emit(op, x)), rtol=tol, atol=tol))


def test_softmax_other_axis():
    fb = prim()
    x = fb.param("x", "f32", (5, 3, 4))
    check(fb.ret(fb.emit("nn.softmax", x, axis=1)), rtol=1e-5)


@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("f16", 3e-3)])
def test_rms_norm_alone(dtype, tol):
    fb = prim()
    x = fb.param("x", dtype, ("n", 16))
    w = fb.param("w", dtype, (16,))
    one_row_kernel(check(fb.ret(fb.emit("nn.rms_norm", x, w, epsilon=1e-6)), rtol=tol, atol=tol))


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False), (False, False)])
def test_layer_norm_alone(center, scale):
    fb = prim()
    x = fb.param("x", "f32", (3, "n", 10))
    g = fb.param("g", "f32", (10,))
    b = fb.param("b", "f32", (10,))
    k = check(fb.ret(fb.emit("nn.layer_norm", x, g, b, epsilon=1e-5, center=center, scale=scale)), rtol=1e-4, atol=1e-5)
    one_row_kernel(k)


def test_norm_over_two_axes():
    fb = prim()
    x = fb.param("x", "f32", (3, 4, 5))
    w = fb.param("w", "f32", (4, 5))
    check(fb.ret(fb.emit("nn.rms_norm", x, w, axes=[1, 2])), rtol=1e-4)


@pytest.mark.parametrize("op", ["mean", "variance"])
def test_mean_variance_alone(op):
    fb = prim()
    x = fb.param("x", "f32", ("n", 9))
    check(fb.ret(fb.emit(op, x, axis=[1], keepdims=True)), rtol=1e-4, atol=1e-6)


def test_softmax_epilogue_and_prologue():
    fb = prim()
    x = fb.param("x", "f32", ("n", 8))
    s = fb.param("s", "f32", ())
    y = fb.emit("nn.softmax", fb.emit("multiply", x, s))
    one_row_kernel(check(fb.ret(fb.emit("astype", y, dtype="f16")), rtol=2e-3, atol=2e-3))


def test_kernel_composite_lowers_like_a_group():
    fb = FunctionBuilder("kernel_rms_norm", attrs={"Primitive": True, "Composite": "kernel.rms_norm"})
    x = fb.param("x", "f32", ("n", 8))
    w = fb.param("w", "f32", (8,))
    one_row_kernel(check(fb.ret(fb.emit("nn.rms_norm", x, w)), rtol=1e-5))


# -- multi-output groups -----------------------------------------------------------------------


def test_multi_output_same_shape_one_nest():
    fb = prim()
    x = fb.param("x", "f32", ("n", 6))
    e = fb.emit("exp", x)
    a = fb.emit("add", e, x)
    k = check(fb.ret(e, a))
    assert len(k.outputs) == 2 and nests(k) == 1


def test_multi_output_different_shapes():
    fb = prim()
    x = fb.param("x", "f32", ("n", 6))
    e = fb.emit("exp", x)
    s = fb.emit("sum", e, axis=[1], keepdims=True)
    d = fb.emit("divide", e, s)
    m = fb.emit("max", x, axis=[1])
    k = check(fb.ret(d, s, m), rtol=1e-5)
    assert [o.shape for o in k.outputs] == [("n", 6), ("n", 1), ("n",)]
    assert nests(k) == 1 and k.kind == "row"


def test_multi_output_that_does_not_fit_one_nest():
    fb = prim()
    x = fb.param("x", "f32", (4, 6))
    e = fb.emit("exp", x)
    k = check(fb.ret(e, fb.emit("permute_dims", e)))
    assert nests(k) == 2


def test_returning_a_parameter_and_duplicates():
    fb = prim()
    x = fb.param("x", "f32", (3,))
    e = fb.emit("exp", x)
    k = check(fb.ret(e, x, e))
    assert len({o.name for o in k.outputs}) == 3


# -- what cannot be lowered --------------------------------------------------------------------


def test_take_is_named_in_the_error():
    fb = prim()
    x = fb.param("x", "f32", (5, 3))
    i = fb.param("i", "i64", (2,))
    t = fb.emit("take", x, i, axis=0, name="gathered")
    f = fb.ret(fb.emit("exp", t))
    with pytest.raises(LoweringError) as err:
        lower_function(f)
    assert "gathered = take(...)" in str(err.value) and "opaque" in str(err.value)


def test_call_of_a_function_is_an_error():
    inner = prim("inner")
    a = inner.param("a", "f32", (3,))
    inner_fn = inner.ret(inner.emit("exp", a))
    fb = prim()
    x = fb.param("x", "f32", (3,))
    y = fb.call(inner_fn, x, name="y")
    with pytest.raises(LoweringError, match="call of function 'inner'"):
        lower_function(fb.ret(fb.emit("exp", y)))


def test_tuple_parameters_and_results_become_one_buffer_per_leaf():
    """As the runtime flattens them: a single concat (a tuple operand, nested here) and a split
    (a tuple result) are kernels like any other."""
    from dpl.kernel.evaluate import evaluate as run

    fb = prim("concat")
    t = fb.param("t", dpl.TupleType([dpl.TensorType((2, 3), "f32"), dpl.TupleType([dpl.TensorType((4, 3), "f32")])]))
    inner = fb.emit("exp", fb.item(fb.item(t, 1), 0))
    fn = fb.ret(fb.emit("concat", dpl.Tuple((fb.item(t, 0), inner)), axis=0))
    k = lower_function(fn)
    assert [b.name for b in k.params] == ["t_0", "t_1_0"]
    a, b = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32), np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(run(k, a, b), dpl.interpret(fn, (a, (b,))), rtol=1e-6)
    fb = prim("split")
    x = fb.param("x", "f32", (6, 4))
    fn = fb.ret(fb.emit("split", x, indices_or_sections=3, axis=0))
    k = lower_function(fn)
    assert len(k.outputs) == 3
    xs = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    for got, want in zip(run(k, xs), dpl.interpret(fn, xs)):
        np.testing.assert_array_equal(got, want)


# -- the kernel.* composites of patterns/llm.dpl -----------------------------------------------


def composite(name):
    return FunctionBuilder(f"kernel_{name}", attrs={"Primitive": True, "Composite": f"kernel.{name}"})


def test_llm_composite_swiglu_and_add_rms_norm():
    fb = composite("swiglu")
    g = fb.param("gate", "f16", ("n", 32))
    u = fb.param("up", "f16", ("n", 32))
    check(fb.ret(fb.emit("multiply", fb.emit("nn.silu", g), u)), rtol=2e-3, atol=2e-3, kind="elementwise")
    fb = composite("add_rms_norm")
    a = fb.param("a", "f32", ("n", 16))
    b = fb.param("b", "f32", ("n", 16))
    w = fb.param("w", "f32", (16,))
    one_row_kernel(check(fb.ret(fb.emit("nn.rms_norm", fb.emit("add", a, b), w)), rtol=1e-5))


def test_llm_composite_attention_is_one_kernel():
    fb = composite("attention")
    q = fb.param("q", "f32", (2, "t", 8))
    k = fb.param("k", "f32", (2, 8, "t"))
    v = fb.param("v", "f32", (2, "t", 4))
    mask = fb.param("mask", "f32", ("t", "t"))
    z = fb.emit("multiply", fb.emit("matmul", q, k), 0.35)
    p = fb.emit("nn.softmax", fb.emit("add", z, mask))
    kern = check(fb.ret(fb.emit("matmul", p, v)), rtol=1e-4, atol=1e-5, kind="matmul")
    assert len(kern.body) == 1


# -- masks built in the kernel, average pooling, slices over symbolic dims ---------------------


def test_causal_mask_from_aranges_fuses_into_the_scores():
    """The mask of a symbolic length, built from two ranges, is computed inside the kernel."""
    fb = prim()
    s = fb.param("scores", "f32", (2, "seq", "seq"))
    r = fb.emit("arange", end="seq")
    allowed = fb.emit("greater_equal", fb.emit("expand_dims", r, axis=[1]), fb.emit("expand_dims", r, axis=[0]))
    masked = fb.emit("where", allowed, s, const(float("-inf")))
    k = check(fb.ret(fb.emit("nn.softmax", masked)), rtol=1e-5, atol=1e-6)
    assert k.params[0].name == "scores" and len(k.params) == 1 and not k.constants


@pytest.mark.parametrize("op, diagonal", [("triu", 1), ("triu", -2), ("tril", 0), ("tril", 3)])
def test_triangles_of_a_symbolic_square(op, diagonal):
    fb = prim()
    x = fb.param("x", "f32", (3, "n", "n"))
    full = fb.emit("full", const(float("-inf")), shape=["n", "n"])
    check(fb.ret(fb.emit("add", x, fb.emit(op, full, k=diagonal))))
    fb = prim()
    y = fb.param("y", "f32", (4, 6))
    check(fb.ret(fb.emit("nn.relu", fb.emit(op, fb.emit("exp", y), k=diagonal))))


@pytest.mark.parametrize("attrs", [dict(end=7), dict(start=3, end=-8, step=-2), dict(start=0.25, end=3.0, step=0.5, dtype="f16")])
def test_static_ranges(attrs):
    fb = prim()
    r = fb.emit("arange", **attrs)
    check(fb.ret(fb.emit("multiply", r, r)), rtol=1e-3)


def test_a_range_no_buffer_carries_is_refused():
    fb = prim()
    x = fb.param("x", "f32", ("n",))
    total = fb.emit("sum", fb.emit("add", fb.emit("astype", fb.emit("arange", end="m"), dtype="f32"), fb.emit("sum", x)))
    with pytest.raises(LoweringError, match="symbolic dimension.* m appear in no parameter or result"):
        lower_function(fb.ret(total))


@pytest.mark.parametrize("attrs", [
    dict(pool_size=[2, 2], strides=[2, 2]),
    dict(pool_size=[3, 3], padding=[1]),
    dict(pool_size=[3, 3], padding=[1], count_include_pad=True),
    dict(pool_size=[3, 2], strides=[2, 1], padding=[1, 0, 1, 1], dilation=[2, 1]),
    dict(pool_size=[2, 2], strides=[2, 2], padding=[1], ceil_mode=True, count_include_pad=True),
    dict(pool_size=[3, 3], strides=[2, 2], ceil_mode=True),
])
def test_avg_pool2d_with_epilogue(attrs):
    fb = prim()
    x = fb.param("x", "f32", (2, 3, 7, 6))
    b = fb.param("b", "f32", (3, 1, 1))
    check(fb.ret(fb.emit("nn.relu", fb.emit("add", fb.emit("nn.avg_pool2d", x, **attrs), b))), kind="pool")


@pytest.mark.parametrize("size", [None, [1, 1], [2, 3], [3, 3], [7, 4], [14, 9]])
def test_adaptive_avg_pool2d(size):
    fb = prim()
    x = fb.param("x", "f32", ("n", 3, 7, 6))
    attrs = {} if size is None else {"output_size": size}
    check(fb.ret(fb.emit("multiply", fb.emit("nn.adaptive_avg_pool2d", x, **attrs), 2.0)), kind="pool")


@pytest.mark.parametrize("op", ["nn.avg_pool2d", "nn.max_pool2d"])
def test_a_pool_window_larger_than_its_input_loops_over_the_taps_that_reach_it(op):
    fb = prim()
    x = fb.param("x", "f32", (2, 3, 3, 2))
    k = check(fb.ret(fb.emit(op, x, pool_size=[64, 64], strides=[64, 64], padding=[1], ceil_mode=True)), kind="pool")
    assert "64" not in str(k), str(k)  # the loops run over the 5 x 4 taps of the padded input


def test_pooling_f16_accumulates_in_f32():
    fb = prim()
    x = fb.param("x", "f16", (1, 2, 8, 8))
    check(fb.ret(fb.emit("nn.avg_pool2d", x, pool_size=4, strides=2)), rtol=2e-3, atol=2e-3)


def test_slice_of_a_static_buffer_to_a_symbolic_length():
    """nanoGPT's ``mask[:T, :T]``: read in place, and only for T within the buffer."""
    fb = prim()
    mask = fb.param("mask", "f32", (16, 16))
    scores = fb.param("scores", "f32", (2, "T", "T"))
    cut = fb.emit("strided_slice", mask, axes=[0, 1], begin=[0, 0], end=["T", "T"])
    k = check(fb.ret(fb.emit("add", scores, cut)))
    assert k.requires == (("T", 16),) and "requires T <= 16" in str(k)
    from dpl.kernel.evaluate import KernelEvalError

    with pytest.raises(KernelEvalError, match="needs T <= 16 .* got T=17"):
        evaluate(k, np.zeros((16, 16), np.float32), np.zeros((2, 17, 17), np.float32))


@pytest.mark.parametrize("begin, end", [(-2, 2**62), (-2, -1), (1, 2), (0, "n")])
def test_slices_of_a_symbolic_axis(begin, end):
    fb = prim()
    x = fb.param("x", "f32", ("n", 4))
    y = fb.emit("strided_slice", fb.emit("exp", x), axes=[0], begin=[begin], end=[end])
    check(fb.ret(fb.emit("negative", y)))
