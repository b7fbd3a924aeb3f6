"""Memory planning: peak bytes of hand-computed plans; outputs never alias a reused buffer."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module
from runtime_corpus import CORPUS, inputs_for

F32_16x16 = 16 * 16 * 4  # 1024 bytes


def build_main(body, params=(("x", (16, 16)),)):
    fb = FunctionBuilder("main")
    vs = [fb.param(n, "f32", s) for n, s in params]
    out = body(fb, *vs)
    mod = Module([fb.ret(*out) if isinstance(out, tuple) else fb.ret(out)])
    return mod, dpl.build(mod, "numpy")


def check(mod, exe):
    args = inputs_for(mod, {})
    got, want = exe(*args), dpl.interpret(mod, *args)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)
    return exe.plan(*args)


def test_a_chain_needs_two_buffers():
    # relu -> exp -> negative -> tanh -> abs: t1 s0 | t2 s1, t1 dies | t3 s0, t2 dies | t4 s1 | out fresh
    mod, exe = build_main(lambda fb, x: fb.emit("abs", fb.emit("tanh", fb.emit("negative", fb.emit("exp", fb.emit("nn.relu", x))))))
    plan = check(mod, exe)
    assert plan.slot_sizes == [F32_16x16, F32_16x16]
    assert plan.peak_bytes == 2 * F32_16x16
    assert plan.unplanned_bytes == 4 * F32_16x16
    assert plan.output_bytes == F32_16x16
    assert [plan.slot_of[b] for s in plan.steps[:4] for b in s.outputs] == [0, 1, 0, 1]


def test_a_diamond_keeps_its_fork_alive():
    # a = relu(x) s0; b = exp(a) s1; c = tanh(a) s2 (a still live), a dies; d = add(b, c) s0; out = negative(d)
    def body(fb, x):
        a = fb.emit("nn.relu", x)
        return fb.emit("negative", fb.emit("add", fb.emit("exp", a), fb.emit("tanh", a)))

    plan = check(*build_main(body))
    assert plan.peak_bytes == 3 * F32_16x16
    assert [plan.slot_of[b] for s in plan.steps[:4] for b in s.outputs] == [0, 1, 2, 0]


def test_a_small_value_reuses_the_best_fitting_free_buffer():
    # t1 = relu(x) 1024 B s0; t2 = sum(t1, axis 1) 64 B s1, t1 dies; t3 = exp(t2) 64 B -> s0 (the only free one)
    # t2 dies; t4 = abs(t3) 64 B -> s1; out = negative(t4) is fresh
    def body(fb, x):
        t2 = fb.emit("sum", fb.emit("nn.relu", x), axis=[1])
        return fb.emit("negative", fb.emit("abs", fb.emit("exp", t2)))

    plan = check(*build_main(body))
    assert plan.slot_sizes == [F32_16x16, 64]
    assert plan.peak_bytes == F32_16x16 + 64
    assert [plan.slot_of[b] for s in plan.steps[:3] for b in s.outputs] == [0, 1, 0]


def test_best_fit_prefers_the_smallest_buffer_that_fits():
    # small = sum(x) 64 B s0; big = relu(x) 1024 B s1; c = exp(small) 64 B s2, small dies;
    # d = tanh(big) 1024 B s3, big dies -> free: s0 (64 B), s1 (1024 B);
    # e = abs(c) 64 B takes s0, the smallest that fits, not s1; c dies -> s2;
    # ex = negative(e) 64 B takes s2 (s1 is bigger); out = add(d, ex) is fresh
    def body(fb, x):
        small = fb.emit("sum", x, axis=[1], keepdims=True)
        big = fb.emit("nn.relu", x)
        c = fb.emit("exp", small)
        d = fb.emit("tanh", big)
        e = fb.emit("abs", c)
        return fb.emit("add", d, fb.emit("negative", e))

    plan = check(*build_main(body))
    slots = [plan.slot_of[b] for s in plan.steps[:6] for b in s.outputs]
    assert slots == [0, 1, 2, 3, 0, 2]
    assert plan.slot_sizes == [64, F32_16x16, 64, F32_16x16]
    assert plan.peak_bytes == 2 * F32_16x16 + 2 * 64


def test_values_returned_are_never_arena_buffers():
    # a tuple output whose first field is also read later: it is an output, not a temporary
    def body(fb, x):
        a = fb.emit("exp", x)
        b = fb.emit("nn.relu", a)
        return a, fb.emit("negative", b), a, x

    mod, exe = build_main(body)
    plan = check(mod, exe)
    assert plan.peak_bytes == F32_16x16  # only b lives in the arena
    assert len(plan.copies) == 2  # the duplicate a and the input x are copied


@pytest.mark.parametrize("case", list(CORPUS))
def test_outputs_never_alias_the_arena_inputs_or_each_other(case):
    make, dims = CORPUS[case]
    mod = make()
    exe = dpl.build(mod, "numpy", config=dpl.FusionConfig(min_tensor_elements=1))
    args = inputs_for(mod, dims)
    outs = exe(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    plan = exe.plan(*args)
    temps = [v for views in plan._views.values() for b, v in enumerate(views) if b in plan.slot_of]
    for i, o in enumerate(outs):
        assert not any(np.shares_memory(o, t) for t in temps)
        assert not any(np.shares_memory(o, a) for a in args)
        assert not any(np.shares_memory(o, p) for p in outs[:i])
    again = exe(*args)
    for o, p in zip(outs, again if isinstance(again, tuple) else (again,)):
        assert not np.shares_memory(o, p)
        np.testing.assert_array_equal(o, p)  # the first results were not overwritten by the second run


def test_a_value_never_read_is_freed_at_once():
    def body(fb, x):
        fb.emit("exp", x)  # dead
        return fb.emit("negative", fb.emit("nn.relu", x))

    plan = check(*build_main(body))
    assert plan.peak_bytes == F32_16x16  # the dead value's buffer is reused by relu


# -- an invariant on random graphs -----------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

UNARY = ["nn.relu", "exp", "tanh", "negative", "abs", "sigmoid"]


@st.composite
def random_graphs(draw):
    """A random DAG of unary and binary ops over values of two sizes, some returned, some dead;
    views (runs of reshape, expand_dims and squeeze, an op between) of inputs and values."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (8, 16))
    values = [x]
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "view"]))
        a = draw(st.sampled_from(values))
        if kind == "view":  # viewed as another shape, maybe an op there, viewed back
            shape = list(a.ty.shape)
            if draw(st.booleans()):
                v = fb.emit("expand_dims", fb.emit("reshape", a, shape=[shape[0] * shape[1]]), axis=[0])
            else:
                v = fb.emit("expand_dims", a, axis=[0])
            if draw(st.booleans()):
                v = fb.emit(draw(st.sampled_from(UNARY)), v)
            values.append(fb.emit("reshape", fb.emit("squeeze", v, axis=[0]), shape=shape))
        elif kind == "unary":
            values.append(fb.emit(draw(st.sampled_from(UNARY)), a))
        elif kind == "binary":
            b = draw(st.sampled_from(values))
            values.append(fb.emit(draw(st.sampled_from(["add", "multiply", "subtract"])), a, b))
        elif a.ty.shape == (8, 16):
            values.append(fb.emit("max", a, axis=[1], keepdims=True))  # (8, 1): broadcasts back
    outs = draw(st.lists(st.sampled_from(values[1:] or values), min_size=1, max_size=3))
    return Module([fb.ret(*outs)])


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_no_two_live_values_share_a_buffer(mod):
    exe = dpl.build(mod, "numpy")
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    got, want = exe(x), dpl.interpret(mod, x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(g, w)
    plan = exe.plan(x)
    live = {}  # buffer -> (first step, last step), a view's reads counted on its base
    for i, s in enumerate(plan.steps):
        for b in (*map(plan.base_of, s.inputs), *s.outputs):
            first, _ = live.get(b, (i, i))
            live[b] = (first, i)
    for pos, b in plan.copies:
        live[plan.base_of(b)] = (live.get(plan.base_of(b), (0, 0))[0], len(plan.steps))
    assert all(plan.buffers[b].kind in ("temp", "output") for s in plan.steps for b in s.outputs)
    temps = sorted(plan.slot_of)
    for i, a in enumerate(temps):
        assert plan.buffers[a].nbytes <= plan.slot_sizes[plan.slot_of[a]]
        for b in temps[i + 1:]:
            if plan.slot_of[a] == plan.slot_of[b]:
                (a0, a1), (b0, b1) = live[a], live[b]
                assert a1 < b0 or b1 < a0, f"buffers {a} and {b} share slot {plan.slot_of[a]} while both live"
    assert plan.peak_bytes <= plan.unplanned_bytes
