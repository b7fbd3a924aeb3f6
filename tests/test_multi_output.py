"""``fuse_ops(mod, multi_output=True)`` (dpl.transform.multi_output): a lone op at most injective
joins the group that computes everything it reads, as one more output of that group; TVM's
grouping (the default) leaves it alone. Built for cpu (compiled, no fall-back) and numpy and
compared with the interpreter on random inputs."""

import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module
from dpl.transform import fuse_ops, fusion_groups

ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)
rng = np.random.default_rng(3)


def mask_read_by_two(*, mask_from_two_groups=False):
    """The decoder's mask: a test of the padding (one group), where() of it read only by opaque
    calls (here: two exps kept apart by being returned), and the test read again by a reduction."""
    fb = FunctionBuilder("main")
    am = fb.param("am", "i64", (2, "n"))
    s = fb.param("s", "f32", (2, "n", "n"))
    keep = fb.emit("expand_dims", fb.emit("astype", am, dtype="bool", name="keep0"), axis=[1], name="keep")
    zero, other = 0.0, None
    if mask_from_two_groups:  # a second group's value (returned, so its group ends there) read as well
        other = fb.emit("exp", fb.emit("sum", s, axis=[-1], keepdims=True, name="rows"), name="other")
        zero = other
    bias = fb.emit("where", keep, zero, -1e9, name="bias")
    guard = fb.emit("max", fb.emit("astype", keep, dtype="f32", name="keepf"), axis=[-1], keepdims=True, name="guard")
    a = fb.emit("nn.softmax", fb.emit("add", s, bias, name="m1"), name="p1")  # softmax: a kernel of its own
    return Module([fb.ret(a, bias, guard, *([other] if other is not None else []))])


def names(mod, groups):
    return [[mod["main"].bindings[i].var.name for i in g] for g in groups]


def test_the_where_joins_its_producers_group_only_when_asked():
    mod = mask_read_by_two()
    tvm = names(mod, fusion_groups(mod["main"]))
    multi = names(mod, fusion_groups(mod["main"], multi_output=True))
    assert not any("bias" in g for g in tvm)
    # the where, then the add that reads it (and the parameter s), each one more output of the group
    assert ["keep0", "keep", "bias", "m1"] in multi
    assert dpl.structural_equal(fuse_ops(mod), fuse_ops(mod, multi_output=False))


def test_a_where_reading_two_groups_joins_neither():
    mod = mask_read_by_two(mask_from_two_groups=True)
    multi = names(mod, fusion_groups(mod["main"], multi_output=True))
    assert ["keep0", "keep"] in multi  # the where reads two groups: it joins neither
    assert ["bias", "m1"] in multi  # the add joins the where, the only computed value it reads


@pytest.mark.parametrize("target", ["cpu", "numpy"])
def test_the_joined_group_computes_the_same(target):
    if target == "cpu":
        needs.c_compiler()
    mod = mask_read_by_two()
    fused = fuse_ops(mod, views=True, multi_output=True)
    am = (rng.random((2, 5)) > 0.3).astype(np.int64)
    s = rng.standard_normal((2, 5, 5)).astype(np.float32)
    exe = dpl.build(fused, target, config=ALWAYS)
    for want, got in zip(dpl.interpret(mod, am, s), exe(am, s)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if target == "cpu":
        assert "fall-back" not in exe.summary().split("plan for")[0]


def test_apply_turns_it_on_and_can_be_told_not_to():
    mod = mask_read_by_two()
    trace = dpl.Trace()
    dpl.apply(mod, trace=trace)
    assert "where" not in [a.op for a in trace.coverage()["main"].alone]
    trace = dpl.Trace()
    dpl.apply(mod, multi_output=False, trace=trace)
    assert "where" in [a.op for a in trace.coverage()["main"].alone]
