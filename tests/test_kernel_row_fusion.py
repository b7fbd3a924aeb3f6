"""fuse_reductions: decomposed softmax / RMSNorm / LayerNorm become one row kernel each (kernel
side), and the row-fusion pass finds those chains in a larger function (partition side)."""

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module
from dpl.kernel import ir, lower_function
from dpl.kernel.row_fusion import find_row_groups, fuse_reductions

from test_kernel_lower import check, random_inputs


def softmax(fb, x):
    m = fb.emit("max", x, axis=[-1], keepdims=True)
    e = fb.emit("exp", fb.emit("subtract", x, m))
    return fb.emit("divide", e, fb.emit("sum", e, axis=[-1], keepdims=True))


def rms_norm(fb, h, w, casts, square="power"):
    x = fb.emit("astype", h, dtype="f32") if casts else h
    p = fb.emit("power", x, 2.0) if square == "power" else fb.emit("multiply", x, x)
    v = fb.emit("mean", p, axis=[-1], keepdims=True)
    y = fb.emit("multiply", x, fb.emit("rsqrt", fb.emit("add", v, 1e-6)))
    if casts:
        y = fb.emit("astype", y, dtype=h.ty.dtype)
    return fb.emit("multiply", w, y)


def layer_norm(fb, h, g, b, casts, use_variance=False):
    x = fb.emit("astype", h, dtype="f32") if casts else h
    mu = fb.emit("mean", x, axis=[-1], keepdims=True)
    d = fb.emit("subtract", x, mu)
    var = fb.emit("variance", x, axis=[-1], keepdims=True) if use_variance else fb.emit("mean", fb.emit("multiply", d, d), axis=[-1], keepdims=True)
    y = fb.emit("multiply", d, fb.emit("rsqrt", fb.emit("add", var, 1e-5)))
    if casts:
        y = fb.emit("astype", y, dtype=h.ty.dtype)
    return fb.emit("add", fb.emit("multiply", y, g), b)


def one_row_kernel(k):
    assert k.kind == "row", str(k)
    assert len(k.body) == 1 and isinstance(k.body[0], ir.Loop), str(k)
    return k


# -- kernel side: each decomposed chain, as a Primitive function, is one row kernel ------------


@pytest.mark.parametrize("dtype, tol", [("f32", 1e-5), ("f16", 2e-3)])
def test_decomposed_softmax_is_one_row_kernel(dtype, tol):
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    x = fb.param("x", dtype, ("n", 10))
    one_row_kernel(check(fb.ret(softmax(fb, x)), rtol=tol, atol=tol))


@pytest.mark.parametrize("casts, dtype, tol", [(False, "f32", 1e-5), (True, "f16", 2e-3), (True, "f32", 1e-5)])
@pytest.mark.parametrize("square", ["power", "multiply"])
def test_decomposed_rms_norm_is_one_row_kernel(casts, dtype, tol, square):
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    h = fb.param("h", dtype, ("n", 16))
    w = fb.param("w", dtype, (16,))
    k = one_row_kernel(check(fb.ret(rms_norm(fb, h, w, casts, square)), rtol=tol, atol=tol))
    assert sum(isinstance(s, ir.Reduce) for s in ir.walk(k.body)) == 1


@pytest.mark.parametrize("casts, dtype, tol", [(False, "f32", 1e-4), (True, "f16", 3e-3)])
@pytest.mark.parametrize("use_variance", [False, True])
def test_decomposed_layer_norm_is_one_row_kernel(casts, dtype, tol, use_variance):
    fb = FunctionBuilder("f", attrs={"Primitive": True})
    h = fb.param("h", dtype, (2, "n", 12))
    g = fb.param("g", dtype, (12,))
    b = fb.param("b", dtype, (12,))
    one_row_kernel(check(fb.ret(layer_norm(fb, h, g, b, casts, use_variance)), rtol=tol, atol=tol))


# -- partition side: the pass finds the chains -------------------------------------------------


def same_numbers(before: Module, after: Module, tol=1e-5):
    arrays = random_inputs(before["main"])
    want = dpl.interpret(before, *arrays)
    got = dpl.interpret(after, *arrays)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def primitives(mod):
    return [f for f in mod.functions.values() if f.attrs.get("Primitive")]


@pytest.mark.parametrize("casts", [False, True])
def test_pass_groups_rms_norm_between_matmuls(casts):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 8))
    w1 = fb.param("w1", "f32", (8, 16))
    g = fb.param("g", "f32", (16,))
    w2 = fb.param("w2", "f32", (16, 4))
    h = fb.emit("matmul", x, w1)
    y = rms_norm(fb, h, g, casts)
    mod = Module([fb.ret(fb.emit("matmul", y, w2))])
    out = fuse_reductions(mod)
    (prim,) = primitives(out)
    assert len(prim.bindings) == (8 if casts else 6)
    assert {b.value.op for b in out["main"].bindings} == {"matmul", dpl.GlobalVar(prim.name)}
    one_row_kernel(lower_function(prim))
    same_numbers(mod, out)
    assert primitives(mod) == []  # the input is untouched


def test_pass_groups_softmax_and_layer_norm_separately():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 6))
    w = fb.param("w", "f32", (6, 6))
    g = fb.param("g", "f32", (6,))
    b = fb.param("b", "f32", (6,))
    s = softmax(fb, x)
    m = fb.emit("matmul", s, w)
    mod = Module([fb.ret(layer_norm(fb, m, g, b, casts=False))])
    out = fuse_reductions(mod)
    prims = primitives(out)
    assert len(prims) == 2
    for p in prims:
        one_row_kernel(lower_function(p))
    same_numbers(mod, out)


def test_pass_keeps_groups_convex_across_a_residual():
    # h feeds the first norm and, through a matmul, the residual add that feeds the second:
    # pulling that add into the first group would make a cycle through the matmul
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    a = fb.param("a", "f32", (4, 8))
    w = fb.param("w", "f32", (8, 8))
    g = fb.param("g", "f32", (8,))
    h = fb.emit("add", x, a)
    n1 = rms_norm(fb, h, g, casts=False)
    h2 = fb.emit("add", h, fb.emit("matmul", n1, w))
    n2 = rms_norm(fb, h2, g, casts=False)
    mod = Module([fb.ret(n2)])
    out = fuse_reductions(mod)
    prims = primitives(out)
    assert len(prims) == 2
    # h is needed by the residual add: the first group makes it an output too
    assert any(isinstance(p.ret, dpl.Tuple) for p in prims)
    for p in prims:
        one_row_kernel(lower_function(p))
    same_numbers(mod, out)


def test_pass_ignores_other_axes_and_lone_reductions():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    s0 = fb.emit("sum", fb.emit("exp", x), axis=[0], keepdims=True)  # not the last axis
    s1 = fb.emit("max", x, axis=[1], keepdims=False)  # no keepdims
    s2 = fb.emit("sum", x, axis=[1], keepdims=True)  # alone: nothing around it on the rows
    mod = Module([fb.ret(s0, s1, s2)])
    assert find_row_groups(mod["main"]) == [[3]]
    assert primitives(fuse_reductions(mod)) == []


def test_pass_schedules_the_call_after_late_inputs():
    # the weight is computed after the chain starts: the fused call must follow it
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (3, 5))
    v = fb.param("v", "f32", (5,))
    m = fb.emit("max", x, axis=[-1], keepdims=True)
    d = fb.emit("subtract", x, m)
    w = fb.emit("sqrt", fb.emit("abs", v))  # [5]: not row-shaped, stays in main
    y = fb.emit("multiply", d, w)
    mod = Module([fb.ret(y)])
    out = fuse_reductions(mod)
    (prim,) = primitives(out)
    names = [b.var.name for b in out["main"].bindings]
    assert names.index(w.name) < names.index(y.name)
    same_numbers(mod, out)


def test_pass_is_idempotent_and_leaves_dead_chains():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (3, 5))
    softmax(fb, fb.emit("negative", x))  # dead: nothing uses it
    mod = Module([fb.ret(softmax(fb, x))])
    once = fuse_reductions(mod)
    assert len(primitives(once)) == 1
    twice = fuse_reductions(once)
    assert sorted(twice.functions) == sorted(once.functions)
    assert [b.var.name for b in twice["main"].bindings] == [b.var.name for b in once["main"].bindings]
    same_numbers(mod, twice)
