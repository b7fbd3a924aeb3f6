"""A BLAS-segmented group keeps its intermediate values in buffers reused from call to call:
results are right on every call, at every shape, and never share memory with what the next
call writes."""

import attrs
import numpy as np
import pytest

import needs

import dpl

ATTENTION = dpl.parse("""
func main(q: f32[4, n, 16], k: f32[4, 16, n], v: f32[4, n, 16], mask: f32[n, n]) -> f32[4, n, 16] {
  s = matmul(q, k)
  z = multiply(s, 0.25)
  m = add(z, mask)
  p = nn.softmax(m)
  o = matmul(p, v)
  return o
}""")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    fused = dpl.apply(ATTENTION, ["llm"])
    composite = next(f for f in fused.functions.values() if f.attrs.get("Composite") == "kernel.attention")
    run = CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), attention="segments").compile(composite, module=fused)
    assert run.__qualname__.startswith("cpu-blas+c:")
    order = [p.name for p in composite.params]  # the composite's parameters, in order of first use
    return lambda args, outs: run([args[["q", "k", "v", "mask"].index(name)] for name in order], outs)


def inputs(n, seed):
    rng = np.random.default_rng(seed)
    shapes = [(4, n, 16), (4, 16, n), (4, n, 16), (n, n)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_repeated_calls_at_several_shapes_equal_the_interpreter(kernel):
    results = []
    for n, seed in [(8, 0), (8, 1), (24, 2), (8, 3)]:
        args = inputs(n, seed)
        out = np.empty((4, n, 16), np.float32)
        kernel(args, [out])
        np.testing.assert_allclose(out, dpl.interpret(ATTENTION, *args), rtol=1e-5, atol=1e-5)
        results.append((out, out.copy()))
    for out, snapshot in results:  # later calls wrote their own outputs only
        np.testing.assert_array_equal(out, snapshot)


def test_a_non_contiguous_output_is_filled(kernel):
    args = inputs(8, 4)
    out = np.empty((4, 8, 32), np.float32)[:, :, ::2]
    kernel(args, [out])
    np.testing.assert_allclose(out, dpl.interpret(ATTENTION, *args), rtol=1e-5, atol=1e-5)


RESIDUAL = dpl.parse("""
func main(x: f32[16, 32], w1: f32[32, 32], w2: f32[32, 32]) -> f32[16, 32] {
  a = matmul(x, w1)
  b = nn.silu(a)
  c = matmul(b, w2)
  d = add(c, a)
  return d
}""")


def test_intermediates_alive_together_have_their_own_buffers(tmp_path):
    """``a`` is read after ``b`` and ``c`` are written: each value keeps its own buffer."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    group = attrs.evolve(RESIDUAL["main"], attrs={"Primitive": True})  # FuseOps never groups two products
    run = CpuBackend(cache_dir=tmp_path).compile(group, module=dpl.Module([group]))
    assert run.__qualname__.startswith("cpu-blas+c:") and len(run.parts) == 2
    for seed in range(3):
        rng = np.random.default_rng(seed)
        args = [rng.standard_normal(p.ty.shape).astype(np.float32) for p in group.params]
        out = np.empty((16, 32), np.float32)
        run(args, [out])
        np.testing.assert_allclose(out, dpl.interpret(group, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pool", ["nn.avg_pool2d", "nn.max_pool2d"])
def test_a_pool_begins_its_own_part_with_its_input_written_out(pool):
    """conv -> batch-norm-like epilogue -> relu -> pool: the CPU's segments end the epilogue's
    part before the pool (generated C would recompute the epilogue for every window; a float
    max pool is a library step of its own, backends/cpu/max_pool.py), and the numbers are the
    interpreter's."""
    from dpl.backends.cpu.backend import CpuBackend, _blas_product, _pool
    from dpl.backends.cpu.segments import Part, Product, segment

    needs.c_compiler()
    mod = dpl.parse(f"""
func main(x: f32[1, 3, 20, 20], w: f32[8, 3, 3, 3], s: f32[1, 8, 1, 1]) -> f32[1, 8, 8, 8] {{
  c = nn.conv2d(x, w)
  m = multiply(c, s)
  r = nn.relu(m)
  p = {pool}(r, pool_size=[3, 3], strides=[2, 2])
  return p
}}""")
    fn = mod["main"]
    steps = segment(fn, _blas_product, starts_part=_pool)
    parts = [s for s in steps if isinstance(s, Part)]
    if pool == "nn.max_pool2d":
        assert [[b.value.op for b in p.function.bindings] for p in parts] == [["multiply", "nn.relu"]]
        assert isinstance(steps[-1], Product) and steps[-1].call.op == pool
    else:
        assert [[b.value.op for b in p.function.bindings] for p in parts] == [["multiply", "nn.relu"], [pool]]
        assert [[b.value.op for b in p.function.bindings] for p in segment(fn, _blas_product) if isinstance(p, Part)] == [
            ["multiply", "nn.relu", pool]]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(p.ty.shape).astype(np.float32) for p in fn.params]
    run = CpuBackend(products="numpy").compile(fn, module=mod)
    out = np.empty((1, 8, 8, 8), np.float32)
    run(args, [out])
    np.testing.assert_allclose(out, dpl.interpret(mod, *args), rtol=1e-5, atol=1e-5)
