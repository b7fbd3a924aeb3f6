"""dpl/kernel/loop_split.py: an innermost loop read as ``i / c`` and ``i % c`` runs as two
loops, the same numbers (the NumPy evaluator and the compiled C against the interpreter), and
loops it must not split are left as they are."""

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
import needs
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cpu.backend import CpuBackend
from dpl.kernel.evaluate import evaluate
from dpl.kernel.ir import Bin, Loop, Var, walk, walk_exprs
from dpl.kernel.loop_split import MIN_INNER, split_index_loops
from dpl.kernel.lower import lower_function

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def merge_heads(b: int, h: int, s: int, d: int, dtype: str = "f32", scaled: bool = True):
    """Attention's output merged back: [b, h, s, d] -> [b, s, h * d] (times a row scale)."""
    scale = f"\n  y = multiply(x, r)" if scaled else "\n  y = add(x, x)"
    return dpl.parse(f"""
func main(x: {dtype}[{b}, {h}, {s}, {d}], r: {dtype}[{b}, 1, {s}, 1]) -> {dtype}[{b}, {s}, {h * d}] {{{scale}
  t = permute_dims(y, axes=[0, 2, 1, 3])
  z = reshape(t, shape=[{b}, {s}, {h * d}])
  return z
}}""")


def kernel_of(mod):
    return lower_function(mod["main"])


def loops(kernel):
    return [s for s in walk(kernel.body) if isinstance(s, Loop)]


def divides_a_loop_variable(kernel) -> bool:
    names = {s.var.name for s in loops(kernel)}
    for s in walk(kernel.body):
        for e in [getattr(s, "value", None), *getattr(s, "indices", ())]:
            if e is None:
                continue
            for x in walk_exprs(e):
                if isinstance(x, Bin) and x.op in "/%" and isinstance(x.a, Var) and x.a.name in names:
                    return True
    return False


def test_a_merged_axis_runs_as_two_loops_and_computes_the_same():
    kernel = kernel_of(merge_heads(2, 4, 8, 64))
    assert divides_a_loop_variable(kernel)
    split = split_index_loops(kernel)
    assert not divides_a_loop_variable(split)
    assert [int(s.extent.value) for s in loops(split)][-2:] == [4, 64]  # heads, then the contiguous head dims
    rng = np.random.default_rng(0)
    x, r = rng.standard_normal((2, 4, 8, 64)).astype(np.float32), rng.standard_normal((2, 1, 8, 1)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(split, x, r), evaluate(kernel, x, r))
    source = emit_kernel(kernel)
    assert "v_i2_lo" in source and "/ 64" not in source and "% 64" not in source


@pytest.mark.parametrize("d", [MIN_INNER // 2, 3])
def test_loops_too_short_to_fill_a_vector_are_left(d):
    kernel = kernel_of(merge_heads(2, 4, 8, d))
    assert split_index_loops(kernel) is kernel


def test_a_symbolic_outer_dim_keeps_the_static_inner_split_and_a_symbolic_extent_is_left():
    mod = dpl.parse("""
func main(x: f32[4, n, 32]) -> f32[n, 128] {
  t = permute_dims(x, axes=[1, 0, 2])
  z = reshape(t, shape=[n, 128])
  return z
}""")
    kernel = kernel_of(mod)
    split = split_index_loops(kernel)
    assert [getattr(s.extent, "value", None) for s in loops(split)] == [None, 4, 32]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5, 32)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(split, x), evaluate(kernel, x))
    inner = loops(kernel)[-1]
    symbolic = attrs.evolve(kernel, body=(attrs.evolve(loops(kernel)[0], body=(attrs.evolve(inner, extent=Var("n")),)),))
    assert split_index_loops(symbolic) is symbolic


@st.composite
def merges(draw):
    b, h, s = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 9))
    d = draw(st.sampled_from([1, 8, 16, 17, 32, 48, 64]))
    dtype = draw(st.sampled_from(["f32", "f64", "i32", "f16"]))
    return b, h, s, d, dtype, draw(st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=merges())
def test_compiled_merges_equal_the_interpreter(tmp_path_factory, case):
    """Random head merges in every float and int width, split or not: the compiled kernel
    equals the interpreter bit for bit."""
    needs.c_compiler()
    b, h, s, d, dtype, scaled = case
    mod = merge_heads(b, h, s, d, dtype, scaled)
    fused = dpl.fuse_ops(mod, ALWAYS)
    exe = dpl.build(fused, [CpuBackend(cache_dir=tmp_path_factory.getbasetemp() / "kernels"), "numpy"], config=ALWAYS)
    rng = np.random.default_rng(b * 1000 + h * 100 + s * 10 + d)
    np_dtype = dpl.dtypes.to_numpy(mod["main"].params[0].ty.dtype)
    x = (rng.standard_normal((b, h, s, d)) * 8).astype(np_dtype)
    r = (rng.standard_normal((b, 1, s, 1)) * 8).astype(np_dtype)
    np.testing.assert_array_equal(np.asarray(exe(x, r)), np.asarray(dpl.interpret(mod, x, r)))
    assert not exe.fallbacks
