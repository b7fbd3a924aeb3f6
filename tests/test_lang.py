"""The .dpl language, construct by construct: .dpl text in, matched bindings out."""

import numpy as np
import pytest

import dpl
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, const
from dpl.lang import check_hook, load_rules, parse_patterns, parse_rules
from dpl.lang.matching import find_matches


def accepted(text, func):
    """{root binding: [pattern names]} of the accepted matches."""
    out = {}
    for f in find_matches(parse_patterns(text, "t.dpl"), func):
        if f.accepted:
            out.setdefault(f.binding, []).append(f.pattern.split(".", 1)[1])
    return out


def fn(build, **params):
    fb = FunctionBuilder("main")
    ps = {name: fb.param(name, *spec) for name, spec in params.items()}
    ret = build(fb, **ps)
    return fb.ret(ret)


F32 = ("f32", (4, 8))


def test_free_names_are_wildcards_and_root_is_unconsumed():
    f = fn(lambda fb, x, y: fb.emit("nn.relu", fb.emit("add", x, y, name="s"), name="r"), x=F32, y=F32)
    assert accepted("codegen k\npattern p { s = add(a, b); out = nn.relu(s) }", f) == {"r": ["p"]}


def test_name_used_twice_binds_the_same_value():
    def build(fb, x, y):
        fb.emit("multiply", x, x, name="sq")
        return fb.emit("multiply", x, y, name="xy")

    f = fn(build, x=F32, y=F32)
    assert accepted("pattern k.sq { out = multiply(a, a) }", f) == {"sq": ["sq"]}


def test_underscore_is_anonymous():
    f = fn(lambda fb, x, y: fb.emit("multiply", x, y, name="xy"), x=F32, y=F32)
    assert accepted("pattern k.any { out = multiply(_, _) }", f) == {"xy": ["any"]}


def test_alternatives_and_negation():
    def build(fb, x):
        a = fb.emit("exp", x, name="a")
        b = fb.emit("nn.relu", a, name="b")
        return fb.emit("nn.gelu", b, name="c")

    f = fn(build, x=F32)
    assert accepted("pattern k.act { out = nn.relu(y) | nn.gelu(y) }", f) == {"b": ["act"], "c": ["act"]}
    assert accepted("pattern k.act { out = nn.relu(y) | nn.gelu(y); y = ~exp(_) }", f) == {"c": ["act"]}
    assert accepted("pattern k.both { out = nn.gelu(y) & nn.gelu(nn.relu(_)) }", f) == {"c": ["both"]}


def test_optional_trailing_op():
    def build(fb, x, w):
        m1 = fb.emit("matmul", x, w, name="m1")
        r = fb.emit("nn.relu", m1, name="r")
        m2 = fb.emit("matmul", r, fb.emit("permute_dims", w, name="wt"), name="m2")
        return fb.emit("add", m2, x, name="out")

    f = fn(build, x=("f32", (8, 8)), w=("f32", (8, 8)))
    found = find_matches(parse_patterns("pattern k.mm { m = matmul(x, w); out = nn.relu?(m) }"), f)
    assert {(m.binding, m.bindings) for m in found} == {("m1", ("m1",)), ("r", ("m1", "r")), ("m2", ("m2",))}


def test_literals_match_constant_values_and_dtypes():
    def build(fb, x):
        a = fb.emit("add", x, 1.0, name="a")
        b = fb.emit("add", a, 2.0, name="b")
        return fb.emit("multiply", b, const(np.ones(8, np.float32)), name="c")

    f = fn(build, x=F32)
    assert accepted("pattern k.one { out = add(x, 1.0) }", f) == {"a": ["one"]}
    assert accepted("pattern k.one { out = add(x, 1.0:f16) }", f) == {}
    assert accepted("pattern k.c { out = add(x, const) }", f) == {"a": ["c"], "b": ["c"]}
    assert accepted("pattern k.c { out = multiply(x, c); c: const f32[8] }", f) == {"c": ["c"]}


def test_attribute_constraints_exact_or_wildcard():
    def build(fb, x):
        fb.emit("sum", x, axis=[1], keepdims=True, name="s1")
        return fb.emit("sum", x, axis=[0], name="s0")

    f = fn(build, x=F32)
    assert accepted("pattern k.r { out = sum(x, axis=[1]) }", f) == {"s1": ["r"]}
    assert accepted("pattern k.r { out = sum(x, axis=-1) }", f) == {}  # attributes match as written
    assert accepted("pattern k.r { out = sum(x, axis=_, keepdims=false) }", f) == {"s0": ["r"]}


def test_dtype_and_shape_annotations_bind_symbols_consistently():
    def build(fb, a, b, c):
        fb.emit("matmul", a, b, name="ab")
        return fb.emit("matmul", a, c, name="ac")

    f = fn(build, a=("f16", (4, 16)), b=("f16", (16, 16)), c=("f16", (16, 8)))
    assert accepted("pattern k.sq { out = matmul(x, w); w: f16[k, k] }", f) == {"ab": ["sq"]}
    assert accepted("pattern k.mm { out = matmul(x, w); x: f16[_, 16] }", f) == {"ab": ["mm"], "ac": ["mm"]}
    assert accepted("pattern k.mm { out = matmul(x, w); x: f32 }", f) == {}


def test_tuples_and_items():
    def build(fb, x):
        parts = fb.emit("split", x, indices_or_sections=2, axis=1, name="parts")
        first = fb.item(parts, 0, name="first")
        second = fb.item(parts, 1, name="second")
        return fb.emit("concat", (second, first), axis=1, name="cat")

    f = fn(build, x=F32)
    assert accepted("pattern k.swap { p = split(x); out = concat((p[1], p[0])) }", f) == {"cat": ["swap"]}
    assert accepted("pattern k.any { p = split(x); out = concat((p[_], p[_])) }", f) == {"cat": ["any"]}
    assert accepted("pattern k.same { p = split(x); out = concat((p[0], p[1])) }", f) == {}


def test_rest_arguments():
    f = fn(lambda fb, x, y: fb.emit("where", fb.emit("less", x, y, name="c"), x, y, name="w"), x=F32, y=F32)
    assert accepted("pattern k.w { out = where(c, ...) ; c = less(_, _) }", f) == {"w": ["w"]}


def test_where_language():
    def build(fb, x, w, b):
        mm = fb.emit("matmul", x, w, name="mm")
        return fb.emit("add", mm, b, name="y")

    f = fn(build, x=("f16", (4, 64)), w=("f16", (64, 32)), b=("f16", (32,)))
    base = "pattern k.p {{ mm = matmul(x, w); out = add(mm, b); where {} }}"
    holds = [
        "rank(b) == 1", "rank(x) == 2 and rank(w) == 2", "rank(b) == 2 or dtype(x) == f16",
        "not rank(b) == 2", "dtype(x) in [f16, bf16]", "dtype(x) not in [f32]", "shape(w)[0] % 8 == 0",
        "shape(w)[-1] == 32", "shape(x)[1] * 2 == 128", "attr(mm, \"out_dtype\") == none", "not is_const(b)",
        "only_used_by(mm, out)", "used_by(mm, out)", "len(shape(x)) == rank(x)",
    ]
    for pred in holds:
        assert accepted(base.format(pred), f) == {"y": ["p"]}, pred
    for pred in ["rank(b) == 2", "dtype(x) == f32", "shape(w)[0] % 7 == 0", "is_const(b)", "value(b) == 1"]:
        assert accepted(base.format(pred), f) == {}, pred


def test_only_used_by_sees_other_users():
    def build(fb, x, w, b):
        mm = fb.emit("matmul", x, w, name="mm")
        y = fb.emit("add", mm, b, name="y")
        return fb.emit("multiply", y, mm, name="z")

    f = fn(build, x=F32, w=("f32", (8, 8)), b=("f32", (8,)))
    assert accepted("pattern k.p { mm = matmul(x, w); out = add(mm, b); where only_used_by(mm, out) }", f) == {}
    found = find_matches(parse_patterns("pattern k.p { mm = matmul(x, w); out = add(mm, b); where only_used_by(mm, out) }"), f)
    assert "t.dpl" not in found[0].reason and "only_used_by(mm, out)" in found[0].reason


def test_value_of_constants_in_where_and_replacement():
    def build(fb, x):
        return fb.emit("add", x, 1e-5, name="a")

    f = fn(build, x=F32)
    assert accepted("pattern k.eps { out = add(x, eps); where is_const(eps) and value(eps) < 1e-3 }", f) == {"a": ["eps"]}
    assert accepted("pattern k.eps { out = add(x, eps); where value(eps) > 1 }", f) == {}


def test_check_hooks_registered_from_python():
    seen = []

    @check_hook("test.rank2", replace=True)
    def rank2(view):
        seen.append(view.expr("x"))
        return view.expr("x").ty.ndim == 2

    f = fn(lambda fb, x: fb.emit("exp", x, name="e"), x=F32)
    assert accepted("pattern k.e { out = exp(x); check test.rank2 }", f) == {"e": ["e"]}
    assert len(seen) == 1
    f3 = fn(lambda fb, x: fb.emit("exp", x, name="e"), x=("f32", (2, 2, 2)))
    [found] = find_matches(parse_patterns("pattern k.e { out = exp(x); check test.rank2 }"), f3)
    assert not found.accepted and "check hook 'test.rank2' said no" in found.reason


def test_annotations_become_annotation_patterns():
    [fp] = parse_patterns("pattern k.mb { mm = matmul(x, w); out = add(mm, b); annotate lhs = x, bias = b, matmul = mm }").patterns
    assert sorted(fp.annotation_patterns) == ["bias", "lhs", "matmul"]

    def build(fb, x, w, b):
        return fb.emit("add", fb.emit("matmul", x, w, name="mm"), b, name="y")

    f = fn(build, x=F32, w=("f32", (8, 8)), b=("f32", (8,)))
    [found] = find_matches([fp], f)
    ann = fp.annotated(found.match)
    assert ann["lhs"] is f.params[0] and ann["bias"] is f.params[2] and ann["matmul"] is f.bindings[0].value


def test_names_codegen_prefix_priority_and_docs():
    rules = parse_rules(
        "codegen cublas\n## first\npattern a { out = exp(x) }\n## second\n## two lines\npattern b { out = exp(x); priority 5 }\n"
        "pattern other.c { out = exp(x) }\ncodegen kernel\npattern d { out = exp(x) }\n"
    )
    assert [r.name for r in rules] == ["cublas.b", "cublas.a", "other.c", "kernel.d"]
    assert rules[0].doc == "second\ntwo lines" and rules[1].doc == "first" and rules[2].doc is None
    assert rules[0].codegen == "cublas" and rules[0].root_op == "exp"


def test_rewrite_with_values_from_the_match():
    ps = parse_patterns("rewrite r { v = mean(multiply(x, x), axis=[-1], keepdims=true); out = multiply(multiply(x, rsqrt(add(v, eps))), w) "
                        "where is_const(eps) => nn.rms_norm(x, w, epsilon=value(eps)) }")
    assert ps.patterns == () and len(ps.rewrites) == 1
    # w is not bound by the pattern: the replacement cannot use it
    with pytest.raises(DplError, match="undefined name 'w' in replacement"):
        parse_rules("rewrite r { out = exp(x) => nn.relu(w) }")


def test_replacement_type_mismatch_is_no_match():
    ps = parse_patterns("rewrite r { out = sum(x, axis=[1]) => exp(x) }")
    f = fn(lambda fb, x: fb.emit("sum", x, axis=[1], name="s"), x=F32)
    assert dpl.structural_equal(ps.apply_rewrites(f), f)


def test_load_shipped_and_files(tmp_path):
    p = tmp_path / "mine.dpl"
    p.write_text("pattern mine.e { out = exp(x) }\n")
    rules = load_rules([str(p), "cublas"])
    # file order among rules of one priority; cublas's epilogues (`priority 10`) go first
    epilogues = ["cublas.matmul_bias_act", "cublas.matmul_act", "cublas.matmul_bias_residual"]
    assert [r.name for r in rules[:5]] == [*epilogues, "mine.e", "cublas.matmul_residual"]
    with pytest.raises(DplError, match="no shipped or installed pattern library 'cublass'"):
        load_rules("cublass")
    with pytest.raises(DplError, match="does not exist"):
        load_rules(str(tmp_path / "missing.dpl"))
    bad1, bad2 = tmp_path / "a.dpl", tmp_path / "b.dpl"
    bad1.write_text("pattern x { out = exp(x) }\n")
    bad2.write_text("pattern k.y { out = expp(x) }\n")
    with pytest.raises(DplError) as err:
        load_rules([str(bad1), str(bad2)])
    assert "a.dpl:1:1" in str(err.value) and "b.dpl:1:21" in str(err.value) and str(err.value).endswith("2 errors")
