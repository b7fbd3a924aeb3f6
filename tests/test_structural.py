"""Structural equality and hashing of functions and modules; identity equality of nodes."""

import numpy as np

from dpl.ir import FunctionBuilder, Module, const, replace, structural_equal, structural_hash


def build(name="main", act="nn.relu", out_name="y", attrs=None, c=1.0):
    fb = FunctionBuilder(name, attrs=attrs)
    x = fb.param("x", "f32", ("n", 4))
    h = fb.emit("add", x, const(np.full(4, c, np.float32)), name="h")
    return Module([fb.ret(fb.emit(act, h, name=out_name))])


def test_equal_programs():
    a, b = build(), build()
    assert structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)


def test_nodes_compare_by_identity():
    a, b = build(), build()
    va, vb = a["main"].bindings[0].var, b["main"].bindings[0].var
    assert va != vb and va == va
    assert len({va, vb}) == 2


def test_differences_are_seen():
    base = build()
    for other in [build(act="exp"), build(out_name="z"), build(attrs={"Primitive": True}), build(c=2.0), build(name="f")]:
        assert not structural_equal(base, other)
        assert structural_hash(base) != structural_hash(other)


def test_names_can_be_ignored():
    assert structural_equal(build(), build(out_name="z"), names=False)
    assert structural_hash(build(), names=False) == structural_hash(build(out_name="z"), names=False)


def test_replace_makes_a_copy():
    mod = build()
    fn = mod["main"]
    fn2 = replace(fn, attrs={"Primitive": True})
    assert dict(fn.attrs) == {} and fn2.attrs["Primitive"] is True
    assert fn2.bindings is fn.bindings


def test_frozen():
    import attrs
    import pytest

    fn = build()["main"]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        fn.name = "other"
    with pytest.raises(TypeError):
        fn.attrs["Primitive"] = True
