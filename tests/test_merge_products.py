"""Merged products: parallel matmuls over one input and constant weights become one wider product."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.transform.merge_products import merge_products

RNG = np.random.default_rng(1)


def _w(*shape, name):
    return const(RNG.standard_normal(shape).astype("float32"), name=name)


def _ops(mod, fn="main"):
    return [b.value.op if hasattr(b.value, "op") else type(b.value).__name__ for b in mod[fn].bindings]


def qkv(bias: bool):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    outs = []
    for name, width in (("q", 16), ("k", 8), ("v", 8)):
        y = fb.emit("matmul", x, _w(16, width, name=f"w{name}"), name=f"{name}_mm")
        if bias:
            y = fb.emit("add", y, _w(width, name=f"b{name}"), name=name)
        outs.append(y)
    k_t = fb.emit("permute_dims", fb.emit("concat", [outs[1], outs[2]], axis=-1, name="kv"), name="kv_t")
    s = fb.emit("matmul", outs[0], k_t, name="s")
    return Module([fb.ret(s)])


@pytest.mark.parametrize("bias", [False, True])
def test_qkv_products_become_one_and_compute_the_same(bias):
    mod = qkv(bias)
    merged = merge_products(mod)
    ops = _ops(merged)
    assert ops.count("matmul") == 2  # the merged projection and the scores
    assert ops.count("split") == 0 and ops.count("add") == (1 if bias else 0)
    slices = [b.value for b in merged["main"].bindings if getattr(b.value, "op", None) == "strided_slice"]
    # one slice of the wide product per branch, its columns in branch order
    assert [(s.attrs["begin"], s.attrs["end"]) for s in slices] == [((0,), (16,)), ((16,), (24,)), ((24,), (32,))]
    a = RNG.standard_normal((5, 16)).astype("float32")
    np.testing.assert_allclose(dpl.interpret(merged, a), dpl.interpret(mod, a), rtol=1e-5, atol=1e-5)
    assert _ops(mod).count("matmul") == 4  # the input is not changed
    for target in ("numpy", "cpu"):
        exe = dpl.build(dpl.apply(mod, ["llm", "cublas"]), target)
        np.testing.assert_allclose(exe(a), dpl.interpret(mod, a), rtol=1e-4, atol=1e-4)


def test_what_is_not_merged():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    w = fb.param("w", "f32", (16, 8))  # a parameter, not a constant
    a = fb.emit("matmul", x, w, name="a")
    b = fb.emit("matmul", x, _w(16, 8, name="wb"), name="b")
    c = fb.emit("matmul", x, _w(16, 8, name="wc"), name="c")
    cb = fb.emit("add", c, _w(8, name="bc"), name="cb")  # a bias on one branch only: separate groups
    h = fb.emit("astype", x, dtype="float16", name="h")
    d = fb.emit("matmul", h, const(RNG.standard_normal((16, 8)).astype("float16"), name="wd"), name="d")
    out = fb.emit("add", fb.emit("add", fb.emit("add", a, b, name="ab"), cb, name="abc"), fb.emit("astype", d, dtype="float32", name="d32"), name="out")
    mod = Module([fb.ret(out)])
    assert merge_products(mod) is mod


def test_apply_merges_by_default_and_can_be_told_not_to():
    mod = qkv(True)
    assert "strided_slice" in dpl.apply(mod, fuse=False, composites=False).script()
    assert "strided_slice" not in dpl.apply(mod, fuse=False, composites=False, merge_products=False).script()


def test_gate_and_up_make_one_composite_with_their_product():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    gate = fb.emit("matmul", x, _w(16, 32, name="wg"), name="gate")
    up = fb.emit("matmul", x, _w(16, 32, name="wu"), name="up")
    h = fb.emit("multiply", fb.emit("nn.silu", gate, name="act"), up, name="h")
    out = fb.emit("matmul", h, _w(32, 16, name="wd"), name="out")
    mod = Module([fb.ret(out)])
    trace = dpl.Trace()
    fused = dpl.apply(mod, ["rewrites", "llm"], trace=trace)
    # the merged product, its two halves and the SwiGLU over them: llm's matmul_glu
    assert 'composite("kernel.matmul_glu")' in fused.script()
    assert [a.op for a in trace.coverage()["main"].alone] == ["matmul"]  # the down projection: no epilogue
    a = RNG.standard_normal((7, 16)).astype("float32")
    np.testing.assert_allclose(dpl.build(fused, "cpu")(a), dpl.interpret(mod, a), rtol=1e-4, atol=1e-4)


# -- splits as slices (dpl.transform.split_slices) -------------------------------------------------


def split_three(returned: bool = False):
    """GPT-2's c_attn: one product split in three along the last axis, each part read alone."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    parts = fb.emit("split", fb.emit("matmul", x, _w(16, 24, name="w"), name="mm"), indices_or_sections=[8, 16], axis=-1,
                    name="parts")
    q, k, v = (fb.item(parts, i, name=n) for i, n in enumerate("qkv"))
    out = fb.emit("add", fb.emit("exp", q, name="eq"), fb.emit("multiply", k, v, name="kv"), name="out")
    return Module([fb.ret(out, parts) if returned else fb.ret(out)])


def test_split_items_become_slices_and_compute_the_same():
    from dpl.transform.split_slices import split_slices

    mod = split_three()
    sliced = split_slices(mod)
    assert "split" not in _ops(sliced) and _ops(sliced).count("strided_slice") == 3
    assert "split" in _ops(mod)  # the input is not changed
    a = RNG.standard_normal((5, 16)).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(sliced, a), dpl.interpret(mod, a))
    trace = dpl.Trace()
    fused = dpl.apply(mod, trace=trace)
    assert [x.op for x in trace.coverage()["main"].alone] == ["matmul"]  # each slice joined its user
    np.testing.assert_allclose(dpl.build(fused, "cpu")(a), dpl.interpret(mod, a), rtol=1e-5, atol=1e-5)


def test_a_split_read_as_a_tuple_stays():
    from dpl.transform.split_slices import split_slices

    mod = split_three(returned=True)
    assert split_slices(mod) is mod
    assert "split" in dpl.apply(mod, fuse=False).script()
    assert "split" in dpl.apply(split_three(), fuse=False, split_slices=False).script()
