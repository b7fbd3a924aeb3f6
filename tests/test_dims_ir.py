"""Expression dims (dpl.ir.dims) in the IR: the text form, the interpreter's and the runtime's
binding of symbols, shape inference over symbolic sizes, type patterns, and a property test
that a module with expression shapes computes what its static instances compute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dpl
from dpl.errors import DplError, InterpretError, TypeInferenceError
from dpl.ir import FunctionBuilder, Module
from dpl.ir.dims import DimExpr, parse as parse_dim
from dpl.ir.structural import structural_equal, structural_hash

EXPR_MODULE = """\
func main(x: f32[b, 64, 8, 8], y: f32[m, 64], z: f32[n, (n - 3) // 2 + 1, min(n, 64)]) -> f32[b * 64 + m, 64] {
  r = reshape(x, shape=[-1, 64])
  s = reshape(x, shape=["b * 64", 64])
  e = add(r, s)
  c = concat((e, y))
  return c
}"""


def rand(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype("float32")


def static_parse(text: str) -> dpl.Module:
    return dpl.parse(text, "t.ir")


# -- the text form ------------------------------------------------------------------------------


def test_expression_shapes_print_parse_and_round_trip():
    mod = static_parse(EXPR_MODULE)
    text = str(mod)
    assert "z: f32[n, (n + 1) // 2 - 1, min(n, 64)]" in text  # the canonical form
    assert 's = reshape(x, shape=["b * 64", 64])' in text  # an expression attribute prints as its text
    assert "-> f32[b * 64 + m, 64]" in text
    again = static_parse(text)
    assert str(again) == text
    assert structural_equal(mod, again) and structural_hash(mod) == structural_hash(again)
    assert isinstance(mod["main"].bindings[1].value.attrs["shape"][0], DimExpr)


def test_equal_expressions_written_differently_are_one_type():
    a = static_parse("func main(x: f32[n * 4, (m + 1) * 2]) -> f32[n * 4, (m + 1) * 2] {\n  return x\n}")
    b = static_parse("func main(x: f32[4 * n, m + m + 2]) -> f32[n + n + 2 * n, 2 + 2 * m] {\n  return x\n}")
    assert a["main"].params[0].ty == b["main"].params[0].ty == b["main"].ret_type
    assert structural_equal(a, b) and structural_hash(a) == structural_hash(b)


def test_save_and_load_keep_expression_shapes(tmp_path):
    mod = static_parse(EXPR_MODULE)
    path = tmp_path / "m.ir"
    dpl.save(mod, str(path))
    assert str(dpl.load(str(path))) == str(mod)


@pytest.mark.parametrize("dim, where, message", [
    ("n / 2", "1:20", "unexpected character '/'"),
    ("n // 0", "1:18", "division by zero: n // 0"),
    ("min(n, 2, 3)", "1:26", "unexpected ','"),
    ("n - 5 - n", "1:14", "negative dimension -5"),
])
def test_bad_dims_are_located(dim, where, message):
    with pytest.raises(DplError) as err:
        dpl.parse(f"func main(x: f32[{dim}]) -> f32[{dim}] {{\n  return x\n}}", "bad.ir")
    assert f"bad.ir:{where}: error:" in str(err.value) and message in str(err.value)


# -- binding at run time ------------------------------------------------------------------------

BIND = "func main(x: f32[n * 2, 3], y: f32[n + m], w: f32[n, k]) -> f32[n * 2, 3] {\n  return x\n}"


def test_symbols_bind_from_plain_dims_then_linear_ones():
    mod = static_parse(BIND)
    out = dpl.interpret(mod, rand(8, 3), rand(7), rand(4, 2))  # n = 4 from w, m = 3 solved from n + m
    assert out.shape == (8, 3)
    solved = static_parse("func main(x: f32[n * 2 + 1], y: f32[n + m]) -> f32[n + m] {\n  return y\n}")
    assert dpl.interpret(solved, rand(9), rand(6)).shape == (6,)  # n = 4 solved, then m = 2


@pytest.mark.parametrize("shapes, message", [
    ([(7, 3), (7,), (4, 2)], "parameter 'x' of 'main' dim 0 is 7, but its type says n * 2 with n = 4, which is 8"),
    ([(8, 3), (2,), (4, 2)], "parameter 'y' of 'main' dim 0 is 2, but its type says m + n with n = 4: m + 4 equals 2 only at m = -2"),
])
def test_a_mismatch_names_the_expression_and_the_values(shapes, message):
    mod = static_parse(BIND)
    with pytest.raises(InterpretError) as err:
        dpl.interpret(mod, *(rand(*s) for s in shapes))
    assert message in str(err.value)


def test_a_dim_no_value_of_its_symbol_gives_is_refused():
    mod = static_parse("func main(x: f32[n * 2]) -> f32[n * 2] {\n  return x\n}")
    with pytest.raises(InterpretError, match="dim 0 is 7, but its type says n \\* 2: no value of n makes n \\* 2 equal 7"):
        dpl.interpret(mod, rand(7))
    nonlinear = static_parse("func main(x: f32[n * n]) -> f32[n * n] {\n  return x\n}")
    with pytest.raises(InterpretError, match="nothing determines n"):
        dpl.interpret(nonlinear, rand(9))


def test_the_runtime_binds_and_checks_as_the_interpreter_does():
    mod = static_parse(EXPR_MODULE)
    exe = dpl.build(mod, "numpy")
    x, y, z = rand(2, 64, 8, 8), rand(3, 64), rand(6, 2, 6)  # n = 6: (6 - 3) // 2 + 1 = 2, min(6, 64) = 6
    want = np.concatenate([2 * x.reshape(-1, 64), y])
    np.testing.assert_allclose(np.asarray(exe(x, y, z)), want, rtol=1e-6)
    np.testing.assert_allclose(dpl.interpret(mod, x, y, z), want, rtol=1e-6)
    with pytest.raises(DplError, match=r"input 'z' dim 1 is 3, but its type says \(n \+ 1\) // 2 - 1 with n = 6, which is 2"):
        exe(x, y, rand(6, 3, 6))


def test_a_result_size_that_is_negative_at_run_time_is_an_error_before_the_reference_runs():
    mod = static_parse("func main(x: f32[1, 4, L], w: f32[6, 4, 3]) -> f32[1, 6, L - 2] {\n"
                       "  y = nn.conv1d(x, w)\n  return y\n}")
    with pytest.raises(InterpretError, match="L - 2, which is -1 with L = 1: a size is never negative"):
        dpl.interpret(mod, rand(1, 4, 1), rand(6, 4, 3))


# -- shape inference ----------------------------------------------------------------------------


def emit(op, *shapes, **attrs):
    fb = FunctionBuilder("main")
    params = [fb.param(f"p{i}", "f32", s) for i, s in enumerate(shapes)]
    if op == "concat":
        return fb.emit(op, params, **attrs)
    return fb.emit(op, *params, **attrs)


@pytest.mark.parametrize("op, shapes, attrs, want", [
    ("reshape", [("b", 64, 8, 8)], dict(shape=[-1, 64]), "f32[b * 64, 64]"),
    ("reshape", [("b", 64, 8, 8)], dict(shape=["b * 64", 64]), "f32[b * 64, 64]"),
    ("reshape", [("b * 64", 64)], dict(shape=["b", -1, 8]), "f32[b, 512, 8]"),
    ("reshape", [("b * 64", 64)], dict(shape=[-1, 2, 4, 2]), "f32[b * 256, 2, 4, 2]"),
    ("reshape", [("b", "s", 12, 64)], dict(shape=[-1, 768]), "f32[b * s, 768]"),
    ("reshape", [("n * 4",)], dict(shape=[-1, "n"]), "f32[4, n]"),
    ("concat", [("n", 8), ("m", 8), (3, 8)], dict(axis=0), "f32[m + n + 3, 8]"),
    ("concat", [(2, "n"), (2, "n")], dict(axis=1), "f32[2, n * 2]"),
    ("add", [("n * 4", 1), ("4 * n", 5)], {}, "f32[n * 4, 5]"),
    ("strided_slice", [("n", 3)], dict(axes=[0], begin=[1], end=[2**40]), "f32[n - 1, 3]"),
    ("strided_slice", [("n * 2", 3)], dict(axes=[0], begin=[0], end=[2**40], strides=[2]), "f32[n, 3]"),
    ("strided_slice", [("n", 3)], dict(axes=[0], begin=[2], end=["n - 1"]), "f32[n - 3, 3]"),
    ("split", [("n * 4", 3)], dict(indices_or_sections=2), "(f32[n * 2, 3], f32[n * 2, 3])"),
    ("split", [("n", 3)], dict(indices_or_sections=[2]), "(f32[2, 3], f32[n - 2, 3])"),
    ("nn.conv2d", [(1, 3, "h", "w"), (8, 3, 3, 3)], dict(strides=2, padding=1), "f32[1, 8, (h + 1) // 2, (w + 1) // 2]"),
    ("nn.conv2d", [(1, 3, "h", 9), (8, 3, 7, 1)], dict(dilation=[2, 1]), "f32[1, 8, h - 12, 9]"),
    ("nn.max_pool2d", [(1, 3, "h", "h")], dict(pool_size=[2, 2], strides=[2, 2]), "f32[1, 3, h // 2, h // 2]"),
    ("nn.avg_pool2d", [(1, 3, "h", 4)], dict(pool_size=[3, 3], strides=[2, 2], padding=[1, 1]), "f32[1, 3, (h + 1) // 2, 2]"),
    ("arange", [], dict(start="n", end="n + k"), "i64[k]"),
])
def test_shape_inference_gives_expressions(op, shapes, attrs, want):
    assert str(emit(op, *[tuple(parse_dim(d) if isinstance(d, str) else d for d in s) for s in shapes], **attrs).ty) == want


@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("reshape", [("n", 6)], dict(shape=[-1, 4]), "n \\* 6 elements are not provably a multiple of 4"),
    ("reshape", [("n", 6)], dict(shape=["n", 4]), "element counts differ \\(n \\* 6 vs n \\* 4\\)"),
    ("reshape", [("n", 6)], dict(shape=[0, -1]), "the other dimensions hold no elements"),
    ("split", [("n", 3)], dict(indices_or_sections=2), "cannot split dimension n into 2 equal sections"),
    ("concat", [("n", 8), ("m", 4)], dict(axis=0), "differ in dimension 1"),
    ("add", [("n * 4",), ("n * 2",)], {}, "cannot broadcast \\(dimension 0: n \\* 4 vs n \\* 2\\)"),
])
def test_shape_inference_refuses_what_it_cannot_prove(op, shapes, attrs, message):
    with pytest.raises(TypeInferenceError, match=message):
        emit(op, *[tuple(parse_dim(d) if isinstance(d, str) else d for d in s) for s in shapes], **attrs)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pool_output_expressions_agree_with_the_static_count(ceil_mode):
    from dpl.ir.dims import evaluate
    from dpl.ops.nn import pool_out, pool_out_dim

    for kernel, stride, dilation, lo, hi in [(3, 2, 1, 1, 1), (2, 2, 1, 0, 0), (3, 3, 2, 1, 2), (1, 1, 1, 0, 0)]:
        d = pool_out_dim("n", kernel, stride, dilation, lo, hi, ceil_mode)
        for n in range(dilation * (kernel - 1) + 1, 30):
            assert evaluate(d, {"n": n}) == pool_out(n, kernel, stride, dilation, lo, hi, ceil_mode)


# -- type patterns ------------------------------------------------------------------------------


def test_has_shape_compares_and_binds_expression_dims():
    from dpl.pattern.match import match

    from dpl.ir.builder import call as make

    call = make("reshape", FunctionBuilder("main").param("x", "f32", ("b", 64, 8, 8)), shape=[-1, 64])
    got = {str(w): match(dpl.is_op("reshape")(dpl.wildcard()).has_shape(w), call) for w in
           (["n * 64", 64], ["n * 32", 64], ["n * 128", 64], ["n", 64], ["n * 64", "n - n + 64"])}
    assert {k: (dict(v.symbols) if v else None) for k, v in got.items()} == {
        "['n * 64', 64]": {"n": "b"},
        "['n * 32', 64]": {"n": parse_dim("b * 2")},
        "['n * 128', 64]": None,
        "['n', 64]": {"n": parse_dim("b * 64")},
        "['n * 64', 'n - n + 64']": {"n": "b"},
    }


def test_dpl_type_annotations_take_expressions():
    from dpl.lang import parse_patterns
    from dpl.lang.matching import find_matches

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("b", 64, 8, 8))
    func = fb.ret(fb.emit("reshape", x, shape=["b * 64", 64], name="r"))
    found = {t: [f.binding for f in find_matches(parse_patterns(t, "t.dpl"), func) if f.accepted] for t in (
        "pattern k.m { out = reshape(x); x: f32[n, 64, 8, 8]; out: f32[n * 64, 64] }",
        "pattern k.m { out = reshape(x); x: f32[n, 64, 8, 8]; out: f32[n * 32, 64] }",
        "pattern k.m { out = reshape(x); out: f32[(n + 1) * 64 - 64, _] }",
    )}
    assert list(found.values()) == [["r"], [], ["r"]]


# -- symbolic modules compute what their static instances compute -------------------------------

OPS = ("negative", "concat", "slice_head", "slice_tail", "slice_even", "merge", "split_rows")


def build_chain(ops, n, m):
    """The chain of ``ops`` over x: f32[n, 6] and y: f32[m, 6]; n and m are symbols or ints,
    and the same code builds the symbolic module and its static instance."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (n, 6))
    y = fb.param("y", "f32", (m, 6))
    cur = x
    for op in ops:
        if op == "negative":
            cur = fb.emit("negative", cur)
        elif op == "concat":
            cur = fb.emit("concat", [cur, y], axis=0)
        elif op == "slice_head":  # [1:]
            cur = fb.emit("strided_slice", cur, axes=[0], begin=[1], end=[2**40])
        elif op == "slice_tail":  # [:-1]
            cur = fb.emit("strided_slice", cur, axes=[0], begin=[0], end=[-1])
        elif op == "slice_even":  # [::2]
            cur = fb.emit("strided_slice", cur, axes=[0], begin=[0], end=[2**40], strides=[2])
        elif op == "merge":  # [r, 6] -> [r * 2, 3] -> [-1, 6]
            rows = cur.ty.shape[0]
            cur = fb.emit("reshape", cur, shape=[rows * 2 if isinstance(rows, int) else parse_dim(f"({rows}) * 2"), 3])
            cur = fb.emit("reshape", cur, shape=[-1, 6])
        elif op == "split_rows":  # [r, 6] -> [r, 2, 3] -> the first of two halves of the last axis
            cur = fb.emit("reshape", cur, shape=[cur.ty.shape[0], 2, 3])
            cur = fb.emit("split", cur, indices_or_sections=[2], axis=2)
            cur = fb.emit("reshape", fb.emit("concat", [fb.item(cur, 0), fb.item(cur, 1)], axis=2), shape=[-1, 6])
    return Module([fb.ret(cur)])


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.sampled_from(OPS), max_size=8).filter(lambda ops: sum(o.startswith("slice") for o in ops) <= 4),
       n=st.integers(16, 40), m=st.integers(0, 9))
def test_a_symbolic_module_computes_what_its_static_instance_computes(ops, n, m):
    symbolic = build_chain(ops, "n", "m")
    static = build_chain(ops, n, m)
    text = str(symbolic)
    assert str(dpl.parse(text)) == text  # and it prints and parses back
    rng = np.random.default_rng(n * 100 + m)
    x, y = rng.standard_normal((n, 6)).astype("float32"), rng.standard_normal((m, 6)).astype("float32")
    want = dpl.interpret(static, x, y)
    got = dpl.interpret(symbolic, x, y)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    from dpl.ir.dims import evaluate
    assert tuple(evaluate(d, {"n": n, "m": m}) for d in symbolic["main"].ret_type.shape) == static["main"].ret_type.shape
