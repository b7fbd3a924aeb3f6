"""dpl's own convolution (backends/cpu/conv_direct.py): random float32 NCHW convolutions of every
stride, padding, dilation and window, odd channel counts, batches, equal the interpreter on
this CPU's build and on an AVX2-only one (``march="haswell"``); its epilogue rounds as the
separate ops do; through the backend with convolutions="direct", at two sizes of symbolic dims."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu import conv_direct
from dpl.ir import FunctionBuilder, Module
from dpl.ir.builder import const
from dpl.ops.registry import get_op

FUSE_ALL = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, max_graph_size=1000, fallback_on_error=False)


@pytest.fixture(scope="module", params=["native", "haswell"])
def routine(request, tmp_path_factory):
    """The routine on this CPU's instruction sets, and built for AVX2 and FMA alone."""
    from dpl.backends.cpu.toolchain import KernelCache

    needs.c_compiler()
    cache = KernelCache(tmp_path_factory.mktemp(request.param), march=request.param)
    return conv_direct.Routine(cache.load(conv_direct.SOURCE))


def conv_module(x_shape, w, attrs, weight_param=False, epilogue=False):
    """``y = conv2d(x, w)`` (``w`` a constant, or a parameter); with ``epilogue``, plus a
    per-channel bias and a ReLU."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", x_shape)
    weight = fb.param("w", "f32", w.shape) if weight_param else const(w)
    y = fb.emit("nn.conv2d", x, weight, **attrs)
    if epilogue:
        y = fb.emit("nn.relu", fb.emit("add", y, const(np.linspace(-1, 1, w.shape[0], dtype=np.float32).reshape(-1, 1, 1))))
    return Module([fb.ret(y)])


def random_case(seed: int):
    """A convolution at random: window 1-5 (or a patch embedding's, stride = window), stride 1-3,
    dilation 1-2, padding 0-2 on each side, channel counts not multiples of a vector."""
    rng = np.random.default_rng(seed)
    if seed % 5 == 0:  # a patch embedding: no overlap, no padding
        k = int(rng.integers(2, 5))
        attrs = dict(strides=[k, k])
        kh = kw = k
    else:
        kh, kw = (int(v) for v in rng.integers(1, 6, 2))
        attrs = dict(strides=[int(v) for v in rng.integers(1, 4, 2)], dilation=[int(v) for v in rng.integers(1, 3, 2)],
                     padding=[int(v) for v in rng.integers(0, 3, 4)])
    n, c, o = int(rng.integers(1, 4)), int(rng.integers(1, 20)), int(rng.integers(1, 40))
    h, w = (int(v) + 12 for v in rng.integers(0, 20, 2))
    weights = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    return x, weights, attrs


def expected(x, w, attrs):
    return dpl.interpret(conv_module(x.shape, w, attrs), x)


@pytest.mark.parametrize("seed", range(24))
def test_random_convolutions_equal_the_interpreter(routine, seed):
    x, w, attrs = random_case(seed)
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    assert conv_direct.takes(call)
    want = expected(x, w, attrs)
    out = np.full(want.shape, np.nan, np.float32)
    conv_direct.runner(call, routine, threads=1 + seed % 2)(x, w, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 3, 224, 224), (2, 16, 56, 56), (1, 64, 7, 7)], ids=["stem", "3x3", "1x1"])
def test_model_shapes_equal_the_interpreter(routine, shape):
    """ResNet's stem (7x7, stride 2), a 3x3 stage conv at two images, a 1x1 read in place."""
    rng = np.random.default_rng(1)
    window, attrs = {"stem": (7, dict(strides=[2, 2], padding=[3, 3, 3, 3])), "3x3": (3, dict(padding=[1, 1, 1, 1])),
                     "1x1": (1, {})}[{224: "stem", 56: "3x3", 7: "1x1"}[shape[2]]]
    w = rng.standard_normal((37, shape[1], window, window)).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    out = np.empty(expected(x, w, attrs).shape, np.float32)
    conv_direct.runner(call, routine)(x, w, out)
    np.testing.assert_allclose(out, expected(x, w, attrs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, attrs", [
    ((2, 16, 12, 12), {}),  # a 1x1 read as it lies (more pixels than a tile)
    ((1, 8, 3, 5), {}),  # a 1x1 with fewer pixels than a tile: prepared, whole vectors inside the slack
    ((1, 16, 20, 21), dict(strides=[2, 2])),  # a 1x1 at stride 2: one phase of four prepared
    ((1, 4, 9, 40), dict(strides=[1, 3], dilation=[2, 1])),  # phases some taps skip
], ids=["in place", "tiny", "strided", "dilated"])
def test_pointwise_and_phase_geometries(routine, shape, attrs):
    rng = np.random.default_rng(6)
    k = 1 if "dilation" not in attrs else 3
    w = rng.standard_normal((19, shape[1], k, k)).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    out = np.full(expected(x, w, attrs).shape, np.nan, np.float32)
    conv_direct.runner(call, routine, threads=2)(x, w, out)
    np.testing.assert_allclose(out, expected(x, w, attrs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", [None, "nn.relu", "nn.gelu"])
def test_the_epilogue_rounds_as_the_separate_ops(routine, act):
    """Plus a bias per channel, plus a residual, then the activation, each on the stored sum:
    bit for bit the convolution's result followed by NumPy's adds and the op's own C."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 11, 13)).astype(np.float32)
    w = rng.standard_normal((9, 5, 3, 3)).astype(np.float32)
    attrs = dict(padding=[1, 1, 1, 1])
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    bias = rng.standard_normal(9).astype(np.float32)
    res = rng.standard_normal((2, 9, 11, 13)).astype(np.float32)
    plain = np.empty_like(res)
    conv_direct.runner(call, routine)(x, w, plain)
    folded = np.empty_like(res)
    conv_direct.runner(call, routine, bias=bias, residual=True, act=act)(x, w, res, folded)
    want = (plain + bias.reshape(-1, 1, 1)) + res
    if act == "nn.relu":
        want = np.maximum(want, 0)
    if act == "nn.gelu":
        np.testing.assert_allclose(folded, get_op(act).ref(want), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(folded, want)


def test_what_it_takes():
    w = np.ones((4, 3, 3, 3), np.float32)
    assert conv_direct.takes(conv_module((1, 3, 8, 8), w, {})["main"].bindings[0].value)
    assert conv_direct.takes(conv_module((1, 3, 8, 8), w, {}, weight_param=True)["main"].bindings[0].value)
    grouped = conv_module((1, 6, 8, 8), np.ones((4, 3, 3, 3), np.float32), dict(groups=2))["main"].bindings[0].value
    assert not conv_direct.takes(grouped)
    fb = FunctionBuilder("main")
    y = fb.emit("nn.conv2d", fb.param("x", "f64", (1, 3, 8, 8)), const(w.astype(np.float64)))
    assert not conv_direct.takes(Module([fb.ret(y)])["main"].bindings[0].value)


def symbolic_module(w, attrs):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", w.shape[1], "h", "w"))
    y = fb.emit("nn.relu", fb.emit("nn.conv2d", x, const(w), **attrs))
    return Module([fb.ret(y)])


def test_through_the_backend_at_two_sizes_of_symbolic_dims(tmp_path):
    """convolutions="direct": one build, called at two batch and image sizes (and back), equals the
    interpreter at each, its convolution by the direct routine."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    rng = np.random.default_rng(3)
    w = rng.standard_normal((10, 6, 3, 3)).astype(np.float32)
    mod = symbolic_module(w, dict(strides=[2, 2], padding=[1, 0, 1, 2]))
    cpu = CpuBackend(cache_dir=tmp_path, products="dpl", convolutions="direct")
    exe = dpl.build(dpl.apply(mod), [cpu, "numpy"], config=FUSE_ALL)
    for shape in [(1, 6, 17, 23), (3, 6, 30, 12), (1, 6, 17, 23)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(exe(x), dpl.interpret(mod, x), rtol=1e-4, atol=1e-4)
    assert cpu._direct_conv  # the convolution went to the direct routine


STEP_OPS = [("add", False), ("subtract", False), ("subtract", True), ("multiply", False), ("divide", False), ("divide", True)]


@pytest.mark.parametrize("shape, window, attrs", [
    ((1, 3, 40, 44), 7, dict(strides=[2, 2], padding=[3, 3, 3, 3])),  # a stem: output rows walked one by one
    ((2, 5, 14, 14), 3, dict(padding=[1, 1, 1, 1])),  # a 3x3: the flat walk
], ids=["rows", "flat"])
@pytest.mark.parametrize("act", [None, "nn.relu", "nn.gelu"])
@pytest.mark.parametrize("residual", [False, True])
def test_per_channel_steps_round_as_the_separate_ops(routine, shape, window, attrs, act, residual):
    """Every per-channel step (both operand orders of subtract and divide), then a residual, then
    the activation, on the tiles' registers or the stored rows: bit for bit the convolution
    followed by NumPy's float32 ops in order (relu by the kernels' own rule), in either walk."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    o = 13
    w = rng.standard_normal((o, shape[1], window, window)).astype(np.float32)
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    plain = np.empty(expected(x, w, attrs).shape, np.float32)
    conv_direct.runner(call, routine)(x, w, plain)
    steps, want = [], plain.copy()
    for op, first in STEP_OPS:
        values = rng.uniform(0.5, 1.5, o).astype(np.float32) * np.where(rng.random(o) < 0.5, -1, 1).astype(np.float32)
        steps.append((conv_direct.step_code(op, first), values))
        c = values.reshape(-1, 1, 1)
        want = getattr(np, op)(c, want) if first else getattr(np, op)(want, c)
    res = rng.standard_normal(plain.shape).astype(np.float32)
    if residual:
        want = want + res
    got = np.full_like(plain, np.nan)
    run = conv_direct.runner(call, routine, steps=tuple(steps), residual=residual, act=act)
    run(x, w, *([res] if residual else []), got)
    if act == "nn.gelu":
        np.testing.assert_allclose(got, get_op(act).ref(want), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, np.where(want <= 0, np.float32(0), want) if act else want)


def test_step_codes():
    assert conv_direct.step_code("add", True) == conv_direct.step_code("add", False)
    assert conv_direct.step_code("subtract", True) != conv_direct.step_code("subtract", False)
    assert conv_direct.step_code("power", False) is None


def test_which_convolutions_it_wins():
    """By measurement: windows at stride 1 and the few-channel stem; not 1x1s, strided windows
    over many channels or patch embeddings."""
    def call(c, k, stride):
        w = np.ones((8, c, k, k), np.float32)
        return conv_module((1, c, 32, 32), w, dict(strides=[stride, stride]))["main"].bindings[0].value

    assert conv_direct.wins(call(16, 3, 1)) and conv_direct.wins(call(3, 7, 2))
    assert not conv_direct.wins(call(64, 1, 1)) and not conv_direct.wins(call(32, 3, 2)) and not conv_direct.wins(call(3, 4, 4))


def test_an_inference_batchnorm_folds_into_the_convolution(tmp_path):
    """A conv, a BatchNorm as inference computes it (subtract, multiply, multiply, add, one value
    per channel), a residual and a ReLU, claimed by the shipped `cnn` library (its constants kept):
    through the backend the direct convolution applies all of it as it stores, equal to the
    interpreter; the default ("auto") takes this 3x3."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    rng = np.random.default_rng(5)
    o = 11
    w = rng.standard_normal((o, 6, 3, 3)).astype(np.float32)
    per = [rng.uniform(0.5, 1.5, (o, 1, 1)).astype(np.float32) for _ in range(4)]
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 6, 15, 17))
    r = fb.param("r", "f32", (2, o, 15, 17))
    y = fb.emit("nn.conv2d", x, const(w), padding=[1, 1])
    y = fb.emit("add", fb.emit("multiply", fb.emit("multiply", fb.emit("subtract", y, const(per[0])), const(per[1])),
                               const(per[2])), const(per[3]))
    mod = Module([fb.ret(fb.emit("nn.relu", fb.emit("add", y, r)))])
    cpu = CpuBackend(cache_dir=tmp_path)
    exe = dpl.build(dpl.apply(mod, ["cnn"]), [cpu, "numpy"], config=FUSE_ALL)
    xs, rs = rng.standard_normal((2, 6, 15, 17)).astype(np.float32), rng.standard_normal((2, o, 15, 17)).astype(np.float32)
    np.testing.assert_allclose(exe(xs, rs), dpl.interpret(mod, xs, rs), rtol=1e-5, atol=1e-5)
    (kernel,) = [step.kernel for step in exe.plan(xs, rs).steps]
    names = [fn.__qualname__ for fn in kernel.products]
    assert names == ["cpu:direct-conv 11x6x3x3 subtract multiply multiply add + residual, nn.relu"], names
    assert not kernel.parts  # nothing left for generated C


def test_a_step_after_a_view_is_not_taken_per_channel(tmp_path):
    """conv [1, 8, 4, 4] viewed as [8, 4, 4], plus a constant [4, 1]: its second axis is the rows,
    not the channels, so the add stays after the convolution; the numbers are the interpreter's."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    rng = np.random.default_rng(7)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 3, 4, 4))
    y = fb.emit("nn.conv2d", x, const(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)), padding=[1, 1])
    v = fb.emit("reshape", y, shape=[8, 4, 4])
    mod = Module([fb.ret(fb.emit("nn.relu", fb.emit("add", v, const(rng.standard_normal((4, 1)).astype(np.float32)))))])
    block = dpl.lang.parse_patterns("codegen kernel\npattern block { out = nn.relu(add(reshape(nn.conv2d(x, w)), k)) }")
    exe = dpl.build(dpl.apply(mod, block), [CpuBackend(cache_dir=tmp_path, convolutions="direct"), "numpy"], config=FUSE_ALL)
    xs = rng.standard_normal((1, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(exe(xs), dpl.interpret(mod, xs), rtol=1e-5, atol=1e-5)
    (kernel,) = [step.kernel for step in exe.plan(xs).steps]
    assert [fn.__qualname__ for fn in kernel.products] == ["cpu:direct-conv 8x3x3x3"]  # constant weights, no step
