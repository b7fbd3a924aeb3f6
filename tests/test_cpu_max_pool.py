"""backends/cpu/max_pool.py: the CPU's max pool routine equals the interpreter for every window,
stride, padding (symmetric or not), dilation and size the op allows, NCHW and NHWC, float32 and
float64, with NaN and infinities in the input; and a ResNet stem runs it."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import needs

import dpl
from dpl.backends.cpu import max_pool


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), products="numpy")


def pool_module(shape, dtype, attrs):
    from dpl.ir import FunctionBuilder, Module

    fb = FunctionBuilder("main")
    x = fb.param("x", dtype, list(shape))
    return Module([fb.ret(fb.emit("nn.max_pool2d", x, **attrs))])


@st.composite
def cases(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, (kh - 1) * dh // 2 + 1)), draw(st.integers(0, (kw - 1) * dw // 2 + 1))]
    pads += [draw(st.integers(0, pads[0])), draw(st.integers(0, pads[1]))]
    h = draw(st.integers((kh - 1) * dh + 1, 19))
    w = draw(st.integers((kw - 1) * dw + 1, 40))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3) if layout == "NCHW" else st.integers(1, 20))
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    dtype = draw(st.sampled_from(["float32", "float64"]))
    special = draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([np.nan, np.inf, -np.inf])), max_size=3))
    attrs = dict(pool_size=[kh, kw], strides=[sh, sw], dilation=[dh, dw], padding=pads, ceil_mode=draw(st.booleans()), layout=layout)
    return shape, dtype, attrs, special, draw(st.integers(0, 2**31))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_the_routine_equals_the_interpreter(backend, case):
    shape, dtype, attrs, special, seed = case
    mod = pool_module(shape, dtype, attrs)
    call = mod["main"].bindings[0].value
    assert max_pool.takes(call)
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    for where, value in special:
        x.flat[where % x.size] = value
    want = dpl.interpret(mod, x)
    run = max_pool.runner(call, backend.cache.load(max_pool.source(dtype)))
    got = np.full(want.shape, 7.0, dtype)
    run(x, got)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_without_its_row_buffer_the_routine_still_equals_the_interpreter(backend, case):
    """Where the column maxima's buffer cannot be had (malloc returns NULL, forced here), the
    window goes across each input row instead: the same numbers."""
    shape, dtype, attrs, special, seed = case
    mod = pool_module(shape, dtype, attrs)
    call = mod["main"].bindings[0].value
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    for where, value in special:
        x.flat[where % x.size] = value
    source = max_pool.source(dtype).replace("#include <math.h>\n", "#include <math.h>\n#define malloc(n) ((void *)0)\n", 1)
    assert "#define malloc" in source
    got = np.full(dpl.interpret(mod, x).shape, 7.0, dtype)
    max_pool.runner(call, backend.cache.load(source))(x, got)
    np.testing.assert_array_equal(got, dpl.interpret(mod, x))


def test_it_takes_float_max_pools_only():
    from dpl.ir import FunctionBuilder

    fb = FunctionBuilder("main")
    x = fb.param("x", "int32", [1, 2, 6, 6])
    assert not max_pool.takes(fb.emit("nn.max_pool2d", x, pool_size=[2, 2]))
    z = fb.param("z", "float32", [1, 2, 6, 6])
    assert not max_pool.takes(fb.emit("nn.avg_pool2d", z, pool_size=[2, 2]))


def test_a_resnet_stem_runs_the_routine_at_one_and_two_threads(backend):
    """conv -> batch norm -> relu -> 3x3/2 pool, as cnn's stem composite and as FuseOps' group,
    equal to the interpreter whichever thread count the plan's choice takes."""
    mod = dpl.parse("""
func main(x: f32[2, 3, 30, 30], w: f32[8, 3, 7, 7], m: f32[1, 8, 1, 1], s: f32[1, 8, 1, 1]) -> f32[2, 8, 8, 8] {
  c = nn.conv2d(x, w, strides=[2, 2], padding=[3, 3])
  d = subtract(c, m)
  e = multiply(d, s)
  r = nn.relu(e)
  p = nn.max_pool2d(r, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])
  return p
}""")
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) for p in mod["main"].params]
    args[0][0, 1, 4, 4] = np.nan
    want = dpl.interpret(mod, *args)
    for libraries in (["cnn"], []):
        exe = dpl.build(dpl.apply(mod, libraries), [backend, "numpy"], threads=2)
        plan = exe.plan(*args)
        assert any(getattr(s.kernel, "__qualname__", "").startswith("cpu-blas+c:") for s in plan.steps)
        for _ in range(4):
            np.testing.assert_allclose(exe(*args), want, rtol=1e-4, atol=1e-4)
        assert np.isnan(exe(*args)[0, :, 0:3, 0:3]).any()
