"""Loop nests below ``PARALLEL_MIN_WORK`` iterations run on the calling thread (no OpenMP team to
wake, no barrier to meet), larger ones in parallel, symbolic ones decided at run time by an
``if`` clause; the numbers equal the interpreter on every side of the threshold."""

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cgen.emitter import PARALLEL_MIN_WORK, emit_kernel
from dpl.kernel import lower_function

FUSE_ALL = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0, fallback_on_error=False)


def add_relu(rows, cols):
    return dpl.parse(f"""
func main(x: f32[{rows}, {cols}], y: f32[{rows}, {cols}]) -> f32[{rows}, {cols}] {{
  a = add(x, y)
  b = nn.relu(a)
  return b
}}""")


def source_of(mod):
    group = dpl.apply(mod, fuse_reductions=True)
    fn = next(f for f in group.functions.values() if f.attrs.get("Primitive"))
    return emit_kernel(lower_function(fn))


def test_a_small_nest_has_no_parallel_region_and_a_large_one_has():
    small = source_of(add_relu(8, 8))
    assert "omp parallel" not in small and "#pragma omp simd" in small
    rows = PARALLEL_MIN_WORK // 64
    large = source_of(add_relu(rows, 64))
    assert "#pragma omp parallel for schedule(static)\n" in large


def test_a_symbolic_nest_decides_at_run_time():
    src = source_of(add_relu("n", 64))
    assert f">= {PARALLEL_MIN_WORK})" in src and "if((" in src


@pytest.mark.parametrize("rows", [3, PARALLEL_MIN_WORK // 64 - 1, PARALLEL_MIN_WORK // 64 + 5])
def test_numbers_on_both_sides_of_the_threshold(tmp_path, rows):
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend

    mod = add_relu("n", 64)
    exe = dpl.build(dpl.apply(mod), [CpuBackend(cache_dir=tmp_path), "numpy"], config=FUSE_ALL)
    rng = np.random.default_rng(rows)
    x, y = (rng.standard_normal((rows, 64)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(exe(x, y), dpl.interpret(mod, x, y), rtol=1e-6, atol=1e-6)
    assert exe.plan(x, y).steps[0].kernel.__qualname__.startswith("cpu:")


def test_an_extent_that_reads_a_loop_variable_keeps_the_parallel_loop():
    """A triangular nest has no iteration count before it: parallel, as before, and it compiles."""
    from dpl.kernel.ir import Buffer, Kernel, Load, Loop, Store, Var

    i, j = Var("i"), Var("j")
    body = Loop(i, Var("n"), (Loop(j, i, (Store("out", (i, j), Load("x", (i, j))),)),))
    kernel = Kernel("tri", (Buffer("x", ("n", "n")),), (Buffer("out", ("n", "n")),), (body,))
    src = emit_kernel(kernel, stream_bytes=None)
    assert "#pragma omp parallel for schedule(static)\n" in src and "if((" not in src
