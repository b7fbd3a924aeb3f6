"""One written pattern, many spellings: equivalences, optional casts, macros, imports."""

import itertools
import math

import numpy as np
import pytest

import dpl
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, const
from dpl.lang import load_patterns, load_rules, parse_patterns, parse_rules

rng = np.random.default_rng(3)


def run_both(func, new):
    args = []
    for p in func.params:
        shape = tuple(6 if isinstance(d, str) else d for d in p.ty.shape)
        args.append(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)))
    want, got = dpl.interpret(func, *args), dpl.interpret(new, *args)
    tol = 3e-3 if want.dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def rmsnorm_variant(cast, square, inverse, weight_first):
    dtype = "f16" if cast else "f32"
    fb = FunctionBuilder("main")
    x, w = fb.param("x", dtype, ("n", 32)), fb.param("w", dtype, (32,))
    h = fb.emit("astype", x, dtype="f32") if cast else x
    sq = fb.emit("power", h, const(2.0)) if square == "pow" else fb.emit("multiply", h, h)
    var = fb.emit("mean", sq, axis=[-1], keepdims=True)
    ve = fb.emit("add", var, const(1e-6))
    r = fb.emit("rsqrt", ve) if inverse == "rsqrt" else fb.emit("divide", const(1.0), fb.emit("sqrt", ve))  # ONNX: Reciprocal(Sqrt)
    n = fb.emit("multiply", h, r)
    back = fb.emit("astype", n, dtype=dtype) if cast else n
    out = fb.emit("multiply", w, back) if weight_first else fb.emit("multiply", back, w)
    return fb.ret(out)


RMS_VARIANTS = list(itertools.product([True, False], ["pow", "mul"], ["rsqrt", "reciprocal"], [True, False]))


@pytest.mark.parametrize("cast,square,inverse,weight_first", RMS_VARIANTS)
def test_rms_norm_written_once_covers_its_variants(cast, square, inverse, weight_first):
    func = rmsnorm_variant(cast, square, inverse, weight_first)
    new = load_patterns("rewrites").apply_rewrites(func)
    assert [b.value.op for b in new.bindings] == ["nn.rms_norm"]
    run_both(func, new)


def gelu_variant(scale, grouping):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 16))
    s = fb.emit("divide", x, math.sqrt(2.0)) if scale == "div" else fb.emit("multiply", x, 1 / math.sqrt(2.0))
    a = fb.emit("add", fb.emit("erf", s), 1.0)
    if grouping == 0:
        out = fb.emit("multiply", fb.emit("multiply", x, 0.5), a)
    elif grouping == 1:
        out = fb.emit("multiply", x, fb.emit("multiply", a, 0.5))
    else:
        out = fb.emit("multiply", fb.emit("multiply", a, x), 0.5)
    return fb.ret(out)


@pytest.mark.parametrize("scale,grouping", list(itertools.product(["div", "mul"], [0, 1, 2])))
def test_gelu_written_once_covers_its_variants(scale, grouping):
    func = gelu_variant(scale, grouping)
    new = load_patterns("rewrites").apply_rewrites(func)
    assert [b.value.op for b in new.bindings] == ["nn.gelu"]
    run_both(func, new)


def test_expansion_counts():
    counts = {r.name: r.variants for r in load_rules("rewrites")}
    # cast in x2, pow/mul x2, rsqrt or 1 / sqrt x2, cast out x2 (weight order is free: commutative)
    assert counts["rms_norm"] == 16 == len(RMS_VARIANTS)
    assert counts["gelu"] == 6  # divide/multiply x2, three groupings
    [r] = parse_rules("equiv power(x, 2.0) == multiply(x, x)\npattern k.p { out = add(power(a, 2.0), power(b, 2.0)) }")
    assert r.variants == 4


def test_equivalence_keeps_repeated_placeholders_one_value():
    ps = parse_patterns("equiv power(x, 2.0) == multiply(x, x)\npattern k.sq { out = power(exp(a), 2.0) }")

    def build(same):
        fb = FunctionBuilder("main")
        x = fb.param("x", "f32", (4,))
        e1 = fb.emit("exp", x, name="e1")
        e2 = e1 if same else fb.emit("exp", x, name="e2")
        return fb.ret(fb.emit("multiply", e1, e2, name="out"))

    from dpl.lang.matching import find_matches

    assert [f.binding for f in find_matches(ps, build(True)) if f.accepted] == ["out"]
    assert find_matches(ps, build(False)) == []


def test_variant_limit_is_an_error_naming_the_pattern():
    text = "equiv power(x, 2.0) == multiply(x, x)\npattern k.big { out = concat((" + ", ".join("power(a, 2.0)" for _ in range(11)) + ")) }"
    with pytest.raises(DplError, match=r"pattern 'k.big' expands into 2048 variants \(the limit is 1024\)"):
        parse_rules(text)


def test_macros():
    ps = parse_patterns("def act(y) = nn.relu(y) | nn.gelu(y)\ndef dense(x) = act(add(matmul(x, _), _))\npattern k.d { out = dense(h) }")
    [fp] = ps.patterns
    fb = FunctionBuilder("main")
    x, w, b = fb.param("x", "f32", (2, 4)), fb.param("w", "f32", (4, 4)), fb.param("b", "f32", (4,))
    out = fb.emit("nn.gelu", fb.emit("add", fb.emit("matmul", x, w), b), name="out")
    from dpl.lang.matching import find_matches

    assert [f.bindings for f in find_matches(ps, fb.ret(out))] == [("lv0", "lv1", "out")]


def test_macro_wildcards_are_fresh_at_each_use():
    # each use of `shifted` has its own `_` and its own literal: the two adds need not add one value
    ps = parse_patterns("def shifted(x) = add(multiply(x, 2.0), _)\npattern k.two { out = multiply(shifted(a), shifted(b)) }")
    fb = FunctionBuilder("main")
    a, b = fb.param("a", "f32", (4,)), fb.param("b", "f32", (4,))
    c, d = fb.param("c", "f32", (4,)), fb.param("d", "f32", (4,))
    left = fb.emit("add", fb.emit("multiply", a, 2.0), c)
    right = fb.emit("add", fb.emit("multiply", b, 2.0), d)
    out = fb.emit("multiply", left, right, name="out")
    from dpl.lang.matching import find_matches

    assert [f.binding for f in find_matches(ps, fb.ret(out)) if f.accepted] == ["out"]


def test_imports_relative_and_shipped(tmp_path):
    (tmp_path / "common.dpl").write_text("def act(y) = nn.relu(y) | nn.silu(y)\nequiv power(x, 2.0) == multiply(x, x)\n"
                                         "pattern common.e { out = exp(x) }\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "mine.dpl").write_text('import "common.dpl"\nimport cublas\ncodegen mine\npattern a { out = act(power(x, 2.0)) }\n')
    rules = load_rules(str(sub / "mine.dpl"), search_path=[str(tmp_path)])  # common.dpl is outside sub/
    names = [r.name for r in rules]
    # imports in order, then the file's own rules; cublas's epilogues (`priority 10`) first
    epilogues = ["cublas.matmul_bias_act", "cublas.matmul_act", "cublas.matmul_bias_residual"]
    assert names[:5] == [*epilogues, "common.e", "cublas.matmul_residual"] and names[-1] == "mine.a"
    assert rules[-1].variants == 4


def test_import_diamond_is_loaded_once(tmp_path):
    (tmp_path / "base.dpl").write_text("pattern base.e { out = exp(x) }\n")
    (tmp_path / "a.dpl").write_text('import "base.dpl"\n')
    (tmp_path / "b.dpl").write_text('import "base.dpl"\n')
    (tmp_path / "top.dpl").write_text('import "a.dpl"\nimport "b.dpl"\n')
    assert [r.name for r in load_rules(str(tmp_path / "top.dpl"))] == ["base.e"]


def diagnostics(tmp_path, files, entry):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(DplError) as err:
        load_rules(str(tmp_path / entry))
    return str(err.value).replace(str(tmp_path) + "/", "")


def test_import_cycle_is_reported_with_the_chain(tmp_path):
    text = diagnostics(tmp_path, {"a.dpl": 'import "b.dpl"\n', "b.dpl": 'import "c.dpl"\n', "c.dpl": 'import "a.dpl"\n'}, "a.dpl")
    assert text == (
        'c.dpl:1:8: error: import cycle: a.dpl -> b.dpl -> c.dpl -> a.dpl\n'
        '  import "a.dpl"\n'
        '         ^^^^^^^'
    )


def test_missing_import(tmp_path):
    text = diagnostics(tmp_path, {"a.dpl": 'import "nope.dpl"\nimport nolib\n'}, "a.dpl")
    assert text == (
        "a.dpl:1:8: error: pattern file 'nope.dpl' does not exist\n"
        '  import "nope.dpl"\n'
        "         ^^^^^^^^^^\n"
        "a.dpl:2:8: error: no shipped or installed pattern library 'nolib'\n"
        "  import nolib\n"
        "         ^^^^^\n"
        "  hint: shipped libraries: cnn, cublas, llm, rewrites\n"
        "2 errors"
    )


def test_macro_errors(tmp_path):
    text = diagnostics(tmp_path, {"m.dpl": (
        "def a(y) = b(y)\ndef b(y) = a(y)\ndef act(y) = nn.relu(z)\ndef exp(y) = y\n"
        "pattern k.p { out = a(x) }\npattern k.q { out = act(x, x) }\n"
    )}, "m.dpl")
    assert text == (
        "m.dpl:2:12: error: macro 'a' expands into itself: a -> b -> a\n"
        "  def b(y) = a(y)\n"
        "             ^\n"
        "m.dpl:3:22: error: undefined name 'z' in macro 'act'\n"
        "  def act(y) = nn.relu(z)\n"
        "                       ^\n"
        "  hint: a macro body may use only its parameters (y) and _\n"
        "m.dpl:4:5: error: macro 'exp' has the name of an op\n"
        "  def exp(y) = y\n"
        "      ^^^\n"
        "  hint: give the macro another name\n"
        "m.dpl:6:21: error: macro 'act' takes 1 argument, got 2\n"
        "  pattern k.q { out = act(x, x) }\n"
        "                      ^^^\n"
        "4 errors"
    )
