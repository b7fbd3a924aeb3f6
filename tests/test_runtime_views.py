"""Views cost nothing at run time (issue 16, item 3): a reshape, squeeze or expand_dims that
stays out of a fused kernel (alone, between two kernels, at the module's output, or a group of
nothing but views) runs as a view of its base's buffer: no kernel call, no copy, no memory of
its own. Every module is compared with the interpreter on random inputs, on cpu and numpy (and
the CUDA path on the stand-in CuPy); what it returns never shares memory with its inputs, the
module's constants or its other results."""

import threading

import attrs
import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module, const
from runtime_corpus import group

TARGETS = ["numpy", "cpu"]


@pytest.fixture(params=TARGETS)
def target(request):
    if request.param == "cpu":
        needs.c_compiler()
    return request.param


def main(params, body, extra=()):
    fb = FunctionBuilder("main")
    vs = [fb.param(n, "f32", s) for n, s in params]
    out = body(fb, *vs)
    return Module([fb.ret(*out) if isinstance(out, tuple) else fb.ret(out), *extra])


def args_for(mod, dims, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        a = rng.standard_normal(tuple(dims.get(d, d) for d in p.ty.shape)).astype(np.float32)
        a[a == 0] = 0.5
        out.append(a)
    return out


def leaves(value):
    return list(value) if isinstance(value, tuple) else [value]


def check(exe, mod, args):
    got, want = leaves(exe(*args)), leaves(dpl.interpret(mod, *args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


def assert_independent(outs, args, consts=()):
    """What a call returns shares memory with none of its inputs, the constants, or each other."""
    for i, o in enumerate(outs):
        assert not any(np.shares_memory(o, a) for a in args), f"output {i} shares an input's memory"
        assert not any(np.shares_memory(o, c) for c in consts), f"output {i} shares a constant's memory"
        assert not any(np.shares_memory(o, p) for p in outs[:i]), f"output {i} shares another output's memory"


# -- the modules -----------------------------------------------------------------------------------

W = np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8)


def lone_between_kernels():
    """exp -> reshape -> tanh: the reshape between two kernels."""
    return main([("x", ("n", 8))], lambda fb, x: fb.emit("tanh", fb.emit("reshape", fb.emit("exp", x), shape=["n", 2, 4])))


def chain_at_the_output():
    """A chain of views of a kernel's result, returned: the kernel writes the caller's array."""
    def body(fb, x):
        e = fb.emit("exp", x)
        v = fb.emit("expand_dims", fb.emit("reshape", e, shape=["n", 4, 2]), axis=[0])
        return fb.emit("reshape", fb.emit("squeeze", v, axis=[0]), shape=["n", 8])
    return main([("x", ("n", 8))], body)


def views_of_inputs_constants_and_outputs():
    """An input, a constant and a result, each viewed and returned beside itself."""
    def body(fb, x):
        c = const(W, name="w")
        e = fb.emit("exp", x)
        return (fb.emit("reshape", x, shape=[8, "n"]), fb.emit("expand_dims", c, axis=[1]), e,
                fb.emit("reshape", e, shape=["n", 2, 4]), fb.emit("squeeze", fb.emit("expand_dims", e, axis=[0]), axis=[0]))
    return main([("x", ("n", 8))], body)


def one_view_two_readers():
    """A view of a temporary read by two kernels, one long after its base's last direct use."""
    def body(fb, x):
        a = fb.emit("exp", x)
        v = fb.emit("reshape", a, shape=["n", 2, 4])
        b = fb.emit("negative", fb.emit("tanh", x))  # would take a's memory were v not counted
        first = fb.emit("sigmoid", v)
        return fb.emit("add", fb.emit("add", v, first), fb.emit("reshape", b, shape=["n", 2, 4]))
    return main([("x", ("n", 8))], body)


def views_of_a_constant_feeding_kernels():
    def body(fb, x):
        w = fb.emit("reshape", const(W, name="w"), shape=[48])
        return fb.emit("multiply", fb.emit("reshape", x, shape=["n", 48]), fb.emit("expand_dims", w, axis=[0]))
    return main([("x", ("n", 6, 8))], body)


def group_of_views_only():
    """A Primitive group of nothing but views (as FuseOps leaves a lone reshape) between two."""
    g = group("fused_reshape_expand_dims", [("x", "f32", ("n", 8))],
              lambda fb, x: fb.emit("expand_dims", fb.emit("reshape", x, shape=["n", 2, 4]), axis=[0]))
    def body(fb, x):
        v = fb.call(g, fb.emit("exp", x))
        return fb.emit("tanh", v), fb.call(g, x)
    return main([("x", ("n", 8))], body, extra=[g])


MODULES = {f.__name__: f for f in (lone_between_kernels, chain_at_the_output, views_of_inputs_constants_and_outputs,
                                   one_view_two_readers, views_of_a_constant_feeding_kernels, group_of_views_only)}


@pytest.mark.parametrize("name", list(MODULES))
def test_views_equal_the_interpreter_at_every_size(target, name):
    mod = MODULES[name]()
    exe = dpl.build(mod, target)
    consts = [W]
    for n in (1, 5, 12):  # symbolic n: one plan per size
        for seed in (0, 1):
            args = args_for(mod, {"n": n}, seed)
            outs = check(exe, mod, args)
            assert_independent(outs, args, consts)
            again = check(exe, mod, args)
            assert_independent(again, args, consts)
            for o, p in zip(outs, again):  # the second call did not write the first one's results
                assert not np.shares_memory(o, p)
                np.testing.assert_array_equal(o, p)
    assert all(plan.view_count > 0 for plan in exe.plans.values())
    assert np.array_equal(W, np.linspace(-1, 1, 48, dtype=np.float32).reshape(6, 8))  # the weight never written


# -- no kernel, no copy ------------------------------------------------------------------------------

def recording(plan):
    """``plan`` with every step's kernel recording the arrays it was given, in order."""
    seen = []

    def wrap(step):
        def kernel(ins, dst):
            seen.append((step.label, list(ins), list(dst)))
            step.kernel(ins, dst)
        return attrs.evolve(step, kernel=kernel)

    plan.steps[:] = [wrap(s) for s in plan.steps]
    return seen


def test_a_lone_view_is_no_kernel_and_no_memory(target):
    mod = lone_between_kernels()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 6})
    plan = exe.plan(*args)
    assert [s.label for s in plan.steps] == ["op exp", "op tanh"]
    assert plan.view_count == 1 and plan.copies == []
    # exp's result only, the view has no buffer; sized for n up to 7, its bucket (dpl.runtime.rebinding)
    assert len(plan.slot_sizes) == 1 and plan.peak_bytes == 7 * 8 * 4
    seen = recording(plan)
    check(exe, mod, args)
    (_, _, exp_out), (_, tanh_in, _) = seen
    assert tanh_in[0].shape == (6, 2, 4) and np.shares_memory(tanh_in[0], exp_out[0])
    assert "1 view (no kernel, no copy)" in exe.summary()


def test_a_returned_chain_of_views_is_written_by_its_kernel(target):
    mod = chain_at_the_output()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 7})
    plan = exe.plan(*args)
    assert [s.label for s in plan.steps] == ["op exp"] and plan.view_count == 4
    assert plan.copies == [] and plan.peak_bytes == 0
    seen = recording(plan)
    (out,) = check(exe, mod, args)
    assert np.shares_memory(seen[0][2][0], out)  # exp wrote the caller's array, no copy after


def test_a_group_of_views_runs_no_kernel(target):
    mod = group_of_views_only()
    exe = dpl.build(mod, target)
    plan = exe.plan(*args_for(mod, {"n": 4}))
    assert [s.label for s in plan.steps] == ["op exp", "op tanh"]
    assert plan.view_groups == ("fused_reshape_expand_dims", "fused_reshape_expand_dims")
    (pos, b), = plan.copies  # the group's view of x is returned: copied, the input is never handed out
    assert pos == 1 and plan.buffers[plan.base_of(b)].kind == "input"
    assert "group fused_reshape_expand_dims: views only, no kernel" in exe.summary()


def test_views_of_inputs_and_constants_are_copied_once_at_the_edge(target):
    mod = views_of_inputs_constants_and_outputs()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 3})
    plan = exe.plan(*args)
    assert [s.label for s in plan.steps] == ["op exp"]
    # e is written into the caller's array; the views of x and of the constant, and e's views
    # (their base is returned already), are copied
    assert [pos for pos, _ in plan.copies] == [0, 1, 3, 4]
    outs = check(exe, mod, args)
    outs[1][...] = 0  # writing a result never writes the module's weight
    outs[0][...] = 0
    again = check(exe, mod, args)
    assert np.all(again[1] == W[:, None, :]) and not np.all(args[0] == 0)


def test_a_view_of_a_readonly_input_is_never_written(target):
    mod = views_of_a_constant_feeding_kernels()
    exe = dpl.build(mod, target)
    (x,) = args_for(mod, {"n": 4})
    x.setflags(write=False)
    check(exe, mod, [x])
    assert exe.plan(x).view_count == 3


def test_a_base_outlives_its_last_view(target):
    mod = one_view_two_readers()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 5})
    plan = exe.plan(*args)
    check(exe, mod, args)
    base = next(plan.base_of(b) for s in plan.steps for b in s.inputs if plan.buffers[b].kind == "view")
    last = max(i for i, s in enumerate(plan.steps) for b in s.inputs if plan.base_of(b) == base)
    first = next(i for i, s in enumerate(plan.steps) if base in s.outputs)
    for i, s in enumerate(plan.steps):  # nothing written during the base's life takes its slot
        for b in s.outputs:
            if first < i <= last and b in plan.slot_of:
                assert plan.slot_of[b] != plan.slot_of[base], f"step {i} ({s.label}) overwrites a live view"


@pytest.mark.parametrize("contiguous", [True, False])
def test_out_arrays_receive_returned_views(target, contiguous):
    mod = chain_at_the_output()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 6})
    want = dpl.interpret(mod, *args)
    out = np.zeros((6, 8), np.float32) if contiguous else np.zeros((8, 6), np.float32).T
    assert exe(*args, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_a_strided_out_array_whose_value_is_viewed_later(target):
    """e is returned into a transposed out= array and read again through a view: the view must
    see what the kernel wrote, not what the array held before."""
    def body(fb, x):
        e = fb.emit("exp", x)
        return e, fb.emit("tanh", fb.emit("reshape", e, shape=["n", 8]))

    mod = main([("x", ("n", 2, 4))], body)
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 6})
    want = dpl.interpret(mod, *args)
    out = (np.zeros((4, 2, 6), np.float32).T, np.zeros((6, 8), np.float32))  # no reshape of out[0] is a view
    exe(*args, out=out)
    for o, w in zip(out, want):
        np.testing.assert_allclose(o, w, rtol=1e-6)


def test_threads_calling_at_once_get_their_own_results(target):
    mod = views_of_inputs_constants_and_outputs()
    exe = dpl.build(mod, target)
    inputs = [args_for(mod, {"n": 1 + i % 3}, seed=i) for i in range(8)]
    wants = [leaves(dpl.interpret(mod, *a)) for a in inputs]
    wrong = []

    def worker(i):
        for _ in range(20):
            got = leaves(exe(*inputs[i]))
            if not all(np.allclose(g, w, rtol=1e-5) for g, w in zip(got, wants[i])):
                wrong.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


# -- the CUDA path (the stand-in CuPy) ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["lone_between_kernels", "views_of_inputs_constants_and_outputs", "group_of_views_only"])
def test_views_on_the_device(cxx, name):
    import fake_cupy
    from dpl.backends.cuda.backend import CupyBackend

    fake = fake_cupy.FakeCupy()
    mod = MODULES[name]()
    exe = dpl.build(mod, [CupyBackend(cupy=fake, block=8), "numpy"])
    for seed in (0, 1, 2):  # step by step, captured, replayed
        args = args_for(mod, {"n": 5}, seed)
        outs = check(exe, mod, args)
        assert_independent(outs, args, [W])
    plan = exe.plan(*args)
    device = exe._device_runner().device_plan(plan)
    assert len(device.steps) == len(plan.steps) and plan.view_count > 0
    assert "CUDA graph captured" in exe.summary()


def test_a_group_of_views_is_no_kernel_in_the_coverage_table(target):
    """What the build did (from_executable) and what decide() predicts agree on a group of
    views, and the coverage table says it runs as no kernel."""
    from dpl.viz.coverage import coverage
    from dpl.viz.runtime import VIEWS_ONLY, decide, from_executable

    mod = group_of_views_only()
    exe = dpl.build(mod, target)
    exe(*args_for(mod, {"n": 8}))
    built, asked = from_executable(exe), decide(mod, target)
    assert built["fused_reshape_expand_dims"] == asked["fused_reshape_expand_dims"]
    assert built["fused_reshape_expand_dims"].why == VIEWS_ONLY and built["fused_reshape_expand_dims"].backend is None
    assert f"at run time: {VIEWS_ONLY}" in coverage(mod, runtime=built).table()


def test_the_fusion_model_prices_a_view_apart_as_free():
    """Op by op, the plan runs a view as no kernel: the model's "apart" side counts no call,
    no bytes and no arithmetic for it (the "fused" side is unchanged)."""
    from dpl.runtime.cost import group_cost

    def make(view):
        def body(fb, x, b):
            y = fb.emit("exp", x)
            y = fb.emit("reshape", y, shape=[4, 16, 8]) if view else fb.emit("negative", y)
            return fb.emit("add", y if view else fb.emit("reshape", y, shape=[4, 16, 8]), b)
        return group("g", [("x", "f32", (64, 8)), ("b", "f32", (16, 8))], body)

    with_view, with_op = group_cost(make(True), [(64, 8), (16, 8)]), group_cost(make(False), [(64, 8), (16, 8)])
    x, b = 64 * 8 * 4, 16 * 8 * 4
    assert with_view.calls_apart == 2 and with_view.bytes_apart == (x + x) + (x + b + x)
    assert with_op.calls_apart == 3 and with_op.bytes_apart == with_view.bytes_apart + 2 * x
    assert with_view.bytes_fused == with_op.bytes_fused == x + b + x
    assert with_view.ops == 2 * 64 * 8 and with_op.ops == 3 * 64 * 8


def test_the_output_pool_recycles_a_returned_view_only_once_released(target):
    mod = chain_at_the_output()
    exe = dpl.build(mod, target)
    args = args_for(mod, {"n": 6})
    plan = exe.plan(*args)
    kept = exe(*args)
    before = plan.output_pool.reused
    second = exe(*args)  # the first result is still held: fresh memory
    assert not np.shares_memory(kept, second) and plan.output_pool.reused == before
    del second
    third = exe(*args)  # the second was released: its memory comes back, the kernel writes it
    assert plan.output_pool.reused == before + 1 and not np.shares_memory(kept, third)
    np.testing.assert_array_equal(kept, third)
