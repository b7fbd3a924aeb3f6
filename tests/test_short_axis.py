"""dpl/kernel/short_axis.py: a short outer axis read interleaved is unrolled into the innermost
loop, the same numbers (the NumPy evaluator and the compiled C against the interpreter), and
nests it must not change are left as they are. Also: ``where`` reads both sides before it
selects, so that a strided side vectorises."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cpu.backend import CpuBackend
from dpl.kernel.evaluate import evaluate
from dpl.kernel.ir import Let, Loop, Store, walk
from dpl.kernel.lower import lower_function
from dpl.kernel.short_axis import MAX_UNROLL, unroll_short_axes

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def position_bias(s: int, h: int, dtype: str = "f32", masked: bool = True, axes=(2, 0, 1)):
    """T5's position bias: a [s, s, h] table turned to [h, s, s], masked by key."""
    shape = [[s, s, h][a] for a in axes]
    out = f"{dtype}[{', '.join(map(str, shape))}]"
    if masked:
        body = f"""  p = permute_dims(t, axes={list(axes)})
  y = where(m, p, f)
  return y"""
    else:
        body = f"""  p = permute_dims(t, axes={list(axes)})
  y = add(p, p)
  return y"""
    return dpl.parse(f"""
func main(t: {dtype}[{s}, {s}, {h}], m: bool[1, {s}], f: {dtype}[]) -> {out} {{
{body}
}}""")


def loops(kernel):
    return [s for s in walk(kernel.body) if isinstance(s, Loop)]


def turned_alike(kernel, *args):
    """``kernel`` with its short axes unrolled, after checking that the evaluator computes the
    same from ``args`` both ways."""
    turned = unroll_short_axes(kernel)
    np.testing.assert_array_equal(evaluate(turned, *args), evaluate(kernel, *args))
    return turned


def inputs(s: int, h: int, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    t = (rng.standard_normal((s, s, h)) * 8).astype(dtype)
    m = rng.random((1, s)) < 0.6
    return t, m, np.asarray(-1000, dtype)


def test_the_heads_loop_is_unrolled_into_the_key_loop_and_computes_the_same():
    kernel = lower_function(position_bias(64, 4)["main"])
    assert [int(x.extent.value) for x in loops(kernel)] == [4, 64, 64]
    turned = unroll_short_axes(kernel)
    assert [int(x.extent.value) for x in loops(turned)] == [64, 64]
    stores = [x for x in walk(turned.body) if isinstance(x, Store)]
    assert len(stores) == 4  # one per head, each contiguous in the keys
    args = inputs(64, 4)
    np.testing.assert_array_equal(evaluate(turned, *args), evaluate(kernel, *args))
    source = emit_kernel(kernel)
    assert "< 4;" not in source and source.count("v_y[") == 4


@pytest.mark.parametrize("h", [1, MAX_UNROLL + 1])
def test_an_axis_of_one_or_too_long_to_unroll_is_left(h):
    kernel = lower_function(position_bias(32, h)["main"])
    assert unroll_short_axes(kernel) is kernel


def test_a_short_axis_below_an_outer_loop_is_unrolled_too():
    # [s, s, h] -> [s, h, s]: the heads are the middle loop, the rows' loop stays above them
    kernel = lower_function(position_bias(32, 4, axes=(0, 2, 1))["main"])
    turned = unroll_short_axes(kernel)
    assert [int(x.extent.value) for x in loops(kernel)] == [32, 4, 32]
    assert [int(x.extent.value) for x in loops(turned)] == [32, 32]
    args = inputs(32, 4)
    np.testing.assert_array_equal(evaluate(turned, *args), evaluate(kernel, *args))
    # a batch of tables, [b, s, s, h] -> [b, h, s, s]
    batched = dpl.parse("""
func main(t: f32[2, 16, 16, 3]) -> f32[2, 3, 16, 16] {
  p = permute_dims(t, axes=[0, 3, 1, 2])
  y = add(p, p)
  return y
}""")
    t = np.random.default_rng(5).standard_normal((2, 16, 16, 3)).astype(np.float32)
    assert [int(x.extent.value) for x in loops(turned_alike(lower_function(batched["main"]), t))] == [2, 16, 16]


@pytest.mark.parametrize("shape", ["4, 64", "64, 3"])
def test_a_nest_that_reads_no_side_interleaved_is_left(shape):
    # a plain elementwise nest: its reads are contiguous already, in the short innermost loop too
    plain = lower_function(dpl.parse(f"""
func main(x: f32[{shape}]) -> f32[{shape}] {{
  y = add(x, x)
  return y
}}""")["main"])
    assert unroll_short_axes(plain) is plain


def test_where_reads_both_sides_before_it_selects():
    kernel = lower_function(position_bias(16, 4)["main"])
    lets = [x.name for x in walk(kernel.body) if isinstance(x, Let)]
    assert "where_a" in lets  # the table's element, read whether or not the key is masked
    args = inputs(16, 4)
    np.testing.assert_array_equal(evaluate(kernel, *args), np.asarray(dpl.interpret(position_bias(16, 4), *args)))


@st.composite
def biases(draw):
    s = draw(st.integers(1, 40))
    h = draw(st.sampled_from([2, 3, 4, 8, 12, 15, 16, 17]))
    dtype = draw(st.sampled_from(["f32", "f64", "i32", "f16"]))
    return s, h, dtype, draw(st.booleans()), draw(st.sampled_from([(2, 0, 1), (0, 2, 1)]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=biases())
def test_compiled_position_biases_equal_the_interpreter(tmp_path_factory, case):
    """Random tables turned (the heads outermost or in the middle) and masked, in every float
    and int width, unrolled or not: the compiled kernel equals the interpreter bit for bit."""
    needs.c_compiler()
    s, h, dtype, masked, axes = case
    mod = position_bias(s, h, dtype, masked, axes)
    fused = dpl.fuse_ops(mod, ALWAYS)
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"], config=ALWAYS)
    args = inputs(s, h, dpl.dtypes.to_numpy(mod["main"].params[0].ty.dtype), seed=s * 100 + h)
    np.testing.assert_array_equal(np.asarray(exe(*args)), np.asarray(dpl.interpret(mod, *args)))
    assert not exe.fallbacks


def channels_last(shape, dtype: str = "f32"):
    """An image sent to channels last, ``[n, c, h, w] -> [n, h, w, c]``, then added to itself."""
    n, c, h, w = shape
    return dpl.parse(f"""
func main(x: {dtype}[{n}, {c}, {h}, {w}]) -> {dtype}[{n}, {h}, {w}, {c}] {{
  p = permute_dims(x, axes=[0, 2, 3, 1])
  y = add(p, p)
  return y
}}""")


def test_a_short_innermost_axis_that_stores_interleaved_is_unrolled_into_the_loop_above():
    """ResNet's input, three channels: the channel loop unrolled into the columns' loop, which
    reads each plane contiguously and stores the three channels of a pixel side by side."""
    kernel = lower_function(channels_last((1, 3, 24, 40))["main"])
    assert [int(x.extent.value) for x in loops(kernel)][-2:] == [40, 3]
    turned = turned_alike(kernel, np.random.default_rng(3).standard_normal((1, 3, 24, 40)).astype(np.float32))
    assert [int(x.extent.value) for x in loops(turned)][-1] == 40
    assert len([x for x in walk(turned.body) if isinstance(x, Store)]) == 3
    assert "< 3;" not in emit_kernel(kernel)
    # two axes: [c, w] -> [w, c]
    pair = lower_function(dpl.parse("""
func main(x: f32[5, 64]) -> f32[64, 5] {
  p = permute_dims(x, axes=[1, 0])
  y = add(p, p)
  return y
}""")["main"])
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    assert [int(x.extent.value) for x in loops(turned_alike(pair, x))] == [64]


@st.composite
def images(draw):
    c = draw(st.sampled_from([2, 3, 4, 5, 8, 15, 16, 17]))
    return (draw(st.integers(1, 2)), c, draw(st.integers(1, 9)), draw(st.integers(1, 70))), draw(st.sampled_from(["f32", "f64", "i32", "f16"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=images())
def test_compiled_channels_last_permutes_equal_the_interpreter(tmp_path_factory, case):
    """Random images sent to channels last, few channels or many, in every float and int width:
    the compiled kernel equals the interpreter bit for bit."""
    needs.c_compiler()
    shape, dtype = case
    mod = channels_last(shape, dtype)
    fused = dpl.fuse_ops(mod, ALWAYS)
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"], config=ALWAYS)
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 8).astype(dpl.dtypes.to_numpy(mod["main"].params[0].ty.dtype))
    np.testing.assert_array_equal(np.asarray(exe(x)), np.asarray(dpl.interpret(mod, x)))
