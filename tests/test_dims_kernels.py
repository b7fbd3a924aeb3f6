"""Kernels over dimension expressions (issue 32): a fused group whose types have dims such as
``n * 2``, ``m + 1`` or ``(n - m) // 2 + m`` lowers to loops and index arithmetic over those
expressions (symbols are the kernel's dims, ``//`` and ``%`` floor), its C equals the
interpreter at several sizes, and its CUDA source compiles with NVRTC and, built for the host,
computes the same numbers."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dpl
from dpl.backends.cgen.emitter import emit_kernel
from dpl.backends.cuda.emitter import CUDA_PRELUDE, HELPERS, emit_cuda, launch_arguments
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, Module
from dpl.ir import dims as D
from dpl.kernel import evaluate as kernel_evaluate, lower_function
from dpl.kernel.ir import Bin, dim_expr, index_value, to_c
from dpl.kernel.lower import LoweringError

P = D.parse
ALWAYS = dpl.FusionConfig(min_nodes_for_fusion=1, max_graph_size=10_000, min_tensor_elements=0, fallback_on_error=False)


def group(name, params, body):
    """A Primitive function and a main that calls it: ``params`` is [(name, shape)] (f32)."""
    g = FunctionBuilder(name, attrs={"Primitive": True})
    fn = g.ret(body(g, *[g.param(n, "f32", s) for n, s in params]))
    fb = FunctionBuilder("main")
    out = fb.call(fn, *[fb.param(n, "f32", s) for n, s in params])
    return Module([fb.ret(out), fn]), fn


def inputs(fn, bindings, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(D.evaluate(d, bindings) for d in p.ty.shape)).astype(np.float32) for p in fn.params]


def assert_close(want, got, label=""):
    want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
    assert want.shape == got.shape, label
    scale = float(np.abs(want).max()) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * max(scale, 1), err_msg=label)


# -- index arithmetic from dimension expressions -----------------------------------------------

EXPRESSIONS = ["n * 2", "m + 1", "(n + 3) // 2", "(n - m) // 2 + m", "(n - m) % 3", "n - m * 3 - 4", "min(n, m) + 1",
               "max(n, 4) * 2", "n % m", "(n - 7) // m", "(n * m + 5) // 4 - n"]


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_a_dim_as_index_arithmetic_has_its_value_everywhere(text):
    """``dim_expr`` keeps floor semantics where an intermediate is negative (``(n - m) // 2``
    at n < m), in the kernel IR's evaluation and in its C through the dims' helpers."""
    d = P(text)
    e = dim_expr(d)
    for n in range(0, 9):
        for m in range(1, 6):
            assert index_value(e, {"n": n, "m": m}) == D.evaluate(d, {"n": n, "m": m}), (text, n, m)


def test_floor_ops_appear_only_where_a_dividend_may_be_negative():
    """By a constant the simplifier leaves a dividend with non-negative coefficients, which C's
    ``/`` floors; by a symbol the dividend may be negative and the helpers floor."""
    assert to_c(dim_expr(P("(n + 3) // 2"))) == "(((n + 1) / 2) + 1)"
    assert to_c(dim_expr(P("(n - m) // 2"))) == "(((m + n) / 2) - m)"
    assert to_c(dim_expr(P("(n - 7) // m"))) == "dpl_floordiv((n - 7), m)"
    assert to_c(dim_expr(P("(n - 7) % m"))) == "dpl_mod((n - 7), m)"
    assert to_c(dim_expr(P("min(n, 64)"))) == "((n < 64) ? n : 64)"
    assert Bin("floordiv", dim_expr("n"), dim_expr(2)).dtype == "int64"


def test_the_c_helpers_floor_like_python(tmp_path):
    """Every EXPRESSIONS dim through ``emit_kernel``'s spelling of a buffer's strides is what
    Python computes: a kernel copying x: f32[k, <dim>] reads each row at the right stride."""
    for text in ["(n - 7) // m + 3", "(n - 7) % m + 1", "(n - m) // 2 + m", "n % m + 1"]:
        mod, fn = group("fused_copy", [("x", (4, P(text))), ("s", ("n", "m"))],
                        lambda g, x, s: g.emit("add", x, g.emit("sum", s)))
        source = emit_kernel(lower_function(fn))
        assert "DPL_DIM_HELPERS" in source and ("dpl_floordiv(" in source or "dpl_mod(" in source)
        exe = dpl.build(mod, "cpu", config=ALWAYS)
        for n, m in [(1, 4), (5, 4), (9, 2), (3, 3)]:  # C's truncation would differ at the first two
            if D.evaluate(P(text), {"n": n, "m": m}) < 0:
                continue
            args = inputs(fn, {"n": n, "m": m}, n * 7 + m)
            assert_close(dpl.interpret(mod, *args), exe(*args), f"{text} n={n} m={m}")


# -- kernels: the dims are the free symbols, bound by solving ------------------------------------


def test_a_symbol_only_inside_an_expression_is_a_kernel_dim():
    _, fn = group("fused_exp", [("x", (P("n * 2"), P("m + 1")))], lambda g, x: g.emit("exp", x))
    k = lower_function(fn)
    assert set(k.dims) == {"n", "m"}
    assert k.bind_dims([(6, 5), (6, 5)]) == {"n": 3, "m": 4}
    text = str(k)
    assert "for i0 in [0, (n * 2)):" in text and "for i1 in [0, (m + 1)):" in text
    with pytest.raises(DplError, match=r"n \* 2"):
        k.bind_dims([(7, 5), (7, 5)])  # no n gives 7
    with pytest.raises(DplError, match=r"m \+ 1"):
        k.bind_dims([(6, 5), (6, 4)])  # the output disagrees with the input


def test_symbols_no_buffer_determines_are_a_lowering_error():
    """n and m, needed inside (the reshape's rows), are in no buffer but as n * m."""
    _, fn = group("fused_neg", [("x", (P("n * m"), 4))],
                  lambda g, x: g.emit("sum", g.emit("reshape", g.emit("negative", x), shape=["n", P("m * 4")])))
    with pytest.raises(LoweringError, match="n, m|m, n"):
        lower_function(fn)


def test_the_kernel_evaluator_binds_expression_dims():
    mod, fn = group("fused_exp", [("x", (P("(n + 3) // 2"), 8)), ("s", ("n",))],
                    lambda g, x, s: g.emit("multiply", g.emit("exp", x), g.emit("sum", s)))
    k = lower_function(fn)
    for n in (0, 1, 4, 7):
        args = inputs(fn, {"n": n}, n)
        assert_close(dpl.interpret(mod, *args), kernel_evaluate(k, *args), f"n={n}")


# -- whole groups on the cpu target --------------------------------------------------------------

GROUPS = {
    # name: (params, body, bindings)
    "softmax": ([("x", (P("n * 2"), P("m + 1")))], lambda g, x: g.emit("nn.softmax", x, axis=-1),
                [{"n": 1, "m": 0}, {"n": 3, "m": 4}, {"n": 5, "m": 17}]),
    "half_rows": ([("x", (P("(n + 3) // 2"), 8)), ("b", (8,)), ("s", ("n",))],  # s binds n: (n + 3) // 2 cannot
                  lambda g, x, b, s: g.emit("nn.relu", g.emit("add", g.emit("add", x, b), g.emit("sum", s))),
                  [{"n": 0}, {"n": 4}, {"n": 9}]),
    "floor_rows": ([("x", (P("(n - 7) // m + 3"), P("(n - 7) % m + 1"))), ("s", ("n", "m"))],
                   lambda g, x, s: g.emit("multiply", x, g.emit("sum", s)),
                   [{"n": 1, "m": 4}, {"n": 5, "m": 4}, {"n": 9, "m": 2}]),
    "merge_rows": ([("x", (P("n * 2"), P("m + 1")))],
                   lambda g, x: g.emit("reshape", g.emit("tanh", x), shape=[P("n"), P("m * 2 + 2")]),
                   [{"n": 1, "m": 0}, {"n": 3, "m": 2}, {"n": 4, "m": 6}]),
    "concat": ([("x", ("n", 4)), ("y", (P("m + 1"), 4))],
               lambda g, x, y: g.emit("sigmoid", g.emit("concat", [x, y], axis=0)), [{"n": 0, "m": 0}, {"n": 3, "m": 2}]),
    "transposed_sum": ([("x", (P("n * 2"), P("m + 1")))],
                       lambda g, x: g.emit("sum", g.emit("permute_dims", x, axes=[1, 0]), axis=[1], keepdims=True),
                       [{"n": 1, "m": 1}, {"n": 6, "m": 3}]),
}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_groups_over_expression_dims_equal_the_interpreter_on_cpu(name):
    params, body, sizes = GROUPS[name]
    mod, fn = group(f"fused_{name}", params, body)
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    assert "fall-back" not in exe.summary()
    for k, bindings in enumerate(sizes):
        args = inputs(fn, bindings, k)
        assert_close(dpl.interpret(mod, *args), exe(*args), f"{name} {bindings}")


def test_a_shape_that_fits_no_binding_names_the_expression():
    mod, fn = group("fused_exp", [("x", (P("n * 2"), 4))], lambda g, x: g.emit("exp", x))
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    with pytest.raises(DplError, match=r"n \* 2"):
        exe(np.zeros((5, 4), np.float32))


# -- the property: random elementwise and reduction groups ----------------------------------------

SHAPES = [  # (shape, symbols' ranges); a binder parameter s: f32[n, m] joins where a symbol hides
    ((P("n * 2"), P("m + 1")), False),
    ((P("(n + 3) // 2"), 8), True),
    ((P("(n - m) // 2 + m"), 4), True),
    ((P("(n - 7) // m + 3"), P("(n - 7) % m + 1")), True),
    ((P("min(n, m) + 1"), 3), True),
    ((P("n % 3 + 1"), P("m * 2 + 1")), True),
]
UNARY = ["tanh", "negative", "sigmoid", "nn.relu", "abs"]
BINARY = ["add", "multiply", "subtract", "maximum"]
REDUCE = ["sum", "max", "mean"]


@st.composite
def random_groups(draw):
    shape, binder = draw(st.sampled_from(SHAPES))
    steps = draw(st.lists(st.tuples(st.sampled_from(["unary", "binary", "row", "column"]), st.integers(0, 99)),
                          min_size=1, max_size=4))
    params = [("x", shape), ("y", shape if draw(st.booleans()) else (1, shape[1]))]
    if binder:
        params.append(("s", ("n", "m")))

    def body(g, x, y, *s):
        v = x
        for kind, pick in steps:
            if kind == "unary":
                v = g.emit(UNARY[pick % len(UNARY)], v)
            elif kind == "binary":
                v = g.emit(BINARY[pick % len(BINARY)], v, y)
            else:  # a reduction over one axis, kept and broadcast back onto the rows or columns
                r = g.emit(REDUCE[pick % len(REDUCE)], v, axis=[1 if kind == "row" else 0], keepdims=True)
                v = g.emit(BINARY[pick % len(BINARY)], v, r)
        return g.emit("add", v, g.emit("sum", s[0])) if s else v

    return params, body, steps


SIZES = [{"n": 1, "m": 1}, {"n": 2, "m": 5}, {"n": 7, "m": 3}, {"n": 12, "m": 2}]


@pytest.fixture(scope="module")
def nvrtc_or_none():
    from dpl.backends.cuda import nvrtc

    ok, _ = nvrtc.available()
    return nvrtc if ok else None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(random_groups())
def test_random_groups_over_expression_dims(nvrtc_or_none, case):
    """The cpu target gives the interpreter's numbers at several sizes (dims of at least 1, so
    every reduction has an identity-free value), and the same kernel's CUDA source compiles."""
    params, body, steps = case
    mod, fn = group("fused_random", params, body)
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    for k, bindings in enumerate(SIZES):
        if any(D.evaluate(d, bindings) < 1 for _, shape in params for d in shape):
            continue
        args = inputs(fn, bindings, k)
        assert_close(dpl.interpret(mod, *args), exe(*args), f"{steps} {bindings}")
    if nvrtc_or_none is not None:
        for mode, rows_from in (("thread", 10**9), ("block", 0)):
            source = emit_cuda(lower_function(fn), f"k_{mode}", rows_from)
            ptx = nvrtc_or_none.compile_ptx(source.code, f"{mode}.cu")
            assert f".entry k_{mode}(" in ptx


# -- CUDA: NVRTC and the host twin ---------------------------------------------------------------


def _cuda_groups():
    out = []
    for name in ("softmax", "floor_rows", "merge_rows", "concat", "transposed_sum"):
        params, body, sizes = GROUPS[name]
        mod, fn = group(f"fused_{name}", params, body)
        out.append((name, mod, fn, sizes))
    return out


def test_cuda_kernels_over_expression_dims_compile_with_nvrtc(nvrtc):
    for name, _, fn, _ in _cuda_groups():
        source = emit_cuda(lower_function(fn), f"k_{name}", 0)
        assert "DPL_DIM_HELPERS" in source.code
        assert f".entry k_{name}(" in nvrtc.compile_ptx(source.code, f"{name}.cu")


def test_cuda_twin_over_expression_dims_equals_the_interpreter(cxx):
    from dpl.backends.cuda.host import HostTwin

    cases = []
    for name, mod, fn, sizes in _cuda_groups():
        for mode, rows_from in (("thread", 10**9), ("block", 0)):
            cases.append((name, mod, fn, sizes, emit_cuda(lower_function(fn), f"k_{name}_{mode}", rows_from)))
    twin = HostTwin([c[-1] for c in cases], block=8)
    for name, mod, fn, sizes, source in cases:
        for k, bindings in enumerate(sizes):
            args = inputs(fn, bindings, k)
            want = np.asarray(dpl.interpret(mod, *args))
            out = np.full_like(want, np.nan)
            for grid in (None, 1, 3):
                twin.run(source.name, args, [out], grid=grid)
                assert_close(want, out, f"{source.name} {bindings} grid={grid}")


def test_cuda_launch_arguments_solve_expression_dims():
    _, fn = group("fused_exp", [("x", (P("n * 2"), P("m + 1")))], lambda g, x: g.emit("exp", x))
    source = emit_cuda(lower_function(fn), "k")
    x = np.zeros((6, 5), np.float32)
    arrays, dims = launch_arguments(source, [x], [np.zeros_like(x)])
    assert dict(zip(source.dims, dims)) == {"n": 3, "m": 4}
    with pytest.raises(DplError, match=r"m \+ 1"):
        launch_arguments(source, [x], [np.zeros((6, 4), np.float32)])


# -- extents no buffer determines: a kernel symbol of their own -----------------------------------
# A group cut from a strided conv1d holds n only in (n + 1) // 2 - 1: no size gives n back. The
# kernel gets a symbol for the atom (n + 1) // 2 and binds it by solving; main binds n from s.


def hidden_group(name, params, body, binder=("n", "m")):
    """As :func:`group`, with main also taking ``s: f32[<binder>]``, which binds the symbols the
    group's own parameters leave undetermined and which the group never reads."""
    g = FunctionBuilder(name, attrs={"Primitive": True})
    fn = g.ret(body(g, *[g.param(n, "f32", s) for n, s in params]))
    fb = FunctionBuilder("main")
    args = [fb.param(n, "f32", s) for n, s in params]
    fb.param("s", "f32", binder)
    return Module([fb.ret(fb.call(fn, *args)), fn]), fn


def hidden_inputs(fn, bindings, seed, binder=("n", "m")):
    return [*inputs(fn, bindings, seed), np.zeros(tuple(bindings[s] for s in binder), np.float32)]


def test_an_extent_no_buffer_determines_gets_a_kernel_symbol():
    from dpl.ir.extent_symbols import with_extent_symbols

    _, fn = hidden_group("fused_half", [("x", (2, P("(n + 1) // 2 - 1")))], lambda g, x: g.emit("tanh", x))
    rewritten = with_extent_symbols(fn)
    assert [str(p.ty) for p in rewritten.params] == ["f32[2, ext0 - 1]"] and str(rewritten.ret.ty) == "f32[2, ext0 - 1]"
    assert with_extent_symbols(rewritten) is rewritten  # every symbol is determined now
    k = lower_function(fn)
    assert k.dims == ("ext0",) and k.bind_dims([(2, 8), (2, 8)]) == {"ext0": 9}
    with pytest.raises(DplError, match=r"ext0 - 1"):
        k.bind_dims([(2, 8), (2, 7)])  # the output disagrees with the input
    # an atom that may be negative is shifted by its least value: the symbol stays >= 0
    _, fn = hidden_group("fused_floor", [("x", (P("(n - 7) // 2 + 5"),))], lambda g, x: g.emit("exp", x))
    assert str(with_extent_symbols(fn).params[0].ty) == "f32[ext0 + 1]"
    assert lower_function(fn).bind_dims([(1,), (1,)]) == {"ext0": 0}  # n = 0: (0 - 7) // 2 = -4


def test_a_whole_dim_over_hidden_symbols_is_a_symbol_and_an_inner_use_is_refused():
    """``m + n`` (a concat's result, read alone) has no atom to name: the whole dim is a size and
    gets a symbol. Where n and m are needed inside (test_symbols_no_buffer_determines_are_a_
    lowering_error's reshape), no symbol can stand for them: the function is returned as it was."""
    from dpl.ir.extent_symbols import with_extent_symbols

    _, fn = hidden_group("fused_relu", [("x", (2, P("m + n"), 3))], lambda g, x: g.emit("nn.relu", x))
    assert str(with_extent_symbols(fn).params[0].ty) == "f32[2, ext0, 3]"
    _, fn = group("fused_neg", [("x", (P("n * m"), 4))],
                  lambda g, x: g.emit("sum", g.emit("reshape", x, shape=["n", P("m * 4")])))
    assert with_extent_symbols(fn) is fn


def test_a_whole_dim_a_hidden_symbol_is_alone_in_is_solved_for_inside_too():
    """``m + n`` read through a merging reshape, ``(m + n) * 2`` inside: n is solved for
    (``ext0 - m``), so the inner dim reads ``ext0 * 2`` and the kernel binds ext0 from the size."""
    from dpl.ir.extent_symbols import with_extent_symbols

    def merge(g, x):
        doubled = g.emit("negative", g.emit("reshape", x, shape=[P("(m + n) * 2"), 3]))
        return g.emit("reshape", doubled, shape=[P("m + n"), 6])

    mod, fn = hidden_group("fused_merge", [("x", (P("m + n"), 6))], merge)
    rewritten = with_extent_symbols(fn)
    assert [str(b.var.ty) for b in rewritten.bindings][:2] == ["f32[ext0 * 2, 3]", "f32[ext0 * 2, 3]"]
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    for bindings in ({"n": 0, "m": 1}, {"n": 4, "m": 3}):
        args = hidden_inputs(fn, bindings, 0)
        assert_close(dpl.interpret(mod, *args), exe(*args), str(bindings))


HIDDEN = {
    # name: (params, body, bindings); n (and m) only inside atoms no size inverts
    "strided": ([("x", (2, 6, P("(n + 1) // 2 - 1"))), ("b", (6, 1))],
                lambda g, x, b: g.emit("nn.relu", g.emit("add", x, b)), [{"n": 2, "m": 1}, {"n": 9, "m": 1}, {"n": 24, "m": 1}]),
    "doubled": ([("x", (P("n % 3 + 1"), P("min(n, m) + 2")))],
                lambda g, x: g.emit("concat", [g.emit("exp", x), g.emit("negative", x)], axis=1),
                [{"n": 0, "m": 3}, {"n": 5, "m": 2}, {"n": 7, "m": 9}]),
    "row_softmax": ([("x", (P("(n - 7) // 2 + 5"), P("max(m, 4) * 2")))], lambda g, x: g.emit("nn.softmax", x, axis=-1),
                    [{"n": 0, "m": 1}, {"n": 8, "m": 6}, {"n": 13, "m": 3}]),
}


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_hidden_extents_run_on_every_kernel_path(name, nvrtc_or_none):
    """The C kernel, the reference running the group alone (the numpy target), the kernel
    evaluator and the CUDA launch arguments all bind the group from its own buffers."""
    params, body, sizes = HIDDEN[name]
    mod, fn = hidden_group(f"fused_{name}", params, body)
    k = lower_function(fn)
    assert not set(k.dims) & {"n", "m"}
    cpu, ref = dpl.build(mod, "cpu", config=ALWAYS), dpl.build(mod, "numpy", config=ALWAYS)
    assert "fall-back" not in cpu.summary() + ref.summary()
    source = emit_cuda(k, f"k_{name}", 0)
    for j, bindings in enumerate(sizes):
        args = hidden_inputs(fn, bindings, j)
        want = dpl.interpret(mod, *args)
        for label, got in (("cpu", cpu(*args)), ("numpy", ref(*args)), ("kernel", kernel_evaluate(k, *args[:-1]))):
            assert_close(want, got, f"{name} {label} {bindings}")
        _, dims = launch_arguments(source, args[:-1], [np.zeros_like(np.asarray(want))])
        assert dict(zip(source.dims, dims)) == k.bind_dims([a.shape for a in args[:-1]] + [np.shape(want)])
    if nvrtc_or_none is not None:
        assert f".entry k_{name}(" in nvrtc_or_none.compile_ptx(source.code, f"{name}.cu")


HIDDEN_SHAPES = [  # (shape, the least n and m at which every dim is >= 1)
    (2, P("(n + 1) // 2 - 1")),
    (P("n % 3 + 1"), P("m * 2 + 1")),
    (P("min(n, m) + 1"), 3),
    (P("(n - 7) // 2 + 5"), P("max(m, 4) // 3")),
    (P("(n + m) // 3 + 1"), P("m % 4 + 1")),
]
HIDDEN_SIZES = [{"n": 1, "m": 1}, {"n": 2, "m": 5}, {"n": 7, "m": 3}, {"n": 12, "m": 2}, {"n": 31, "m": 8}]


@st.composite
def hidden_random_groups(draw):
    shape = draw(st.sampled_from(HIDDEN_SHAPES))
    steps = draw(st.lists(st.tuples(st.sampled_from(["unary", "binary", "row", "column", "concat", "pad"]),
                                    st.integers(0, 99)), min_size=1, max_size=4))
    params = [("x", shape), ("y", shape if draw(st.booleans()) else (1, shape[1]))]

    def body(g, x, y):
        v = x
        for kind, pick in steps:
            if kind == "unary":
                v = g.emit(UNARY[pick % len(UNARY)], v)
            elif kind == "binary":
                v = g.emit(BINARY[pick % len(BINARY)], v, y if v.ty.shape == x.ty.shape else g.emit("tanh", v))
            elif kind == "concat":  # the extent doubles: 2 * ext0 - 2, bound from the output
                v = g.emit("concat", [v, g.emit(UNARY[pick % len(UNARY)], v)], axis=pick % 2)
            elif kind == "pad":  # the extent grows: ext0 + 2
                v = g.emit("nn.pad", v, pad_width=[0, 0, 1, 1], pad_value=0.5)
            else:
                r = g.emit(REDUCE[pick % len(REDUCE)], v, axis=[1 if kind == "row" else 0], keepdims=True)
                v = g.emit(BINARY[pick % len(BINARY)], v, r)
        return v

    return params, body, steps


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(hidden_random_groups())
def test_random_groups_over_hidden_extents(case):
    """Groups whose every dim is a non-linear expression of n and m (no buffer gives n or m
    back) equal the interpreter on the cpu target at several bindings."""
    params, body, steps = case
    mod, fn = hidden_group("fused_random", params, body)
    assert "n" not in lower_function(fn).dims  # m may bind by solving (m * 2 + 1)
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    assert "fall-back" not in exe.summary()
    for j, bindings in enumerate(HIDDEN_SIZES):
        if any(D.evaluate(d, bindings) < 1 for _, shape in params for d in shape):
            continue
        args = hidden_inputs(fn, bindings, j)
        assert_close(dpl.interpret(mod, *args), exe(*args), f"{steps} {bindings}")


# wav2vec2's all-true mask: the frames of a strided conv are n // 10 - 1 (no size gives n back),
# and arange's own length is max(n // 10, 1) - 1, which gives back neither n nor the end the
# reference computes; a sum reduces another such arange away, so no buffer holds it at all
CALLER_ONLY = """
func main(x: f32[2, n]) -> (f32[2, n // 10 - 1], f32[]) {
  r0 = arange(end="n // 10 - 1", dtype=i64)
  r = strided_slice(r0, axes=[0], begin=[0], end=["n // 10 - 1"])
  rf = astype(r, dtype=f32)
  row = expand_dims(rf, axis=[0])
  s = strided_slice(x, axes=[1], begin=[0], end=["n // 10 - 1"])
  y = add(s, row)
  k = arange(end="n // 5 + 2", dtype=f32)
  total = sum(k)
  return (y, total)
}
"""


@pytest.mark.parametrize("fused", [False, True], ids=["op_by_op", "fused"])
@pytest.mark.parametrize("target", ["cpu", "numpy"])
def test_a_symbol_no_buffer_of_a_kernel_determines_takes_the_callers_value(target, fused):
    """Neither the sizes of its buffers nor symbols of its own give such a kernel ``n``: the plan,
    made for one signature, writes the caller's value into it, at every size called."""
    mod = dpl.parse(CALLER_ONLY)
    exe = dpl.build(dpl.apply(mod, []) if fused else mod, target, config=ALWAYS)
    for n in (25, 97, 40, 25):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        y, total = exe(x)
        np.testing.assert_array_equal(y, x[:, : n // 10 - 1] + np.arange(n // 10 - 1, dtype=np.float32))
        assert total == sum(range(n // 5 + 2))
    assert "fall-back" not in exe.summary()


def test_a_symbol_only_in_a_linear_dim_is_solved_per_call_without_the_general_binding(monkeypatch):
    """A decode step's key cache after its concatenation is ``s + 1`` long in every buffer of the
    permute and the attention that read it: the CPU runner solves s from that axis (the checks
    still compare every dim), not through the general binding at each new length; a length no s
    gives still names the expression."""
    from dpl.kernel import ir as kernel_ir

    calls = []
    general = kernel_ir.Kernel.bind_dims
    monkeypatch.setattr(kernel_ir.Kernel, "bind_dims", lambda self, *a, **k: calls.append(1) or general(self, *a, **k))
    mod, fn = group("fused_permute_dims", [("x", (2, P("n * 2 + 1"), 3))],
                    lambda g, x: g.emit("exp", g.emit("permute_dims", x, axes=[0, 2, 1])))
    exe = dpl.build(mod, "cpu", config=ALWAYS)
    for k, n in enumerate((1, 4, 9)):
        args = inputs(fn, {"n": n}, k)
        assert_close(dpl.interpret(mod, *args), exe(*args), f"n = {n}")
    assert not calls
    with pytest.raises(DplError, match=r"n \* 2 \+ 1"):
        exe(np.zeros((2, 6, 3), np.float32))  # no n makes 2n + 1 equal 6
