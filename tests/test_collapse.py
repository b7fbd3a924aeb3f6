"""dpl/kernel/collapse.py: a channels-last map sent back to NCHW becomes a transpose of two axes
that the emitter turns in tiles, the same numbers (the compiled C against NumPy's transpose, for
random permutes in every width); nests it must not change are left as they are."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cpu.backend import CpuBackend
from dpl.kernel.collapse import collapse_transposes
from dpl.kernel.ir import Loop, walk
from dpl.kernel.lower import lower_function

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def permuted(shape, axes, dtype="f32"):
    """``permute_dims(x, axes)`` and an add of it to itself (so that it is a kernel)."""
    out = [shape[a] for a in axes]
    return dpl.parse(f"""
func main(x: {dtype}[{', '.join(map(str, shape))}]) -> {dtype}[{', '.join(map(str, out))}] {{
  p = permute_dims(x, axes={list(axes)})
  y = add(p, p)
  return y
}}""")


def extents(kernel):
    return [int(s.extent.value) for s in walk(kernel.body) if isinstance(s, Loop)]


def test_resnets_output_becomes_a_tiled_transpose():
    """[1, 28, 28, 128] NHWC -> NCHW: loops (C, H, W) become (C, H W), the emitter's tiles."""
    kernel = lower_function(permuted((1, 28, 28, 128), (0, 3, 1, 2))["main"])
    assert extents(kernel) == [128, 28, 28]
    merged = collapse_transposes(kernel)
    assert extents(merged) == [128, 784]
    assert "dpl_transpose16(" in emit_kernel(kernel)  # the emitter merges, then turns tiles


@pytest.mark.parametrize("shape, axes", [
    ((4, 64), (0, 1)),  # no permute: nothing to merge
    ((8, 12, 16), (1, 0, 2)),  # the innermost dim stays innermost: contiguous already
])
def test_nests_without_a_transpose_to_make_are_left(shape, axes):
    kernel = lower_function(permuted(shape, axes)["main"])
    assert collapse_transposes(kernel) is kernel


def test_a_batch_loop_stays_above_the_merged_pair():
    """[b, s, s, h] -> [b, h, s, s] with three heads: the two image loops merge under the batch and
    heads loops (the short heads' loop is then short_axis.py's to unroll)."""
    merged = collapse_transposes(lower_function(permuted((2, 16, 16, 3), (0, 3, 1, 2))["main"]))
    assert extents(merged) == [2, 3, 256]


def test_an_index_read_off_a_variable_keeps_its_loop():
    """A slice's rows read at ``h + 1``: not a bare index, so ``h`` and ``w`` stay two loops."""
    mod = dpl.parse("""
func main(x: f32[1, 21, 24, 32]) -> f32[1, 32, 20, 24] {
  s = strided_slice(x, axes=[1], begin=[1], end=[21])
  p = permute_dims(s, axes=[0, 3, 1, 2])
  y = add(p, p)
  return y
}""")
    kernel = lower_function(mod["main"])
    assert extents(kernel) == [32, 20, 24]
    assert collapse_transposes(kernel) is kernel


@st.composite
def permutes(draw):
    rank = draw(st.integers(3, 5))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 5, 16, 17, 31, 33])) for _ in range(rank))
    axes = tuple(draw(st.permutations(range(rank))))
    return shape, axes, draw(st.sampled_from(["f32", "f64", "i32", "f16"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=permutes())
def test_compiled_permutes_equal_numpy(tmp_path_factory, case):
    """Random permutes of 3-5 dims in every width, merged or not: the compiled kernel equals
    NumPy's transpose bit for bit."""
    needs.c_compiler()
    shape, axes, dtype = case
    mod = permuted(shape, axes, dtype)
    fused = dpl.fuse_ops(mod, ALWAYS)
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"], config=ALWAYS)
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 8).astype(dpl.dtypes.to_numpy(mod["main"].params[0].ty.dtype))
    np.testing.assert_array_equal(np.asarray(exe(x)), x.transpose(axes) + x.transpose(axes))
    assert not exe.fallbacks


def test_every_4d_permute_at_model_sizes(tmp_path):
    needs.c_compiler()
    rng = np.random.default_rng(2)
    backend = CpuBackend(cache_dir=tmp_path)
    for axes in itertools.permutations(range(4)):
        mod = permuted((2, 17, 19, 33), axes)
        exe = dpl.build(dpl.fuse_ops(mod, ALWAYS), [backend, "numpy"], config=ALWAYS)
        x = rng.standard_normal((2, 17, 19, 33)).astype(np.float32)
        np.testing.assert_array_equal(exe(x), x.transpose(axes) * 2)
