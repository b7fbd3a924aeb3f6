"""Constant folding: bindings over constants are computed once, with the interpreter's numbers."""

import numpy as np
from hypothesis import given, settings, strategies as st

import dpl
from dpl.ir import FunctionBuilder, Module, const
from dpl.transform.fold_constants import fold_constants

RNG = np.random.default_rng(0)


def _weights(*shape, name="w"):
    return const(RNG.standard_normal(shape).astype("float32"), name=name)


def _ops(mod):
    return [b.value.op for b in mod["main"].bindings]


def test_gemma_one_plus_w_is_folded_and_numbers_are_unchanged():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    w1 = fb.emit("add", _weights(16), const(1.0), name="w1")
    y = fb.emit("multiply", x, w1, name="y")
    mod = Module([fb.ret(y)])
    before = mod.script()
    folded = fold_constants(mod)
    assert mod.script() == before  # the input is not changed
    assert _ops(folded) == ["multiply"]
    a = RNG.standard_normal((5, 16)).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(folded, a), dpl.interpret(mod, a))


def test_a_chain_over_weights_folds_in_one_walk_and_round_trips():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 8))
    wt = fb.emit("permute_dims", _weights(4, 8), name="wt")
    ws = fb.emit("multiply", wt, const(0.5), name="ws")
    b = fb.emit("add", _weights(4, name="b"), _weights(4, name="b2"), name="bias")
    mm = fb.emit("matmul", x, ws, name="mm")
    y = fb.emit("add", mm, b, name="y")
    mod = Module([fb.ret(y)])
    folded = fold_constants(mod)
    assert _ops(folded) == ["matmul", "add"]
    a = RNG.standard_normal((3, 8)).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(folded, a), dpl.interpret(mod, a))
    again = dpl.parse(folded.script(), constants={c.name: c.value for c in _named_constants(folded)})
    np.testing.assert_array_equal(dpl.interpret(again, a), dpl.interpret(mod, a))


def _named_constants(mod):
    from dpl.ir.printer import collect_constants

    return [c for c in collect_constants(mod) if c.name]


def test_a_folded_tuple_feeds_its_items():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (3,))
    parts = fb.emit("split", _weights(6), indices_or_sections=2, name="parts")
    first = fb.item(parts, 0, name="first")
    y = fb.emit("add", x, first, name="y")
    mod = Module([fb.ret(y)])
    folded = fold_constants(mod)
    assert _ops(folded) == ["add"]
    a = RNG.standard_normal(3).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(folded, a), dpl.interpret(mod, a))


def test_what_is_not_folded():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (512, 512))
    big = fb.emit("broadcast_to", const(1.0), shape=[512, 512], name="big")  # grows 4 bytes to 1 MiB
    n = fb.param("s", "f32", ("n",))
    ar = fb.emit("arange", end="n", dtype="float32", name="ar")  # symbolic length
    y = fb.emit("add", x, big, name="y")
    z = fb.emit("add", ar, n, name="z")
    mod = Module([fb.ret(y, z)])
    assert fold_constants(mod) is mod
    small = fold_constants(mod, grow_bytes=2 * 1024 * 1024)
    assert "broadcast_to" not in _ops(small) and "arange" in _ops(small)


def test_apply_folds_after_the_rewrites_and_can_be_told_not_to():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 16))
    w1 = fb.emit("add", _weights(16), const(1.0), name="w1")
    y = fb.emit("multiply", x, w1, name="y")
    mod = Module([fb.ret(y)])
    assert "add" not in str(dpl.apply(mod, fuse=False))
    assert "add(" in str(dpl.apply(mod, fuse=False, fold=False))


_UNARY = ["exp", "tanh", "sigmoid", "negative", "abs", "nn.relu", "nn.silu", "sqrt"]
_BINARY = ["add", "subtract", "multiply", "maximum", "minimum"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_UNARY + _BINARY), st.integers(0, 10), st.booleans()), min_size=1, max_size=8),
       st.integers(0, 2**31 - 1))
def test_folding_never_changes_the_numbers(steps, seed):
    """Random chains mixing constants and a parameter: the folded module computes the same values."""
    rng = np.random.default_rng(seed)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (3, 4))
    values = [x, const(rng.standard_normal((3, 4)).astype("float32"), name="c0"), const(rng.standard_normal(4).astype("float32"), name="c1")]
    for i, (op, pick, use_const) in enumerate(steps):
        a = values[pick % len(values)]
        if op in _BINARY:
            b = values[1 + (pick % 2)] if use_const else values[-1]
            values.append(fb.emit(op, a, b, name=f"v{i}"))
        else:
            values.append(fb.emit(op, a, name=f"v{i}"))
    out = fb.emit("add", values[-1], x, name="out")
    mod = Module([fb.ret(out)])
    folded = fold_constants(mod)
    a = rng.standard_normal((3, 4)).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(folded, a), dpl.interpret(mod, a))
    assert len(folded["main"].bindings) <= len(mod["main"].bindings)


def test_a_relative_position_bias_over_a_small_table_folds_whole():
    """T5's attention bias at a static length: two ranges, their difference, a bucket of each,
    the table's rows at them, as the heads' [1, 4, 128, 128] floats (256 KiB from a 512-byte
    table): computed once at build, one constant left beside the scores, the numbers the
    interpreter's."""
    fb = FunctionBuilder("main")
    scores = fb.param("s", "f32", (1, 4, 128, 128))
    q = fb.emit("reshape", fb.emit("arange", end=128, dtype="int64"), shape=[128, 1], name="q")
    k = fb.emit("reshape", fb.emit("arange", end=128, dtype="int64"), shape=[1, 128], name="k")
    rel = fb.emit("subtract", k, q, name="rel")
    bucket = fb.emit("clip", fb.emit("add", rel, const(np.array(16, np.int64))), min=0, max=31, name="bucket")
    rows = fb.emit("take", _weights(32, 4, name="table"), bucket, axis=0, name="rows")  # [128, 128, 4]
    bias = fb.emit("expand_dims", fb.emit("permute_dims", rows, axes=[2, 0, 1]), axis=0, name="bias")
    y = fb.emit("add", scores, bias, name="y")
    mod = Module([fb.ret(y)])
    folded = fold_constants(mod)
    assert _ops(folded) == ["add"]
    a = RNG.standard_normal((1, 4, 128, 128)).astype("float32")
    np.testing.assert_array_equal(dpl.interpret(folded, a), dpl.interpret(mod, a))
