"""``dpl.explain``: the first sub-pattern that failed, the expression it met, and why;
plus graph-pattern contexts, further graph assignments, FusionPattern and PatternSet."""

from __future__ import annotations

import pytest

import dpl
from dpl.ir import FunctionBuilder, call
from dpl.pattern import (
    CheckContext, FusionPattern, GraphPattern, NoMatch, PatternContext, PatternError, PatternSet, RewriteRule,
    explain, is_const, is_op, is_var, iter_graph_matches, match_graph, wildcard,
)


def fn_and_vars():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f16", ("n", 8))
    e1 = fb.emit("exp", x, name="e1")
    e2 = fb.emit("exp", x, name="e2")
    t = fb.emit("add", e1, e2, name="t")
    mn = fb.emit("mean", t, axis=[-1], keepdims=True, name="mn")
    return fb.ret(mn), dict(x=x, e1=e1, e2=e2, t=t, mn=mn)


def test_explain_wrong_op():
    fn, v = fn_and_vars()
    inner = is_op("nn.relu")(wildcard())
    report = explain(is_op("add")(inner, wildcard()), v["t"], fn)
    assert not report and report.failure.pattern is inner and report.failure.kind == "op"
    text = str(report)
    assert "does not match t = add(e1, e2)" in text
    assert "met         e1 = exp(x)" in text and "expected op nn.relu, found exp" in text
    assert "test_pattern_explain.py" in text


def test_explain_attribute():
    fn, v = fn_and_vars()
    report = explain(is_op("mean")(wildcard(), keepdims=False), v["mn"], fn)
    assert report.failure.kind == "attribute" and "attribute keepdims: expected False, found True" in str(report)


def test_explain_dtype_and_shape():
    fn, v = fn_and_vars()
    assert explain(is_op("exp")(wildcard()).has_dtype("f32"), v["e1"], fn).failure.kind == "dtype"
    report = explain(wildcard().has_shape(["n", 4]), v["e1"], fn)
    assert report.failure.kind == "shape" and "dimension 1 is 8, not 4" in str(report)


def test_explain_consistency_conflict():
    fn, v = fn_and_vars()
    w = wildcard()
    report = explain(is_op("add")(w, w), v["t"], fn)
    assert report.failure.kind == "consistency"
    assert "already matched e1 = exp(x)" in str(report) and "e2 = exp(x)" in str(report)


def test_explain_bound_var():
    fn, v = fn_and_vars()
    report = explain(is_op("mean")(is_var()), v["mn"], fn)
    assert report.failure.kind == "bound-var" and "t is bound in the function" in str(report)


def test_explain_lists_each_alternative():
    fn, v = fn_and_vars()
    p = is_op("nn.relu")(wildcard()) | is_op("sigmoid")(wildcard())
    text = str(explain(p, v["e1"], fn))
    assert "none of the alternatives" in text and "found exp" in text and "expected op sigmoid" in text


def test_explain_of_a_match_shows_the_bindings():
    fn, v = fn_and_vars()
    w = wildcard()
    report = explain(is_op("exp")(w), v["e1"], fn)
    assert report and report.matched and "wildcard() -> x" in str(report)


# -- graph patterns: contexts, further assignments ----------------------------------------------

def chain_fn():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    outs = []
    for i in range(3):
        e = fb.emit("exp", x, name=f"e{i}")
        outs.append(fb.emit("nn.relu", e, name=f"r{i}"))
    return fb.ret(fb.emit("concat", tuple(outs), axis=0, name="cat"))


def test_pattern_context_collects_edges_and_nests():
    fn = chain_fn()
    with PatternContext() as outer:
        e, r = is_op("exp")(wildcard()), is_op("nn.relu")(wildcard())
        e >> r
        with PatternContext(incremental=True) as inner:
            r ^ is_op("concat")(wildcard())
            assert PatternContext.current() is inner
            assert len(inner.edges) == 2
            assert inner.match_function(fn)
        assert PatternContext.current() is outer and len(outer.edges) == 1
        got = outer.match_dfb(fn)
        assert got[e].name == "e0" and got[r].name == "r0"
    assert PatternContext.current() is None


def test_the_same_edge_twice_in_a_context_is_an_error():
    a, b = wildcard(), wildcard()
    with PatternContext():
        a ^ b
        with pytest.raises(PatternError):
            a ^ b


def test_further_assignments_come_from_a_separate_call():
    fn = chain_fn()
    g = is_op("exp")(wildcard()) >> is_op("nn.relu")(wildcard())
    first = match_graph(g, fn)
    every = list(iter_graph_matches(g, fn))
    assert [m[g[0]].name for m in every] == ["e0", "e1", "e2"]
    assert every[0] == first


def test_uses_in_the_return_are_not_counted():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    e = fb.emit("exp", x, name="e")
    r = fb.emit("nn.relu", e, name="r")
    fn = fb.ret(e, r)  # e is returned as well: still "only used by" r
    assert match_graph(is_op("exp")(wildcard()) >> is_op("nn.relu")(wildcard()), fn)


def test_graph_no_match_says_why():
    fn = chain_fn()
    e = is_op("exp")(wildcard())
    got = match_graph(e >> is_op("sigmoid")(wildcard()), fn)
    assert isinstance(got, NoMatch) and not got and "sigmoid" in str(got)
    got = match_graph(GraphPattern((), (e,)), fn)
    assert not got and "no edges" in got.reason


def test_chains_index_their_patterns():
    a, b, c = wildcard(), wildcard(), wildcard()
    g = a >> b >> c
    assert (g[0], g[1], g[2]) == (a, b, c) and len(g.edges) == 2
    f = a.fork_to(b, c)
    assert [e.consumer for e in f.edges] == [b, c]


def test_dup_gives_an_independent_copy_of_a_chain():
    fn = chain_fn()
    x = is_var("x")
    chain = is_op("exp")(wildcard()) >> is_op("nn.relu")(wildcard())
    copy = chain.dup()
    assert copy[0] is not chain[0] and repr(copy[0]) == repr(chain[0]) and copy[0].origin == chain[0].origin
    three = GraphPattern.union(x.fork_to(chain, copy, chain.dup()), chain, copy)
    got = match_graph(three, fn)
    assert got and {got[chain[0]].name, got[copy[0]].name} <= {"e0", "e1", "e2"}
    assert got[chain[0]] is not got[copy[0]]
    four = GraphPattern.union(x.fork_to(chain, copy, chain.dup(), chain.dup()), chain, copy)
    assert not match_graph(four, fn)


def test_dup_keeps_sharing_inside_a_pattern():
    w = wildcard()
    p = is_op("add")(w, w)
    q = p.dup()
    assert q.args[0] is q.args[1] and q.args[0] is not w


# -- FusionPattern, PatternSet ---------------------------------------------------------------------

def test_fusion_pattern_check_keeps_the_reason():
    fn, v = fn_and_vars()
    lhs = wildcard()
    p = is_op("exp")(lhs)
    ctx = CheckContext(v["e1"], {"lhs": v["x"]}, {}, {}, {})
    yes = FusionPattern("kernel.exp", p, {"lhs": lhs}, check=lambda c: True)
    assert yes.run_check(ctx) and yes.codegen == "kernel"
    no = FusionPattern("kernel.exp", p, check=lambda c: False)
    verdict = no.run_check(ctx)
    assert not verdict and "kernel.exp" in verdict.reason and "test_pattern_explain.py" in verdict.reason
    reasoned = FusionPattern("kernel.exp", p, check=lambda c: NoMatch(p, c.matched_expr, "check", "rank must be 2"))
    assert reasoned.run_check(ctx).reason == "rank must be 2"
    assert FusionPattern("plain", p).codegen is None


def test_fusion_pattern_annotations():
    fn, v = fn_and_vars()
    x = wildcard()
    p = is_op("exp")(x)
    fp = FusionPattern("k.exp", p, {"input": x, "absent": is_const()})
    m = dpl.match(p, v["e1"], fn)
    assert fp.annotated(m) == {"input": v["x"]}


def test_fusion_pattern_validates_its_fields():
    with pytest.raises(PatternError, match="non-empty name"):
        FusionPattern("", wildcard())
    with pytest.raises(PatternError, match="expected a pattern"):
        FusionPattern("a.b", "exp")
    with pytest.raises(PatternError, match="annotation 'x'"):
        FusionPattern("a.b", wildcard(), {"x": 3})


def test_pattern_set_keeps_order_and_unique_names():
    a = FusionPattern("k.a", wildcard())
    b = FusionPattern("k.b", wildcard())
    s = PatternSet([a, b]) + PatternSet([FusionPattern("k.c", wildcard())])
    assert [p.name for p in s] == ["k.a", "k.b", "k.c"] and s["k.b"] is b and len(s) == 3
    with pytest.raises(PatternError, match="two rules named 'k.a'"):
        PatternSet([a, FusionPattern("k.a", wildcard())])


def test_pattern_set_applies_its_rewrites_in_order():
    fn, v = fn_and_vars()
    w = wildcard()
    to_sigmoid = RewriteRule("exp_to_sigmoid", is_op("exp")(w), lambda e, m: call("sigmoid", m[w]))
    s = PatternSet(rewrites=[to_sigmoid])
    out = s.apply_rewrites(dpl.Module([fn]))
    # both exps became sigmoid(x): the two equal bindings merge, as after Relax's rewrite_call
    assert [b.value.op for b in out["main"].bindings] == ["sigmoid", "add", "mean"]
