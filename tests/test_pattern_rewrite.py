"""rewrite_call / rewrite_bindings: fixed points, "return the original = no match" with
top-level alternatives, dead-binding removal, type checks, fresh names, no mutation, the
LlamaRMSNorm decomposition rewritten into nn.rms_norm (checked numerically), and three
cases compared with TVM 0.27's rewrite_call (test_rewrite_simple, test_repeated_pattern_match,
test_backtrack_if_rewriter_returns_no_op)."""

from __future__ import annotations

import numpy as np
import pytest

import dpl
from dpl.ir import FunctionBuilder, Module, call, const
from dpl.pattern import (
    GraphPattern, RewriteNotConverged, RewriteTypeError, is_const, is_op, is_var, rewrite_bindings, rewrite_call,
    wildcard,
)
from _dpl_tvm import build_dpl, build_tvm

DOUBLE = [("param", "x", (16, 16), "float32"), ("x2", "add", ["x", "x"]), ("x4", "add", ["x2", "x2"])]


def ops(fn):
    return [getattr(b.value, "op", type(b.value).__name__) for b in fn.bindings]


def rng_inputs(fn, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for p in fn.params:
        shape = [3 if isinstance(d, str) else d for d in p.ty.shape]
        out.append((rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(p.ty.dtype))
    return out


def doubling():
    w = wildcard()
    return w, is_op("add")(w, w)


def test_rewrite_simple_reaches_a_fixed_point():
    fn, _ = build_dpl(DOUBLE)
    w, p = doubling()
    out = rewrite_call(p, lambda e, m: call("multiply", m[w], const(2.0)), fn)
    assert ops(out) == ["multiply", "multiply"]
    assert [b.var.name for b in out.bindings] == ["x2", "x4"]
    x = rng_inputs(fn)
    np.testing.assert_allclose(dpl.interpret(out, *x), dpl.interpret(fn, *x), rtol=1e-6)


def test_repeated_pattern_collapses_and_dead_bindings_go():
    fn, _ = build_dpl(DOUBLE)
    w = wildcard()
    inner = is_op("add")(w, w)
    out = rewrite_call(is_op("add")(inner, inner), lambda e, m: call("multiply", m[w], const(4.0)), fn)
    assert ops(out) == ["multiply"] and out.bindings[0].var.name == "x4"


def test_no_match_returns_the_same_function_object():
    fn, _ = build_dpl(DOUBLE)
    assert rewrite_call(is_op("exp")(wildcard()), lambda e, m: None, fn) is fn


def test_returning_the_original_tries_the_next_alternative():
    fn, _ = build_dpl(DOUBLE)
    w, v, u = wildcard(), wildcard(), wildcard()
    first, second = is_op("add")(w, w), is_op("add")(v, u)
    seen = []

    def rewriter(e, m):
        seen.append(first in m)
        if first in m:
            return e  # "no match": fall through to the next alternative
        return call("multiply", m[v], const(2.0))

    out = rewrite_call(first | second, rewriter, fn)
    assert ops(out) == ["multiply", "multiply"] and seen[:2] == [True, False]


def test_top_level_or_is_in_the_match():
    fn, _ = build_dpl(DOUBLE)
    p = is_op("add")(wildcard(), wildcard()) | is_op("exp")(wildcard())
    got = []
    rewrite_call(p, lambda e, m: got.append(m[p] is e), fn)
    assert got and all(got)


def test_non_convergence_names_the_pattern():
    fn, _ = build_dpl(DOUBLE)
    w, p = doubling()
    with pytest.raises(RewriteNotConverged) as err:
        # every round rebuilds the pattern one level deeper (an equal rebuild would be a fixed point)
        grow = lambda e, m: call("add", call("multiply", m[w], const(1.0)), call("multiply", m[w], const(1.0)))  # noqa: E731
        rewrite_call(p, grow, fn, max_iterations=5)
    assert "is_op('add')(w0, w0)" in str(err.value) and "test_pattern_rewrite.py" in str(err.value)


def test_a_replacement_of_another_type_is_rejected_naming_both_types():
    fn, _ = build_dpl(DOUBLE)
    w, p = doubling()
    with pytest.raises(RewriteTypeError) as err:
        rewrite_call(p, lambda e, m: call("sum", m[w]), fn)
    assert "f32[16, 16]" in str(err.value) and "f32[]" in str(err.value)


def test_functions_are_never_mutated_and_names_are_fresh():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    a = fb.emit("add", x, x, name="a")
    fb.emit("exp", x, name="a_0")  # the name a fresh binding would take first
    out_var = fb.emit("add", a, a, name="out")
    fn = fb.ret(out_var)
    before = fn.script()
    w = wildcard()
    # a nested replacement: exp(w) * 2 gets a new binding for exp(w)
    out = rewrite_call(is_op("add")(w, w), lambda e, m: call("multiply", call("exp", m[w]), const(2.0)), fn)
    assert fn.script() == before
    names = [b.var.name for b in out.bindings]
    assert len(names) == len(set(names)) and "a_1" in names
    x0 = rng_inputs(fn)
    expected = np.exp(np.exp(x0[0]) * 2) * 2
    np.testing.assert_allclose(dpl.interpret(out, *x0), expected, rtol=1e-5)


def test_matched_values_reuse_their_bindings():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    e = fb.emit("exp", x, name="e")
    r = fb.emit("nn.relu", e, name="r")
    fn = fb.ret(fb.emit("add", r, e, name="out"))
    inner = is_op("exp")(wildcard())
    p = is_op("nn.relu")(inner)
    out = rewrite_call(p, lambda v, m: call("maximum", m[inner], const(0.0)), fn)
    assert ops(out) == ["exp", "maximum", "add"]  # exp(x) not recomputed
    assert out.bindings[1].value.args[0] is out.bindings[0].var


def test_modules_rewrite_each_function_and_stay_unchanged_when_nothing_matches():
    fn, _ = build_dpl(DOUBLE)
    fb = FunctionBuilder("other")
    y = fb.param("y", "f32", (2,))
    other = fb.ret(fb.emit("exp", y))
    mod = Module([fn, other])
    w, p = doubling()
    new = rewrite_call(p, lambda e, m: call("multiply", m[w], const(2.0)), mod)
    assert new is not mod and new["other"] is other and ops(new["main"]) == ["multiply", "multiply"]
    assert rewrite_call(is_op("tanh")(wildcard()), lambda e, m: None, mod) is mod


# -- LlamaRMSNorm ---------------------------------------------------------------------------

def llama_rms_norm(dtype="f16", eps=1e-6):
    """hidden.to(f32); var = hidden.pow(2).mean(-1, keepdim=True); hidden * rsqrt(var + eps);
    weight * hidden.to(input_dtype) -- as the TT-XLA seed decomposes it."""
    fb = FunctionBuilder("main")
    h = fb.param("h", dtype, ("n", 64))
    w = fb.param("w", dtype, (64,))
    h32 = fb.emit("astype", h, dtype="f32", name="h32")
    sq = fb.emit("power", h32, 2.0, name="sq")
    var = fb.emit("mean", sq, axis=[-1], keepdims=True, name="var")
    ve = fb.emit("add", var, const(eps), name="ve")
    rs = fb.emit("rsqrt", ve, name="rs")
    normed = fb.emit("multiply", h32, rs, name="normed")
    back = fb.emit("astype", normed, dtype=dtype, name="back")
    out = fb.emit("multiply", w, back, name="out")
    return fb.ret(out)


def rms_norm_rule():
    h, w, eps = wildcard(), wildcard(), is_const()
    h32 = is_op("astype")(h, dtype="f32")
    var = is_op("mean")(is_op("power")(h32, is_const(2.0)), axis=[-1], keepdims=True)
    normed = is_op("multiply")(h32, is_op("rsqrt")(is_op("add")(var, eps)))
    pattern = is_op("multiply")(w, is_op("astype")(normed))

    def rewriter(expr, m):
        if m[h].ty.dtype != expr.ty.dtype:
            return expr
        return call("nn.rms_norm", m[h], m[w], axes=[-1], epsilon=float(m[eps].value))

    return pattern, rewriter


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_llama_rms_norm_becomes_nn_rms_norm(dtype):
    fn = llama_rms_norm(dtype)
    pattern, rewriter = rms_norm_rule()
    out = rewrite_call(pattern, rewriter, fn)
    assert ops(out) == ["nn.rms_norm"] and out.bindings[0].var.name == "out"
    assert out.bindings[0].value.attrs["epsilon"] == pytest.approx(1e-6)
    x = rng_inputs(fn, seed=3)
    want = dpl.interpret(fn, *x).astype(np.float64)
    got = dpl.interpret(out, *x).astype(np.float64)
    tol = 2e-3 if dtype == "f16" else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_rms_norm_with_the_weight_on_the_right_still_matches():
    fb = FunctionBuilder("main")
    h = fb.param("h", "f32", (4, 8))
    w = fb.param("w", "f32", (8,))
    h32 = fb.emit("astype", h, dtype="f32")
    var = fb.emit("mean", fb.emit("power", h32, 2.0), axis=[-1], keepdims=True)
    normed = fb.emit("multiply", fb.emit("rsqrt", fb.emit("add", var, const(1e-5))), h32)  # commuted
    out = fb.emit("multiply", fb.emit("astype", normed, dtype="f32"), w)  # commuted
    fn = fb.ret(out)
    pattern, rewriter = rms_norm_rule()
    new = rewrite_call(pattern, rewriter, fn)
    assert ops(new) == ["nn.rms_norm"]
    x = rng_inputs(fn)
    np.testing.assert_allclose(dpl.interpret(new, *x), dpl.interpret(fn, *x), rtol=1e-5, atol=1e-6)


def test_rms_norm_with_another_axis_is_left_alone():
    fb = FunctionBuilder("main")
    h = fb.param("h", "f32", (8, 8))
    w = fb.param("w", "f32", (8, 1))
    h32 = fb.emit("astype", h, dtype="f32")
    var = fb.emit("mean", fb.emit("power", h32, 2.0), axis=[0], keepdims=True)
    normed = fb.emit("multiply", h32, fb.emit("rsqrt", fb.emit("add", var, const(1e-5))))
    fn = fb.ret(fb.emit("multiply", w, fb.emit("astype", normed, dtype="f32")))
    pattern, rewriter = rms_norm_rule()
    assert rewrite_call(pattern, rewriter, fn) is fn
    why = dpl.explain(pattern, fn.ret, fn)
    assert not why and "attribute axis" in str(why)


# -- graph rewriting ---------------------------------------------------------------------------

def test_rewrite_bindings_merges_two_matmuls_sharing_an_input():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    w1 = fb.param("w1", "f32", (8, 6))
    w2 = fb.param("w2", "f32", (8, 6))
    m1 = fb.emit("matmul", x, w1, name="m1")
    m2 = fb.emit("matmul", x, w2, name="m2")
    fn = fb.ret(fb.emit("add", m1, m2, name="out"))
    inp, wa, wb = is_var(), is_var(), is_var()
    mm1, mm2 = is_op("matmul")(inp, wa), is_op("matmul")(inp, wb)
    graph = GraphPattern.union(inp.used_by(mm1, 0), inp.used_by(mm2, 0))

    def rewriter(matches, bindings):
        xv, a, b = (bindings[matches[mm1]].args[0], bindings[matches[mm1]].args[1], bindings[matches[mm2]].args[1])
        both = call("matmul", xv, call("concat", (a, b), axis=1))
        parts = call("split", both, indices_or_sections=2, axis=1)
        return {matches[mm1]: dpl.TupleGetItem(parts, 0), matches[mm2]: dpl.TupleGetItem(parts, 1)}

    out = rewrite_bindings(graph, rewriter, fn)
    assert ops(out)[:3] == ["concat", "matmul", "split"] and ops(out).count("matmul") == 1
    data = rng_inputs(fn)
    np.testing.assert_allclose(dpl.interpret(out, *data), dpl.interpret(fn, *data), rtol=1e-5)
    assert [b.var.name for b in fn.bindings] == ["m1", "m2", "out"]  # untouched


def test_rewrite_bindings_without_a_match_returns_the_function():
    fn, _ = build_dpl(DOUBLE)
    g = is_op("exp")(wildcard()) >> is_op("exp")(wildcard())
    assert rewrite_bindings(g, lambda m, b: {}, fn) is fn


# -- the same rewrites through TVM ----------------------------------------------------------------

def _tvm_ops(fn):
    return [b.value.op.name.removeprefix("relax.") for blk in fn.body.blocks for b in blk.bindings]


@pytest.mark.oracle
@pytest.mark.parametrize("repeated", [False, True], ids=["test_rewrite_simple", "test_repeated_pattern_match"])
def test_rewrite_oracle(tvm, repeated):
    from tvm import relax as rx
    from tvm.relax import dpl as t

    tfn, _ = build_tvm(DOUBLE)
    tw = t.wildcard()
    tp = t.is_op("relax.add")(tw, tw)
    factor = 4.0 if repeated else 2.0
    if repeated:
        tp = t.is_op("relax.add")(tp, tp)
    theirs = t.rewrite_call(tp, lambda e, m: rx.op.multiply(m[tw], rx.const(factor, "float32")), tfn)

    fn, _ = build_dpl(DOUBLE)
    w = wildcard()
    p = is_op("add")(w, w)
    if repeated:
        p = is_op("add")(p, p)
    mine = rewrite_call(p, lambda e, m: call("multiply", m[w], const(factor)), fn)
    assert ops(mine) == _tvm_ops(theirs)


@pytest.mark.oracle
def test_backtrack_oracle(tvm):
    """test_backtrack_if_rewriter_returns_no_op: the first alternative's rewriter declines."""
    from tvm import relax as rx
    from tvm.relax import dpl as t

    tfn, _ = build_tvm(DOUBLE)
    tw, tv, tu = t.wildcard(), t.wildcard(), t.wildcard()
    tfirst, tsecond = t.is_op("relax.add")(tw, tw), t.is_op("relax.add")(tv, tu)

    def trewriter(e, m):
        if tfirst in m:
            return e
        return rx.op.subtract(m[tv], rx.op.negative(m[tu]))

    theirs = t.rewrite_call(tfirst | tsecond, trewriter, tfn)

    fn, _ = build_dpl(DOUBLE)
    w, v, u = wildcard(), wildcard(), wildcard()
    first, second = is_op("add")(w, w), is_op("add")(v, u)
    mine = rewrite_call(first | second, lambda e, m: e if first in m else call("subtract", m[v], call("negative", m[u])), fn)
    assert ops(mine) == _tvm_ops(theirs)


def test_bad_rewriter_results_are_clear_errors():
    from dpl.pattern import RewriteError

    fn, _ = build_dpl(DOUBLE)
    w, p = doubling()
    with pytest.raises(RewriteError, match="not an expression"):
        rewrite_call(p, lambda e, m: [m[w]], fn)
    g = is_op("add")(wildcard(), wildcard()) ^ is_op("add")(wildcard(), wildcard())
    with pytest.raises(RewriteError, match="must return a mapping"):
        rewrite_bindings(g, lambda m, b: [1], fn)
    with pytest.raises(RewriteError, match="not a binding"):
        rewrite_bindings(g, lambda m, b: {fn.params[0]: fn.params[0]}, fn)


def test_an_equal_rebuild_is_a_fixed_point_and_leaves_the_function_alone():
    """Relax stops when a round gives a structurally equal function (the input is returned,
    not simplified)."""
    fn, _ = build_dpl([("param", "x", (4,), "float32"), ("a", "exp", ["x"]), ("b", "alias", "a"), ("c", "add", ["b", "b"])])
    w = wildcard()
    assert rewrite_call(is_op("exp")(w), lambda e, m: call("exp", m[w]), fn) is fn
