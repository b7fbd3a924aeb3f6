"""Masks built at a symbolic length (arange, triu/tril, full), average pooling and slices over
symbolic dims, end to end: the text form in, FuseOps, the kernels the CPU backend compiles (and
the NumPy kernel evaluator), numbers equal to the interpreter at two lengths; TVM 0.27 as the
oracle for pooling's numbers and output sizes."""

import numpy as np
import pytest

import needs

import dpl

rng = np.random.default_rng(11)

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)

CAUSAL_ATTENTION = """
func main(q: f32[2, seq, 16], k: f32[2, seq, 16], v: f32[2, seq, 16]) -> f32[2, seq, 16] {
  kt = permute_dims(k, axes=[0, 2, 1])
  qk = matmul(q, kt)
  scores = multiply(qk, 0.25)
  r = arange(end="seq")
  rows = expand_dims(r, axis=[1])
  cols = expand_dims(r, axis=[0])
  allowed = greater_equal(rows, cols)
  masked = where(allowed, scores, -inf)
  p = nn.softmax(masked, axis=-1)
  out = matmul(p, v)
  return out
}
"""

TRIU_MASK = """
func main(x: f32[seq, 8], w: f32[8, 8]) -> f32[seq, seq] {
  h = matmul(x, w)
  xt = permute_dims(x)
  s = matmul(h, xt)
  blocked = full(-inf, shape=["seq", "seq"])
  mask = triu(blocked, k=1)
  one = ones(shape=["seq", "seq"], dtype=f32)
  keep = tril(one, k=0)
  kept = multiply(s, keep)
  y = add(kept, mask)
  return y
}
"""

ZERO_INPUT_GROUP = """
func main(x: f32[n, 4]) -> f32[n, n] {
  z = zeros(shape=["n", "n"], dtype=f32)
  r = arange(end="n")
  row = expand_dims(r, axis=[0])
  rf = astype(row, dtype=f32)
  m = add(z, rf)
  t = tril(m, k=-1)
  return t
}
"""

CNN_POOLING = """
func main(x: f32[n, 3, 9, 9], w: f32[4, 3, 3, 3]) -> (f32[n, 4, 3, 3], f32[n, 4, 1, 1], f32[n, 4, 3, 2]) {
  conv = nn.conv2d(x, w, padding=[1, 1])
  c = nn.relu(conv)
  a = nn.avg_pool2d(c, pool_size=3, strides=2, padding=1, ceil_mode=true)
  a2 = multiply(a, 2.0)
  p = nn.adaptive_avg_pool2d(a2, output_size=[3, 3])
  b = add(p, 1.0)
  g0 = nn.adaptive_avg_pool2d(c, output_size=1)
  g = nn.relu(g0)
  u0 = nn.adaptive_avg_pool2d(c, output_size=[3, 2])
  u = add(u0, 0.5)
  return (b, g, u)
}
"""

SLICED_BUFFER = """
func main(x: f32[2, T, 16], mask: f32[32, 32]) -> (f32[2, T, T], f32[2, 2, 16]) {
  xt = permute_dims(x, axes=[0, 2, 1])
  s = matmul(x, xt)
  cut = strided_slice(mask, axes=[0, 1], begin=[0, 0], end=["T", "T"])
  z = add(s, cut)
  y = nn.softmax(z)
  last = strided_slice(x, axes=[1], begin=[-2], end=[9223372036854775807])
  return (y, last)
}
"""

# Swin's shifted-window mask: constants broadcast over the batch and merged with it, in a group
# whose only symbol is in its result's expression (n * 4), solved from the result's size
MERGED_MASK = """
func main(x: f32[n, 3], m: f32[1, 4, 1, 2], b: f32[1, 1, 2]) -> (f32[n * 4, 2], f32[n, 3]) {
  e = broadcast_to(m, shape=["n", 4, 1, 2])
  s = add(b, e)
  f = reshape(s, shape=["n * 4", 2])
  r = nn.relu(x)
  return (f, r)
}
"""

MODELS = {"causal_attention": CAUSAL_ATTENTION, "triu_mask": TRIU_MASK, "zero_input_group": ZERO_INPUT_GROUP,
          "cnn_pooling": CNN_POOLING, "sliced_buffer": SLICED_BUFFER, "merged_mask": MERGED_MASK}


def args_for(func, **dims):
    arrays = []
    for p in func.params:
        shape = tuple(dims[d] if isinstance(d, str) else d for d in p.ty.shape)
        arrays.append(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)))
    return arrays


def assert_close(want, got, tol=2e-5):
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


def groups(mod):
    return [f for f in mod.functions.values() if f.attrs.get("Primitive")]


@pytest.fixture
def c_compiler():
    needs.c_compiler()


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("target", ["cpu", "numpy-kernel", "numpy"])
def test_fused_models_equal_the_interpreter_at_two_lengths(c_compiler, name, target):
    mod = dpl.parse(MODELS[name])
    fused = dpl.apply(mod, [])
    new_ops = {"arange", "triu", "tril", "full", "zeros", "ones", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "strided_slice",
               "broadcast_to"}
    # the new ops are inside fused groups (never left outside as single ops)
    assert any(new_ops & {b.value.op for b in g.bindings if isinstance(b.value, dpl.Call)} for g in groups(fused))
    exe = dpl.build(fused, target, config=ALWAYS)
    for size in (5, 9):
        args = args_for(mod["main"], seq=size, n=size - 3, T=size)
        assert_close(dpl.interpret(mod, *args), exe(*args))
    summary = exe.summary()
    rows = [r for r in summary.splitlines() if r.strip().startswith("primitive function")]
    assert rows and all(f"-> {target} (" in r and "fall-back" not in r for r in rows), summary


def test_every_group_of_the_models_lowers_to_one_kernel():
    """Kernel level: each fused group's kernel, run by the NumPy kernel evaluator, equals the
    interpreter on the group (a dim no parameter binds comes from the caller in both)."""
    from dpl.interpret import run_function
    from dpl.kernel import evaluate, lower_function

    dims = {"seq": 6, "n": 4, "T": 6}
    for text in MODELS.values():
        for fn in groups(dpl.apply(dpl.parse(text), [])):
            kernel = lower_function(fn)  # a LoweringError here names the binding
            args = args_for(fn, **dims)
            assert_close(run_function(None, fn, args, outer_dims=dims), evaluate(kernel, *args, dims=dims))


def test_zero_input_group_reads_its_length_off_its_outputs(c_compiler):
    """A group that computes ``tril(arange(n) + zeros(n, n))`` has no parameter telling it n:
    the runtime passes the caller's n, and the kernel reads it off its destination buffers."""
    mod = dpl.parse(ZERO_INPUT_GROUP)
    fused = dpl.apply(mod, [])
    assert any(not fn.params for fn in groups(fused))
    exe = dpl.build(fused, "cpu", config=ALWAYS)
    for n in (3, 8):
        t = exe(np.zeros((n, 4), np.float32))
        np.testing.assert_array_equal(t, np.tril(np.broadcast_to(np.arange(n, dtype=np.float32), (n, n)), -1))
        assert_close(dpl.interpret(mod, np.zeros((n, 4), np.float32)), dpl.interpret(fused, np.zeros((n, 4), np.float32)))


@pytest.mark.parametrize("target", ["cpu", "numpy", "numpy-kernel"])
def test_a_slice_end_beyond_its_buffer_is_an_error_on_every_target(c_compiler, target):
    exe = dpl.build(dpl.apply(dpl.parse(SLICED_BUFFER), []), target, config=ALWAYS)
    x, mask = args_for(dpl.parse(SLICED_BUFFER)["main"], T=40)
    with pytest.raises(dpl.errors.DplError, match="T"):
        exe(x, mask)


# -- TVM 0.27 as the oracle of pooling: numbers and output sizes -------------------------------


def tvm_run(tvm, shape, build):
    from tvm import relax as rx
    from tvm.script import relax as R

    x = rx.Var("x", R.Tensor(shape, "float32"))
    bb = rx.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(rx.op.nn, x))
        bb.emit_func_output(out)
    vm = rx.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    data = rng.standard_normal(shape).astype(np.float32)
    return data, vm["main"](tvm.runtime.tensor(data)).numpy()


POOLS = [
    ((1, 2, 5, 5), dict(pool_size=[2, 2], strides=[2, 2], padding=[1, 1], ceil_mode=True, count_include_pad=True)),
    ((1, 2, 6, 6), dict(pool_size=[3, 3], strides=[2, 2], ceil_mode=True, count_include_pad=True)),
    ((2, 2, 7, 6), dict(pool_size=[3, 2], strides=[2, 1], padding=[1, 0, 1, 1], dilation=[2, 1], count_include_pad=True)),
    ((1, 3, 7, 6), dict(pool_size=[3, 2], strides=[2, 1], padding=[1, 0, 1, 1], dilation=[2, 1])),
    ((1, 2, 9, 9), dict(pool_size=[3, 3], strides=[3, 3], padding=[1, 1], dilation=[2, 2], ceil_mode=True)),
]


@pytest.mark.oracle
@pytest.mark.parametrize("shape, attrs", POOLS)
def test_avg_pool2d_equals_tvm(tvm, shape, attrs):
    data, want = tvm_run(tvm, shape, lambda nn, x: nn.avg_pool2d(x, **attrs))
    fb = dpl.ir.FunctionBuilder("main", attrs={"Primitive": True})
    fn = fb.ret(fb.emit("nn.avg_pool2d", fb.param("x", "f32", shape), **attrs))
    np.testing.assert_allclose(dpl.interpret(fn, data), want, rtol=1e-5, atol=1e-6)
    from dpl.kernel import evaluate, lower_function

    np.testing.assert_allclose(evaluate(lower_function(fn), data), want, rtol=1e-5, atol=1e-6)


@pytest.mark.oracle
@pytest.mark.parametrize("hw, out", [((7, 7), (3, 3)), ((8, 6), (3, 4)), ((4, 4), (8, 8)), ((5, 8), (2, 3)), ((6, 6), (1, 1))])
def test_adaptive_avg_pool2d_equals_tvm(tvm, hw, out):
    data, want = tvm_run(tvm, (1, 2) + hw, lambda nn, x: nn.adaptive_avg_pool2d(x, out))
    fb = dpl.ir.FunctionBuilder("main", attrs={"Primitive": True})
    fn = fb.ret(fb.emit("nn.adaptive_avg_pool2d", fb.param("x", "f32", (1, 2) + hw), output_size=list(out)))
    np.testing.assert_allclose(dpl.interpret(fn, data), want, rtol=1e-5, atol=1e-6)


@pytest.mark.oracle
def test_pooled_sizes_equal_tvm_over_a_grid(tvm):
    """ceil_mode keeps a last window only when it starts inside the input or its leading padding."""
    from tvm import relax as rx
    from tvm.script import relax as R

    checked = 0
    for size in (4, 5, 6, 7):
        for k, s, d, lo, hi in [(2, 2, 1, 1, 1), (3, 2, 1, 1, 0), (2, 3, 1, 0, 1), (3, 3, 2, 1, 1), (2, 2, 1, 0, 0)]:
            for ceil in (False, True):
                attrs = dict(pool_size=[k, 1], strides=[s, 1], dilation=[d, 1], padding=[lo, 0, hi, 0], ceil_mode=ceil)
                if d * (k - 1) + 1 > size + lo + hi:
                    continue
                for op in ("max_pool2d", "avg_pool2d"):
                    x = rx.Var("x", R.Tensor((1, 1, size, 3), "float32"))
                    call = rx.BlockBuilder().normalize(getattr(rx.op.nn, op)(x, **attrs))
                    want = [int(v) for v in call.ty.shape.values]
                    got = dpl.ir.call(f"nn.{op}", dpl.ir.Var("x", dpl.TensorType((1, 1, size, 3), "float32")), **attrs).ty.shape
                    assert list(got) == want, (op, size, attrs)
                    checked += 1
    assert checked > 60
