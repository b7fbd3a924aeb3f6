"""``fuse_ops(mod, rematerialize=True)`` (dpl.transform.rematerialize): an op that reads no
tensor, read by several groups, is copied into each of them (T5's ``arange(seq)``); TVM's
grouping (the default) leaves it alone. Built for cpu (compiled, no fall-back) and numpy and
compared with the interpreter on random inputs."""

import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module
from dpl.transform import fuse_ops
from dpl.transform.rematerialize import copy_sources

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def range_read_twice(second_reader="tanh"):
    """positions = arange(n), read by two chains that end in two results."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n",))
    r = fb.emit("arange", end="n", dtype="f32", name="positions")
    a = fb.emit("exp", fb.emit("add", x, r, name="shifted"), name="a")
    b = fb.emit("multiply", x, r, name="scaled")
    b = fb.emit(second_reader, b, name="b") if second_reader else b
    return Module([fb.ret(a, b)])


def ops_alone(mod):
    return [b.value.op for b in mod["main"].bindings if isinstance(b.value.op, str)]


def test_a_range_read_by_two_groups_is_computed_in_each():
    mod = range_read_twice()
    assert "arange" in ops_alone(fuse_ops(mod, views=True))
    fused = fuse_ops(mod, views=True, rematerialize=True)
    assert ops_alone(fused) == []
    bodies = [[b.value.op for b in fn.bindings] for fn in fused.functions.values() if "Primitive" in fn.attrs]
    assert sorted(bodies) == [["arange", "add", "exp"], ["arange", "multiply", "tanh"]]
    assert dpl.structural_equal(fuse_ops(mod), fuse_ops(mod, rematerialize=False))


def test_copies_that_would_stand_alone_are_not_made():
    # the second reader is a gather (opaque): a copy of the range before it would stand alone
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, "n"))
    r = fb.emit("arange", end="n", dtype="i64", name="positions")
    a = fb.emit("exp", fb.emit("add", x, fb.emit("astype", r, dtype="f32", name="rf"), name="shifted"), name="a")
    prod = fb.emit("take", x, r, axis=1, name="p")
    mod = Module([fb.ret(a, prod)])
    copied, copies = copy_sources(mod["main"])
    assert len(copies) == 1 and len(copies[0]) == 2  # made here...
    fused = fuse_ops(mod, views=True, rematerialize=True)
    assert dpl.structural_equal(fused, fuse_ops(mod, views=True))  # ...but one copy would stay alone


@pytest.mark.parametrize("target", ["cpu", "numpy"])
def test_the_copies_compute_the_same(target):
    if target == "cpu":
        needs.c_compiler()
    mod = range_read_twice()
    fused = fuse_ops(mod, views=True, rematerialize=True)
    x = np.random.default_rng(4).standard_normal(7).astype(np.float32)
    exe = dpl.build(fused, target, config=ALWAYS)
    for want, got in zip(dpl.interpret(mod, x), exe(x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if target == "cpu":
        assert "fall-back" not in exe.summary().split("plan for")[0]


def test_apply_turns_it_on():
    trace = dpl.Trace()
    dpl.apply(range_read_twice(), trace=trace)
    assert [a.op for a in trace.coverage()["main"].alone] == []
    trace = dpl.Trace()
    dpl.apply(range_read_twice(), rematerialize=False, trace=trace)
    assert [a.op for a in trace.coverage()["main"].alone] == ["arange"]
