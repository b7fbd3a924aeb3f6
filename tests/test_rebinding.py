"""Plans rebound to another binding of the entry's symbols (dpl.runtime.rebinding, issue 31): a
size of the same bucket gets the walked plan's kernels with its buffers' shapes evaluated anew.
The rebound plan must be the plan a walk would make at that size (same steps, same shapes, same
memory), compute what the interpreter computes, refuse sizes that break what the walk checked,
and not exist where a kernel was made for one size."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dpl
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, Module
from dpl.ir import dims as D
from dpl.runtime.rebinding import bucket

P = D.parse
ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def renamed():
    """A group in symbols of its own: k from ``a: [k + 1, 64]`` against the entry's n, and ``b``
    checked against it."""
    g = FunctionBuilder("fused_g", attrs={"Primitive": True})
    a, b = g.param("a", "f32", (P("k + 1"), 64)), g.param("b", "f32", ("k", 64))
    fn = g.ret(g.emit("add", g.emit("tanh", a), g.emit("sum", b, axis=[0], keepdims=True)))
    fb = FunctionBuilder("main")
    x, y = fb.param("x", "f32", ("n", 64)), fb.param("y", "f32", (P("n - 1"), 64))
    return Module([fb.ret(fb.call(fn, x, y)), fn])


def two_symbols_one_callee():
    """A callee whose two parameters share k, given the entry's a and b: equal at every call
    that runs, which the walk checked and a rebound plan must check too."""
    g = FunctionBuilder("fused_pair", attrs={"Primitive": True})
    p, q = g.param("p", "f32", ("k", 8)), g.param("q", "f32", ("k", 8))
    fn = g.ret(g.emit("multiply", g.emit("exp", p), q))
    fb = FunctionBuilder("main")
    x, y = fb.param("x", "f32", ("a", 8)), fb.param("y", "f32", ("b", 8))
    return Module([fb.ret(fb.call(fn, x, y)), fn])


def views_and_concat():
    """Views of an input and of temporaries over symbolic dims, a concat of n + n rows, a view
    returned (its base becomes the output)."""
    src = """
    func main(x: f32[n, 16], w: f32[16, 16]) -> (f32[n * 2, 16], f32[n, 4, 4]) {
      y = matmul(x, w)
      z = nn.relu(y)
      c = concat((z, x), axis=0)
      s = sum(c, axis=[0], keepdims=true)
      r = add(c, s)
      v = reshape(z, shape=[n, 4, 4])
      return (r, v)
    }
    """
    return dpl.parse(src)


def example(name):
    return dpl.load(f"examples/{name}.ir")


def attention():
    """Grouped-query attention of t query rows against n keys, with an additive mask: the
    ``llm`` library makes it a kernel.attention composite (flash, decode or two products)."""
    return dpl.parse("""
func main(q: f32[1, 2, 4, t, 64], k: f32[1, 2, 1, 64, n], v: f32[1, 2, 1, n, 64], mask: f32[t, n]) -> f32[1, 2, 4, t, 64] {
  s = matmul(q, k)
  z = multiply(s, 0.125)
  w = add(z, mask)
  p = nn.softmax(w)
  o = matmul(p, v)
  return o
}""")


MODULES = {"renamed": renamed, "views_and_concat": views_and_concat, "mlp": lambda: example("mlp"),
           "llama_mlp": lambda: example("llama_mlp"), "attention": attention,
           "residual_rmsnorm": lambda: example("residual_rmsnorm")}


def fused(name):
    """Module ``name`` through dpl.apply (the llm library for the attention)."""
    return dpl.apply(MODULES[name](), ["llm"] if name == "attention" else ())


def specs_of(mod):
    """(shape, dtype) of each input of ``mod``'s entry."""
    return [(p.ty.shape, p.ty.dtype) for p in mod["main"].params]


def inputs(mod, dims, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(D.evaluate(d, dims) for d in shape)).astype(dpl.dtypes.to_numpy(dtype))
            for shape, dtype in specs_of(mod)]


def symbols_of(mod):
    return sorted({s for shape, _ in specs_of(mod) for d in shape if not isinstance(d, int) for s in D.free_symbols(d)})


def walked_and_rebound(target, mod, first, then):
    """The plan a fresh build walks at ``then``, and the one a build that walked ``first`` rebinds
    to it (with the rebound build)."""
    walked = dpl.build(mod, target, config=ALWAYS, progress=False)
    walked(*inputs(mod, then))
    exe = dpl.build(mod, target, config=ALWAYS, progress=False)
    exe(*inputs(mod, first))
    rebound = exe.plan(*inputs(mod, then))
    return next(iter(walked.plans.values())), rebound, exe


def same_plan(walked, rebound):
    assert rebound.origin is not None, "planned by a walk, not rebound"
    assert [b.shape for b in rebound.buffers] == [b.shape for b in walked.buffers]
    assert [(b.kind, b.dtype, b.base) for b in rebound.buffers] == [(b.kind, b.dtype, b.base) for b in walked.buffers]
    assert [(s.label, s.inputs, s.outputs) for s in rebound.steps] == [(s.label, s.inputs, s.outputs) for s in walked.steps]
    assert rebound.slot_sizes == walked.slot_sizes and rebound.slot_of == walked.slot_of
    assert [(tuple(s), np.dtype(d)) for s, d in rebound.out_specs] == [(tuple(s), np.dtype(d)) for s, d in walked.out_specs]
    assert rebound.signature == walked.signature


@st.composite
def two_sizes(draw):
    """A module and two bindings of its symbols in one bucket (each symbol >= 2, so that
    ``n - 1`` stays a size)."""
    name = draw(st.sampled_from(sorted(MODULES)))
    mod = fused(name)
    first, then = {}, {}
    for s in symbols_of(mod):
        bits = draw(st.integers(2, 9))
        lo, hi = 1 << (bits - 1), (1 << bits) - 1
        first[s], then[s] = draw(st.integers(max(lo, 2), hi)), draw(st.integers(max(lo, 2), hi))
    return name, mod, first, then


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_sizes())
def test_a_rebound_plan_is_the_plan_a_walk_makes(case):
    name, mod, first, then = case
    walked, rebound, exe = walked_and_rebound("numpy", mod, first, then)
    if first == then:
        assert rebound is next(iter(exe.plans.values()))
        return
    same_plan(walked, rebound)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_rebound_plans_compute_what_the_interpreter_computes_on_cpu(name):
    mod = fused(name)
    exe = dpl.build(mod, "cpu", config=ALWAYS, progress=False)
    sizes = [4, 5, 7, 6, 33, 40, 4]  # two buckets, each walked once
    for k, n in enumerate(sizes):
        dims = {s: n for s in symbols_of(mod)}
        args = inputs(mod, dims, seed=k)
        got, want = exe(*args), dpl.interpret(mod, *args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            scale = max(float(np.abs(w).max()), 1.0)  # sums of many products: relative to the largest
            tol = 2e-3 if w.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(g, w, rtol=10 * tol, atol=tol * scale, err_msg=f"{name} at {dims}")
    assert len(exe._plans) == 2, exe.summary()  # one walk per bucket
    assert {bucket(dict.fromkeys(symbols_of(mod), n)) for n in sizes} == {(3,) * len(symbols_of(mod)),
                                                                               (6,) * len(symbols_of(mod))}
    assert "by rebinding" in exe.summary()


def test_the_buckets_keep_zero_and_one_apart():
    """No keys and one query row change what a backend chooses: each is a bucket of its own."""
    assert len({bucket({"n": n}) for n in (0, 1, 2, 3)}) == 3
    assert bucket({"n": 130}) == bucket({"n": 255}) != bucket({"n": 256})


def test_a_size_that_breaks_a_checked_equality_is_refused_not_computed():
    mod = two_symbols_one_callee()
    exe = dpl.build(mod, "cpu", config=ALWAYS, progress=False)
    x = np.ones((4, 8), np.float32)
    np.testing.assert_allclose(exe(x, x), np.exp(x) * x, rtol=1e-6)
    with pytest.raises(DplError, match="'k' is already 5"):
        exe(np.ones((5, 8), np.float32), np.ones((6, 8), np.float32))  # a = 5, b = 6: same bucket, k cannot be both
    y = np.full((6, 8), 0.5, np.float32)
    np.testing.assert_allclose(exe(y, y), np.exp(y) * y, rtol=1e-6)
    assert len(exe._plans) == 1 and len(exe._rebound) == 1


def test_a_plan_with_a_callers_value_written_in_serves_its_sizes_only():
    """``arange(end=n)`` in a group whose buffers do not size n: the group's kernel has the
    caller's n written in, so another n is planned by a walk."""
    g = FunctionBuilder("fused_ramp", attrs={"Primitive": True})
    x = g.param("x", "f32", (1,))
    fn = g.ret(g.emit("add", g.emit("sum", g.emit("astype", g.emit("arange", end="n"), dtype="float32")), x))
    fb = FunctionBuilder("main")
    xs = fb.param("x", "f32", (1,))
    ns = fb.param("s", "f32", ("n",))
    out = fb.emit("add", fb.call(fn, xs), fb.emit("sum", ns))
    mod = Module([fb.ret(out), fn])
    exe = dpl.build(mod, "cpu", config=ALWAYS, progress=False)
    for n in (4, 5):
        got = exe(np.zeros(1, np.float32), np.ones(n, np.float32))
        np.testing.assert_allclose(got, [n * (n - 1) / 2 + n])
    assert len(exe._plans) == 2 and not exe._rebound
    assert "for these sizes only ('fused_ramp' has a caller's value written in)" in exe.summary()


def test_rebound_plans_held_are_bounded(monkeypatch):
    from dpl.runtime import executable
    monkeypatch.setattr(executable, "REBOUND_PLANS", 3)
    mod = dpl.apply(views_and_concat())
    exe = dpl.build(mod, "numpy", progress=False)
    for n in range(64, 72):
        exe(*inputs(mod, {"n": n}))
    assert len(exe._plans) == 1 and [sig[0][0][0] for sig in exe._rebound] == [69, 70, 71]


def test_rebound_plans_share_the_buckets_arenas_and_their_prepared_runs():
    """The walked plan's arenas are sized for its bucket's largest binding; a plan rebound from it
    borrows them, is prepared at its first call, and takes the prepared runs of the steps whose
    shapes did not change (the weight's product) from the arena, which keeps no others; bits as a
    walked plan's."""
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.ir import const

    g = FunctionBuilder("fused_linear", attrs={"Primitive": True})  # the weight inside: packed, prepared
    w = const(np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32), name="w")
    fn = g.ret(g.emit("nn.gelu", g.emit("matmul", g.param("x", "f32", (1, 32)), w)))
    fb = FunctionBuilder("main")
    x, s = fb.param("x", "f32", (1, 32)), fb.param("s", "f32", ("n", 48))
    y = fb.call(fn, x)
    mod = Module([fb.ret(fb.emit("concat", [s, y], axis=0)), fn])  # a cache of n rows and the new one
    backend = CpuBackend(products="dpl")
    exe = dpl.build(mod, backend, config=ALWAYS, progress=False, threads=1)
    exe(*inputs(mod, {"n": 5}))
    template = next(iter(exe._plans.values()))
    assert template.sized_for_bucket and template.peak_bytes >= 48 * 4
    runs = {k: v for arena in template._arenas for k, v in arena.runs.items()}
    for n in (6, 7, 4):
        args = inputs(mod, {"n": n}, seed=n)
        got = exe(*args)
        plan = exe.plan(*args)
        assert plan.origin is template and plan._home is template and plan._prepared and plan.peak_bytes == 0
        walked = dpl.build(mod, CpuBackend(products="dpl"), config=ALWAYS, progress=False, threads=1)
        assert walked(*args).tobytes() == got.tobytes()
        parts = getattr(plan._prepared[next(iter(plan._prepared))], "parts", ())
        assert any(p is run for p in parts for run in runs.values())  # the product's run, made at n = 5
    shared = {k: v for arena in template._arenas for k, v in arena.runs.items()}
    assert runs and shared == runs  # the concatenation's runs are each plan's own, never piled up on the arena
