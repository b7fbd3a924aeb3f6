"""dpl's channels-last convolution (backends/cpu/conv_lanes.py): random float32 NHWC convolutions
of every stride, padding, dilation and window, channel counts that fill no vector and several,
batches, equal the interpreter on this CPU's build and on an AVX2-only one (``march="haswell"``);
1x1s read in place (the last tile overlapping the one before it) and prepared; its epilogue rounds
as the separate ops do; through the backend after the convert-layout pass, a BatchNorm folded."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu import conv_direct, conv_lanes
from dpl.ir import FunctionBuilder, Module
from dpl.ir.builder import const
from dpl.ops.registry import get_op

FUSE_ALL = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, max_graph_size=1000, fallback_on_error=False)
STEP_OPS = [("add", False), ("subtract", False), ("subtract", True), ("multiply", False), ("divide", False), ("divide", True)]


@pytest.fixture(scope="module", params=["native", "haswell"])
def routine(request, tmp_path_factory):
    """The routine on this CPU's instruction sets, and built for AVX2 and FMA alone."""
    from dpl.backends.cpu.toolchain import KernelCache

    needs.c_compiler()
    cache = KernelCache(tmp_path_factory.mktemp(request.param), march=request.param)
    return conv_lanes.Routine(cache.load(conv_lanes.SOURCE))


def conv_module(x_shape, w, attrs):
    """``y = conv2d(x, w)``, NHWC data and OHWI weights (a constant)."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", x_shape)
    return Module([fb.ret(fb.emit("nn.conv2d", x, const(w), data_layout="NHWC", kernel_layout="OHWI", **attrs))])


def the_call(x, w, attrs):
    call = conv_module(x.shape, w, attrs)["main"].bindings[0].value
    assert conv_lanes.takes(call)
    return call


def expected(x, w, attrs):
    return dpl.interpret(conv_module(x.shape, w, attrs), x)


def random_case(seed: int):
    """A convolution at random: window 1-5, stride 1-3, dilation 1-2, padding 0-2 on each side,
    1-80 output channels (one to five vectors, the last in part), 1-20 input channels."""
    rng = np.random.default_rng(seed)
    kh, kw = (int(v) for v in rng.integers(1, 6, 2))
    attrs = dict(strides=[int(v) for v in rng.integers(1, 4, 2)], dilation=[int(v) for v in rng.integers(1, 3, 2)],
                 padding=[int(v) for v in rng.integers(0, 3, 4)])
    n, c, o = int(rng.integers(1, 4)), int(rng.integers(1, 21)), int(rng.integers(1, 81))
    h, w = (int(v) + 12 for v in rng.integers(0, 20, 2))
    return rng.standard_normal((n, h, w, c)).astype(np.float32), rng.standard_normal((o, kh, kw, c)).astype(np.float32), attrs


@pytest.mark.parametrize("seed", range(24))
def test_random_convolutions_equal_the_interpreter(routine, seed):
    x, w, attrs = random_case(seed)
    want = expected(x, w, attrs)
    out = np.full(want.shape, np.nan, np.float32)
    conv_lanes.runner(the_call(x, w, attrs), routine, threads=1 + seed % 2)(x, w, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, o, window, attrs", [
    ((1, 224, 224, 3), 64, 7, dict(strides=[2, 2], padding=[3, 3, 3, 3])),  # ResNet's stem: four vectors a tile
    ((2, 56, 56, 16), 16, 3, dict(padding=[1, 1, 1, 1])),  # one vector a tile
    ((1, 28, 28, 32), 128, 1, {}),  # a 1x1 read in place, two blocks of four vectors
    ((1, 56, 56, 64), 128, 1, dict(strides=[2, 2])),  # a 1x1 at stride 2: one phase of four prepared
    ((2, 3, 5, 8), 48, 1, {}),  # a 1x1 of fewer pixels than a tile: prepared, read inside the slack
    ((1, 13, 1, 8), 32, 1, {}),  # a 1x1 in place, its last tile overlapping the one before
    ((2, 9, 10, 128), 272, 3, dict(padding=[1, 1, 1, 1])),  # 1.3 MB of weights: a block at a time over the tiles
], ids=["stem", "3x3", "1x1", "1x1-strided", "1x1-tiny", "1x1-overlap", "large-weights"])
def test_model_shapes_and_geometries(routine, shape, o, window, attrs):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((o, window, window, shape[3])).astype(np.float32)
    want = expected(x, w, attrs)
    for threads in (1, 2):
        out = np.full(want.shape, np.nan, np.float32)
        conv_lanes.runner(the_call(x, w, attrs), routine, threads=threads)(x, w, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("o, shape, window, attrs", [
    (13, (2, 14, 14, 5), 3, dict(padding=[1, 1, 1, 1])),  # one part-filled vector, prepared
    (40, (1, 9, 11, 6), 1, {}),  # a 1x1 in place, the last vector in part
    (64, (1, 20, 22, 3), 5, dict(strides=[2, 2], padding=[2, 2, 2, 2])),  # four whole vectors, two phases a dim
], ids=["part", "in-place", "strided"])
@pytest.mark.parametrize("act", [None, "nn.relu", "nn.gelu"])
@pytest.mark.parametrize("residual", [False, True])
def test_per_channel_steps_round_as_the_separate_ops(routine, o, shape, window, attrs, act, residual):
    """Every per-channel step (both operand orders of subtract and divide), then a residual, then
    the activation: bit for bit the convolution followed by NumPy's float32 ops in order (relu
    by the kernels' own rule: +0 for -0)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((o, window, window, shape[3])).astype(np.float32)
    call = the_call(x, w, attrs)
    plain = np.empty(expected(x, w, attrs).shape, np.float32)
    conv_lanes.runner(call, routine)(x, w, plain)
    steps, want = [], plain.copy()
    for op, first in STEP_OPS:
        values = rng.uniform(0.5, 1.5, o).astype(np.float32) * np.where(rng.random(o) < 0.5, -1, 1).astype(np.float32)
        steps.append((conv_direct.step_code(op, first), values))
        want = getattr(np, op)(values, want) if first else getattr(np, op)(want, values)
    res = rng.standard_normal(plain.shape).astype(np.float32)
    if residual:
        want = want + res
    got = np.full_like(plain, np.nan)
    conv_lanes.runner(call, routine, threads=2, steps=tuple(steps), residual=residual, act=act)(x, w, *([res] if residual else []), got)
    if act == "nn.gelu":
        np.testing.assert_allclose(got, get_op(act).ref(want), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, np.where(want <= 0, np.float32(0), want) if act else want)


def pool_call(shape, **attrs):
    """An NHWC max pool of an array of ``shape``."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", shape)
    return Module([fb.ret(fb.emit("nn.max_pool2d", x, layout="NHWC", **attrs))])


def random_pool(seed: int):
    """A pool at random: window 1-4, stride 1-3, dilation 1-2, padding up to half the window on
    each side, ceil mode or not."""
    rng = np.random.default_rng(100 + seed)
    k = [int(v) for v in rng.integers(1, 5, 2)]
    return dict(pool_size=k, strides=[int(v) for v in rng.integers(1, 4, 2)], dilation=[int(v) for v in rng.integers(1, 3, 2)],
                padding=[int(rng.integers(0, k[i % 2] // 2 + 1)) for i in range(4)], ceil_mode=bool(rng.integers(0, 2)))


@pytest.mark.parametrize("seed", range(16))
def test_pooled_convolutions_equal_the_convolution_then_the_pool(routine, seed):
    """A max pool folded into the convolution (its rows pooled as they are computed, a thread's
    run of pooled rows reusing the rows the last one read): the interpreter's pool of the
    interpreter's convolution, at random geometries of both, one and two threads, with an
    activation applied in registers (ReLU) and on the stored rows (GELU); the pool's windows the
    rows' edges and padding cut short included."""
    x, w, attrs = random_case(seed)
    conv = expected(x, w, attrs)
    pool = pool_call(conv.shape, **random_pool(seed))
    act = (None, "nn.relu", "nn.gelu")[seed % 3]
    if act is not None:
        conv = get_op(act).ref(conv)
    want = dpl.interpret(pool, conv)
    out = np.full(want.shape, np.nan, np.float32)
    conv_lanes.runner(the_call(x, w, attrs), routine, threads=1 + seed % 2, act=act, pool=pool["main"].bindings[0].value)(x, w, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_pooled_stem_and_its_nan(routine):
    """ResNet's stem (7x7 / 2, BatchNorm, ReLU) and its 3x3 / 2 pool, 64 channels, at one and two
    threads; a NaN in the image reaches exactly the pooled outputs whose windows hold a
    convolution output it reached (the pool's rule: a NaN in a window makes it NaN)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64, 60, 3)).astype(np.float32)
    w = rng.standard_normal((64, 7, 7, 3)).astype(np.float32)
    attrs = dict(strides=[2, 2], padding=[3, 3, 3, 3])
    pool = pool_call(expected(x, w, attrs).shape, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
    x[0, 20, 31, 1] = np.nan
    want = dpl.interpret(pool, get_op("nn.relu").ref(expected(x, w, attrs)))
    assert 0 < np.isnan(want).sum() < want.size // 4
    for threads in (1, 2):
        out = np.full(want.shape, -1.0, np.float32)
        conv_lanes.runner(the_call(x, w, attrs), routine, threads=threads, act="nn.relu", pool=pool["main"].bindings[0].value)(x, w, out)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_pooled_convolution_refuses_a_residual(routine):
    """The pool reads the convolution's rows before any other array could be added to them: the
    runner says so rather than computing something else."""
    x, w, attrs = random_case(0)
    pool = pool_call(expected(x, w, attrs).shape, pool_size=[2, 2], strides=[2, 2])
    with pytest.raises(ValueError, match="takes no residual"):
        conv_lanes.runner(the_call(x, w, attrs), routine, residual=True, pool=pool["main"].bindings[0].value)


def test_tile_widths():
    """The most channel vectors a tile (up to the widest) that divide the output's: no padded
    vector but the last one's lanes."""
    assert [conv_lanes.tile_width(o, 16, 4) for o in (3, 16, 17, 48, 64, 80, 96, 128, 112)] == [1, 1, 2, 3, 4, 1, 3, 4, 1]
    assert [conv_lanes.tile_width(o, 8, 2) for o in (8, 24, 64)] == [1, 1, 2]


def test_what_it_takes():
    w = np.ones((8, 3, 3, 4), np.float32)
    assert conv_lanes.takes(conv_module((1, 9, 9, 4), w, {})["main"].bindings[0].value)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 4, 9, 9))
    nchw = fb.emit("nn.conv2d", x, const(np.ones((8, 4, 3, 3), np.float32)))
    assert not conv_lanes.takes(Module([fb.ret(nchw)])["main"].bindings[0].value)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 9, 9, 4))
    grouped = fb.emit("nn.conv2d", x, const(np.ones((8, 3, 3, 2), np.float32)), data_layout="NHWC", kernel_layout="OHWI", groups=2)
    assert not conv_lanes.takes(Module([fb.ret(grouped)])["main"].bindings[0].value)


def test_a_resnet_block_after_convert_layout(tmp_path):
    """A stem (conv, inference BatchNorm, ReLU, max pool) and a bottleneck with its residual,
    through convert-layout and the backend at one and two threads: every convolution by this
    routine with its BatchNorm, residual and ReLU folded, the stem's pool too, the numbers the
    interpreter's."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    rng = np.random.default_rng(5)

    def bn(fb, y, o):
        per = [rng.uniform(0.5, 1.5, (o, 1, 1)).astype(np.float32) for _ in range(4)]
        return fb.emit("add", fb.emit("multiply", fb.emit("multiply", fb.emit("subtract", y, const(per[0])), const(per[1])),
                                      const(per[2])), const(per[3]))

    def weight(*shape):
        return const((rng.standard_normal(shape) * 0.2).astype(np.float32))

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 3, 40, 36))
    y = fb.emit("nn.relu", bn(fb, fb.emit("nn.conv2d", x, weight(32, 3, 7, 7), strides=[2, 2], padding=[3, 3]), 32))
    y = fb.emit("nn.max_pool2d", y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])
    z = fb.emit("nn.relu", bn(fb, fb.emit("nn.conv2d", y, weight(16, 32, 1, 1)), 16))
    z = fb.emit("nn.relu", bn(fb, fb.emit("nn.conv2d", z, weight(16, 16, 3, 3), padding=[1, 1]), 16))
    z = bn(fb, fb.emit("nn.conv2d", z, weight(32, 16, 1, 1)), 32)
    mod = Module([fb.ret(fb.emit("nn.relu", fb.emit("add", z, y)))])
    xs = rng.standard_normal((2, 3, 40, 36)).astype(np.float32)
    want = dpl.interpret(mod, xs)
    fused = dpl.apply(mod, ["cnn"], convert_layout=True)
    for threads in (1, 2):
        exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path), "numpy"], config=FUSE_ALL, threads=threads)
        np.testing.assert_allclose(exe(xs), want, rtol=1e-4, atol=1e-4)
        names = [fn.__qualname__ for step in exe.plan(xs).steps for fn in getattr(step.kernel, "products", ())]
        convs = [n for n in names if "conv" in n]
        assert convs == ["cpu:lanes-conv 32x7x7x3 subtract multiply multiply add, nn.relu, max pool 3x3",
                         "cpu:lanes-conv 16x1x1x32 subtract multiply multiply add, nn.relu",
                         "cpu:lanes-conv 16x3x3x16 subtract multiply multiply add, nn.relu",
                         "cpu:lanes-conv 32x1x1x16 subtract multiply multiply add + residual, nn.relu"], names
