"""Matcher semantics beyond the TVM-mirrored cases: printing, origins, build-time errors,
constants by value, exact is_gv, is_expr, symbolic shapes, optional, rollback, caching,
indexing by root op."""

from __future__ import annotations

import pytest

import dpl
from dpl.ir import FunctionBuilder, GlobalVar, call, const
from dpl.ops.registry import call_function
from dpl.pattern import (
    Match, Matcher, NoMatch, PatternError, PatternIndex, has_dtype, is_const, is_expr, is_gv, is_op, is_tuple,
    is_tuple_get_item, is_var, match, match_bindings, wildcard,
)


def small():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 8))
    w = fb.param("w", "f32", (8, 8))
    m = fb.emit("matmul", x, w, name="m")
    r = fb.emit("nn.relu", m, name="r")
    mn = fb.emit("mean", r, axis=[-1], keepdims=True, name="mn")
    mn2 = fb.emit("mean", r, axis=[-1], name="mn2")
    c = fb.bind(const(2.0), name="c")
    s = fb.emit("multiply", r, c, name="s")
    return fb.ret(s), dict(x=x, w=w, m=m, r=r, mn=mn, mn2=mn2, c=c, s=s)


def value(fn, var):
    return next(b.value for b in fn.bindings if b.var is var)


# -- building and printing --------------------------------------------------------------------

def test_patterns_print_in_the_syntax_that_builds_them():
    w = wildcard()
    assert repr(is_op("add")(w, w)) == "w0 = wildcard(); is_op('add')(w0, w0)"
    assert repr(is_op("mean")(wildcard(), keepdims=True)) == "is_op('mean')(wildcard(), keepdims=True)"
    assert repr(wildcard().has_dtype("float16")) == "wildcard().has_dtype('f16')"
    assert repr(wildcard().has_shape(["n", None, 4])) == "wildcard().has_shape(['n', None, 4])"
    assert repr(~is_const() | is_var("x")) == "~is_const() | is_var('x')"
    assert repr(is_tuple_get_item(is_tuple([wildcard()], unordered=True), None)) == \
        "is_tuple_get_item(is_tuple([wildcard()], unordered=True), None)"
    p = is_op("matmul")(wildcard(), wildcard()).optional(lambda x: is_op("nn.relu")(x))
    assert repr(p) == "is_op('matmul')(wildcard(), wildcard()).optional(lambda x: is_op('nn.relu')(x))"


def test_patterns_remember_where_they_were_built():
    p = is_op("exp")(wildcard())  # this line
    assert p.origin.startswith("test_pattern_match.py:")
    line = int(p.origin.split(":")[1])
    assert "# this line" in open(__file__).read().splitlines()[line - 1]


def test_patterns_compare_by_identity():
    a, b = wildcard(), wildcard()
    assert a != b and a == a and len({a, b}) == 2


def test_unknown_op_is_a_build_error_with_a_suggestion():
    with pytest.raises(PatternError) as err:
        is_op("matmull")
    assert "matmul" in str(err.value)
    with pytest.raises(PatternError) as err:
        is_op("relax.add")
    assert "is_op('add')" in str(err.value)


def test_unknown_attribute_is_a_build_error():
    with pytest.raises(PatternError, match="no attribute 'keepdim'"):
        is_op("mean")(wildcard(), keepdim=True)


def test_non_pattern_argument_is_a_build_error():
    with pytest.raises(PatternError, match="is_const"):
        is_op("add")(wildcard(), 1.0)


def test_tuple_pattern_index_sugar():
    t = is_tuple([wildcard(), wildcard()])
    assert t[-1].index == 1 and t[None].index is None
    with pytest.raises(IndexError):
        t[2]
    assert is_tuple_get_item(t, -1).index is None  # TVM: -1 is any index


# -- semantics ----------------------------------------------------------------------------------

def test_attribute_constraints_are_canonicalised_like_the_ir():
    fn, v = small()
    assert match(is_op("mean")(wildcard(), axis=-1), value(fn, v["mn"]), fn)
    assert match(is_op("mean")(wildcard(), axis=[-1], keepdims=True), value(fn, v["mn"]), fn)
    assert not match(is_op("mean")(wildcard(), axis=[0]), value(fn, v["mn"]), fn)


def test_attributes_not_mentioned_are_unconstrained():
    fn, v = small()
    p = is_op("mean")(wildcard())
    assert match(p, value(fn, v["mn"]), fn) and match(p, value(fn, v["mn2"]), fn)


def test_const_by_kind_and_by_value_through_a_binding():
    fn, v = small()
    assert match(is_op("multiply")(wildcard(), is_const()), v["s"], fn)
    assert match(is_op("multiply")(wildcard(), is_const(2.0)), v["s"], fn)
    assert not match(is_op("multiply")(wildcard(), is_const(3.0)), v["s"], fn)
    assert not match(is_op("multiply")(wildcard(), is_const([2.0, 2.0])), v["s"], fn)


def test_without_a_function_variables_are_not_looked_through():
    fn, v = small()
    p = is_op("nn.relu")(is_op("matmul")(wildcard(), wildcard()))
    assert not match(p, value(fn, v["r"]))
    assert match(p, value(fn, v["r"]), fn)


def test_is_gv_is_exact_not_substring():
    assert match(is_gv("x"), GlobalVar("x"))
    assert not match(is_gv("x"), GlobalVar("fused_x"))  # TVM 0.27 says yes; we do not copy it
    assert match(is_gv(), GlobalVar("fused_x"))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2,))
    c = call_function(GlobalVar("fused_relu"), [x], x.ty)
    assert match(is_gv("fused_relu")(wildcard()), c)
    assert not match(is_gv("relu")(wildcard()), c)
    assert not match(is_op("nn.relu")(wildcard()), c)


def test_is_expr_matches_the_object_or_a_structural_copy():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2,))
    e = call("exp", x)
    assert match(is_expr(e), e)
    assert match(is_expr(e), call("exp", x))
    assert not match(is_expr(e), call("exp", fb.param("y", "f32", (2,))))
    assert match(is_op("nn.relu")(is_expr(x)), call("nn.relu", x))


def symbolic():
    fb = FunctionBuilder("main")
    a = fb.param("a", "f32", ("n", 4))
    b = fb.param("b", "f32", ("n", 4))
    c = fb.param("c", "f32", ("m", 4))
    s1 = fb.emit("add", a, b, name="s1")
    s2 = fb.bind(dpl.Tuple((a, c)), name="s2")
    return fb.ret(s1, s2), s1, s2, a, c


def test_symbolic_shapes_bind_consistently():
    fn, s1, s2, a, c = symbolic()
    x, y = wildcard().has_shape(["k", 4]), wildcard().has_shape(["k", 4])
    got = match(is_op("add")(x, y), s1, fn)
    assert got and got.symbols == {"k": "n"}
    mismatch = match(is_tuple([x, y]), s2, fn)
    assert not mismatch and mismatch.kind == "consistency" and "'k' is already bound to n" in mismatch.reason


def test_symbolic_pattern_dims_bind_concrete_dims_too():
    fb = FunctionBuilder("main")
    sq = fb.param("sq", "f32", (4, 4))
    rect = fb.param("rect", "f32", (4, 8))
    square = wildcard().has_shape(["d", "d"])
    assert match(square, sq) and not match(square, rect)
    assert match(wildcard().has_shape([None, "_"]), rect)
    assert not match(wildcard().has_shape([4]), rect)


def test_symbol_bindings_roll_back_on_a_failed_alternative():
    fn, s1, s2, a, c = symbolic()
    left = is_op("add")(wildcard().has_shape(["k", 4]), is_const())  # binds k, then fails
    right = is_op("add")(wildcard(), wildcard().has_shape([4, "k"]))  # k must start clean
    assert not match(right, s1, fn)
    got = match(left | is_op("add")(wildcard(), wildcard().has_shape(["k", 4])), s1, fn)
    assert got and got.symbols == {"k": "n"}


def test_memo_rolls_back_on_a_failed_alternative():
    fn, v = small()
    w = wildcard()
    first = is_op("multiply")(w, is_var())  # binds w to r, then fails on the bound c
    second = is_op("multiply")(is_op("nn.relu")(wildcard()), w)  # w must be free again
    got = match(first | second, v["s"], fn)
    assert got and isinstance(got[w], dpl.Constant)


def test_optional_trailing_op():
    fn, v = small()
    base = is_op("matmul")(wildcard(), wildcard())
    p = base.optional(lambda x: is_op("nn.relu")(x))
    on_relu = match(p, v["r"], fn)
    assert on_relu and on_relu[base] is value(fn, v["m"])
    assert match(p, v["m"], fn)
    assert not match(p, v["mn"], fn)


def test_not_and_and():
    fn, v = small()
    not_relu = ~is_op("nn.relu")(wildcard())
    assert match(not_relu, v["m"], fn) and not match(not_relu, v["r"], fn)
    both = is_op("nn.relu")(wildcard()) & has_dtype("f32")
    assert match(both, v["r"], fn) and not match(both & has_dtype("f16"), v["r"], fn)


def test_match_is_a_mapping_of_pattern_to_unwrapped_expression():
    fn, v = small()
    x, w = wildcard(), wildcard()
    op = is_op("matmul")
    p = is_op("nn.relu")(op(x, w))
    got = match(p, v["r"], fn)
    assert isinstance(got, Match) and got
    assert got[x] is v["x"] and got[w] is v["w"] and got[op] == "matmul"
    assert got[p] is value(fn, v["r"]) and len(got) == 6 and x in got


def test_or_callee_binds_the_op():
    fn, v = small()
    callee = is_op("exp") | is_op("nn.relu")
    got = match(callee(wildcard()), v["r"], fn)
    assert got[callee] == "nn.relu"


def test_no_match_is_falsy_and_builds_its_reason_lazily():
    fn, v = small()
    got = match(is_op("exp")(wildcard()), v["r"], fn)
    assert isinstance(got, NoMatch) and not got
    assert callable(got._reason)  # not built yet
    assert got.reason == "expected op exp, found nn.relu"
    assert got.kind == "op" and got.expr is v["r"]
    assert "test_pattern_match.py" in str(got)


def test_bound_var_reason():
    fn, v = small()
    got = match(is_op("nn.relu")(is_var()), v["r"], fn)
    assert got.kind == "bound-var" and "m is bound" in got.reason


def test_a_matcher_reused_across_roots_keeps_repeated_patterns_consistent():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    e1 = fb.emit("exp", x)
    e2 = fb.emit("exp", x)
    same = fb.emit("add", e1, e1)
    diff = fb.emit("add", e1, e2)
    fn = fb.ret(same, diff)
    w = wildcard()
    inner = is_op("exp")(w)  # cached per expression: must not leak bindings across roots
    p = is_op("add")(inner, inner)
    m = Matcher(fn)
    assert m.match(p, same) and not m.match(p, diff) and m.match(p, same)
    q = is_op("add")(is_op("exp")(w), is_op("exp")(w))
    assert m.match(q, diff) and m.match(q, same)


def test_pattern_index_by_root_op():
    a = is_op("exp")(wildcard())
    b = (is_op("nn.relu") | is_op("exp"))(wildcard())
    c = wildcard().has_dtype("f32")
    d = is_op("nn.relu")(wildcard()).optional(lambda x: is_op("exp")(x))
    index = PatternIndex([a, b, c, d])
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    assert index.candidates(call("exp", x)) == [a, b, c, d]
    assert index.candidates(call("nn.relu", x)) == [b, c, d]
    assert index.candidates(call("sigmoid", x)) == [c]
    assert index.candidates(x) == [c]


def test_match_bindings_finds_every_binding_in_order():
    fn, v = small()
    found = match_bindings([is_op("mean")(wildcard()), is_op("nn.relu")(wildcard())], fn)
    assert [(b.var.name, str(p)) for b, p, _ in found] == [
        ("r", "is_op('nn.relu')(wildcard())"), ("mn", "is_op('mean')(wildcard())"), ("mn2", "is_op('mean')(wildcard())")]


def test_dpl_reexports_the_pattern_language():
    assert dpl.is_op is is_op and dpl.match is match and callable(dpl.explain)


def test_bad_constraints_are_build_errors():
    with pytest.raises(PatternError, match="keepdims"):
        is_op("mean")(wildcard(), keepdims="yes")
    with pytest.raises(PatternError, match="unknown dtype"):
        wildcard().has_dtype("f33")
    with pytest.raises(PatternError, match="dimension"):
        wildcard().has_shape([1.5])
    with pytest.raises(PatternError, match="index"):
        is_tuple_get_item(wildcard(), "0")
    with pytest.raises(PatternError, match="expected a pattern"):
        match("exp", call("exp", FunctionBuilder("f").param("x", "f32", (1,))))


def test_matching_something_that_is_not_an_expression_is_a_plain_no_match():
    got = match(is_op("exp")(wildcard()), 3)
    assert not got and got.kind == "kind" and "int" in got.reason
